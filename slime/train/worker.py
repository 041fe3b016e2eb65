"""`TrainWorker`: one data-parallel rank of the reference trainer (a Ray actor on a CPU bundle).

Plain torch + transformers: the HF model the engines serve, in float32, wrapped in DDP over gloo.
Per rollout (`train`): fetch this rank's Box, recompute the log-probs of the current weights
(slime's "old" policy; also the measured trainer/engine log-prob gap) and of the frozen reference
when a KL term needs it, compute advantages (with `--use-opd`, minus the teacher's reverse-KL
penalty, logged per step as `opd_reverse_kl`), then run the schedule's steps: each step is exactly
the Box's micro-batches (`micro_batch_indices`, `num_microbatches`), gradients accumulated locally
and all-reduced once (DDP `no_sync` on all but the last), clipped, one optimizer step. The loss of
a micro-batch is its per-rollout sums (`rollout_mask_sums` as denominators) divided by the step's
rollout count, times the DP size (DDP averages), so a rollout counts once however it was split.

The worker reads its flags from `WorkerConfig` (`slime.train.flags`); the namespace it is also given
goes only to slime's plugins (`LossHooks`), as slime gives them theirs.

Rank 0 also pushes the weights to the engines (`update_weights`) and writes checkpoints: every
rank holds identical parameters and optimizer state after each step.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import math
import os
import shutil
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import ray
import torch
import torch.distributed as dist

from slime.weights.receive import first_line
from slime.train.checkpoint import CHECKPOINT_TRACKER  # noqa: F401 - importable from its former home
from slime.train.checkpoint import CheckpointError, CheckpointWriter, checkpoint_dir, latest_checkpoint
from slime.train.loss import (
    LossHooks,
    advantages_of_rollout,
    apply_opd_kl_to_advantages,
    normalized_advantages,
    approx_kl,
    call_custom_loss,
    check_loss_args,
    needs_reference,
    policy_loss,
    sample_reducer,
)
from slime.train.finite_guard import check_step, check_weights
from slime.train.flags import WorkerConfig
from slime.train.model import PolicyModel, pack
from slime.train.optimizer import build_optimizer
from slime.train.trainable import apply_trainable_patterns
from slime.utils.vision_model import is_vision_model, load_hf_model

logger = logging.getLogger(__name__)

GROUP_NAME = "slime-pp_0"
WEIGHT_KEEP_TIMEOUT_S = 900.0  # the manager loads the kept push into engines that missed this one
WEIGHT_GROUP_TIMEOUT_S = 30.0  # every collective of a push (gloo's default is 120 s): a lost member fails it soon


class TrainWorker:
    def __init__(self, config: WorkerConfig, plugin_args: Any, world_size: int, rank: int):
        """`plugin_args`: the namespace slime's plugins are called with (`LossHooks`), nothing else reads it."""
        self.config, self.world_size, self.rank = config, world_size, rank
        self._plugin_args = plugin_args
        self.model = self.policy = self.ddp = self.ref = self.optimizer = self.scheduler = None
        self.hooks = LossHooks()
        self.weight_group = None  # WeightUpdateGroup, rank 0, distributed path
        self._group_engines: list[Any] = []
        self._groups_formed = 0  # each group gets its own name (see _connect)
        self._engine_notices: dict[str, tuple[Any, str]] = {}  # actor id -> (exit notice, label), per engine
        self._kept: Any = None  # the last push's tensors in Ray's object store, for replacement engines
        self._store: Any = None  # rank 0's gloo rendezvous store (`master_address`), kept as long as the group
        self.global_step = 0
        threads = config.train.train_threads or max(
            1, (os.cpu_count() or 1) // max(1, int(config.train.actor_num_workers))
        )
        torch.set_num_threads(int(threads))

    # ---- set-up ----
    def master_host(self) -> str:
        return "127.0.0.1" if self.config.engine_host == "127.0.0.1" else ray.util.get_node_ip_address()

    def master_address(self) -> tuple[str, int]:
        """Rank 0's rendezvous for the gloo group: its store, serving from now on a port the OS picks (a port
        found free and bound only later, by `init`, could be taken in between: another run, another test)."""
        host = self.master_host()
        self._store = dist.TCPStore(host, 0, self.world_size, True, wait_for_workers=False)
        return host, self._store.port

    def init(self, master_addr: str, master_port: int, timeout: float = 300.0) -> dict[str, Any]:
        """Join the gloo group, build model / reference / optimizer, resume from `--load`. Returns
        `{"start_rollout_id", "loaded_rollout_id"}`."""
        config = self.config
        check_loss_args(config.loss)
        # slime's custom loss, advantage, TIS, pg_loss reducer and rollout-data post-process, resolved once
        self.hooks = LossHooks.of(config.loss, self._plugin_args)
        torch.manual_seed(int(config.seed))
        if not dist.is_initialized():
            deadline = datetime.timedelta(seconds=timeout)
            store = self._store  # rank 0's, made by `master_address`; else rank 0 serves the address it was given
            if store is None:
                store = dist.TCPStore(
                    master_addr, master_port, self.world_size, self.rank == 0, timeout=deadline, wait_for_workers=False
                )
            else:
                store.set_timeout(deadline)
            dist.init_process_group("gloo", store=store, rank=self.rank, world_size=self.world_size, timeout=deadline)
        loaded = latest_checkpoint(config.load, config.ckpt_step) if config.load else None
        source = str(checkpoint_dir(config.load, loaded) / "model") if loaded is not None else config.hf_checkpoint
        try:
            self.model = load_hf_model(source, torch.float32)  # a vision-language one with its vision tower
        except Exception as e:  # noqa: BLE001 - safetensors' text names neither the flag nor the file
            if loaded is None:
                raise
            raise CheckpointError(
                f"--load {config.load}: cannot load the model of the checkpoint of rollout "
                f"{loaded} ({source}): {first_line(e)}"
            ) from e
        self.model.eval()  # no dropout: the trainer's log-probs must be the engine's
        apply_trainable_patterns(self.model, config.optimizer)  # before DDP, which registers the trainable ones
        self.policy = PolicyModel(self.model, config.rollout_temperature)
        from torch.nn.parallel import DistributedDataParallel

        # a VLM's micro-batch without images leaves the vision tower out of the backward
        self.ddp = DistributedDataParallel(self.policy, find_unused_parameters=is_vision_model(self.model))
        if needs_reference(config.loss):
            ref_path = config.ref_load or config.hf_checkpoint
            if ref_path and not (Path(ref_path) / "config.json").is_file():
                ref_path = config.hf_checkpoint  # a Megatron --ref-load dir: the HF model is the reference
            ref_model = load_hf_model(ref_path, torch.float32).eval()
            for p in ref_model.parameters():
                p.requires_grad_(False)
            self.ref = PolicyModel(ref_model, config.rollout_temperature)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer, self.scheduler = build_optimizer(params, config.optimizer)
        start = int(config.start_rollout_id or 0)
        if loaded is not None:
            self._load_state(checkpoint_dir(config.load, loaded))
            start = loaded + 1
        return {"start_rollout_id": start, "loaded_rollout_id": loaded}

    def _load_state(self, ckpt: Path) -> None:
        state_path = ckpt / "trainer_state.json"
        if state_path.is_file():
            self.global_step = int(json.loads(state_path.read_text()).get("global_step", 0))
        if self.config.no_load_optim:
            return
        optim_path = ckpt / "optimizer.pt"
        if not optim_path.is_file():
            raise CheckpointError(f"--load: {optim_path} is missing (use --no-load-optim to start a fresh optimizer)")
        try:
            state = torch.load(optim_path, map_location="cpu", weights_only=True)
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
        except Exception as e:  # noqa: BLE001 - torch's text names neither the flag nor the file
            raise CheckpointError(
                f"--load {self.config.load}: cannot read {optim_path}: {first_line(e)} "
                "(use --no-load-optim to start a fresh optimizer)"
            ) from e

    # ---- one rollout ----
    def train(self, rollout_id: int, boxes: list[Any]) -> dict[str, Any]:
        """Train on this rank's Box of rollout `rollout_id`; rank 0 returns the metrics (others None)."""
        t0 = time.monotonic()
        data = ray.get(boxes[self.rank].inner)
        loss_config = self.config.loss
        tokens, lengths = data["tokens"], list(data["response_lengths"])
        totals = [len(t) for t in tokens]  # prompt + response, per sample (slime's total_lengths)
        masks = [m.to(torch.float32) for m in data["loss_masks"]]
        denoms = data["rollout_mask_sums"]
        rollout_lp = data.get("rollout_log_probs")
        mb_indices = data["micro_batch_indices"]
        images = data.get("multimodal_train_inputs") or [None] * len(tokens)  # a VLM's, per sample
        packed = [
            pack([tokens[i] for i in mb], [lengths[i] for i in mb], images=[images[i] for i in mb]) for mb in mb_indices
        ]
        total_rollouts = float(sum(data["global_batch_sizes"]))

        # the current weights' log-probs ("old" policy) and the reference's, before any update
        old_lp: list[torch.Tensor] = [torch.empty(0)] * len(tokens)
        ref_lp: list[torch.Tensor] | None = [torch.empty(0)] * len(tokens) if self.ref is not None else None
        with torch.no_grad():
            for mb, batch in zip(mb_indices, packed):
                lp, _ = self.policy.run(batch, with_entropy=False)
                for i, part in zip(mb, lp.split([lengths[i] for i in mb])):
                    old_lp[i] = part
                if self.ref is not None:
                    rlp, _ = self.ref.run(batch, with_entropy=False)
                    for i, part in zip(mb, rlp.split([lengths[i] for i in mb])):
                        ref_lp[i] = part
        rank_stats = defaultdict(float)
        if rollout_lp is not None:
            reduce_all = sample_reducer(lengths, masks, denoms)
            diff = torch.cat(old_lp) - torch.cat(rollout_lp) if lengths else torch.zeros(0)
            rank_stats["train_rollout_logprob_abs_diff"] = float(reduce_all(diff.abs()))
            masked = diff.abs()[torch.cat(masks) > 0] if lengths else diff
            rank_stats["train_rollout_logprob_abs_diff_max"] = float(masked.max()) if masked.numel() else 0.0
        kl = None
        if self.ref is not None:
            kl = [approx_kl(o, r, loss_config.kl_loss_type) for o, r in zip(old_lp, ref_lp)]
        advantages = advantages_of_rollout(
            loss_config,
            self.hooks,
            {
                "rewards": list(data["rewards"]),
                "loss_masks": masks,
                "response_lengths": lengths,
                "total_lengths": totals,
                "log_probs": old_lp,
                "rollout_log_probs": rollout_lp,
                "ref_log_probs": ref_lp,
                "values": None,
                "kl": kl
                if kl is not None or self.hooks.custom_advantage is None
                else [torch.zeros_like(m) for m in masks],
            },
        )
        reverse_kl = None
        if loss_config.use_opd:  # slime: after the estimator, before whitening
            student = rollout_lp if loss_config.use_rollout_logprobs else old_lp
            reverse_kl = apply_opd_kl_to_advantages(loss_config, advantages, student, data.get("teacher_log_probs"))
        advantages = normalized_advantages(loss_config, advantages, masks, dist.all_reduce)
        if self.hooks.rollout_data_postprocess is not None:  # slime: after advantages, before training
            masks, advantages = self._postprocess(rollout_id, data, masks, advantages, old_lp, ref_lp)

        # the schedule's steps
        steps_out: list[dict[str, float]] = []
        cursor = 0
        for n_mb, n_rollouts in zip(data["num_microbatches"], data["global_batch_sizes"]):
            step_mbs = list(range(cursor, cursor + n_mb))
            cursor += n_mb
            self.optimizer.zero_grad(set_to_none=True)
            sums: dict[str, torch.Tensor] = defaultdict(lambda: torch.zeros(()))
            for k, j in enumerate(step_mbs):
                mb, batch = mb_indices[j], packed[j]
                sync = contextlib.nullcontext() if k == n_mb - 1 else self.ddp.no_sync()
                with sync:
                    reduce = sample_reducer([lengths[i] for i in mb], [masks[i] for i in mb], denoms[mb])
                    if self.hooks.custom_loss is not None:
                        *_, logits = self.ddp(
                            batch.input_ids,
                            batch.attention_mask,
                            batch.rows,
                            batch.cols,
                            batch.targets,
                            with_entropy=False,
                            with_logits=True,
                            **batch.images,
                        )
                        mb_batch = self._custom_loss_batch(mb, data, masks, advantages, old_lp, ref_lp, totals)
                        out = call_custom_loss(loss_config, self.hooks, mb_batch, logits, reduce)
                        (out.loss * (self.world_size / n_rollouts)).backward()
                        for key, value in out.metrics.items():
                            sums[key] = sums[key] + value
                        continue
                    lp, ent = self.ddp(
                        batch.input_ids, batch.attention_mask, batch.rows, batch.cols, batch.targets, **batch.images
                    )
                    out = policy_loss(
                        loss_config,
                        log_probs=lp,
                        entropy=ent,
                        old_log_probs=(
                            torch.cat([rollout_lp[i] for i in mb])
                            if loss_config.use_rollout_logprobs
                            else torch.cat([old_lp[i] for i in mb])
                        ),
                        advantages=torch.cat([advantages[i] for i in mb]),
                        rollout_log_probs=torch.cat([rollout_lp[i] for i in mb]) if rollout_lp is not None else None,
                        ref_log_probs=torch.cat([ref_lp[i] for i in mb]) if ref_lp is not None else None,
                        response_lengths=[lengths[i] for i in mb],
                        loss_masks=[masks[i] for i in mb],
                        reduce=reduce,
                        denominators=denoms[mb],
                        total_lengths=[totals[i] for i in mb],
                        hooks=self.hooks,
                    )
                    (out.loss * (self.world_size / n_rollouts)).backward()
                for key, value in out.metrics.items():
                    sums[key] = sums[key] + value
                if reverse_kl is not None:
                    sums["opd_reverse_kl"] = sums["opd_reverse_kl"] + reduce(torch.cat([reverse_kl[i] for i in mb]))
            max_norm = float(self.config.optimizer.clip_grad or 0.0)  # Megatron's --clip-grad, 1.0 by default; 0 = none
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm if max_norm > 0 else math.inf)
            keys = sorted(sums)
            vec = torch.stack([sums[k] for k in keys]).to(torch.float64)
            dist.all_reduce(vec)  # before the step: a NaN of any rank is seen by all, which all stop alike
            step_metrics = {k: float(v) / n_rollouts for k, v in zip(keys, vec)}
            step_metrics["grad_norm"] = float(grad_norm)
            check_step(rollout_id, self.global_step + 1, step_metrics)
            self.optimizer.step()
            self.scheduler.step()
            self.global_step += 1
            step_metrics["entropy"] = step_metrics.get("entropy_loss", 0.0)
            step_metrics["lr"] = float(self.scheduler.get_last_lr()[0])
            step_metrics["step"] = self.global_step
            steps_out.append(step_metrics)

        keys = sorted(k for k in rank_stats if not k.endswith("_max"))
        vec = torch.tensor([rank_stats[k] for k in keys], dtype=torch.float64)
        if keys:
            dist.all_reduce(vec)
        worst = torch.tensor([rank_stats.get("train_rollout_logprob_abs_diff_max", 0.0)], dtype=torch.float64)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        if self.rank != 0:
            return None
        rollout_metrics = {k: float(v) / total_rollouts for k, v in zip(keys, vec)}
        if rollout_lp is not None:
            rollout_metrics["train_rollout_logprob_abs_diff_max"] = float(worst[0])
        raw = data.get("raw_reward") or []
        return {
            "rollout_id": rollout_id,
            "steps": steps_out,
            "rollout": rollout_metrics,
            "raw_reward": sum(raw) / len(raw) if raw else None,
            "seconds": time.monotonic() - t0,
            "weight_versions": sorted({v for vs in data.get("weight_versions", []) for v in vs}),
        }

    def _postprocess(
        self,
        rollout_id: int,
        data: dict[str, Any],
        masks: list[torch.Tensor],
        advantages: list[torch.Tensor],
        old_lp: list[torch.Tensor],
        ref_lp: list[torch.Tensor] | None,
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """`--rollout-data-postprocess-path` on this rank's rollout data (slime's keys); the loss masks
        and advantages it leaves are the ones trained on."""
        rollout_data = {
            **data,
            "loss_masks": list(masks),
            "advantages": list(advantages),
            "returns": list(advantages),
            "log_probs": list(old_lp),
            "ref_log_probs": list(ref_lp) if ref_lp is not None else None,
            "total_lengths": [len(t) for t in data["tokens"]],
        }
        self.hooks.rollout_data_postprocess(self.hooks.args, rollout_id, rollout_data)
        masks = [torch.as_tensor(m, dtype=torch.float32) for m in rollout_data["loss_masks"]]
        advantages = [torch.as_tensor(a, dtype=torch.float32) for a in rollout_data["advantages"]]
        for i, (m, a, n) in enumerate(zip(masks, advantages, data["response_lengths"])):
            if m.numel() != n or a.numel() != n:
                raise ValueError(
                    f"--rollout-data-postprocess-path {self.config.loss.rollout_data_postprocess_path}: "
                    f"sample {i} has {n} response tokens, but {m.numel()} loss-mask values and "
                    f"{a.numel()} advantages after the post-process"
                )
        return masks, advantages

    @staticmethod
    def _custom_loss_batch(
        mb: list[int],
        data: dict[str, Any],
        masks: list[torch.Tensor],
        advantages: list[torch.Tensor],
        old_lp: list[torch.Tensor],
        ref_lp: list[torch.Tensor] | None,
        totals: list[int],
    ) -> dict[str, Any]:
        """One micro-batch as slime's loss functions receive it: per-sample lists under slime's keys."""
        rollout_lp = data.get("rollout_log_probs")
        tokens = [data["tokens"][i] for i in mb]
        return {
            "tokens": tokens,
            "unconcat_tokens": tokens,
            "total_lengths": [totals[i] for i in mb],
            "response_lengths": [int(data["response_lengths"][i]) for i in mb],
            "loss_masks": [masks[i] for i in mb],
            "advantages": [advantages[i] for i in mb],
            "log_probs": [old_lp[i] for i in mb],
            "rewards": [data["rewards"][i] for i in mb],
            "rollout_log_probs": [rollout_lp[i] for i in mb] if rollout_lp is not None else None,
            "ref_log_probs": [ref_lp[i] for i in mb] if ref_lp is not None else None,
        }

    # ---- weights ----
    def weight_checksums(self) -> dict[str, str]:
        from slime.weights.push import model_checksums

        return model_checksums(self.model)

    def update_weights(self, manager: Any, weight_version: str, mode: str) -> dict[str, Any] | None:
        """Rank 0: push the weights to every updatable engine (slime's order: recover dead engines,
        take the engines and the lock, pause, push, continue, release). Other ranks: nothing."""
        if self.rank != 0:
            return None
        from slime.weights.push import paused, push_tensors, trainer_named_tensors

        t0 = time.monotonic()
        named = trainer_named_tensors(self.model)
        check_weights(named, "pushed to the engines")  # before any engine is touched
        ray.get(manager.recover_updatable_engines.remote())
        engines, lock, num_new, *_ = ray.get(manager.get_updatable_engines_and_lock.remote())
        nbytes = sum(t.numel() * t.element_size() for _, t in named)
        if not engines:  # every engine is being replaced: they load this version once up
            if mode != "disk":
                self._keep_for_replacements(manager, weight_version, named)
            return {"engines": 0, "bytes": nbytes, "seconds": time.monotonic() - t0, "mode": mode}
        if not ray.get(lock.acquire.remote(600.0)):
            raise TimeoutError("update_weights: the engines' weight lock was not released within 600 s")
        died: list[str] = []
        losses: list[dict[str, Any]] = []  # how each death was known and how the survivors left (WeightUpdateGroup)
        try:
            remote = self._remote_engines(engines)
            if mode == "disk":
                path = self._save_hf(
                    Path(self.config.save or os.environ.get("TMPDIR", "/tmp")) / f"weights_for_engines_{os.getpid()}"
                )
                ray.get(manager.update_weights_from_disk.remote(str(path), weight_version))
            else:
                with paused(remote):
                    if mode == "tensor":
                        push_tensors(
                            remote,
                            named,
                            weight_version=weight_version,
                            bucket_bytes=int(self.config.update_weight_buffer_size),
                        )
                    else:
                        before = self.weight_group
                        self._connect(remote, engines, num_new)  # deaths while forming the group count too
                        seen = len(before.died) if before is self.weight_group else 0
                        seen_losses = len(before.losses) if before is self.weight_group else 0
                        self.weight_group.push(
                            named,
                            weight_version=weight_version,
                            bucket_bytes=int(self.config.update_weight_buffer_size),
                        )
                        died = [repr(e) for e, _ in self.weight_group.died[seen:]]
                        losses = self.weight_group.losses[seen_losses:]
                self._keep_for_replacements(manager, weight_version, named)
            ray.get(manager.clear_updatable_num_new_engines.remote())
        finally:
            ray.get(lock.release.remote())
        if died:  # the fleet replaces them; a replacement gets the weights at the next push (awaiting_weights)
            logger.warning(
                "weight version %s: %s died during the push; pushed to the %d surviving engine(s)",
                weight_version,
                ", ".join(died),
                len(engines) - len(died),
            )
        return {
            "engines": len(engines) - len(died),
            "engines_died": died,
            "engine_losses": losses,
            "bytes": nbytes,
            "seconds": time.monotonic() - t0,
            "mode": mode,
        }

    def _keep_for_replacements(self, manager: Any, weight_version: str, named: list[tuple[str, Any]]) -> None:
        """The pushed tensors, kept in Ray's object store (owned by this worker: they live while it does)
        for an engine that replaces a lost one: it loads them at once, version checked, instead of waiting
        for the next push, which comes only after the rollout it is needed for. One copy of the weights,
        replaced at each push; a manager without `keep_pushed_weights` is not given any."""
        try:
            keep = manager.keep_pushed_weights
        except AttributeError:
            return
        self._kept = ray.put(named)
        ray.get(keep.remote(weight_version, [self._kept]), timeout=WEIGHT_KEEP_TIMEOUT_S)

    def _remote_engines(self, engines: list[Any]) -> list[Any]:
        """The engines as RemoteEngine, each with its exit notice and its name (asked once per engine
        actor, while it is alive: a push that sees it die names it)."""
        from slime.fleet.engine_actor import RemoteEngine
        from slime.fleet.fleet import exit_notice

        ids = [e._actor_id.hex() for e in engines]  # noqa: SLF001 - identity of the actor, not its handle
        new = [(i, e) for i, e in zip(ids, engines) if i not in self._engine_notices]
        urls = [e.url.remote() for _, e in new]
        for (i, e), ref in zip(new, urls):
            try:
                label = f"engine at {ray.get(ref, timeout=60)}"
            except Exception:  # noqa: BLE001 - dying already: the push names it by its actor
                label = f"engine actor {i[:12]}"
            self._engine_notices[i] = (exit_notice(e), label)
        self._engine_notices = {i: self._engine_notices[i] for i in ids}
        return [
            RemoteEngine(e, exited=self._engine_notices[i][0], label=self._engine_notices[i][1])
            for i, e in zip(ids, engines)
        ]

    def _connect(self, remote: list[Any], engines: list[Any], num_new: int) -> None:
        """(Re)form the gloo group with the engines when it is new or the engines changed."""
        from slime.weights.push import WeightUpdateGroup

        ids = [e._actor_id.hex() for e in engines]  # noqa: SLF001 - identity of the actor, not its handle
        # a push that lost step with the engines closed the group (not connected): form it again
        if self.weight_group is not None and (
            ids != self._group_engines
            or num_new
            or not self.weight_group.connected
            or len(self.weight_group.engines) != len(ids)
        ):
            self.weight_group.close()
            self.weight_group = None
        if self.weight_group is None:
            host = self.master_host()
            # "auto": the shared-memory ring when every engine is on this host, else gloo broadcasts
            transport = self.config.train.weight_sync_transport
            # a fresh name per group: a survivor may still hold a broken rendezvous of an earlier one
            # (an engine died while it formed) until that one's deadline, and refuses a second of that name
            name = f"{GROUP_NAME}-g{self._groups_formed}" if self._groups_formed else GROUP_NAME
            self._groups_formed += 1
            group = WeightUpdateGroup(
                remote, group_name=name, master_address=host, timeout=WEIGHT_GROUP_TIMEOUT_S, transport=transport
            )
            group.connect()
            self.weight_group, self._group_engines = group, ids

    def close_weight_group(self) -> None:
        if self.weight_group is not None:
            self.weight_group.close()
            self.weight_group = None

    # ---- checkpoints ----
    def _save_hf(self, directory: Path) -> Path:
        tmp = directory.with_name(directory.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        self._write_hf(tmp)
        shutil.rmtree(directory, ignore_errors=True)
        tmp.replace(directory)
        return directory

    def _write_hf(self, directory: Path) -> None:
        """The model as the engines load it: safetensors, config, and --hf-checkpoint's tokenizer files."""
        self.model.save_pretrained(str(directory), safe_serialization=True)
        src = Path(self.config.hf_checkpoint)
        for name in os.listdir(src):  # tokenizer and generation config, so the dir serves as is
            if (
                name.startswith(
                    (
                        "tokenizer",
                        "special_tokens",
                        "generation_config",
                        "vocab",
                        "merges",
                        "chat_template",
                        "preprocessor_config",
                        "processor_config",
                    )
                )
                and (src / name).is_file()
            ):
                shutil.copy(src / name, directory / name)

    def save_model(self, rollout_id: int) -> str | None:
        """Rank 0 writes `{--save}/iter_{rollout_id:07d}/` (model, optimizer.pt, trainer_state.json, the
        data state of this rollout, manifest.json last) in a staging directory, renames it into place,
        then moves `latest_checkpointed_iteration.txt`: a crash or a full disk leaves the previous
        checkpoint current (`slime.train.checkpoint`)."""
        dist.barrier()
        if self.rank != 0:
            return None
        root = self.config.save
        writer = CheckpointWriter(root, rollout_id)
        try:
            self._write_hf(writer.staging / "model")
            if not self.config.no_save_optim:
                torch.save(
                    {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()},
                    writer.staging / "optimizer.pt",
                )
            (writer.staging / "trainer_state.json").write_text(
                json.dumps({"rollout_id": rollout_id, "global_step": self.global_step})
            )
            with_data = writer.add_data_state()
            return str(
                writer.commit(self.config.hf_checkpoint, {"global_step": self.global_step, "data_state": with_data})
            )
        except Exception as e:  # noqa: BLE001 - safetensors/torch errors name neither the flag nor the path
            writer.discard()
            raise CheckpointError(
                f"--save {root}: the checkpoint of rollout {rollout_id} could not be written "
                f"({first_line(e)}); the previous checkpoint stays current"
            ) from e

    def shutdown(self) -> None:
        with contextlib.suppress(Exception):
            self.close_weight_group()
        if dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
