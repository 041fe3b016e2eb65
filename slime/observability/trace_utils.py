"""slime's span API for plugin authors (`slime.observability.trace_utils`): spans and events recorded
on the sample itself, so they travel with it into the rollout dump (`--save-debug-rollout-data`,
`--rollout-data-dir`) and the viewer.

A sample's trace is a plain dict on `sample.trace` (slime's carrier: `version`, `trace_id`,
`sample_id`, `group_id`, `attempt`, `events`). `trace_span(sample, name)` appends a `span_start` and,
when the block ends, a `span_end` event (with the block's `set`/`update` attributes, and the error
when it raised); spans nest per sample through a context variable, so an inner span's
`parent_span_id` is the enclosing span of the same trace, across `await`s and tasks. Tracing never
breaks the traced code: a failure to record is logged at debug level and the block runs as is.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from slime.utils.types import Sample

logger = logging.getLogger(__name__)

TRACE_VERSION = 1
TRACE_CHILDREN_KEY = "_trace_children"  # attrs key: child spans given with start/end offsets
SGLANG_TRACE_META_KEYS = (
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "queue_time",
    "e2e_latency",
    "decode_throughput",
)

# the open spans of this context, innermost last: (trace_id, span_id), and the handles of each span
_OPEN_SPANS: contextvars.ContextVar[tuple[tuple[str, str], ...]] = contextvars.ContextVar(
    "slime_trace_spans", default=()
)
_OPEN_TARGETS: contextvars.ContextVar[tuple[tuple["TraceHandle", ...], ...]] = contextvars.ContextVar(
    "slime_trace_targets", default=()
)

Target = Any  # Sample | TraceHandle | list of them


@dataclass
class TraceHandle:
    """Where a trace's events go (`carrier`, usually `sample.trace`) and whom they describe."""

    trace_id: str
    carrier: dict[str, Any]
    sample_id: int | str | None = None
    group_id: int | str | None = None
    attempt: int = 0
    parent_span_id: str | None = None


@dataclass
class TraceSpanContext:
    """What `with trace_span(...) as span` yields: `span.set(key, value)` / `span.update(attrs)` add
    attributes to the span's end event."""

    target: Any
    handles: list[TraceHandle]
    span_records: list[tuple[TraceHandle, str]] = field(default_factory=list)
    start_ts: float = 0.0
    end_attrs: dict[str, Any] = field(default_factory=dict)
    end_events: list[dict[str, Any]] = field(default_factory=list)
    closed: bool = False

    def set(self, key: str, value: Any) -> "TraceSpanContext":
        return self.update({key: value})

    def update(self, attrs: dict[str, Any] | None) -> "TraceSpanContext":
        attrs = dict(attrs or {})
        children = attrs.pop(TRACE_CHILDREN_KEY, None)
        self.end_attrs.update(attrs)
        for event in self.end_events:  # already closed: the end events take the late attributes too
            event.setdefault("attrs", {}).update(attrs)
        if children:
            _record_children(self.span_records, children, self.start_ts)
        return self

    set_attr = set
    update_attrs = update


def _carrier(
    carrier: dict[str, Any] | None,
    *,
    trace_id: str | None = None,
    sample_id: Any = None,
    group_id: Any = None,
    attempt: int = 0,
) -> dict[str, Any]:
    carrier = {} if carrier is None else carrier
    carrier.setdefault("version", TRACE_VERSION)
    carrier.setdefault("trace_id", trace_id or uuid.uuid4().hex)
    carrier.setdefault("events", [])
    carrier["sample_id"] = sample_id if sample_id is not None else carrier.get("sample_id")
    carrier["group_id"] = group_id if group_id is not None else carrier.get("group_id")
    carrier["attempt"] = int(carrier.get("attempt", attempt))
    return carrier


def _handle(carrier: dict[str, Any], parent_span_id: str | None = None) -> TraceHandle:
    return TraceHandle(
        carrier["trace_id"],
        carrier,
        carrier.get("sample_id"),
        carrier.get("group_id"),
        int(carrier.get("attempt", 0)),
        parent_span_id,
    )


def bind_trace(sample: Sample) -> TraceHandle:
    """The sample's trace handle; the carrier is created on `sample.trace` the first time."""
    sample.trace = _carrier(getattr(sample, "trace", None), sample_id=sample.index, group_id=sample.group_index)
    return _handle(sample.trace)


def bind_trace_carrier(
    carrier: dict[str, Any] | None,
    *,
    trace_id: str | None = None,
    sample_id: Any = None,
    group_id: Any = None,
    attempt: int = 0,
    parent_span_id: str | None = None,
) -> TraceHandle:
    """A handle on a carrier that is not a sample's (another process's, a group's)."""
    return _handle(
        _carrier(carrier, trace_id=trace_id, sample_id=sample_id, group_id=group_id, attempt=attempt), parent_span_id
    )


