"""`run_cli`: one way in and out for slime-rollout and slime-train (exit codes, headlines, signals)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest

from slime.cli import rollout, train
from slime.cli.args import ArgError
from slime.cli.command import Terminated, run_cli
from slime.cli.finalize import complete_namespace


def _args(**kw):
    base = dict(
        load=None,
        prompt_data=None,
        load_debug_rollout_data=None,
        start_rollout_id=0,
        num_rollout=0,
        eval_datasets=None,
        tool_config_path=None,
        input_key="input",
        label_key=None,
    )
    return complete_namespace(SimpleNamespace(**{**base, **kw}))


def _run(body, args=None, parse=None):
    return run_cli("slime-x", [], parse or (lambda argv: args if args is not None else _args()), body)


@pytest.fixture(autouse=True)
def _restore_sigterm():
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


def test_success_runs_body_once_and_exits_0():
    seen = []
    assert _run(seen.append) == 0
    assert len(seen) == 1 and seen[0].num_rollout == 0


def test_bad_flags_exit_2_with_one_line(capsys):
    def parse(argv):
        raise ArgError("--num-rollout: must be >= 0")

    assert _run(lambda a: pytest.fail("body ran"), parse=parse) == 2
    assert capsys.readouterr().err == "slime-x: error: --num-rollout: must be >= 0\n"


def test_bad_input_exits_1_before_body(capsys, tmp_path):
    missing = tmp_path / "nope.jsonl"
    assert _run(lambda a: pytest.fail("body ran"), _args(prompt_data=str(missing), num_rollout=1)) == 1
    assert capsys.readouterr().err == f"slime-x: error: --prompt-data: file not found: {missing}\n"


def test_rollouts_without_prompt_data_fail_in_preflight(capsys):
    assert _run(lambda a: pytest.fail("body ran"), _args(num_rollout=2)) == 1
    assert capsys.readouterr().err.startswith("slime-x: error: --prompt-data: required to generate rollouts 0..1")


def test_ctrl_c_exits_130(capsys):
    def body(args):
        raise KeyboardInterrupt

    assert _run(body) == 130
    assert capsys.readouterr().err == "slime-x: interrupted; everything started was stopped\n"


def test_sigterm_takes_the_orderly_stop_and_exits_143(capsys):
    stopped = []

    def body(args):
        try:
            os.kill(os.getpid(), signal.SIGTERM)  # delivered to this (the main) thread
            pytest.fail("SIGTERM did not interrupt the body")
        finally:
            stopped.append(signal.getsignal(signal.SIGTERM))

    assert _run(body) == 143
    assert stopped == [signal.SIG_IGN]  # a second SIGTERM during the stop is ignored
    assert capsys.readouterr().err == "slime-x: terminated; everything started was stopped\n"


def test_other_errors_get_a_headline(capsys):
    def body(args):
        raise RuntimeError("engine 0 died")

    assert _run(body) == 1
    assert capsys.readouterr().err.startswith("slime-x: error: RuntimeError: engine 0 died")


def test_resume_is_announced_before_the_body(capsys, tmp_path):
    (tmp_path / "latest_rollout_id.txt").write_text("1")
    (tmp_path / "rollout_state_1.json").write_text(
        json.dumps({"epoch_id": 0, "offset": 4, "group_counter": 2, "sample_counter": 4, "buffer": []})
    )
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"input": f"question {i}"}) + "\n" for i in range(8)))
    seen = []
    assert (
        _run(
            lambda a: seen.append(a.start_rollout_id),
            _args(load=str(tmp_path), num_rollout=3, prompt_data=str(prompts)),
        )
        == 0
    )
    assert seen == [2]
    assert capsys.readouterr().out == f"--load {tmp_path}: resuming after rollout 1, at rollout 2\n"


def test_a_resume_with_nothing_left_to_do_ends_before_anything_starts(capsys, tmp_path):
    """The body (Ray, engines, the first weight push: 70 s) never runs for no rollout."""
    (tmp_path / "latest_rollout_id.txt").write_text("2")
    (tmp_path / "rollout_state_2.json").write_text(
        json.dumps({"epoch_id": 0, "offset": 6, "group_counter": 3, "sample_counter": 6, "buffer": []})
    )
    seen = []
    assert _run(lambda a: seen.append(a.start_rollout_id), _args(load=str(tmp_path), num_rollout=3)) == 0
    assert seen == []
    assert capsys.readouterr().out == (
        f"--load {tmp_path}: resuming after rollout 2, at rollout 3 "
        "(nothing left to do: --num-rollout 3; nothing was started)\n"
    )


def test_sigterm_re_raised_as_a_plain_keyboard_interrupt_still_exits_143(capsys):
    """Ray's `ray.get` catches the signal handler's exception (KeyboardInterrupt and subclasses) and
    raises a plain KeyboardInterrupt of its own: a SIGTERM while the driver waits on Ray is still one."""

    def body(args):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            pytest.fail("SIGTERM did not interrupt the body")
        except KeyboardInterrupt:  # what _raylet.check_signals does with it
            raise KeyboardInterrupt() from None

    assert _run(body) == 143
    assert capsys.readouterr().err == "slime-x: terminated; everything started was stopped\n"


def test_terminated_is_a_keyboard_interrupt():
    assert issubclass(Terminated, KeyboardInterrupt)


def test_both_commands_use_run_cli(monkeypatch):
    calls = []
    monkeypatch.setattr(rollout, "run_cli", lambda prog, argv, parse, body: calls.append((prog, parse, body)) or 7)
    monkeypatch.setattr(train, "run_cli", lambda prog, argv, parse, body: calls.append((prog, parse, body)) or 8)
    assert rollout.main([]) == 7 and train.main([]) == 8
    assert calls == [
        ("slime-rollout", rollout.parse_args, rollout.run),
        ("slime-train", train.parse_train_args, train.run),
    ]


def test_a_real_command_line_ends_without_interpreter_teardown(tmp_path):
    """From a real command line (argv None) the command ends at once when its body is done: exit
    handlers run, unflushed output is written, the exit code is kept, and the interpreter's teardown
    (here a finalizer standing for Ray's and the tokenizer's modules) is skipped."""
    import subprocess
    import sys
    import textwrap

    script = tmp_path / "cmd.py"
    script.write_text(
        textwrap.dedent(f"""
        import atexit, sys
        from types import SimpleNamespace
        from slime.cli.command import run_cli

        class Teardown:
            def __del__(self):
                print("teardown ran", flush=True)

        keep = Teardown()
        atexit.register(lambda: open({str(tmp_path / "atexit")!r}, "w").write("ran"))

        def body(args):
            sys.stdout.write("last line, unflushed")
            raise RuntimeError("the body failed")

        from slime.cli.finalize import complete_namespace

        args = complete_namespace(SimpleNamespace(
            load=None, prompt_data=None, load_debug_rollout_data=None, start_rollout_id=0, num_rollout=0,
            eval_datasets=None, tool_config_path=None, input_key="input", label_key=None))
        sys.exit(run_cli("slime-x", None, lambda argv: args, body))
    """)
    )
    proc = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert proc.stdout == "last line, unflushed"  # written, and no teardown after it
    assert "the body failed" in proc.stderr
    assert (tmp_path / "atexit").read_text() == "ran"
