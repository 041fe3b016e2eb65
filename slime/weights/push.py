"""Trainer side of weight sync: push a model's named tensors to every engine, by shared memory /
value (`push_tensors`) or by a `torch.distributed` broadcast in buckets (`WeightUpdateGroup`).

An *engine* here is anything with slime's engine methods (`update_weights_from_tensor`,
`init_weights_update_group`, `update_weights_from_distributed`, `destroy_weights_update_group`,
`pause_generation`, `continue_generation`, `check_weights`), called with keyword arguments and
returning the engine's JSON answer or raising: `HttpEngine(url)` from a plain process (tests,
benchmarks), `slime.fleet.engine_actor.RemoteEngine(actor)` for Ray engine actors.

Every engine is called concurrently (one thread each) while rank 0 broadcasts, as slime's Megatron
trainer does; every wait is bounded (`timeout`), and a failure names the engine and the tensor.

Transport of the distributed path (`WeightUpdateGroup(transport=...)`): "auto" (default) offers the
engines a shared-memory ring (slime.weights.ring) at connect and uses it when every engine is on
this host and mapped it: the bytes are copied once by rank 0 and once by each engine, and the gloo
group carries only tiny per-chunk handshakes. Otherwise, or with "broadcast", the tensors themselves
are broadcast over gloo (what slime does across hosts). Both keep slime's request bodies; "auto" adds
one optional field to init_weights_update_group.
A push in several buckets should run inside `paused(engines)` (pause → push → continue, slime's
order), so no request decodes on a half-pushed model.

An engine may die during a push. Engines that carry an exit notice (`exited`: a future completed
when the engine's process is gone; `RemoteEngine` gets it from the fleet's supervised actor) are
watched by every wait of the group: a death wakes the push at once, whatever collective it is in.
The group is then dropped (rank 0 leaves it, so the survivors' collectives fail at once instead of
at gloo's deadline), formed again with the survivors and the whole push repeated to them; the
warning names the engine and the push. `paused` skips dead engines too. A restarted engine gets
the weights at the next push (slime.fleet.awaiting_weights).

The pieces, one idea each (every name stays importable from here): slime.weights.engine_deaths (errors,
exit notices), http_engine (`HttpEngine`), engine_calls (concurrent calls, `paused`), weight_group
(`WeightUpdateGroup`: formation and deaths), weight_group_transport (ring and broadcast pushes).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from slime.weights.engine_calls import (
    gather,
    in_thread,
    on_all_engines,
    on_all_engines_quietly,
    on_live_engines,
    paused,
    settled,
)
from slime.weights.engine_deaths import (
    DEATH_GRACE_S,
    EngineAnswered,
    EnginesDied,
    WeightSyncError,
    dead_engines,
    exit_notice,
)
from slime.weights.http_engine import HttpEngine
from slime.weights.group import DEFAULT_BUCKET_BYTES, WeightUpdateGroup
from slime.weights.transfer import bucket_named_tensors, named_checksums, serialize_named_tensors
from slime.weights.receive import model_tensors

__all__ = [
    "DEATH_GRACE_S",
    "DEFAULT_BUCKET_BYTES",
    "EngineAnswered",
    "EnginesDied",
    "HttpEngine",
    "WeightSyncError",
    "WeightUpdateGroup",
    "dead_engines",
    "exit_notice",
    "gather",
    "in_thread",
    "model_checksums",
    "on_all_engines",
    "on_all_engines_quietly",
    "on_live_engines",
    "paused",
    "push_tensors",
    "settled",
    "trainer_named_tensors",
]


def trainer_named_tensors(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """What a push sends: parameters and persistent buffers, each tied tensor once (under its first name)."""
    seen: set[int] = set()
    out = []
    for name, t in model_tensors(model).items():
        if id(t) not in seen:
            seen.add(id(t))
            out.append((name, t.detach()))
    return out


def model_checksums(model: torch.nn.Module) -> dict[str, str]:
    """`check_weights("compare", checksums=...)` argument for the trainer's current weights."""
    return named_checksums(trainer_named_tensors(model))


def push_tensors(
    engines: Sequence[Any],
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    *,
    weight_version: str | None,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    transport: str = "shm",
    flush_cache: bool = False,
    timeout: float = 600.0,
) -> list[dict]:
    """`update_weights_from_tensor` bucket by bucket; each bucket is serialised once for all engines.
    An engine that dies meanwhile is skipped from then on; the live engines' last answers."""
    answers: list[dict] = []
    live = list(engines)
    for bucket in bucket_named_tensors(named_tensors, bucket_bytes):
        with serialize_named_tensors(bucket, transport=transport) as payload:
            said = on_live_engines(
                live,
                "update_weights_from_tensor",
                timeout,
                serialized_named_tensors=[payload.serialized],
                load_format=None,
                flush_cache=flush_cache,
                weight_version=weight_version,
            )
        live, answers = [e for e, a in zip(live, said) if a is not None], [a for a in said if a is not None]
    return answers
