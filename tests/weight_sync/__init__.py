"""Weight sync on the embedded engine: slime's engine API (EngineActor methods, here as plain objects
around real engine processes) and the trainer-side helpers, on the tiny model.

Model A is what the engines load; model B is the same architecture with another seed. A push of B
must make an engine answer exactly what an engine serving B answers (greedy and seeded sampling),
and every request must come entirely from one weight version.
"""
