"""Megatron THD packing of one micro-batch: a hand-computed example, the round trip back to the
sequences (also for every micro-batch of a real per-rank batch), and megatron-core's PackedSeqParams."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from slime.train_batch.packing import PackedSeqParams, PackingError, pack_micro_batch, unpack_micro_batch
from slime.train_batch.flags import TrainBatchConfig
from slime.train_batch.rank_batches import split_for_data_parallel
from slime.utils.plugin_args import completed

A = [11, 12, 13, 14, 15]  # prompt 3, response 2
B = [21, 22, 23, 24]  # prompt 1, response 3


def test_hand_example():
    p = pack_micro_batch(
        [A, torch.tensor(B)], [2, 3], [[1, 0], [1, 1, 1]], [[-0.1, -0.2], [-1.0, -2.0, -3.0]], pad_multiple=4
    )
    assert p.tokens.tolist() == [[11, 12, 13, 14, 15, 21, 22, 23, 24, 0, 0, 0]]
    assert p.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 3, 0, 1, 2]]
    # value of response token j at the position whose logits predict it: prompt_length - 1 + j
    assert p.loss_mask.tolist() == [[0, 0, 1, 0, 0, 1, 1, 1, 0, 0, 0, 0]]
    assert p.rollout_log_probs[0].tolist() == pytest.approx([0, 0, -0.1, -0.2, 0, -1, -2, -3, 0, 0, 0, 0])
    assert p.cu_seqlens.tolist() == [0, 5, 9, 12] and p.max_seqlen == 5 and p.seq_lengths == [5, 4]
    assert (p.tokens.dtype, p.position_ids.dtype, p.loss_mask.dtype, p.rollout_log_probs.dtype) == (
        torch.int64,
        torch.int64,
        torch.int32,
        torch.float32,
    )
    assert p.tokens.shape == p.position_ids.shape == p.loss_mask.shape == (1, 12)


def test_per_sequence_padding_for_context_parallel():
    p = pack_micro_batch([A, B], [2, 3], [[1, 1], [1, 0, 1]], seq_pad_multiple=2, pad_multiple=4, pad_token_id=7)
    assert p.tokens.tolist() == [[11, 12, 13, 14, 15, 7, 21, 22, 23, 24, 7, 7]]
    assert p.position_ids.tolist() == [[0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 0, 1]]
    assert p.loss_mask.tolist() == [[0, 0, 1, 1, 0, 0, 1, 0, 1, 0, 0, 0]]
    assert p.cu_seqlens.tolist() == [0, 6, 10, 12] and p.max_seqlen == 6
    assert p.rollout_log_probs is None
    # no row padding needed: no extra segment
    assert pack_micro_batch([A, B], [2, 3], [[1, 1], [1, 1, 1]]).cu_seqlens.tolist() == [0, 5, 9]


def test_packed_seq_params_fields():
    p = pack_micro_batch([A, B], [2, 3], [[1, 0], [1, 1, 1]], pad_multiple=128)
    params = p.packed_seq_params
    assert PackedSeqParams.__module__ == "megatron.core.packed_seq_params"  # megatron-core's own type
    assert isinstance(params, PackedSeqParams) and params.qkv_format == "thd"
    assert params.cu_seqlens_q is params.cu_seqlens_kv and params.cu_seqlens_q.dtype == torch.int32
    assert params.cu_seqlens_q.tolist() == [0, 5, 9, 128]
    assert params.max_seqlen_q == params.max_seqlen_kv == 119  # the row's padding is the longest segment
    assert p.tokens.shape == (1, 128)


def test_round_trip_every_micro_batch_of_a_rank_batch():
    rng = random.Random(0)
    n = 24
    batch = {"tokens": [], "response_lengths": [], "loss_masks": [], "rollout_log_probs": [], "rollout_ids": []}
    for i in range(n):
        prompt, resp = rng.randint(1, 40), rng.randint(0, 60)
        batch["tokens"].append([rng.randrange(50_000) for _ in range(prompt + resp)])
        batch["response_lengths"].append(resp)
        batch["loss_masks"].append([rng.randint(0, 1) for _ in range(resp)])
        batch["rollout_log_probs"].append([-rng.random() for _ in range(resp)])
        batch["rollout_ids"].append(i)
    args = completed(SimpleNamespace(use_dynamic_batch_size=True, max_tokens_per_gpu=200))
    ranks, _ = split_for_data_parallel(TrainBatchConfig.from_args(args), batch, {"dp_size": 2})
    for r in ranks:
        for mb in r["micro_batch_indices"]:
            pick = {k: [r[k][i] for i in mb] for k in ("tokens", "response_lengths", "loss_masks", "rollout_log_probs")}
            p = pack_micro_batch(
                pick["tokens"],
                pick["response_lengths"],
                pick["loss_masks"],
                pick["rollout_log_probs"],
                pad_multiple=8,
                seq_pad_multiple=2,
            )
            assert p.tokens.shape[1] % 8 == 0 and int(p.loss_mask.sum()) == sum(
                int(m.sum()) for m in pick["loss_masks"]
            )
            back = unpack_micro_batch(p, pick["response_lengths"])
            for key in ("tokens", "loss_masks", "rollout_log_probs"):
                assert all(torch.equal(x, y) for x, y in zip(back[key], pick[key])), key
            for j, i in enumerate(mb):  # and the originals, through the partition
                assert back["tokens"][j].tolist() == batch["tokens"][r["partition"][i]]


def test_bad_input():
    with pytest.raises(PackingError, match="sequence 1: 4 tokens with response_length 4; packing needs a prompt"):
        pack_micro_batch([A, B], [2, 4], [[1, 1], [1, 1, 1, 1]])
    with pytest.raises(PackingError, match="sequence 0: loss_mask has 1 entries, response_length is 2"):
        pack_micro_batch([A], [2], [[1]])
    with pytest.raises(PackingError, match="2 sequences but 1 response_lengths"):
        pack_micro_batch([A, B], [2], [[1, 1]])
    with pytest.raises(PackingError, match="empty micro-batch"):
        pack_micro_batch([], [], [])
