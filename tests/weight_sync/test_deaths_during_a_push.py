"""Issue 20 item 7: an engine dies during a distributed push or while it joins the group; the survivors
get the whole push, and pause/continue skip the dead engine."""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time

import pytest

from slime.weights.push import WeightUpdateGroup, paused
from slime.fleet.engine_actor import EngineActor
from tests.weight_sync.helpers import load, actor, assert_serves, ring_files


class Watched:
    """An engine with an exit notice (what RemoteEngine gets from the fleet's supervised actor) that
    can SIGKILL itself when the `die_at`-th bucket of a push is announced to it (0: when it is asked
    to join a group)."""

    def __init__(self, engine: EngineActor, die_at: int | None = None):
        self.engine, self.die_at = engine, die_at
        self.exited: cf.Future = cf.Future()
        process = engine.server.process
        threading.Thread(target=lambda: self.exited.set_result(process.wait()), daemon=True).start()

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def __repr__(self) -> str:
        return f"engine {self.engine.rank}"

    def init_weights_update_group(self, **kwargs) -> dict:
        if self.die_at == 0:  # dies as it is asked to join
            self.engine.kill()
        return self.engine.init_weights_update_group(**kwargs)

    def update_weights_from_distributed(self, **kwargs) -> dict:
        if self.die_at:
            self.die_at -= 1
            if self.die_at == 0:
                self.engine.kill()
        return self.engine.update_weights_from_distributed(**kwargs)


OLD_GROUP_DEADLINE_S = 600.0  # far beyond the test's own run: a push that waited for it could not pass


