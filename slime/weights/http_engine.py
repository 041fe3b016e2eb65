"""slime's engine weight API over plain HTTP (`HttpEngine`): one engine server, no Ray needed."""

from __future__ import annotations

import concurrent.futures as cf
from typing import Any

import requests
import torch

from slime.weights.engine_deaths import EngineAnswered
from slime.weights.transfer import dtype_name
from slime.weights.version_answer import parse_weight_version_answer


class HttpEngine:
    """slime's engine weight API over HTTP against one engine server (no Ray needed)."""

    exited: cf.Future | None = None  # a plain HTTP server gives no exit notice

    def __init__(self, url: str, timeout: float = 600.0):
        self.url, self.timeout = url.rstrip("/"), timeout

    def __repr__(self) -> str:
        return f"HttpEngine({self.url})"

    def _post(self, path: str, body: dict, timeout: float | None = None) -> dict:
        r = requests.post(f"{self.url}{path}", json=body, timeout=timeout or self.timeout)
        try:
            answer = r.json()
        except ValueError:
            answer = {"message": r.text}
        if r.status_code >= 400:
            msg = answer.get("message") or (answer.get("error") or {}).get("message") or r.text
            raise EngineAnswered(f"{self.url}{path}: HTTP {r.status_code}: {msg}")
        return answer

    def update_weights_from_tensor(
        self, serialized_named_tensors, load_format=None, flush_cache=False, weight_version=None
    ) -> dict:
        return self._post(
            "/update_weights_from_tensor",
            {
                "serialized_named_tensors": serialized_named_tensors,
                "load_format": load_format,
                "flush_cache": flush_cache,
                "weight_version": weight_version,
            },
        )

    def init_weights_update_group(
        self,
        master_address,
        master_port,
        rank_offset,
        world_size,
        group_name,
        backend,
        timeout: float | None = None,
        weight_transport: str | None = None,
    ) -> dict:
        body = {
            "master_address": master_address,
            "master_port": master_port,
            "rank_offset": rank_offset,
            "world_size": world_size,
            "group_name": group_name,
            "backend": backend,
        }
        if timeout is not None:
            body["timeout"] = timeout
        if weight_transport is not None:
            body["weight_transport"] = weight_transport
        return self._post("/init_weights_update_group", body, timeout=(timeout or self.timeout) + 30)

    def update_weights_from_distributed(
        self, names, dtypes, shapes, group_name, flush_cache=False, weight_version=None, load_format=None
    ) -> dict:
        return self._post(
            "/update_weights_from_distributed",
            {
                "names": names,
                "dtypes": [dtype_name(d) if isinstance(d, torch.dtype) else d for d in dtypes],
                "shapes": [list(s) for s in shapes],
                "group_name": group_name,
                "flush_cache": flush_cache,
                "weight_version": weight_version,
                "load_format": load_format,
            },
        )

    def destroy_weights_update_group(self, group_name) -> dict:
        return self._post("/destroy_weights_update_group", {"group_name": group_name})

    def pause_generation(self, mode: str | None = None) -> dict:
        return self._post("/pause_generation", {} if mode is None else {"mode": mode})

    def continue_generation(self) -> dict:
        return self._post("/continue_generation", {})

    def check_weights(self, action: str, checksums: dict[str, str] | None = None) -> dict:
        """The checker's answer; a compare that finds differences is an answer too (`equal` false)."""
        body: dict[str, Any] = {"action": action}
        if checksums is not None:
            body["checksums"] = checksums
        r = requests.post(f"{self.url}/weights_checker", json=body, timeout=self.timeout)
        answer = r.json()
        if r.status_code >= 400 and "equal" not in answer:
            raise EngineAnswered(f"{self.url}/weights_checker: HTTP {r.status_code}: {answer.get('message')}")
        return answer

    def get_weight_version(self) -> str:
        r = requests.get(f"{self.url}/get_weight_version", timeout=self.timeout)
        r.raise_for_status()
        return parse_weight_version_answer(r.content, self.url)