def export_trace(handle: TraceHandle) -> dict[str, Any]:
    """What another process needs to continue this trace under the current span (`import_trace`)."""
    return {
        "version": TRACE_VERSION,
        "trace_id": handle.trace_id,
        "sample_id": handle.sample_id,
        "group_id": handle.group_id,
        "attempt": handle.attempt,
        "parent_span_id": handle.parent_span_id or _current_span(handle.trace_id),
    }


def import_trace(payload: dict[str, Any], carrier: dict[str, Any] | None = None) -> TraceHandle:
    return bind_trace_carrier(
        carrier,
        trace_id=payload.get("trace_id"),
        sample_id=payload.get("sample_id"),
        group_id=payload.get("group_id"),
        attempt=int(payload.get("attempt", 0)),
        parent_span_id=payload.get("parent_span_id"),
    )


def build_sglang_meta_trace_attrs(meta: dict[str, Any]) -> dict[str, Any]:
    """Span attributes from an SGLang `meta_info`: token counts, latencies, finish reason, request id."""
    attrs = {k: meta[k] for k in SGLANG_TRACE_META_KEYS if meta.get(k) is not None}
    reason = meta.get("finish_reason")
    if reason is not None:
        attrs["finish_reason"] = reason.get("type") if isinstance(reason, dict) else reason
    if meta.get("id") is not None:
        attrs["sglang_request_id"] = meta["id"]
    return attrs


def trace_event(target: Target, name: str, *, attrs: dict[str, Any] | None = None) -> None:
    """A point event on each target's trace, under its current span."""
    try:
        now = time.time()
        for h in _handles(target):
            _append(h, "event", name, now, attrs, parent=h.parent_span_id or _current_span(h.trace_id))
    except Exception as e:  # noqa: BLE001 - tracing never breaks the traced code
        logger.debug("trace event %s not recorded: %s", name, e)


@contextmanager
def trace_span(
    target: Target, name: str, *, attrs: dict[str, Any] | None = None, record_error: bool = True
) -> Iterator[Any]:
    """A span around the block on each target's trace (nested under the open span of the same trace)."""
    try:
        handles = _handles(target)
    except Exception as e:  # noqa: BLE001
        logger.debug("trace span %s not recorded: %s", name, e)
        handles = []
    if not handles:
        yield target
        return
    start, open_before = time.time(), _OPEN_SPANS.get()
    records = []
    for h in handles:
        span_id = uuid.uuid4().hex
        _append(
            h,
            "span_start",
            name,
            start,
            attrs,
            span_id=span_id,
            parent=h.parent_span_id or _current_span(h.trace_id, open_before),
        )
        records.append((h, span_id))
    spans_token = _OPEN_SPANS.set(open_before + tuple((h.trace_id, s) for h, s in records))
    targets_token = _OPEN_TARGETS.set(_OPEN_TARGETS.get() + (tuple(handles),))
    span = TraceSpanContext(handles[0] if len(handles) == 1 else handles, handles, records, start)
    error: BaseException | None = None
    try:
        yield span
    except BaseException as e:
        error = e
        raise
    finally:
        end_attrs = dict(span.end_attrs)
        if error is not None and record_error and isinstance(error, Exception):
            end_attrs.update(error_type=type(error).__name__, error_message=str(error))
        now = time.time()
        span.end_events = [_append(h, "span_end", name, now, end_attrs or None, span_id=s) for h, s in records]
        span.closed = True
        _OPEN_SPANS.reset(spans_token)
        _OPEN_TARGETS.reset(targets_token)


def trace_next_attempt(target: Target, *, attrs: dict[str, Any] | None = None) -> Any:
    """A retry of the same sample: bump its trace's attempt and mark where the attempt starts."""
    handles = _handles(target)
    for h in handles:
        h.attempt = h.carrier["attempt"] = int(h.carrier.get("attempt", 0)) + 1
        trace_event(h, "attempt_start", attrs={"attempt": h.attempt, **(attrs or {})})
    return target if not handles else handles[0] if len(handles) == 1 else handles


