"""Browse rollout dumps: `python tools/rollout_viewer.py DIR [DIR ...] [--tokenizer PATH]`.

DIR is a --rollout-data-dir, a directory of --save-debug-rollout-data files, or a single
.jsonl / .pt file. `--print N` prints the first N samples of each dump instead of browsing (a VLM
sample's pictures as terminal cells beside its answer). --tokenizer (a dir with tokenizer.json, e.g. the --hf-checkpoint) decodes
token spans; by default the tokenizer path recorded in the dump is tried.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "paths",
        nargs="+",
        help="rollout dump directories (--rollout-data-dir, the directory of "
        "--save-debug-rollout-data) or single .jsonl/.pt files",
    )
    p.add_argument("--tokenizer", default=None, help="tokenizer dir or tokenizer.json to decode token spans")
    p.add_argument(
        "--print",
        dest="print_n",
        type=int,
        default=0,
        metavar="N",
        help="print the first N samples of each dump to the terminal instead of browsing",
    )
    a = p.parse_args(argv)
    if a.print_n:
        from rich.console import Console

        from slime.observability import viewer_data as V

        console, decoder = Console(), V.Decoder(a.tokenizer)
        for source in V.discover(a.paths):
            for rec in V.load(source).records[: a.print_n]:
                console.print(V.render_sample(rec, decoder))
        return 0
    from slime.observability.viewer import RolloutViewer

    RolloutViewer(a.paths, tokenizer=a.tokenizer).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
