"""The keeper of a private Ray's sessions (`slime.ray.process_keeper`): when the command holding its pipe
dies, by SIGKILL too, every process of the sessions it was told of is killed (one that forks while being
killed, one that ignores SIGTERM, a grandchild in a process group of its own, as the raylet puts its
workers) and the keeper exits after them; nothing outside those sessions is touched. No Ray here: plain
processes leading sessions told to the keeper, as Ray's are."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import psutil
from hypothesis import given, settings
from hypothesis import strategies as st

from slime.ray.process_keeper import session_members, stat_ids

# The "command": starts the keeper, then two session leaders told to it (one ignoring SIGTERM with a
# child in a process group of its own, one forking without end), one session not told, prints the pids
# and waits to be killed.
COMMAND = textwrap.dedent("""
    import json, os, subprocess, sys, time
    from slime.ray.process_keeper import RayProcessKeeper
    keeper = RayProcessKeeper.start()
    stubborn = ("import os, signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], preexec_fn=os.setpgrp); "
                "print(c.pid, flush=True); time.sleep(600)")
    forker = ("import os, time\\n"
              "while True:\\n"
              "    if os.fork() == 0:\\n"
              "        time.sleep(600); os._exit(0)\\n"
              "    time.sleep(0.005)\\n")
    a = subprocess.Popen([sys.executable, "-c", stubborn], stdout=subprocess.PIPE, text=True, start_new_session=True)
    keeper.adopt(a.pid)
    grandchild = int(a.stdout.readline())
    b = subprocess.Popen([sys.executable, "-c", forker], start_new_session=True)
    keeper.adopt(b.pid)
    outside = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    print(json.dumps({"keeper": keeper.keeper.pid, "sessions": [a.pid, b.pid], "members": [a.pid, grandchild, b.pid],
                      "outside": outside.pid}), flush=True)
    time.sleep(600)
""")


def test_the_command_sigkilled_its_ray_sessions_are_taken_down_and_nothing_else():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    command = subprocess.Popen([sys.executable, "-c", COMMAND], stdout=subprocess.PIPE, text=True, env=env)
    outside = None
    try:
        pids = json.loads(command.stdout.readline())
        outside = psutil.Process(pids["outside"])
        keeper = psutil.Process(pids["keeper"])
        members = [psutil.Process(p) for p in pids["members"]]
        sessions = set(pids["sessions"])
        assert os.getsid(keeper.pid) == keeper.pid and os.getpgid(pids["members"][1]) == pids["members"][1]
        assert set(session_members(sessions)) >= set(pids["members"])
        command.kill()  # no clean-up code runs
        command.wait()
        _, alive = psutil.wait_procs([keeper], timeout=60)  # the keeper exits once the sessions are empty
        assert alive == []
        assert session_members(sessions) == []  # the forker's late children included
        assert all(not p.is_running() or p.status() == psutil.STATUS_ZOMBIE for p in members)
        assert outside.is_running()  # a session not told: not the keeper's business
    finally:
        if command.poll() is None:
            command.kill()
            command.wait()
        command.stdout.close()
        if outside is not None:
            outside.kill()
            outside.wait()


def test_the_session_of_a_process_is_read_from_its_stat():
    me = os.getpid()
    assert me in session_members({os.getsid(0)})
    with open(f"/proc/{me}/stat", "rb") as f:
        state, pgrp, session = stat_ids(f.read())
    assert (pgrp, session) == (os.getpgrp(), os.getsid(0)) and state in "RS"


@settings(max_examples=60, deadline=None)
@given(
    comm=st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=16),
    pgrp=st.integers(1, 2**22),
    session=st.integers(1, 2**22),
)
def test_a_command_name_with_spaces_or_parentheses_does_not_shift_the_fields(comm, pgrp, session):
    """setproctitle and users name processes as they like: `ray::Foo (bar) 1 2` must not be read as
    the group."""
    stat = f"4242 ({comm}) S 1 {pgrp} {session} 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0".encode()
    assert stat_ids(stat) == ("S", pgrp, session)
