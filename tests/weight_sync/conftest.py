"""Fixtures of the weight-sync tests, shared by the files of this package (set up once for them when
they run one after the other): a fork server, two engines serving model A and what an engine serving
model B answers, the trainer's tensors of both models and their checksums."""

from __future__ import annotations

import contextlib
import warnings

import pytest

from slime.weights.push import trainer_named_tensors
from slime.weights.transfer import named_checksums
from slime.fleet.engine_actor import EngineActor
from tests.weight_sync.helpers import PROMPTS, actor, all_of, gen, hf_model, kind


@pytest.fixture(scope="package")
def fork_server(engine_fork_server):
    """The session's engine fork server (tests/conftest.py, model A preloaded): engines start warm, so a test
    that needs a fresh engine (one it kills) does not pay torch's import and the model load, and the package
    starts no fork server of its own (the one the other files use serves here too)."""
    return engine_fork_server


@pytest.fixture(scope="package")
def model_b_dir(tiny_model_b_dir):
    return tiny_model_b_dir


class SharedEngines:
    """The package's two engines serving A (ranks 0 and 1), started from the fork server. One found dead
    before a test is replaced by a fresh one (with a warning naming its exit code), so a test that lost
    it fails alone instead of every test after it erroring at set-up."""

    def __init__(self, model_dir, logs, fork_server: str):
        self.model_dir, self.logs, self.fork_server = model_dir, logs, fork_server
        self.engines: list[EngineActor] = []

    def start(self) -> None:
        for rank in range(2):
            self.engines.append(self._started(rank))

    def _started(self, rank: int) -> EngineActor:
        engine = actor(self.model_dir, self.logs, rank, self.fork_server)
        engine.start()
        return engine

    def alive(self) -> list[EngineActor]:
        for rank, engine in enumerate(self.engines):
            if not engine.alive():
                code = engine.server.process.proc.returncode
                warnings.warn(
                    f"shared engine {rank} died (exit code {code}) before this test; replaced by a "
                    f"fresh one (its log: {engine.server.process.log_path})",
                    stacklevel=1,
                )
                engine.stop()
                self.engines[rank] = self._started(rank)
        return list(self.engines)

    def stop(self) -> None:
        for engine in self.engines:
            engine.stop()


@pytest.fixture(scope="package")
def cluster(tiny_model_dir, model_b_dir, tmp_path_factory, fork_server):
    """Two engines serving A (`SharedEngines`), plus what an engine serving B answers (then stopped)."""
    logs = tmp_path_factory.mktemp("engine-logs")
    shared = SharedEngines(tiny_model_dir, logs, fork_server)
    b = actor(model_b_dir, logs, 2, fork_server)
    with contextlib.ExitStack() as stack:
        stack.callback(shared.stop)
        stack.callback(b.stop)
        shared.start()  # from this thread: engines die with the thread that started them (PR_SET_PDEATHSIG)
        b.start()
        a1 = shared.engines[0]
        # concurrent requests are answered exactly as solo ones (tests/test_hf_engine.py)
        answers = all_of(
            lambda job: gen(job[0].url(), PROMPTS[job[1]], **kind(job[1])),
            [(x, i) for x in (a1, b) for i in range(len(PROMPTS))],
        )
        b.stop()
        yield shared, {"A": answers[: len(PROMPTS)], "B": answers[len(PROMPTS) :]}


@pytest.fixture
def engines(cluster) -> list[EngineActor]:
    """The two shared engines, both alive (a dead one replaced)."""
    return cluster[0].alive()


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
