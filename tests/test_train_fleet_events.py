"""slime-train's per-rollout line and record carry what the fleet went through during the rollout, with the
fields slime-rollout's line shows (issue 24): engine deaths and restarts, the nodes lost and where their
engines and the router went. The counts come from the manager's summary of that rollout, never another's."""

from __future__ import annotations

from slime.cli.rollout import _format_summary
from slime.observability.node_losses import describe_lost_node
from slime.train.fleet_events import describe_fleet_events, fleet_events
from slime.train.loop import TrainRecord

LOST = describe_lost_node(
    {"node_id": "a1" * 28, "engines": [0, 1], "router_moved_to": "c3" * 28, "moved_to": {0: "b2" * 28, 1: None}}
)


def _summary(rollout_id: int, **fleet) -> dict:
    return {
        "rollout_id": rollout_id,
        "samples": 4,
        "mean_reward": 0.5,
        "truncated_ratio": 0.0,
        "failed": 0,
        "tokens_per_s": 10.0,
        "seconds": 1.0,
        "engine_retries": 3,
        **fleet,
    }


def _record(fleet: dict) -> TrainRecord:
    return TrainRecord(
        rollout_id=2,
        weight_version="2",
        raw_reward=0.5,
        steps=[],
        rollout={},
        sample_weight_versions=["2"],
        rollout_time=1.0,
        train_time=2.0,
        update_weights_time=0.5,
        pushed_version="3",
        fleet=fleet,
    )


def test_a_rollout_that_lost_a_node_ends_slime_trains_line_as_slime_rollouts():
    summary = _summary(
        2,
        engine_deaths=2,
        engine_restarts=2,
        nodes_lost=1,
        engines_moved=1,
        engines_unplaced=1,
        router_moves=1,
        lost_nodes=[LOST],
    )
    events = fleet_events(summary, 2)
    assert events == {
        "engine_deaths": 2,
        "engine_restarts": 2,
        "nodes_lost": 1,
        "engines_moved": 1,
        "engines_unplaced": 1,
        "router_moves": 1,
        "lost_nodes": [LOST],
    }
    tail = (
        " engine_deaths=2 engine_restarts=2 nodes_lost=1 (node a1a1a1a1: engine 0 -> node b2b2b2b2, "
        "engine 1 -> waiting for room; router -> node c3c3c3c3)"
    )
    assert describe_fleet_events(events) == tail
    assert _format_summary(summary).endswith(tail)  # the same words as slime-rollout's line
    line = _record(events).line()
    assert line.startswith("rollout 2: reward=0.5000 ") and line.endswith(f"version=2{tail}"), line


def test_a_quiet_rollout_adds_nothing_and_another_rollouts_summary_is_not_taken():
    quiet = fleet_events(_summary(2, engine_deaths=0, nodes_lost=0), 2)
    assert quiet == {
        "engine_deaths": 0,
        "engine_restarts": 0,
        "nodes_lost": 0,
        "engines_moved": 0,
        "engines_unplaced": 0,
        "router_moves": 0,
        "lost_nodes": [],
    }
    assert describe_fleet_events(quiet) == ""
    assert _record(quiet).line().endswith("update_weights=0.5s version=2")
    assert fleet_events(_summary(3, nodes_lost=1, lost_nodes=[LOST]), 2) == {}  # the next rollout's (--async)
    assert fleet_events(None, 2) == {}
    assert _record({}).line() == _record(quiet).line()
