"""Weight sync, both sides: the trainer's push (`push`, `group`), what an engine does with it (`receive`), their
shared wire format (`transfer`, `ring`) and the rollout manager's calls (`manager`). The engine's HTTP routes
(slime.engine.weight_routes) are the only part that lives with the engine; nothing here imports the engine."""