@pytest.mark.parametrize("transport", ["auto", "broadcast"])
@pytest.mark.parametrize("when", ["start", "middle", "end"])
def test_push_survives_an_engine_killed_during_it(
    engines, refs, tiny_model_dir, fork_server, tensors_b, ck_b, tmp_path, caplog, transport, when
):
    """SIGKILL at the first, a middle or the last bucket: the dead engine is dropped, the group formed
    again with the survivors, and they get the whole push (checksums) and serve it, all before the
    broken group's deadline (600 s here) could pass: nothing waits in the dead member's collective
    (neither rank 0 nor a survivor's decode thread frees the broken gloo group); the log names the
    engine and the push."""
    from slime.weights.transfer import bucket_named_tensors

    bucket_bytes = 64 << 10
    n = len(list(bucket_named_tensors(tensors_b, bucket_bytes)))
    assert n >= 5
    victim = actor(tiny_model_dir, tmp_path, rank=7, fork_server=fork_server)
    try:
        victim.start()
        members = [
            Watched(engines[0]),
            Watched(victim, {"start": 1, "middle": n // 2, "end": n}[when]),
            Watched(engines[1]),
        ]
        group = WeightUpdateGroup(
            members, group_name="g-death", timeout=OLD_GROUP_DEADLINE_S, transport=transport, ring_slot_bytes=1 << 20
        )
        group.connect()
        assert group.transport == ("shm_ring" if transport == "auto" else "broadcast")
        try:
            started = time.monotonic()  # the broken group's collectives start after this: their deadline is later
            with caplog.at_level("WARNING", logger="slime.engine"), paused(members):
                answers = group.push(tensors_b, weight_version="d1", bucket_bytes=bucket_bytes)
            assert [a["weight_version"] for a in answers] == ["d1", "d1"]
            assert group.died == [(members[1], "the push of weight version 'd1'")]
            assert (
                "engine 7 died during the push of weight version 'd1' (engine 7: exited with code -9); going on "
                "with the 2 surviving engine(s)" in caplog.messages
            )
            # the loss's record: how the death was known, and each survivor's call in the dropped group ended
            [loss] = group.losses
            assert loss["engines"] == ["engine 7"] and loss["exit"] == {"engine 7": "exited with code -9"}
            assert sorted(loss["survivors"]) == sorted(map(repr, [members[0], members[2]]))
            assert "no answer yet" not in loss["survivors"].values(), loss
            assert group.engines == [members[0], members[2]] and group.group_name == "g-death-1"
            assert group.transport == ("shm_ring" if transport == "auto" else "broadcast")
            assert victim.server.process.wait() is not None
            for e in engines:
                assert e.check_weights("compare", checksums=ck_b)["equal"]
                assert_serves(e.url(), refs["B"], "d1", prompts=(0,))
            with paused(group.engines):  # the group of survivors goes on
                group.push(tensors_b, weight_version="d2", bucket_bytes=1 << 20)
            assert [e.get_weight_version() for e in engines] == ["d2", "d2"]
            assert time.monotonic() - started < OLD_GROUP_DEADLINE_S  # the broken group's deadline never ran out
        finally:
            group.close()
        assert ring_files() == []
    finally:
        victim.stop()


@pytest.mark.parametrize("transport", ["auto", "broadcast"])
def test_group_formation_survives_an_engine_killed_while_joining(
    engines, tiny_model_dir, fork_server, tensors_b, ck_b, tmp_path, caplog, transport
):
    """SIGKILL as an engine is asked to join (issue 20): `connect` drops it, forms the group with the
    survivors (a new name: their join of the broken rendezvous may still be pending) before the broken
    rendezvous' deadline, and the survivors get a whole push."""
    victim = actor(tiny_model_dir, tmp_path, rank=9, fork_server=fork_server)
    try:
        victim.start()
        members = [Watched(engines[0]), Watched(victim, die_at=0), Watched(engines[1])]
        # a name per case: the survivors hold the broken rendezvous of their name until its deadline
        group = WeightUpdateGroup(
            members, group_name=f"g-join-{transport}", timeout=OLD_GROUP_DEADLINE_S, transport=transport
        )
        started = time.monotonic()
        try:
            with caplog.at_level("WARNING", logger="slime.engine"):
                group.connect()
            assert group.died == [(members[1], f"forming weight-update group 'g-join-{transport}'")]
            assert (
                f"engine 9 died during forming weight-update group 'g-join-{transport}' (engine 9: exited with code "
                "-9); going on with the 2 surviving engine(s)" in caplog.messages
            )
            assert group.engines == [members[0], members[2]] and group.group_name == f"g-join-{transport}-1"
            assert group.transport == ("shm_ring" if transport == "auto" else "broadcast")
            with paused(group.engines):
                answers = group.push(tensors_b, weight_version="j1", bucket_bytes=1 << 20)
            assert [a["weight_version"] for a in answers] == ["j1", "j1"]
            assert [e.check_weights("compare", checksums=ck_b)["equal"] for e in engines] == [True, True]
            assert time.monotonic() - started < OLD_GROUP_DEADLINE_S  # the broken rendezvous never ran out
        finally:
            group.close()
        assert ring_files() == []
    finally:
        victim.stop()


def test_pause_and_continue_skip_a_dead_engine(engines, tiny_model_dir, fork_server, tmp_path):
    victim = actor(tiny_model_dir, tmp_path, rank=8, fork_server=fork_server)
    try:
        victim.start()
        members = [Watched(engines[0]), Watched(victim)]
        with paused(members):
            victim.kill()
        assert members[1].exited.result(timeout=60) is not None
        assert load(engines[0].url())["paused"] is False  # the live engine was continued
    finally:
        victim.stop()


def test_a_shared_engine_found_dead_is_replaced(cluster, engines, refs):
    """The package's engines outlive a test that lost one: the next test gets a fresh engine (and a
    warning naming the death) instead of erroring at set-up."""
    shared = cluster[0]
    dead = engines[1]
    dead.kill()
    with pytest.warns(UserWarning, match=r"shared engine 1 died \(exit code -9\) before this test; replaced"):
        now = shared.alive()
    assert now[0] is engines[0] and now[1] is not dead and now[1].alive()
    assert now[1].pid() != dead.pid() and now[1].rank == 1
    assert_serves(now[1].url(), refs["A"], now[1].get_weight_version(), prompts=(0,))  # model A, as started
    assert shared.alive() == now  # nothing else to replace


def test_an_engine_killed_by_a_fatal_signal_says_so_in_its_log(tiny_model_dir, fork_server, tmp_path):
    """An engine dying of a fatal signal (a crash in native code) leaves the signal and every thread's
    Python stack in its log, not a log that just stops."""
    import os
    import signal

    engine = actor(tiny_model_dir, tmp_path, rank=6, fork_server=fork_server)
    try:
        engine.start()
        os.kill(engine.pid(), signal.SIGSEGV)
        assert engine.server.process.proc.wait(timeout=60) == -signal.SIGSEGV
        log = engine.server.process.log_path.read_text()
        assert "Fatal Python error: Segmentation fault" in log and "Thread 0x" in log
    finally:
        engine.stop()
