"""`WeightGate`: a replacement engine serves only the weights the fleet serves.

A replacement boots with the weights on disk. If the serving engines report another weight
version (a trainer pushed weights from memory), it loads the trainer's last push at once when the
trainer kept it for that purpose (`keep`: its tensors in Ray's object store, owned by the trainer,
with their version; `catch_up` loads them and checks the version the engine then reports), and serves:
a replacement of every engine of a lost node never waits for a push that comes only after the rollout
it is needed for. Without kept weights of the serving version (another trainer, or its owner gone), it
stays out of the router in state `awaiting_weights`: it is one of the updatable engines (slime's
`recover_updatable_engines` / `num_new_engines`), so the trainer's next push reaches it, and it is
registered when that push completes (its actor reports the push's end: `continue_generation`
after the updates, or an update from disk) and it reports the serving engines' version. So no
request is ever answered by stale weights while the others serve version N. Its count of pushes is
taken before it shows as updatable (a trainer may push to it at that very moment), and a wait for its
push that fails without its death is asked again (`_PUSH_WAIT_RETRIES` in a row: it is replaced).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Any, Callable

import ray

from slime.weights.version_answer import BadWeightVersion
from slime.fleet.engine_slot import EngineSlot

logger = logging.getLogger(__name__)

_PUSH_WAIT_S = 30.0  # an engine awaiting weights is asked again after this (so a stop is seen)
_PUSH_WAIT_RETRIES = 5  # failed waits in a row (not deaths) before an engine awaiting weights is replaced


class WeightGate:
    """The weight version the fleet serves (`version`), and the engines held back until they have it.
    `lock`, `stopping` and `counters` are the fleet's; `admit(slot)` puts an engine in service (under the lock)."""

    def __init__(
        self, lock: threading.RLock, stopping: threading.Event, counters: Counter, admit: Callable[[EngineSlot], None]
    ):
        self.lock, self.stopping, self.counters, self.admit = lock, stopping, counters, admit
        self.version: str | None = None  # the version the serving engines last reported
        # (version, ref of its named tensors in Ray's object store): the trainer's last push, for replacements
        self.kept: tuple[str, Any] | None = None

    def keep(self, version: str, ref: Any, slots: list[EngineSlot]) -> list[int]:
        """The trainer's push of `version` completed; `ref` holds its named tensors (owned by the trainer,
        freed when the next push replaces it). Engines still awaiting weights that this push did not
        reach (they came up while it ran) load it now. The trainer holds its weight lock meanwhile, so
        no other push runs; the ranks of the engines admitted."""
        with self.lock:
            self.kept, self.version = (str(version), ref), str(version)
            waiting = [(s, s.actor) for s in slots if s.state == "awaiting_weights"]
        admitted = []
        for slot, actor in waiting:
            try:
                mine = ray.get(actor.get_weight_version.remote(), timeout=60)
            except Exception:  # noqa: BLE001 - dying: its watcher handles it
                continue
            if mine != self.version and not self.catch_up(slot, actor):
                continue
            with self.lock:
                if self.stopping.is_set() or slot.actor is not actor or slot.state != "awaiting_weights":
                    continue
                self.admit(slot)
            admitted.append(slot.rank)
            logger.warning(
                "engine %d has the current weights (version %s): serving at %s", slot.rank, self.version, slot.url
            )
        return admitted

    def catch_up(self, slot: EngineSlot, actor: Any) -> bool:
        """Load the kept push into this replacement when it is the version the fleet serves; whether the
        engine then reports that version. Named in the log: the version, where it came from, how long."""
        with self.lock:
            kept, serving = self.kept, self.version
        if kept is None or kept[0] != serving:
            return False
        t0 = time.monotonic()
        try:
            got = ray.get(actor.load_kept_weights.remote([kept[1]], kept[0]), timeout=_PUSH_WAIT_S + 600)
        except ray.exceptions.RayActorError:
            raise
        except Exception as e:  # noqa: BLE001 - the trainer (their owner) gone, an SGLang engine: wait for a push
            logger.warning(
                "engine %d: could not load weight version %s kept from the trainer's last push (%s: %s); "
                "it waits for the next push",
                slot.rank,
                kept[0],
                type(e).__name__,
                str(e)[:300],
            )
            return False
        if got != kept[0]:
            logger.warning(
                "engine %d: loaded the trainer's last push of version %s but reports version %s; it waits "
                "for the next push",
                slot.rank,
                kept[0],
                got,
            )
            return False
        self.counters["engine_weights_caught_up"] += 1
        logger.warning(
            "engine %d: loaded weight version %s from the trainer's last push (kept in Ray's object store) in %.1fs",
            slot.rank,
            got,
            time.monotonic() - t0,
        )
        return True

    def note(self, version: str | None) -> None:
        """The trainer pushed `version` to the serving engines (the manager's `end_weight_update`): what a
        replacement must have before it serves, even if every engine died at once and none can be asked."""
        if version is not None:
            with self.lock:
                self.version = str(version)

    def serving_version(self, slots: list[EngineSlot], exclude: EngineSlot | None = None) -> str | None:
        """The weight version the serving engines report (remembered in `version`); the last
        one known when none serves."""
        for s in slots:
            if s is not exclude and s.state == "healthy":
                try:
                    self.version = ray.get(s.actor.get_weight_version.remote(), timeout=60)
                    break
                except Exception as e:  # noqa: BLE001 - dying too: its watcher reports it; ask the next one
                    self.bad_answer(e, s.rank)
                    continue
        return self.version

    def bad_answer(self, exc: BaseException, rank: int) -> bool:
        """Whether `exc` is an engine's malformed `/get_weight_version` answer: then counted (by field)
        and logged, and the version is never taken from it (a replacement waits for the next push)."""
        cause = getattr(exc, "cause", exc)  # Ray wraps what the actor raised
        if not isinstance(cause, BadWeightVersion):
            return False
        self.counters[cause.reason] += 1
        logger.warning("engine %d: %s; its weight version is not trusted", rank, cause)
        return True

    def stale(self, slot: EngineSlot, actor: Any, slots: list[EngineSlot]) -> tuple[str | None, str] | None:
        """(its version, the serving one) when the started replacement has other weights than the fleet
        serves; None when it may serve (caller holds the lock)."""
        serving = self.serving_version(slots, exclude=slot)
        try:
            mine = ray.get(actor.get_weight_version.remote(), timeout=60)
        except ray.exceptions.RayActorError:
            raise
        except Exception as e:  # noqa: BLE001 - an engine without /get_weight_version: nothing to compare
            mine = None if self.bad_answer(e, slot.rank) else serving
        return (mine, serving) if serving is not None and mine != serving else None

    def hold(self, slot: EngineSlot, actor: Any) -> None:
        """Keep the replacement out of the router, updatable, until a push completes on it (caller holds the lock)."""
        # counted before the trainer can see it: a push that starts the moment it is updatable
        # (its state, read without this lock) must count as the one it waits for
        seen = ray.get(actor.push_count.remote(), timeout=60)  # the replayed ones do not count
        slot.state = "awaiting_weights"
        threading.Thread(
            target=self.await_push, args=(slot, actor, seen), daemon=True, name=f"engine-weights-{slot.rank}"
        ).start()

    def await_push(self, slot: EngineSlot, actor: Any, seen: int) -> None:
        """Wait for the first complete push to this engine, then admit it. Any push that reaches it
        after its restart is the trainer's current weights (a trainer pushes its newest weights to every
        updatable engine), so it is not compared with the others again: they may still be receiving."""
        failures = 0
        while not self.stopping.is_set() and slot.actor is actor and slot.state == "awaiting_weights":
            try:
                count, version = ray.get(actor.wait_push.remote(seen, _PUSH_WAIT_S), timeout=_PUSH_WAIT_S + 60)
                failures = 0
            except ray.exceptions.RayActorError:  # the actor died: its watcher replaces it
                return
            except Exception as e:  # noqa: BLE001 - e.g. a late answer on a loaded host: not a death, ask again
                failures += 1
                if not self._push_wait_failed(slot, actor, failures, e):
                    return
                continue
            if count <= seen:
                continue
            with self.lock:
                if self.stopping.is_set() or slot.actor is not actor or slot.state != "awaiting_weights":
                    return
                if version is not None:
                    self.version = version
                self.admit(slot)
            logger.warning(
                "engine %d has the current weights (version %s): serving at %s", slot.rank, version, slot.url
            )
            return

    def _push_wait_failed(self, slot: EngineSlot, actor: Any, failures: int, exc: BaseException) -> bool:
        """A wait for this engine's push failed without its death: whether to ask again. After
        `_PUSH_WAIT_RETRIES` failures in a row it is handled as dead (its actor killed: its watcher
        replaces it within the restart budget), so an engine that cannot answer never waits for ever."""
        reason = f"{type(exc).__name__}: {str(exc)[:300]}"
        if failures >= _PUSH_WAIT_RETRIES:
            logger.warning(
                "engine %d awaiting weights: %d waits for its push failed (last: %s); replacing it",
                slot.rank,
                failures,
                reason,
            )
            try:
                ray.kill(actor)
            except Exception:  # noqa: BLE001 - already gone: its watcher reports it either way
                pass
            return False
        logger.warning(
            "engine %d awaiting weights: waiting for its push failed (%s); asking again (%d/%d)",
            slot.rank,
            reason,
            failures,
            _PUSH_WAIT_RETRIES,
        )
        return not self.stopping.wait(min(float(failures), _PUSH_WAIT_S))  # a failing call returns at once
