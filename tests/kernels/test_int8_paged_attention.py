"""paged_attention_int8 (Triton, CPU interpreter) against an fp32 reference on the dequantized cache.

Tolerance. K and V enter ``tl.dot`` exactly (int8 -> bf16/fp16 is exact) and the scores
are accumulated in fp32, so the kernel differs from the fp32 reference by two roundings to
the query dtype (unit roundoff ``u``: 2^-8 for bf16, 2^-11 for fp16):

* ``P[:, n] * v_scale[n]`` is rounded before the PV product: each term ``p_n v_n`` gets a
  relative error <= u, so the output row moves by at most ``u * max|v|`` (the weights sum
  to one);
* the output itself is rounded: at most ``u * |o| <= u * max|v|``.

Hence ``|out - ref| <= 2 u max|v|`` plus fp32 noise (exp2 vs exp, summation order), far
below the bound. Rows with few keys (a 1-token sequence outputs one rounded value row) do
not average the errors out: these tests reach 0.3-0.75 of the bound, so it is tight, not
decorative.

With the Hadamard rotation the reference works in the rotated space as the kernels do (see
``attention_reference``); the PV rounding error ``sum_n eps_n p_n v_n`` rotates back to the same
form in the original space, so the bound uses ``max|v|`` of the un-rotated dequantized V. The
prefill writes its output rotated, in the query dtype, before the post pass rotates it back: that
rounding ``delta`` (``|delta_i| <= u |o_rot,i|``) reaches each output element as ``h_j . delta``,
at most ``||delta||_2 <= u ||o||_2`` (H's rows have norm 1 and keep norms), so prefill rows of a
rotated batch add ``u ||o||_2`` of their (token, head) row.
"""

import dataclasses

import pytest
import torch

from govinda_patch.kernel_package import import_kernel

layout = import_kernel("int8_kv_layout")
attention = import_kernel("int8_paged_attention")
launch_configs = import_kernel("launch_configs")
kv_rotation = import_kernel("kv_rotation")

SENTINEL = 7.0  # written into the output beforehand: rows the kernel must leave alone keep it


def unit_roundoff(dtype):
    return {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}[dtype]


