"""Read-only endpoints: `/health`, `/server_info`, `/model_info`, `/get_load`, `/get_weight_version` and
`/metrics` (Prometheus text, SGLang's metric names plus a few `slime_hf:` ones), shaped as SGLang's so
the sglang-router and slime read them unchanged."""

from __future__ import annotations

import time

from starlette.responses import PlainTextResponse, Response

from slime.engine.batcher import HFBatcher

BACKEND = "slime-hf"


class StatusRoutes:
    def __init__(self, batcher: HFBatcher):
        self.batcher = batcher
        self.started = time.time()

    async def health(self) -> Response:
        return Response(status_code=200)  # like SGLang: up means 200, also while weights are released

    async def get_load(self):
        return self.batcher.load()

    async def get_weight_version(self):
        return {"weight_version": self.batcher.weight_version}

    async def server_info(self):
        b = self.batcher
        return {
            "model_path": b.model_path,
            "tokenizer_path": b.tokenizer_path,
            "served_model_name": b.model_path,
            "backend": BACKEND,
            "version": BACKEND,
            "weight_version": b.weight_version,
            "context_length": b.context_length,
            "max_total_num_tokens": b.context_length * b.max_batch_size,
            "max_running_requests": b.max_batch_size,
            "max_batch_size": b.max_batch_size,
            "tp_size": 1,
            "dp_size": 1,
            "disaggregation_mode": "null",
            "is_generation": True,
            "weights_released": not b.weights_loaded,
            "paused": b.paused,
            "uptime_s": time.time() - self.started,
            "internal_states": [b.load()],
        }

    async def model_info(self):
        b = self.batcher
        cfg = getattr(b.model, "config", None)
        return {
            "model_path": b.model_path,
            "tokenizer_path": b.tokenizer_path,
            "is_generation": True,
            "weight_version": b.weight_version,
            "preferred_sampling_params": None,
            "model_type": getattr(cfg, "model_type", None),
            "architectures": getattr(cfg, "architectures", None),
        }

    async def metrics(self) -> PlainTextResponse:
        return PlainTextResponse(self.metrics_text(), media_type="text/plain; version=0.0.4")

    def metrics_text(self) -> str:
        b, s = self.batcher, self.batcher.stats
        load = b.load()
        label = '{model_name="%s"}' % b.model_path.replace('"', "'")
        rows = [
            ("sglang:num_running_reqs", "gauge", "Requests in the running batch", load["num_running_reqs"]),
            ("sglang:num_queue_reqs", "gauge", "Requests waiting for a batch slot", load["num_waiting_reqs"]),
            ("sglang:num_requests_total", "counter", "Generation requests received", s["requests_total"]),
            ("sglang:num_aborted_requests_total", "counter", "Requests aborted", s["requests_aborted"]),
            ("sglang:prompt_tokens_total", "counter", "Prompt tokens prefilled", s["prompt_tokens_total"]),
            ("sglang:generation_tokens_total", "counter", "Tokens generated", s["generated_tokens_total"]),
            ("slime_hf:decode_steps_total", "counter", "Batched decode steps run", s["decode_steps_total"]),
            ("slime_hf:max_batch_size_seen", "gauge", "Largest decode batch so far", s["max_batch_size_seen"]),
            ("slime_hf:weights_released", "gauge", "1 while weights are released", int(not b.weights_loaded)),
        ]
        out = []
        for name, kind, help_, value in rows:
            out += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name}{label} {value}"]
        return "\n".join(out) + "\n"
