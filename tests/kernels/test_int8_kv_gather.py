"""Gather-dequantize (Triton, CPU interpreter) against its torch reference, and the prefill path
that feeds it to a bf16 varlen kernel (``paged_attention_int8(gathered_prefill=...)``).

The gather is bit-exact: both sides compute ``q * scale`` in fp32 (one IEEE multiply), the same
fp32 Hadamard butterfly when rotated, and one round-to-nearest-even to bf16/fp16.
"""

import pytest
import torch

from govinda_patch.kernel_package import import_kernel
from test_int8_paged_attention import SENTINEL, Batch, unit_roundoff

gather = import_kernel("int8_kv_gather")
attention = import_kernel("int8_paged_attention")
launch_configs = import_kernel("launch_configs")


def cu_seqlens(lengths):
    out = [0]
    for length in lengths:
        out.append(out[-1] + length)
    return torch.tensor(out, dtype=torch.int32)


@pytest.mark.parametrize("rotation", ["none", "hadamard"])
@pytest.mark.parametrize(
    ("head_dim", "block_size", "dtype"),
    [
        pytest.param(64, 16, torch.bfloat16, id="d64-bs16-bf16"),
        pytest.param(128, 48, torch.float16, id="d128-bs48-fp16"),
        pytest.param(256, 80, torch.bfloat16, id="d256-bs80-bf16"),
    ],
)
def test_gather_is_bit_exact_against_the_reference(head_dim, block_size, dtype, rotation):
    # A sequence shorter than a tile, one spanning pages, and an empty one.
    seq_lens = [5, 2 * block_size + 7, 0]
    batch = Batch(
        num_q_heads=2, num_kv_heads=2, head_dim=head_dim, block_size=block_size, query_lens=[1, 3, 0],
        seq_lens=seq_lens, num_decodes=1, dtype=dtype, rotation=rotation,
    )
    total = sum(seq_lens)
    # One spare row on each side of the real ones: the kernel must not write there.
    keys = torch.full((total + 1, 2, head_dim), SENTINEL, dtype=dtype)
    values = torch.full_like(keys, SENTINEL)
    gather.gather_kv_int8(
        batch.kv_cache, batch.block_table, batch.seq_lens_tensor, cu_seqlens(seq_lens), keys, values,
        block_size=block_size, num_kv_heads=2, max_seqlen_k=max(seq_lens), rotation=rotation,
        block_t=launch_configs.ARCH_TABLES["interpreter"].gather.block_n,
    )
    ref_k, ref_v = gather.gather_kv_reference(
        batch.kv_cache, batch.block_table, seq_lens, block_size=block_size, num_kv_heads=2, head_dim=head_dim,
        dtype=dtype, rotation=rotation,
    )
    assert torch.equal(keys[:total], ref_k)
    assert torch.equal(values[:total], ref_v)
    assert (keys[total:] == SENTINEL).all() and (values[total:] == SENTINEL).all()
    if rotation == "hadamard":  # de-rotated: close to what was stored, not to the rotated rows
        original_k, _ = batch.original_kv[1]
        error = (ref_k[5:].float() - original_k.float()).abs().max().item()
        assert error < 0.05 * original_k.float().abs().max().item()


def test_gather_from_a_later_row_of_the_batch():
    # The prefills follow the decodes: rows first_seq.. of the batch's own seq_lens / block table
    # (passed whole, so the kernel's pointer specialization does not depend on the decode count).
    seq_lens = [9, 3, 40, 17]
    batch = Batch(
        num_q_heads=2, num_kv_heads=2, head_dim=64, block_size=16, query_lens=[1, 1, 1, 5],
        seq_lens=seq_lens, num_decodes=3, dtype=torch.bfloat16,
    )
    for first_seq in (1, 3):
        gathered = seq_lens[first_seq:]
        keys = torch.full((sum(gathered), 2, 64), SENTINEL, dtype=torch.bfloat16)
        values = torch.full_like(keys, SENTINEL)
        gather.gather_kv_int8(
            batch.kv_cache, batch.block_table, batch.seq_lens_tensor, cu_seqlens(gathered), keys, values,
            block_size=16, num_kv_heads=2, max_seqlen_k=max(gathered), first_seq=first_seq,
            block_t=launch_configs.ARCH_TABLES["interpreter"].gather.block_n,
        )
        ref_k, ref_v = gather.gather_kv_reference(
            batch.kv_cache, batch.block_table[first_seq:], gathered, block_size=16, num_kv_heads=2, head_dim=64,
            dtype=torch.bfloat16,
        )
        assert torch.equal(keys, ref_k) and torch.equal(values, ref_v)
    with pytest.raises(ValueError, match="first_seq"):
        gather.gather_kv_int8(
            batch.kv_cache, batch.block_table[:2], batch.seq_lens_tensor, cu_seqlens(seq_lens[1:]), keys, values,
            block_size=16, num_kv_heads=2, max_seqlen_k=40, first_seq=1,
        )


