"""Worker process of `SymbolicChecker`: reads `{"gold", "answer", "timeout"}` JSON lines on stdin,
answers `{"eq": bool}` lines on stdout. Runs alone in its process so that math-verify's
signal-based timeouts work (this is the main thread) and so that a comparison stuck in C code
can be ended by killing the process. Imports nothing from slime: it is started by file path."""

from __future__ import annotations

import json
import logging
import sys


def main() -> None:
    logging.disable(logging.WARNING)  # math-verify logs parse failures of free text at WARNING
    try:
        from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
    except ImportError as e:
        sys.stdout.write(json.dumps({"fatal": f"{e} (math-verify is a dependency: pip install math-verify)"}) + "\n")
        sys.stdout.flush()
        return

    # float_rounding=10: a decimal equals a fraction only when it is written to 10 places
    # (0.3333333 is not 1/3), close to exact comparison.
    configs = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
    out = sys.stdout
    for line in sys.stdin:
        try:
            req = json.loads(line)
            limit = max(1, int(req.get("timeout", 5)))
            gold = parse(f"${req['gold']}$", configs, parsing_timeout=limit)
            answer = parse(f"${req['answer']}$", configs, parsing_timeout=limit)
            eq = bool(gold and answer and verify(gold, answer, float_rounding=10, timeout_seconds=limit))
            reply = {"eq": eq}
        except Exception as e:  # noqa: BLE001 - a bad expression is "not equal", never a dead worker
            reply = {"eq": False, "error": f"{type(e).__name__}: {e}"[:500]}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
