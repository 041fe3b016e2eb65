"""A Ray actor owning one engine server process on its placement-group bundle."""

from __future__ import annotations

from typing import Any

import ray

from slime.fleet.engine_server import EngineServer, hf_server, sglang_server


class EngineActor:
    def __init__(self, args: Any, rank: int, node_rank: int = 0, nnodes: int = 1,
                 dist_init_addr: str | None = None):
        host = args.engine_host
        if host == "auto":
            host = ray.util.get_node_ip_address()
        self.rank = rank
        if args.rollout_backend == "sglang":
            self.server: EngineServer = sglang_server(args, rank, host, args.log_dir, node_rank=node_rank,
                                                      nnodes=nnodes, dist_init_addr=dist_init_addr)
        else:
            self.server = hf_server(args, rank, host, args.log_dir)

    def rendezvous_address(self) -> str:
        """`host:port` on this node for a multi-node engine's `--dist-init-addr`."""
        from slime.utils.misc import find_free_port

        ip = ray.util.get_node_ip_address()
        return f"{ip}:{find_free_port(ip)}"

    def start(self) -> str:
        return self.server.start()

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
        return self.server.call("POST", "/release_memory_occupation", {"tags": tags} if tags else {})

    def resume_memory_occupation(self, tags: list[str] | None = None) -> Any:
        return self.server.call("POST", "/resume_memory_occupation", {"tags": tags} if tags else {})

    def update_weights_from_disk(self, model_path: str, weight_version: str | None = None) -> Any:
        body = {"model_path": model_path}
        if weight_version is not None:
            body["weight_version"] = weight_version
        return self.server.call("POST", "/update_weights_from_disk", body, timeout=600)

    def abort_all(self) -> Any:
        return self.server.call("POST", "/abort_request", {"abort_all": True})

    def pause_generation(self) -> Any:
        return self.server.call("POST", "/pause_generation", {})

    def continue_generation(self) -> Any:
        return self.server.call("POST", "/continue_generation", {})

    def flush_cache(self) -> Any:
        return self.server.call("POST", "/flush_cache", {})

    def kill(self) -> None:
        self.server.kill()

    def stop(self) -> None:
        self.server.stop()