def test_gather_rejects_mismatched_outputs():
    batch = Batch(num_q_heads=2, num_kv_heads=2, head_dim=64, block_size=16, query_lens=[2], seq_lens=[4], num_decodes=0)
    keys = torch.empty((4, 2, 64), dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="one shape"):
        gather.gather_kv_int8(
            batch.kv_cache, batch.block_table, batch.seq_lens_tensor, cu_seqlens([4]), keys, keys[:3].clone(),
            block_size=16, num_kv_heads=2, max_seqlen_k=4,
        )
    with pytest.raises(ValueError, match="bf16 or fp16"):
        gather.gather_kv_int8(
            batch.kv_cache, batch.block_table, batch.seq_lens_tensor, cu_seqlens([4]), keys.float(), keys.float(),
            block_size=16, num_kv_heads=2, max_seqlen_k=4,
        )


def varlen_reference(calls):
    """The torch varlen reference, recording its inputs."""

    def varlen(q, k, v, out, cu_q, cu_k, max_q, max_k, scale):
        calls.append((q.shape[0], k.shape[0], max_q, max_k))
        gather.varlen_attention_reference(q, k, v, out, cu_q, cu_k, max_q, max_k, scale)

    return varlen


def plan_for(batch, varlen):
    """What the metadata builder computes on the host (govinda_patch/int8/backend.py)."""
    lens = batch.seq_lens[batch.num_decodes :]
    starts = batch.query_start_loc.tolist()
    query_lens = [b - a for a, b in zip(starts[batch.num_decodes :], starts[batch.num_decodes + 1 :])]
    return attention.GatheredPrefill(
        varlen_attention=varlen,
        cu_seqlens_k=cu_seqlens(lens),
        total_k=sum(lens),
        max_seqlen_k=max(lens),
        max_seqlen_q=max(query_lens),
        num_prefill_tokens=sum(query_lens),
    )


@pytest.mark.parametrize("rotation", ["none", "hadamard"])
def test_gathered_prefill_matches_the_reference_and_leaves_decodes_to_the_int8_kernel(rotation):
    # Two decodes, a chunk over a prefix, a fresh prompt and a CUDA-graph padding row.
    batch = Batch(
        num_q_heads=4, num_kv_heads=2, head_dim=64, block_size=48, query_lens=[1, 1, 7, 5, 0],
        seq_lens=[30, 61, 70, 5, 0], num_decodes=2, rotation=rotation,
    )
    calls = []
    plan = plan_for(batch, varlen_reference(calls))
    output = torch.full((batch.num_tokens, 4, 64), SENTINEL, dtype=batch.dtype)
    attention.paged_attention_int8(
        batch.query, batch.kv_cache, output, batch.query_start_loc, batch.seq_lens_tensor, batch.block_table,
        block_size=48, num_kv_heads=2, softmax_scale=batch.softmax_scale, max_query_len=7, max_seq_len=70,
        num_decodes=2, rotation=rotation, gathered_prefill=plan,
    )
    assert calls == [(12, 75, 7, 70)]  # the prefills' query rows and whole contexts, once
    reference = batch.reference()
    # The gathered K/V are rounded to bf16 once more than the reference's: K moves each score by
    # <= u |q| |k| scale, V each output by <= u max|v|.
    u = unit_roundoff(batch.dtype)
    max_q = batch.query[:14].float().abs().amax(dim=-1).norm().item()
    tolerance = 3 * u * batch.max_abs_value() + 2 * u * max_q * 10 * batch.softmax_scale
    error = (output[:14].float() - reference[:14]).abs().max().item()
    assert error <= tolerance, f"max error {error:.3g} > {tolerance:.3g}"
    # The decode rows came from the INT8 decode kernel; padding and trailing rows are untouched.
    assert (output[14:] == SENTINEL).all()
    triton_output = batch.run()
    assert torch.equal(output[:2], triton_output[:2])
