"""verl's reward scores (`verl.utils.reward_score.{gsm8k,geo3k}`) with verl's rules, for the classes a
verl config names (`verl.tools.gsm8k_tool.Gsm8kTool`, `verl.tools.geo3k_tool.Geo3kTool`,
`verl.interactions.gsm8k_interaction.Gsm8kInteraction`): a recipe moved here gets the reward verl
gives for the same answer. slime's own numeric graders (`slime.tools.gsm8k_tool`, `geo3k_tool`) stay
under slime's names."""