def trace_function(
    name: str,
    *,
    target: str | None = None,
    target_getter: Callable[..., Any] | None = None,
    attrs_getter: Callable[..., dict[str, Any] | None] | None = None,
    record_error: bool = True,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A decorator: each call of the function is a span on the trace of its `target` argument (by
    name), of `target_getter(*args, **kwargs)`, of the first Sample-like argument, or else of the span
    the call happens in. No target: the call runs untraced."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        def span_for(args: tuple, kwargs: dict) -> tuple[Any, dict[str, Any] | None]:
            found = _call_target(fn, args, kwargs, target, target_getter)
            extra = None
            if found is not None and attrs_getter is not None:
                try:
                    extra = attrs_getter(*args, **kwargs)
                except Exception as e:  # noqa: BLE001
                    logger.debug("trace_function %s: attrs_getter failed: %s", name, e)
                extra = extra if isinstance(extra, dict) else None
            return found, extra

        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_traced(*args: Any, **kwargs: Any) -> Any:
                found, extra = span_for(args, kwargs)
                if found is None:
                    return await fn(*args, **kwargs)
                with trace_span(found, name, attrs=extra, record_error=record_error):
                    return await fn(*args, **kwargs)

            return async_traced

        @functools.wraps(fn)
        def traced(*args: Any, **kwargs: Any) -> Any:
            found, extra = span_for(args, kwargs)
            if found is None:
                return fn(*args, **kwargs)
            with trace_span(found, name, attrs=extra, record_error=record_error):
                return fn(*args, **kwargs)

        return traced

    return decorate


# ---------------------------------------------------------------- internals


def _append(
    h: TraceHandle,
    kind: str,
    name: str,
    ts: float,
    attrs: dict[str, Any] | None,
    *,
    span_id: str | None = None,
    parent: str | None = None,
) -> dict[str, Any]:
    event = {
        "type": kind,
        "name": name,
        "ts": ts,
        "trace_id": h.trace_id,
        "sample_id": h.sample_id,
        "group_id": h.group_id,
        "attempt": int(h.carrier.get("attempt", h.attempt)),
    }
    if span_id is not None:
        event["span_id"] = span_id
    if parent is not None:
        event["parent_span_id"] = parent
    if attrs:
        event["attrs"] = dict(attrs)
    h.carrier["events"].append(event)
    return event


def _record_children(records: list[tuple[TraceHandle, str]], children: list[dict[str, Any]], start: float) -> None:
    """Child spans given as `{name, start_offset, end_offset, attrs}` (seconds after the parent's start)."""
    for h, parent in records:
        for child in children:
            span_id = uuid.uuid4().hex
            begin = start + float(child.get("start_offset", 0.0))
            _append(h, "span_start", child["name"], begin, child.get("attrs"), span_id=span_id, parent=parent)
            _append(h, "span_end", child["name"], start + float(child.get("end_offset", 0.0)), None, span_id=span_id)


def _current_span(trace_id: str, spans: tuple[tuple[str, str], ...] | None = None) -> str | None:
    for tid, span_id in reversed(_OPEN_SPANS.get() if spans is None else spans):
        if tid == trace_id:
            return span_id
    return None


def _as_target(value: Any) -> Any:
    """A Sample, a TraceHandle, or a non-empty list of them (slime's SampleBox: its generation or prompt)."""
    if type(value).__name__ == "SampleBox" and hasattr(value, "prompt_sample"):
        value = getattr(value, "generation", None) or value.prompt_sample
    if isinstance(value, (Sample, TraceHandle)):
        return value
    if isinstance(value, list) and value and all(_as_target(v) is not None for v in value):
        return [_as_target(v) for v in value]
    return None


def _handles(target: Any) -> list[TraceHandle]:
    target = _as_target(target)
    if isinstance(target, TraceHandle):
        return [target]
    if isinstance(target, Sample):
        return [bind_trace(target)]
    return [h for item in target or () for h in _handles(item)]


def _call_target(
    fn: Callable[..., Any], args: tuple, kwargs: dict, name: str | None, getter: Callable[..., Any] | None
) -> Any:
    try:
        bound = inspect.signature(fn).bind_partial(*args, **kwargs).arguments
    except TypeError:
        bound = {}
    if name is not None:
        found = _as_target(bound.get(name))
        if found is None:
            logger.warning(
                "trace_function: %s has no traceable argument %r; this call is not traced",
                getattr(fn, "__qualname__", fn),
                name,
            )
        return found
    if getter is not None:
        try:
            return _as_target(getter(*args, **kwargs))
        except Exception as e:  # noqa: BLE001
            logger.debug("trace_function: target_getter failed: %s", e)
            return None
    for value in bound.values() if bound else args:
        if _as_target(value) is not None:
            return _as_target(value)
    open_targets = _OPEN_TARGETS.get()
    if open_targets and open_targets[-1]:
        handles = list(open_targets[-1])
        return handles[0] if len(handles) == 1 else handles
    return None
