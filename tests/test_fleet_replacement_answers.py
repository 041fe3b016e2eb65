"""A replacement engine (after an engine death) that answers `/get_weight_version` badly: the fleet
treats it as that engine's fault, counts it (`engine_bad_answer:<field>`), never takes a version from
it, so the replacement waits out of the router (`awaiting_weights`) while the run goes on with the
survivor; the next push (from disk) reaches it and only then does it serve.

The fleet is the real one (its placement group, router, supervision and replacement path) with
engines that are scripted engine processes behind the fleet's own actor class; the replacement's
server answers its version with `BAD_VERSION_BODY`."""

from __future__ import annotations

import argparse
import logging
import pickle
import sys
import threading

import requests

from slime.weights.version_answer import BadWeightVersion
from slime.fleet.engine_server import EngineServer, engine_env
from slime.fleet.flags import FleetConfig
from slime.fleet.fleet import Fleet, SupervisedEngineActor
from slime.fleet.placement import bundle_strategy
from slime.fleet.supervised_engine import ENGINE_CONCURRENCY_GROUPS
from slime.utils.misc import find_free_port

BAD_VERSION_BODY = "<html>502 Bad Gateway</html>"
SAMPLED = [5, 6, 7]


class ScriptedFleetEngine(SupervisedEngineActor):
    """The fleet's own engine actor (watch, pushes, checked weight version) over a scripted engine
    process; `version_body`: what that process answers on `/get_weight_version` (None: SGLang's shape)."""

    def __init__(self, args, rank: int, version_body: str | None = None):
        super().__init__(args, rank)  # builds, without starting, an embedded engine's server: replaced here
        port = find_free_port()
        cmd = [sys.executable, "-m", __name__, "--port", str(port), "--model-path", str(args.hf_checkpoint)]
        if version_body is not None:
            cmd += ["--version-body", version_body]
        self.server = EngineServer(
            cmd, "127.0.0.1", port, f"engine-scripted-{rank}", args.log_dir, engine_env(), startup_timeout=120.0
        )


def serve(argv: list[str] | None = None) -> None:
    """The engine process: a scripted engine sampling `SAMPLED`, its version answer replaced if asked."""
    import uvicorn
    from fastapi.responses import Response

    from slime.testing.scripted_engine import build_app

    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model-path", required=True)
    p.add_argument("--version-body")
    a = p.parse_args(argv)
    app = build_app(lambda body: {"output_ids": SAMPLED, "finish_type": "stop", "text": ""}, a.model_path)
    if a.version_body is not None:
        app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", None) != "/get_weight_version"]
        app.add_api_route("/get_weight_version", lambda: Response(a.version_body, media_type="application/json"))
    uvicorn.run(app, host="127.0.0.1", port=a.port, log_level="warning", access_log=False)


def test_a_bad_version_answer_crosses_a_process_boundary_whole():
    """Raised in the engine's actor, judged by the fleet: pickled by Ray on the way."""
    raised = BadWeightVersion("weight_version", "a int, not a string", 3, "http://127.0.0.1:9")
    seen = pickle.loads(pickle.dumps(raised))
    assert (type(seen), str(seen), seen.field, seen.reason) == (
        BadWeightVersion,
        "http://127.0.0.1:9: bad /get_weight_version answer (weight_version): a int, not a string: 3",
        "weight_version",
        "engine_bad_answer:weight_version",
    )


def test_a_replacement_answering_a_bad_weight_version_is_counted_kept_out_and_the_run_goes_on(
    ray_cluster, tiny_model_dir, tmp_path, monkeypatch, caplog
):
    from slime.cli.args import parse_args

    ray = ray_cluster
    args = parse_args(
        [
            "--rollout-backend",
            "hf",
            "--hf-checkpoint",
            str(tiny_model_dir),
            "--rollout-num-engines",
            "2",
            "--rollout-num-cpus-per-engine",
            "0.5",
            "--engine-max-restarts",
            "2",
            "--log-dir",
            str(tmp_path),
        ]
    )
    remote = ray.remote(concurrency_groups=ENGINE_CONCURRENCY_GROUPS)(ScriptedFleetEngine)
    fleet = Fleet(FleetConfig.from_args(args))
    created = []

    def new_actor(rank, bundle, *rest):  # the first two boot well; the replacement answers badly
        created.append(
            remote.options(num_cpus=0.5, scheduling_strategy=bundle_strategy(fleet.pg, bundle)).remote(
                args, rank, BAD_VERSION_BODY if len(created) >= 2 else None
            )
        )
        return created[-1]

    awaiting = threading.Event()
    await_weights = fleet.weight_gate.await_push

    waiters = []  # the thread that waits for the replacement's weights (it may end as soon as they come)

    def noted_await_weights(*a):
        waiters.append(threading.current_thread())
        awaiting.set()
        await_weights(*a)

    monkeypatch.setattr(fleet, "new_actor", new_actor)
    monkeypatch.setattr(fleet.weight_gate, "await_push", noted_await_weights)
    try:
        fleet.start()
        survivor = fleet.slots[1].url
        assert fleet.weight_version == "default" and not fleet.info()["engine_bad_answers"]
        with caplog.at_level(logging.WARNING, logger="slime.fleet"):
            fleet.kill_engine(0)
            assert awaiting.wait(300), "the replacement was never left waiting for weights"

        replacement = fleet.slots[0]
        assert (replacement.state, replacement.restarts, replacement.deaths) == ("awaiting_weights", 1, 1)
        assert replacement.actor is created[2] and replacement.url != survivor
        assert fleet.info()["engine_bad_answers"] == {"engine_bad_answer:body": 1}
        assert any(
            f"engine 0: {replacement.url}: bad /get_weight_version answer (body): not JSON (JSONDecodeError): "
            f"{BAD_VERSION_BODY}; its weight version is not trusted" in r.getMessage()
            for r in caplog.records
        )
        # never trusted: neither published nor in the router; the run goes on with the survivor
        assert fleet.endpoints.engine_urls == [survivor]
        assert [w.url for w in fleet.router.list_workers()] == [survivor]
        for _ in range(3):
            out = requests.post(
                f"{fleet.router.url}/generate",
                json={"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 3}, "return_logprob": True},
                timeout=60,
            ).json()
            assert out["output_ids"] == SAMPLED

        # a push reaches it (an engine awaiting weights is updatable): then, and only then, it serves
        fleet.each("update_weights_from_disk", str(tiny_model_dir), "1")
        [waiter] = waiters  # (found by name after the push, it was sometimes already gone)
        assert waiter.name == "engine-weights-0"
        waiter.join(120)
        assert replacement.state == "healthy" and not waiter.is_alive()
        assert sorted(fleet.endpoints.engine_urls) == sorted([survivor, replacement.url])
        assert fleet.info()["engine_bad_answers"] == {"engine_bad_answer:body": 1}  # counted once, not re-asked
    finally:
        for _, step in fleet.stop_steps():
            step()


if __name__ == "__main__":
    serve()
