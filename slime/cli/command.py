"""`run_cli`: how every slime command starts, fails and stops (`slime-rollout`, `slime-train`).

Why one place: the commands must behave alike at the edges. Bad flags exit 2 with one line; a bad
input found by `preflight` exits 1 with a headline naming flag, file and line, before anything
starts; Ctrl-C (130) and SIGTERM (143, what schedulers and `timeout` send) take the same orderly
stop; any other error is one headline plus the user's own frames (`errors.describe`); and from a
real command line nothing the command started outlives it (`lifeline`).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
from typing import Any, Callable, Sequence

from slime.cli import lifeline
from slime.cli.args import ArgError
from slime.cli.errors import describe
from slime.cli.exit_now import exit_now
from slime.cli.preflight import PreflightError, preflight
from slime.train.save_dir import SaveDirError, SaveDirLock
from slime.utils.startup_trace import mark

logger = logging.getLogger("slime")


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C's KeyboardInterrupt would be, so it takes the same way out."""


def stop_on_sigterm() -> None:
    """SIGTERM takes Ctrl-C's orderly path (KeyboardInterrupt). Installed once, before Ray starts;
    `ray_init` keeps it through `ray.init` (`slime.ray.keep_sigterm`), which would otherwise install
    Ray's own. A second signal during the stop is ignored so the stop completes (which is also how
    `sigterm_received` knows a SIGTERM came)."""

    def handler(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated()

    signal.signal(signal.SIGTERM, handler)


def sigterm_received() -> bool:
    """Whether the KeyboardInterrupt being handled began as SIGTERM. Not every one arrives as
    `Terminated`: a signal that lands while the driver blocks in `ray.get` is caught inside Ray
    (`_raylet.check_signals` catches KeyboardInterrupt, subclasses included) and re-raised as a
    plain KeyboardInterrupt, which made a SIGTERM during start-up exit 130. Our handler leaves
    SIGTERM ignored once it ran; Ctrl-C never does."""
    return signal.getsignal(signal.SIGTERM) is signal.SIG_IGN


def _announce_resume(args: Any, resolved: dict[str, Any]) -> bool:
    """One line saying what `--load` will really do (preflight resolved it); False when nothing is left
    to do (the run then ends there: starting Ray, engines and a weight push for no rollout took 70 s)."""
    if resolved.get("resumed_after") is None:
        return True
    left = (
        ""
        if args.start_rollout_id < args.num_rollout
        else f" (nothing left to do: --num-rollout {args.num_rollout}; nothing was started)"
    )
    message = (
        resolved.get("resume_message")
        or f"--load {args.load}: resuming after rollout {resolved['resumed_after']}, at rollout {args.start_rollout_id}"
    )
    print(message + left, flush=True)
    return not left


@contextlib.contextmanager
def plugin_import_path(restore: bool) -> Any:
    """`sys.path` as the Ray workers will have it while the plugins are checked: a plugin a worker
    cannot import fails here, naming its flag, before Ray starts. With `restore` (a command called
    in-process, as tests do) `sys.path` is as it was afterwards."""
    from slime.ray.worker_path import apply_to_sys_path

    saved = list(sys.path)
    apply_to_sys_path()
    try:
        yield
    finally:
        if restore:
            sys.path[:] = saved


def _save_dir_lock(args: Any) -> Any:
    """The `--save` directory's lock, held while the command runs (a second run is refused)."""
    return SaveDirLock(args.save) if args.save else contextlib.nullcontext()


def run_cli(
    prog: str, argv: Sequence[str] | None, parse: Callable[[Sequence[str] | None], Any], body: Callable[[Any], Any]
) -> int:
    """Parse, check every input, then run `body(args)`; the exit code.

    With `argv` None (a real command line) the process is also made to take everything it started
    down with it (`lifeline`), and ends as soon as it has (`exit_now`: no interpreter teardown);
    called with a list (tests, scripts) the process is left alone and the code returned.
    """
    code = _run(prog, argv, parse, body)
    if argv is None:
        exit_now(code)
    return code


def _run(
    prog: str, argv: Sequence[str] | None, parse: Callable[[Sequence[str] | None], Any], body: Callable[[Any], Any]
) -> int:
    mark(f"{prog}: imported")
    lifeline_pid = None
    if argv is None:
        if lifeline.own_process_group():
            lifeline_pid = lifeline.start_lifeline()  # before any thread starts
        lifeline.become_subreaper()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        args = parse(argv)
    except ArgError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    stop_on_sigterm()
    try:
        # the path the workers import plugins from (slime.ray.worker_path); a real command keeps it
        with plugin_import_path(restore=argv is not None):
            resolved = preflight(args)
        if not _announce_resume(args, resolved):
            return 0
        mark(f"{prog}: inputs checked")
        with _save_dir_lock(args):
            body(args)
    except (PreflightError, SaveDirError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        if isinstance(e, Terminated) or sigterm_received():
            print(f"{prog}: terminated; everything started was stopped", file=sys.stderr)
            return 128 + signal.SIGTERM
        print(f"{prog}: interrupted; everything started was stopped", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - the cause and the user's frames, not a Ray traceback
        print(describe(e, prog), file=sys.stderr)
        return 1
    finally:
        if argv is None:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the stop is under way: let it finish
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            left = lifeline.reap_descendants(keep=(lifeline_pid,) if lifeline_pid else ())
            if left:
                logger.warning("stopped %d leftover process(es) at exit: %s", len(left), "; ".join(left))
            mark(f"{prog}: descendants reaped")
    return 0
