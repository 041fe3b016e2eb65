"""Agentic RL: any agent speaking the OpenAI or Anthropic API trains through a token-exact gateway."""
