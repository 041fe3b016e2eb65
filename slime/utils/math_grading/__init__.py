"""Math answer grading as pure functions plus a bounded symbolic checker, in the lowest layer so that
both the reward rules (`slime.rollout.rm_hub`, which keeps slime's module paths as re-exports) and the
tools (`slime.tools.geo3k_tool`) use it: `answers` (extraction, normalisation, the graders), `braces`
(balanced-brace scanning), `symbolic` (math-verify in worker processes, `_symbolic_worker.py`, under a
deadline)."""
