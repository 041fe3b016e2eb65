"""Turn a metrics.jsonl into PNG plots: `python tools/report.py RUN_DIR_OR_METRICS_JSONL [-o OUT]`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slime.observability.plots import make_report  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("metrics", help="metrics.jsonl, or a directory containing it")
    p.add_argument("-o", "--out", default=None, help="output directory (default: <metrics dir>/report)")
    a = p.parse_args(argv)
    src = Path(a.metrics)
    out = Path(a.out) if a.out else (src if src.is_dir() else src.parent) / "report"
    files = make_report(src, out)
    if not files:
        print(f"no plottable metrics in {src}", file=sys.stderr)
        return 1
    for f in files:
        print(f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
