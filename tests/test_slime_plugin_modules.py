"""slime's module paths for plugin authors: `slime.observability.trace_utils` (spans on the sample,
nested per sample, through tasks), `slime.rollout.sleep_rollout`, `slime.observability.rollout_metrics`,
`slime.backends.sglang_utils.server_control`."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slime.backends.sglang_utils.server_control import num_requests_from_load
from slime.observability.rollout_metrics import compute_metrics_from_samples, compute_perf_metrics_from_samples
from slime.observability.trace_utils import (
    build_sglang_meta_trace_attrs,
    export_trace,
    import_trace,
    trace_event,
    trace_function,
    trace_next_attempt,
    trace_span,
)
from slime.rollout.sleep_rollout import sleep
from slime.utils.types import Sample


def spans(sample: Sample) -> dict[str, dict]:
    """name -> {start, end} events of the sample's trace."""
    out: dict[str, dict] = {}
    for e in sample.trace["events"]:
        if e["type"] in ("span_start", "span_end"):
            out.setdefault(e["name"], {})[e["type"]] = e
    return out


def test_spans_nest_per_sample_across_tasks_and_record_errors():
    a, b = Sample(index=0, group_index=0), Sample(index=1, group_index=0)

    @trace_function("call_engine")
    async def call(sample: Sample) -> None:
        await asyncio.sleep(0)
        trace_event(sample, "tick", attrs={"i": sample.index})

    async def one(sample: Sample) -> None:
        with trace_span(sample, "generate", attrs={"max_new_tokens": 8}) as span:
            await call(sample)
            span.update(build_sglang_meta_trace_attrs({"completion_tokens": 3, "finish_reason": {"type": "stop"}}))

    async def main() -> None:
        with trace_span([a, b], "group"):
            await asyncio.gather(one(a), one(b))

    asyncio.run(main())
    for s in (a, b):
        sp = spans(s)
        group, gen, call_span = sp["group"]["span_start"], sp["generate"]["span_start"], sp["call_engine"]["span_start"]
        assert "parent_span_id" not in group and gen["parent_span_id"] == group["span_id"]
        assert call_span["parent_span_id"] == gen["span_id"]
        tick = next(e for e in s.trace["events"] if e["name"] == "tick")
        assert tick["parent_span_id"] == call_span["span_id"] and tick["attrs"] == {"i": s.index}
        assert sp["generate"]["span_end"]["attrs"] == {"completion_tokens": 3, "finish_reason": "stop"}
        assert {e["sample_id"] for e in s.trace["events"]} == {s.index}
    assert a.trace["trace_id"] != b.trace["trace_id"]

    c = Sample(index=2)
    with pytest.raises(ValueError):
        with trace_span(c, "reward"):
            raise ValueError("bad label")
    assert spans(c)["reward"]["span_end"]["attrs"] == {"error_type": "ValueError", "error_message": "bad label"}
    trace_next_attempt(c)
    assert c.trace["attempt"] == 1 and c.trace["events"][-1]["name"] == "attempt_start"


def test_a_trace_continues_in_another_carrier_under_the_current_span():
    s = Sample(index=5)
    with trace_span(s, "outer") as span:
        payload = export_trace(span.target)
    remote = import_trace(payload)
    with trace_span(remote, "remote_work"):
        pass
    start = next(e for e in remote.carrier["events"] if e["type"] == "span_start")
    assert start["parent_span_id"] == spans(s)["outer"]["span_start"]["span_id"]
    assert remote.trace_id == s.trace["trace_id"]


def test_untraceable_targets_run_untraced():
    @trace_function("f")
    def f(x: int) -> int:
        return x + 1

    assert f(1) == 2
    with trace_span(None, "nothing") as target:
        assert target is None


def test_sleep_rollout_waits_until_stopped():
    stop = threading.Event()
    t = threading.Thread(target=sleep, args=(None, 0, None), kwargs={"stop": stop})
    t.start()
    assert t.is_alive()
    stop.set()
    t.join(60)
    assert not t.is_alive()


def test_rollout_metrics_use_slimes_keys():
    samples = [Sample(response_length=4, status=Sample.Status.TRUNCATED), Sample(response_length=2)]
    m = compute_metrics_from_samples(SimpleNamespace(), samples)
    assert m["response_len/mean"] == 3.0 and m["truncated_ratio"] == 0.5
    p = compute_perf_metrics_from_samples(SimpleNamespace(rollout_num_gpus=2), samples, 2.0)
    assert p == {
        "rollout_time": 2.0,
        "tokens_per_gpu_per_sec": 1.5,
        "longest_sample_tokens_per_sec": 2.0,
        "effective_tokens_per_gpu_per_sec": 1.5,
        "longest_effective_sample_tokens_per_sec": 2.0,
    }


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 9), st.integers(0, 9)), max_size=4))
def test_load_answers_count_running_and_waiting(pairs):
    loads = [{"num_running_reqs": r, "num_waiting_reqs": w} for r, w in pairs]
    assert num_requests_from_load({"loads": loads}) == sum(r + w for r, w in pairs)
    assert num_requests_from_load(loads[0] if loads else {}) == (sum(pairs[0]) if pairs else 0)
