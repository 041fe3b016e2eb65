"""A Ray actor owning one engine server process on its placement-group bundle."""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Any

import ray
import requests

from slime.weights.version_answer import parse_weight_version_answer
from slime.fleet import sglang_payloads as payloads
from slime.fleet.engine_server import EngineServer, hf_server, sglang_server
from slime.fleet.flags import EngineConfig

WEIGHT_PUSH_TIMEOUT_S = 600.0  # one bucket of a large model, or a rendezvous, may take minutes on a busy box


class EngineActor:
    def __init__(
        self,
        config: EngineConfig,
        rank: int,
        node_rank: int = 0,
        nnodes: int = 1,
        dist_init_addr: str | None = None,
        fork_server: str | None = None,
    ):
        """`fork_server`: the socket of this node's engine fork server, for an embedded engine to start
        warm (slime.engine.warm_start); None starts it cold."""
        host = config.engine_host
        if host == "auto":
            host = ray.util.get_node_ip_address()
        self.rank = rank
        self.backend = config.rollout_backend
        if config.rollout_backend == "sglang":
            self.server: EngineServer = sglang_server(
                config, rank, host, node_rank=node_rank, nnodes=nnodes, dist_init_addr=dist_init_addr
            )
        else:
            self.server = hf_server(config, rank, host, fork_server=fork_server)
        # completed weight pushes, for the fleet to admit a restarted engine once it has the current weights
        self._pushes = threading.Condition()
        self._push_count = 0
        self._push_open = False  # an update landed since the last pause: the push ends at continue_generation
        self._push_broken = False  # an update of this push failed: its continue_generation completes nothing
        self._pushed_version: str | None = None
        self._die_at_update: int | None = None  # fault injection: SIGKILL the server at this update call

    # ---- weight pushes seen by this actor (see Fleet: a restarted engine serves only the current weights)
    def _update(self, complete: bool, path: str, body: dict, timeout: float) -> Any:
        """One weight update call, recorded: `complete` when the call is a whole push (from disk). A failed
        update spoils the push it belongs to (until the next pause)."""
        try:
            answer = self.server.call("POST", path, body, timeout=timeout)
        except BaseException:
            with self._pushes:
                self._push_open, self._push_broken = False, True
            raise
        version = answer.get("weight_version") if isinstance(answer, dict) else None
        with self._pushes:
            self._pushed_version = None if version is None else str(version)
            self._push_open = not complete and not self._push_broken
            if complete:
                self._push_count += 1
                self._pushes.notify_all()
        return answer

    def _push_done(self) -> None:
        with self._pushes:
            self._push_broken = False
            if self._push_open:
                self._push_open = False
                self._push_count += 1
                self._pushes.notify_all()

    def push_count(self) -> int:
        with self._pushes:
            return self._push_count

    def pushes_after(self, seen: int, timeout: float) -> tuple[int, str | None]:
        """Block until more than `seen` pushes completed (or `timeout` s): (count, version they left)."""
        with self._pushes:
            self._pushes.wait_for(lambda: self._push_count > seen, timeout=timeout)
            return self._push_count, self._pushed_version

    def rendezvous_address(self) -> str:
        """`host:port` on this node for a multi-node engine's `--dist-init-addr`."""
        from slime.utils.misc import find_free_port

        ip = ray.util.get_node_ip_address()
        return f"{ip}:{find_free_port(ip)}"

    def start(self) -> str:
        return self.server.start()

    def node_id(self) -> str:
        """The Ray node this actor lives on (hex id): the fleet tells by it which engines a lost node took."""
        return ray.get_runtime_context().get_node_id()

    def url(self) -> str:
        return self.server.url

    def pid(self) -> int | None:
        return self.server.pid

    def alive(self) -> bool:
        return self.server.alive()

    def health(self) -> bool:
        try:
            self.server.call("GET", "/health", timeout=5)
            return True
        except Exception:  # noqa: BLE001
            return False

    def release_memory_occupation(self, tags: list[str] | None = None) -> Any:
        return self.server.call("POST", "/release_memory_occupation", payloads.release_memory_occupation(tags))

    def resume_memory_occupation(self, tags: list[str] | None = None) -> Any:
        return self.server.call("POST", "/resume_memory_occupation", payloads.resume_memory_occupation(tags))

    def update_weights_from_disk(self, model_path: str, weight_version: str | None = None) -> Any:
        return self._update(
            True,
            "/update_weights_from_disk",
            payloads.update_weights_from_disk(model_path, weight_version=weight_version),
            600,
        )

    def abort_all(self) -> Any:
        return self.server.call("POST", "/abort_request", payloads.abort_request(abort_all=True))

    def pause_generation(self, mode: str | None = None) -> Any:
        """`mode` None = the engine's default (embedded: in_place; SGLang: abort), or in_place/retract/abort.
        Starts a push: an earlier failed update no longer counts against it."""
        with self._pushes:
            self._push_broken = False
        return self.server.call("POST", "/pause_generation", payloads.pause_generation(mode))

    def continue_generation(self) -> Any:
        """Ends a push (slime's order: pause, update in buckets, continue)."""
        answer = self.server.call("POST", "/continue_generation", payloads.continue_generation())
        self._push_done()
        return answer

    def flush_cache(self) -> Any:
        return self.server.call("POST", "/flush_cache", payloads.flush_cache())

    # ---- weight sync: slime's SGLangEngine names and payloads; the same bodies reach SGLang or the embedded engine
    def get_weight_version(self) -> str:
        """The engine's version, from an answer checked against SGLang's shape (BadWeightVersion if not)."""
        answer = self.server.call("GET", "/get_weight_version", timeout=30)
        return parse_weight_version_answer(answer, self.server.url)

    def update_weights_from_tensor(
        self,
        serialized_named_tensors: list[str],
        load_format: str | None = None,
        flush_cache: bool = False,
        weight_version: str | None = None,
    ) -> Any:
        body = payloads.update_weights_from_tensor(
            serialized_named_tensors,
            load_format=load_format,
            flush_cache=flush_cache,
            weight_version=None if weight_version is None else str(weight_version),
        )
        return self._update(False, "/update_weights_from_tensor", body, WEIGHT_PUSH_TIMEOUT_S)

    def init_weights_update_group(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str,
        backend: str,
        timeout: float | None = None,
        weight_transport: str | None = None,
    ) -> Any:
        """Join the trainer's group; `backend` is passed through (SGLang: nccl; embedded engine: gloo only).
        Embedded engine only (SGLang's request has no such fields, its answer then says nothing of the
        transport and the trainer broadcasts): `timeout` (seconds) bounds the rendezvous;
        `weight_transport` "auto" maps the trainer's shared-memory ring when on its host."""
        body = payloads.init_weights_update_group(
            master_address, master_port, rank_offset, world_size, group_name, backend
        )
        if self.backend != "sglang":
            if timeout is not None:
                body["timeout"] = timeout
            if weight_transport is not None:
                body["weight_transport"] = weight_transport
        return self.server.call(
            "POST", "/init_weights_update_group", body, timeout=(timeout or WEIGHT_PUSH_TIMEOUT_S) + 30
        )

    def load_kept_weights(self, kept: list[Any], weight_version: str) -> str | None:
        """Load the trainer's last push, kept in Ray's object store (`kept`: [the ref of its named
        tensors], nested so this actor fetches it, not the caller), as a push by shared memory on this
        host; the version the engine then reports. A replacement serves the current weights at once
        instead of waiting for a push that comes only after the rollout it is needed for
        (slime.fleet.awaiting_weights)."""
        from slime.weights.group import DEFAULT_BUCKET_BYTES
        from slime.weights.transfer import bucket_named_tensors, serialize_named_tensors

        if self.backend == "sglang":  # SGLang's tensor path takes its own serialiser's payloads
            raise NotImplementedError("kept weights are loaded into embedded engines only")
        named = ray.get(kept[0], timeout=WEIGHT_PUSH_TIMEOUT_S)
        for bucket in bucket_named_tensors(named, DEFAULT_BUCKET_BYTES):
            with serialize_named_tensors(bucket, transport="shm") as payload:
                self.update_weights_from_tensor([payload.serialized], weight_version=weight_version)
        self._push_done()
        return self.get_weight_version()

    def die_during_push(self, at_update: int) -> None:
        """Fault injection for tests and chaos runs: SIGKILL this engine's server when the `at_update`-th
        bucket of the coming distributed pushes (1 = the first) is announced to it."""
        self._die_at_update = at_update

    def update_weights_from_distributed(
        self,
        names: list[str],
        dtypes: list[Any],
        shapes: list[list[int]],
        group_name: str,
        flush_cache: bool = False,
        weight_version: str | None = None,
        load_format: str | None = None,
    ) -> Any:
        if self._die_at_update is not None:
            self._die_at_update -= 1
            if self._die_at_update == 0:
                self.server.kill()
        body = payloads.update_weights_from_distributed(
            names,
            dtypes,
            shapes,
            group_name,
            flush_cache=flush_cache,
            load_format=load_format,
            weight_version=None if weight_version is None else str(weight_version),
        )
        return self._update(False, "/update_weights_from_distributed", body, WEIGHT_PUSH_TIMEOUT_S)

    def destroy_weights_update_group(self, group_name: str) -> Any:
        """Like slime: an engine that never had the group (e.g. just restarted) is not an error."""
        try:
            return self.server.call(
                "POST", "/destroy_weights_update_group", payloads.destroy_weights_update_group(group_name)
            )
        except requests.RequestException as exc:
            return {"success": False, "message": str(exc)}

    def check_weights(self, action: str, checksums: dict[str, str] | None = None) -> dict:
        """snapshot | compare (against the snapshot, or `checksums` {name: sha256}) | reset_tensors ...
        A compare that finds differences answers `{"success": False, "equal": False, "tensors": {...}}`
        (HTTP 400, as SGLang) instead of raising, so the caller sees which tensors differ."""
        body: dict[str, Any] = (
            payloads.check_weights(action) if action in payloads.CHECK_WEIGHTS_ACTIONS else {"action": action}
        )  # the embedded engine's extra actions (compare_checksum, checksum, ...)
        if checksums is not None:  # embedded engine only: the trainer's checksums to compare against
            body["checksums"] = checksums
        answer = self.server.call(
            "POST", "/weights_checker", body, timeout=WEIGHT_PUSH_TIMEOUT_S, answer_statuses=(400,)
        )
        if isinstance(answer, dict) and not answer.get("success", False) and "equal" not in answer:
            raise RuntimeError(f"check_weights({action!r}) on {self.server.url}: {answer.get('message', answer)}")
        return answer

    def kill(self) -> None:
        self.server.kill()

    def stop(self) -> None:
        self.server.stop()


class RemoteEngine:
    """An `EngineActor` handle with blocking methods, for slime.weights.push (which calls engines in threads):
    `WeightUpdateGroup([RemoteEngine(a) for a in actors])`. `exited`: the engine's exit notice (a future
    done when its process is gone; slime.fleet.supervised_engine.exit_notice), so a push notices its death at once;
    `label` names it in messages (e.g. "engine 1 at http://...")."""

    def __init__(
        self,
        actor: Any,
        timeout: float = WEIGHT_PUSH_TIMEOUT_S + 60,
        *,
        exited: concurrent.futures.Future | None = None,
        label: str | None = None,
    ):
        self.actor, self.timeout, self.exited, self.label = actor, timeout, exited, label

    def __repr__(self) -> str:
        return self.label or f"RemoteEngine({self.actor})"

    def __getattr__(self, name: str):
        method = getattr(self.actor, name)
        return lambda *args, **kwargs: ray.get(method.remote(*args, **kwargs), timeout=self.timeout)
