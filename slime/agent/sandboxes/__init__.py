"""Agents in sandboxes: the `Sandbox` contract and its backends (slime's own sandbox server, E2B), the pool that
hands them out, the workspace and grader a sample's agent runs with, the command agent and the CLI harnesses
(claude-code, codex). An agent reaches the model only through the gateway's URL; nothing here imports the gateway
but the flattening of message content (slime.agent.gateway.protocols.common)."""
