"""`python -m slime.fleet.router_launch ARGS`: sglang-router's own launcher (`sglang_router.launch_router`), without
the import of its Python debugging balancer.

Why: `sglang_router.launch_router` imports `sglang_router.mini_lb` at its top, and with it FastAPI, uvicorn and
aiohttp (1.1 of its 1.2 CPU seconds of imports), for `--mini-lb` only, which slime never passes. The router is
started on every cold start (and again after each router death), in the middle of the manager's start. This
module does what `launch_router.main` does with the same pieces of the same package (its options parser, its
`RouterArgs`, the Rust `Router`), so the command line and the router are sglang-router's; `--mini-lb` is
handed to sglang-router's own launcher.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence


def parse_router_args(argv: Sequence[str]):
    """sglang-router's options as its own launcher parses them (`launch_router.parse_router_args`)."""
    from sglang_router.router_args import RouterArgs

    parser = argparse.ArgumentParser(prog="sglang_router.launch_router")
    RouterArgs.add_cli_args(parser, use_router_prefix=False)
    return RouterArgs.from_cli_args(parser.parse_args(list(argv)), use_router_prefix=False)


def main(argv: Sequence[str] | None = None) -> None:
    router_args = parse_router_args(sys.argv[1:] if argv is None else argv)
    if router_args.mini_lb:
        from sglang_router.launch_router import launch_router

        launch_router(router_args)
        return
    import setproctitle
    from sglang_router.router import Router

    setproctitle.setproctitle("sglang::router")  # as launch_router names it
    router_args._validate_router_args()  # noqa: SLF001 - launch_router's own check, before the start
    Router.from_args(router_args).start()


if __name__ == "__main__":
    main()