class Batch:
    """A vLLM-style step: decodes first, then prefill chunks (each over an existing prefix)."""

    def __init__(
        self,
        *,
        num_q_heads,
        num_kv_heads,
        head_dim,
        block_size,
        query_lens,
        seq_lens,
        num_decodes,
        dtype=torch.bfloat16,
        extra_tokens=2,
        seed=0,
        rotation="none",
        key_outlier_channels=(),
    ):
        generator = torch.Generator().manual_seed(seed)
        self.num_q_heads, self.num_kv_heads, self.head_dim = num_q_heads, num_kv_heads, head_dim
        self.block_size, self.num_decodes, self.dtype = block_size, num_decodes, dtype
        self.query_lens, self.seq_lens = list(query_lens), list(seq_lens)
        self.rotation = rotation
        self.original_kv = {}  # seq -> (key, value) before quantization

        # Shuffled physical blocks, block 0 never used, table rows padded with block 0.
        blocks_per_seq = [-(-length // block_size) for length in self.seq_lens]
        num_blocks = sum(blocks_per_seq) + 2
        physical = torch.randperm(num_blocks - 1, generator=generator) + 1
        self.block_table = torch.zeros(len(self.seq_lens), max(blocks_per_seq + [1]) + 1, dtype=torch.int32)
        used = 0
        for row, count in enumerate(blocks_per_seq):
            self.block_table[row, :count] = physical[used : used + count]
            used += count

        # Cache: random bytes first (unwritten slots hold garbage), then every KV position written.
        shape = layout.cache_shape(num_blocks, block_size, num_kv_heads, head_dim)
        self.kv_cache = torch.randint(-128, 128, shape, dtype=torch.int8, generator=generator)
        for seq, length in enumerate(self.seq_lens):
            if length == 0:
                continue
            key = torch.randn(length, num_kv_heads, head_dim, generator=generator) * 2
            key[..., list(key_outlier_channels)] *= 20  # real K has a few large channels
            key = key.to(dtype)
            value = torch.randn(length, num_kv_heads, head_dim, generator=generator).to(dtype)
            positions = torch.arange(length)
            slots = self.block_table[seq].long()[positions // block_size] * block_size + positions % block_size
            layout.store_reference(key, value, self.kv_cache, slots, block_size, rotation=rotation)
            self.original_kv[seq] = (key, value)

        starts = [0]
        for length in self.query_lens:
            starts.append(starts[-1] + length)
        self.query_start_loc = torch.tensor(starts, dtype=torch.int32)
        self.seq_lens_tensor = torch.tensor(self.seq_lens, dtype=torch.int32)
        self.num_tokens = starts[-1] + extra_tokens  # trailing rows that belong to no sequence
        # The query is a strided view of a fused qkv tensor, as in vLLM.
        width = (num_q_heads + 2 * num_kv_heads) * head_dim
        qkv = torch.randn(self.num_tokens, width, generator=generator).to(dtype)
        self.query = qkv[:, : num_q_heads * head_dim].view(self.num_tokens, num_q_heads, head_dim)

    @property
    def softmax_scale(self):
        return self.head_dim**-0.5

    def run(self, workspace=None, output=None, configs=None):
        if output is None:
            output = torch.full((self.num_tokens, self.num_q_heads, self.head_dim), SENTINEL, dtype=self.dtype)
        attention.paged_attention_int8(
            self.query,
            self.kv_cache,
            output,
            self.query_start_loc,
            self.seq_lens_tensor,
            self.block_table,
            block_size=self.block_size,
            num_kv_heads=self.num_kv_heads,
            softmax_scale=self.softmax_scale,
            max_query_len=max(self.query_lens),
            max_seq_len=max(self.seq_lens),
            num_decodes=self.num_decodes,
            workspace=workspace,
            configs=configs,
            rotation=self.rotation,
        )
        return output

    def reference(self):
        return attention.attention_reference(
            self.query,
            self.kv_cache,
            self.query_start_loc,
            self.seq_lens_tensor,
            self.block_table,
            block_size=self.block_size,
            num_kv_heads=self.num_kv_heads,
            softmax_scale=self.softmax_scale,
            rotation=self.rotation,
        )

    def max_abs_value(self):
        """Largest dequantized |V| over the written KV positions (the rest of a page is garbage)."""
        largest = 0.0
        for seq, length in enumerate(self.seq_lens):
            if length:
                _, value = layout.gather_reference(
                    self.kv_cache, self.block_table[seq], length, self.block_size, self.num_kv_heads, self.head_dim
                )
                if self.rotation != "none":
                    value = kv_rotation.hadamard_reference(value)
                largest = max(largest, value.abs().max().item())
        return largest

    def tolerance(self):
        return 2 * unit_roundoff(self.dtype) * self.max_abs_value() + 1e-6

    def real_rows(self):
        """Row ranges of sequences that have queries and KV (the ones the kernel must write)."""
        starts = self.query_start_loc.tolist()
        return [
            (starts[seq], starts[seq + 1])
            for seq in range(len(self.seq_lens))
            if starts[seq + 1] > starts[seq] and self.seq_lens[seq] > 0
        ]


def assert_matches_reference(batch, output):
    reference = batch.reference()
    # [T, Hq, 1]: the bound, plus the rotated prefill's rounding before its post pass.
    tolerance = torch.full((batch.num_tokens, batch.num_q_heads, 1), batch.tolerance())
    if batch.rotation != "none":
        first_prefill_row = batch.query_start_loc[batch.num_decodes].item()
        rows = slice(first_prefill_row, batch.num_tokens)
        tolerance[rows] += unit_roundoff(batch.dtype) * reference[rows].norm(dim=-1, keepdim=True)
    written = torch.zeros(batch.num_tokens, dtype=torch.bool)
    for start, end in batch.real_rows():
        written[start:end] = True
        ratio = ((output[start:end].float() - reference[start:end]).abs() / tolerance[start:end]).max().item()
        assert ratio <= 1.0, f"rows {start}:{end}: max error {ratio:.3g} x the tolerance"
    assert torch.isfinite(output).all()
    # Everything else (padding sequences, tokens outside every sequence) is untouched.
    assert (output[~written] == SENTINEL).all()
    return reference


# (num_q_heads, num_kv_heads, head_dim, block_size, dtype): every GQA ratio, the three head
# sizes, block sizes 16 and non-powers-of-two (48, 80, and Qwen3.5's hybrid 1552), both query dtypes.
GEOMETRIES = [
    pytest.param(4, 4, 64, 16, torch.bfloat16, id="gqa1-d64-bs16-bf16"),
    pytest.param(4, 2, 128, 48, torch.float16, id="gqa2-d128-bs48-fp16"),
    pytest.param(8, 2, 64, 80, torch.bfloat16, id="gqa4-d64-bs80-bf16"),
    pytest.param(12, 2, 64, 48, torch.bfloat16, id="gqa6-d64-bs48-bf16"),
    pytest.param(8, 1, 128, 16, torch.float16, id="gqa8-d128-bs16-fp16"),
    pytest.param(6, 1, 256, 1552, torch.bfloat16, id="gqa6-d256-bs1552-bf16"),  # a Qwen3.5-27B KV head
]


@pytest.mark.parametrize(("num_q_heads", "num_kv_heads", "head_dim", "block_size", "dtype"), GEOMETRIES)
def test_mixed_decode_and_chunked_prefill_batch(num_q_heads, num_kv_heads, head_dim, block_size, dtype):
    # 3 decodes with ragged lengths, then: a 1-token prefill chunk, a fresh prompt, and a chunk
    # over an existing INT8 prefix whose query tiles straddle pages and the causal diagonal.
    batch = Batch(
        num_q_heads=num_q_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        block_size=block_size,
        query_lens=[1, 1, 1, 1, 37, 21],
        seq_lens=[1, 23, 130, 9, 37, 83],
        num_decodes=3,
        dtype=dtype,
        seed=num_q_heads * head_dim + block_size,
    )
    output = batch.run()
    reference = assert_matches_reference(batch, output)
    # The tolerance can tell a causal mask from none: dropping the mask moves the result by far more.
    start, end = batch.query_start_loc[4].item(), batch.query_start_loc[5].item()
    keys, values = layout.gather_reference(
        batch.kv_cache, batch.block_table[4], 37, block_size, num_kv_heads, head_dim
    )
    group = num_q_heads // num_kv_heads
    keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", batch.query[start:end].float(), keys) * batch.softmax_scale
    unmasked = torch.einsum("hqk,khd->qhd", scores.softmax(-1), values)
    assert (unmasked - reference[start:end]).abs().max().item() > 10 * batch.tolerance()


def test_head_dim_256_prefill_only():
    batch = Batch(
        num_q_heads=6,
        num_kv_heads=1,
        head_dim=256,
        block_size=48,
        query_lens=[19, 1],
        seq_lens=[50, 20],
        num_decodes=0,
        seed=256,
    )
    assert_matches_reference(batch, batch.run())


def test_padded_sequences_do_not_touch_real_rows():
    # Decodes: a real one, a CUDA-graph pad (query_len 0, seq_len 0), a query without KV
    # (seq_len 0); prefills: a real chunk, then pads. Two trailing tokens belong to no sequence.
    batch = Batch(
        num_q_heads=4,
        num_kv_heads=2,
        head_dim=64,
        block_size=16,
        query_lens=[1, 0, 1, 18, 0, 0],
        seq_lens=[40, 0, 0, 30, 0, 0],
        num_decodes=3,
        extra_tokens=3,
        seed=7,
    )
    output = batch.run()
    assert_matches_reference(batch, output)
    assert batch.real_rows() == [(0, 1), (2, 20)]


@pytest.mark.parametrize("seq_len", [20, 700], ids=["splits_exceed_tiles", "several_tiles_per_split"])
def test_single_decode_split_kv(seq_len):
    batch = Batch(
        num_q_heads=2,
        num_kv_heads=1,
        head_dim=64,
        block_size=80,
        query_lens=[1],
        seq_lens=[seq_len],
        num_decodes=1,
        seed=seq_len,
    )
    splits = attention.decode_splits_for(1, 1, batch.query.device)
    tile = launch_configs.get_launch_configs(batch.query.device).decode_config(64).block_n
    num_tiles = -(-seq_len // tile)
    if seq_len == 20:
        assert splits > num_tiles  # most splits have no work and must stay out of the result
    else:
        assert num_tiles > splits  # each split walks several tiles; the reduce loops over chunks
    assert_matches_reference(batch, batch.run())


def test_large_decode_batch_uses_one_split_and_writes_output_directly():
    num_decodes, num_kv_heads = 8, 2
    assert attention.decode_splits_for(num_decodes, num_kv_heads, torch.device("cpu")) == 1
    batch = Batch(
        num_q_heads=4,
        num_kv_heads=num_kv_heads,
        head_dim=64,
        block_size=16,
        query_lens=[1] * num_decodes,
        seq_lens=[3, 50, 17, 1, 64, 33, 90, 16],
        num_decodes=num_decodes,
        seed=11,
    )
    assert_matches_reference(batch, batch.run())


def test_preallocated_workspace_is_reused_and_checked():
    batch = Batch(
        num_q_heads=4,
        num_kv_heads=1,
        head_dim=64,
        block_size=16,
        query_lens=[1, 1, 1],
        seq_lens=[60, 5, 33],
        num_decodes=3,
        seed=3,
    )
    workspace = attention.DecodeWorkspace.allocate(8, 4, 64, torch.device("cpu"), num_kv_heads=1)
    assert_matches_reference(batch, batch.run(workspace=workspace))
    # Same workspace, new (shorter: only those KV positions were written) lengths, in the same
    # tensor, as a replayed CUDA graph sees them.
    batch.seq_lens = [45, 3, 20]
    batch.seq_lens_tensor.copy_(torch.tensor(batch.seq_lens, dtype=torch.int32))
    # Output into a strided view of a larger buffer.
    buffer = torch.full((batch.num_tokens, 4, 2 * 64), SENTINEL, dtype=batch.dtype)
    output = buffer[:, :, :64]
    batch.run(workspace=workspace, output=output)
    assert_matches_reference(batch, output)
    assert (buffer[:, :, 64:] == SENTINEL).all()

    # One (decode, split) entry short of what this batch needs.
    needed = 3 * attention.decode_splits_for(3, 1, torch.device("cpu"))
    too_small = attention.DecodeWorkspace.with_entries(needed - 1, 4, 64, torch.device("cpu"))
    with pytest.raises(ValueError, match="workspace"):
        batch.run(workspace=too_small)


@pytest.mark.parametrize("rotation", ["none", "hadamard"])
@pytest.mark.parametrize(
    "d_slice,num_stages", [(0, 1), (32, 1), (16, 1), (16, 2)], ids=["whole_head", "two_slices", "four_slices", "pipelined"]
)
def test_decode_loop_variants_match_reference(d_slice, num_stages, rotation):
    """Every decode form the launch tables and the tuner may pick (head_dim in 1, 2 or 4
    slices, the software-pipelined tile loop), unrotated and rotated: splits with one tile,
    several tiles, a split whose range ends mid-sequence, and splits past the last tile."""
    table = launch_configs.ARCH_TABLES["interpreter"]
    decode = {d: dataclasses.replace(c, d_slice=d_slice, num_stages=num_stages) for d, c in table.decode.items()}
    configs = dataclasses.replace(table, decode=decode)  # passed to the launch: the table stays as it is
    # Rotated decodes run the same sliced kernel (the query is rotated before it).
    assert attention.decode_slice(64, configs.decode_config(64)) == (d_slice or 64)
    batch = Batch(
        num_q_heads=6,
        num_kv_heads=2,
        head_dim=64,
        block_size=48,
        query_lens=[1, 1, 1, 5],
        seq_lens=[700, 20, 97, 40],
        num_decodes=3,
        seed=21,
        rotation=rotation,
    )
    assert_matches_reference(batch, batch.run(configs=configs))


def test_decode_slice_stays_within_the_kernels_bounds():
    config = launch_configs.KernelConfig
    assert attention.decode_slice(256, config(d_slice=64)) == 64
    assert attention.decode_slice(256, config(d_slice=16)) == 64  # at most four slices
    assert attention.decode_slice(256, config(d_slice=0)) == 256
    assert attention.decode_slice(128, config(d_slice=256)) == 128
    assert attention.decode_slice(128, config(d_slice=48)) == 128  # not a divisor: the whole head
    assert attention.decode_slice(16, config(d_slice=64)) == 16
    assert attention.decode_slice(64, config(d_slice=32)) == 32


def test_split_policy_fills_the_gpu_and_can_differ_for_batched_steps():
    policy = launch_configs.DecodeSplitPolicy(programs_per_sm=2, max_splits=256, batched_programs_per_sm=4)
    sms, kv_heads = 132, 4
    single = launch_configs.decode_num_splits(1, kv_heads, sms, policy)
    batched = launch_configs.decode_num_splits(8, kv_heads, sms, policy)
    # As many programs as fit at once, never one more (a partial second wave).
    assert single * kv_heads <= 2 * sms < (single + 1) * kv_heads
    assert batched * 8 * kv_heads <= 4 * sms < (batched + 1) * 8 * kv_heads
    same = launch_configs.DecodeSplitPolicy(programs_per_sm=2, max_splits=256)
    assert launch_configs.decode_num_splits(8, kv_heads, sms, same) < batched
    capped = launch_configs.DecodeSplitPolicy(programs_per_sm=64, max_splits=16)
    assert launch_configs.decode_num_splits(1, 1, sms, capped) == 16
    assert launch_configs.decode_num_splits(10_000, kv_heads, sms, policy) == 1


# Rotated cache: the three head sizes, GQA ratios 1/3/6, a split-KV decode (several tiles per
# split and an empty split), a single-split decode batch, and prefill chunks over a prefix.
ROTATED_CASES = [
    pytest.param(4, 4, 64, 16, torch.bfloat16, [1, 1, 9, 30], [300, 5, 9, 61], id="gqa1-d64-bs16-bf16"),
    pytest.param(6, 2, 128, 48, torch.float16, [1, 1, 1, 17], [130, 23, 1, 50], id="gqa3-d128-bs48-fp16"),
    pytest.param(6, 1, 256, 80, torch.bfloat16, [1, 12], [90, 40], id="gqa6-d256-bs80-bf16"),
]


@pytest.mark.parametrize(
    ("num_q_heads", "num_kv_heads", "head_dim", "block_size", "dtype", "query_lens", "seq_lens"), ROTATED_CASES
)
def test_rotated_cache_matches_reference(num_q_heads, num_kv_heads, head_dim, block_size, dtype, query_lens, seq_lens):
    num_decodes = sum(1 for length in query_lens if length == 1)
    batch = Batch(
        num_q_heads=num_q_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        block_size=block_size,
        query_lens=query_lens,
        seq_lens=seq_lens,
        num_decodes=num_decodes,
        dtype=dtype,
        seed=head_dim + 1,
        rotation="hadamard",
    )
    output = batch.run()
    reference = assert_matches_reference(batch, output)
    # The same bytes read without rotating q and o back give a different answer: the kernel
    # really rotated (the tolerance is far below the gap).
    plain = attention.attention_reference(
        batch.query, batch.kv_cache, batch.query_start_loc, batch.seq_lens_tensor, batch.block_table,
        block_size=block_size, num_kv_heads=num_kv_heads, softmax_scale=batch.softmax_scale,
    )
    start, end = batch.real_rows()[0]
    assert (plain[start:end] - reference[start:end]).abs().max().item() > 10 * batch.tolerance()


@pytest.mark.parametrize("reduce_form", ["whole_rows", "row_slices"])
@pytest.mark.parametrize("max_splits", [1, None], ids=["one_split", "split_kv"])
def test_rotated_decodes_reuse_a_kept_workspace_and_leave_its_row_counts_zero(max_splits, reduce_form, monkeypatch):
    # A rotated decode always takes the reduce kernel, which rotates each output row: in one
    # program per row, or (past WHOLE_ROW_REDUCE_ELEMENTS) in the last of the row's head-dim
    # slices to finish, after an atomic count per row. A pad, a decode without KV, then three
    # real decodes; the same workspace twice, as replays of a captured graph use it.
    monkeypatch.setattr(attention, "WHOLE_ROW_REDUCE_ELEMENTS", 1 << 30 if reduce_form == "whole_rows" else 0)
    batch = Batch(
        num_q_heads=6, num_kv_heads=2, head_dim=128, block_size=16, query_lens=[1, 0, 1, 1, 1, 9],
        seq_lens=[70, 0, 0, 33, 140, 20], num_decodes=5, extra_tokens=2, seed=129, rotation="hadamard",
    )
    configs = launch_configs.get_launch_configs(batch.query.device)
    if max_splits is not None:
        configs = dataclasses.replace(configs, decode_splits=dataclasses.replace(configs.decode_splits, max_splits=max_splits))
    workspace = attention.DecodeWorkspace.allocate(8, 6, 128, torch.device("cpu"), num_kv_heads=2, configs=configs)
    for _ in range(2):
        assert_matches_reference(batch, batch.run(workspace=workspace, configs=configs))
        assert (workspace.row_count == 0).all()


def fp32_attention_on_original_kv(batch):
    """Causal fp32 attention on the K/V before quantization (no cache involved)."""
    group = batch.num_q_heads // batch.num_kv_heads
    starts = batch.query_start_loc.tolist()
    out = torch.zeros(batch.num_tokens, batch.num_q_heads, batch.head_dim)
    for seq, (key, value) in batch.original_kv.items():
        start, end = starts[seq], starts[seq + 1]
        seq_len, query_len = batch.seq_lens[seq], end - start
        keys, values = key.float().repeat_interleave(group, 1), value.float().repeat_interleave(group, 1)
        scores = torch.einsum("qhd,khd->hqk", batch.query[start:end].float(), keys) * batch.softmax_scale
        visible = torch.arange(seq_len)[None, :] <= torch.arange(seq_len - query_len, seq_len)[:, None]
        probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
        out[start:end] = torch.einsum("hqk,khd->qhd", probs, values)
    return out


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_rotation_cuts_the_error_against_fp32_attention_on_the_original_kv(head_dim):
    """K with a few large channels (as after RoPE in real models): per-row absmax INT8 wastes its
    range on them unless the rows are rotated first. Compared with fp32 attention on the
    unquantized K/V, the rotated cache must be clearly closer than the plain INT8 cache."""
    errors = {}
    for rotation_name in ("none", "hadamard"):
        batch = Batch(
            num_q_heads=4,
            num_kv_heads=2,
            head_dim=head_dim,
            block_size=48,
            query_lens=[1, 1, 20],
            seq_lens=[150, 60, 70],
            num_decodes=2,
            dtype=torch.float16,
            seed=head_dim,
            rotation=rotation_name,
            key_outlier_channels=(3, head_dim // 2 + 5),
        )
        output = batch.run()
        assert_matches_reference(batch, output)
        truth = fp32_attention_on_original_kv(batch)
        rows = torch.zeros(batch.num_tokens, dtype=torch.bool)
        for start, end in batch.real_rows():
            rows[start:end] = True
        errors[rotation_name] = (output[rows].float() - truth[rows]).abs().mean().item()
    assert errors["hadamard"] < 0.7 * errors["none"], errors
