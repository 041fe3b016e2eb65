"""Fixtures of the weight-sync tests, shared by the files of this package (set up once for them when
they run one after the other): a fork server, two engines serving model A and what an engine serving
model B answers, the trainer's tensors of both models and their checksums."""

from __future__ import annotations

import contextlib
import json
import os

import pytest

from slime.engine.weight_sync import trainer_named_tensors
from slime.engine.weight_transfer import named_checksums
from slime.fleet.engine_actor import EngineActor
from tests.weight_sync.helpers import PROMPTS, actor, all_of, gen, hf_model, kind


@pytest.fixture(scope="package")
def fork_server(tiny_model_dir, tmp_path_factory):
    """The package's engine fork server (slime.engine.warm_start, model A preloaded): engines start warm,
    so a test that needs a fresh engine (one it kills) does not pay torch's import and the model load."""
    import sys
    import tempfile
    from pathlib import Path

    from slime.utils.child_process import ChildProcess

    where = Path(tempfile.mkdtemp(prefix="slime-ws-fork-"))  # short: a Unix socket path has ~107 bytes
    sock = where / "engines.sock"
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    server = ChildProcess([sys.executable, "-m", "slime.utils.fork_server", "--socket", str(sock), "--main",
                           "slime.engine.warm_start:serve", "--preload", "slime.engine.warm_start:preload",
                           "--preload-json", json.dumps([str(tiny_model_dir)])],
                          name="test engine fork server", log_path=tmp_path_factory.mktemp("fork") / "server.log",
                          env=env, ready=sock.exists, startup_timeout=120).start()
    yield str(sock)
    server.kill()


@pytest.fixture(scope="package")
def model_b_dir(tmp_path_factory):
    from slime.testing.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-b"), seed=1)


@pytest.fixture(scope="package")
def cluster(tiny_model_dir, model_b_dir, tmp_path_factory, fork_server):
    """Two engines serving A, plus what an engine serving B answers (then stopped)."""
    logs = tmp_path_factory.mktemp("engine-logs")
    a1, a2, b = actors = [actor(tiny_model_dir, logs, 0, fork_server), actor(tiny_model_dir, logs, 1, fork_server),
                          actor(model_b_dir, logs, 2, fork_server)]
    with contextlib.ExitStack() as stack:
        for x in actors:
            stack.callback(x.stop)
        for x in actors:  # from this thread: engines die with the thread that started them (PR_SET_PDEATHSIG)
            x.start()
        # concurrent requests are answered exactly as solo ones (tests/test_hf_engine.py)
        answers = all_of(lambda job: gen(job[0].url(), PROMPTS[job[1]], **kind(job[1])),
                         [(x, i) for x in (a1, b) for i in range(len(PROMPTS))])
        b.stop()
        yield [a1, a2], {"A": answers[:len(PROMPTS)], "B": answers[len(PROMPTS):]}


@pytest.fixture(scope="package")
def engines(cluster) -> list[EngineActor]:
    return cluster[0]


@pytest.fixture(scope="package")
def refs(cluster) -> dict[str, list[dict]]:
    return cluster[1]


@pytest.fixture(scope="package")
def tensors_b(model_b_dir):
    return trainer_named_tensors(hf_model(model_b_dir))


@pytest.fixture(scope="package")
def tensors_a(tiny_model_dir):
    return trainer_named_tensors(hf_model(tiny_model_dir))


@pytest.fixture(scope="package")
def ck_a(tensors_a):
    return named_checksums(tensors_a)


@pytest.fixture(scope="package")
def ck_b(tensors_b):
    return named_checksums(tensors_b)


@pytest.fixture(autouse=True)
def base_weights(engines, tiny_model_dir, refs):
    """Every test starts with both engines serving A as version "base", running, with no snapshot left over."""
    for e in engines:
        e.continue_generation()
        e.update_weights_from_disk(str(tiny_model_dir), "base")
        assert e.get_weight_version() == "base"
    yield
