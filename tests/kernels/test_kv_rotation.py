"""The Hadamard rotation (kernels/kv_rotation.py): its Triton butterfly against the torch
reference, the reference against the matrix, and the rotated store kernel bit for bit."""

import pytest
import torch
import triton
import triton.language as tl

from govinda_patch.kernel_package import import_kernel

layout = import_kernel("int8_kv_layout")
store = import_kernel("int8_kv_store")
kv_rotation = import_kernel("kv_rotation")


@triton.jit
def _rotate_rows_kernel(x_ptr, y_ptr, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, LOG2: tl.constexpr, NORM: tl.constexpr):
    offsets = tl.arange(0, ROWS)[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    tl.store(y_ptr + offsets, kv_rotation.hadamard_rows(tl.load(x_ptr + offsets), ROWS, HEAD_DIM, LOG2, NORM))


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_triton_butterfly_is_bit_exact_against_the_reference(head_dim):
    x = torch.randn(16, head_dim, generator=torch.Generator().manual_seed(head_dim)) * 5
    y = torch.empty_like(x)
    _rotate_rows_kernel[(1,)](
        x, y, ROWS=16, HEAD_DIM=head_dim, LOG2=kv_rotation.log2_exact(head_dim), NORM=kv_rotation.normalizer(head_dim)
    )
    assert torch.equal(y, kv_rotation.hadamard_reference(x))


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_reference_is_the_orthonormal_sylvester_hadamard_matrix(head_dim):
    matrix = kv_rotation.hadamard_matrix(head_dim, dtype=torch.float64)
    entries = matrix.abs() * head_dim**0.5
    torch.testing.assert_close(entries, torch.ones_like(entries))
    torch.testing.assert_close(matrix, matrix.T)
    torch.testing.assert_close(matrix @ matrix, torch.eye(head_dim, dtype=torch.float64))
    # Sylvester order: H_2n = [[H_n, H_n], [H_n, -H_n]].
    half = kv_rotation.hadamard_matrix(head_dim // 2, dtype=torch.float64) / 2**0.5
    torch.testing.assert_close(matrix[: head_dim // 2, head_dim // 2 :], half)
    torch.testing.assert_close(matrix[head_dim // 2 :, head_dim // 2 :], -half)
    x = torch.randn(5, 3, head_dim, dtype=torch.float32)
    torch.testing.assert_close(kv_rotation.hadamard_reference(x).double(), x.double() @ matrix, atol=1e-5, rtol=1e-5)
    # Its own inverse.
    torch.testing.assert_close(kv_rotation.hadamard_reference(kv_rotation.hadamard_reference(x)), x, atol=1e-5, rtol=1e-5)


def test_unknown_rotation_and_odd_head_dim_are_clear_errors():
    with pytest.raises(ValueError, match="unknown KV rotation"):
        kv_rotation.check_rotation("givens")
    with pytest.raises(ValueError, match="power-of-two"):
        kv_rotation.log2_exact(96)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize(("head_dim", "block_size"), [(64, 16), (128, 48), (256, 80)], ids=lambda v: str(v))
def test_rotated_store_is_bit_exact_against_rotate_then_quantize(dtype, head_dim, block_size):
    generator = torch.Generator().manual_seed(head_dim * 7 + block_size)
    num_tokens, num_kv_heads = 13, 2
    # Strided K/V views (a token stride larger than H * D), as vLLM hands them over.
    fused = (torch.randn(num_tokens, 2, num_kv_heads, head_dim + 8, generator=generator) * 3).to(dtype)
    key, value = fused[:, 0, :, :head_dim], fused[:, 1, :, :head_dim]
    key[:, :, 3] *= 30  # an outlier channel
    key[4] = 0.0  # all-zero row: the scale floor
    num_blocks = -(-num_tokens // block_size) + 2
    cache = torch.randint(-128, 128, layout.cache_shape(num_blocks, block_size, num_kv_heads, head_dim), dtype=torch.int8, generator=generator)
    slot_mapping = torch.randperm(num_blocks * block_size, generator=generator)[:num_tokens]
    slot_mapping[[0, 7]] = -1
    ours, expected, plain = cache.clone(), cache.clone(), cache.clone()
    store.store_kv_int8(key, value, ours, slot_mapping, block_size=block_size, rotation="hadamard")
    layout.store_reference(key, value, expected, slot_mapping, block_size, rotation="hadamard")
    layout.store_reference(key, value, plain, slot_mapping, block_size)
    assert torch.equal(ours, expected)
    assert not torch.equal(ours, plain)
    # What the page holds is the quantized rotated row: rotating it back recovers the input
    # more closely than the plain format does (the outlier channel no longer sets every step).
    positions = torch.arange(num_blocks * block_size)
    table = torch.arange(num_blocks, dtype=torch.int32)
    rotated_k, _ = layout.gather_reference(ours, table, num_blocks * block_size, block_size, num_kv_heads, head_dim)
    plain_k, _ = layout.gather_reference(plain, table, num_blocks * block_size, block_size, num_kv_heads, head_dim)
    rows = slot_mapping[slot_mapping >= 0].long()
    truth = key[slot_mapping >= 0].float()
    rotated_error = (kv_rotation.hadamard_reference(rotated_k[positions[rows]]) - truth).norm()
    plain_error = (plain_k[positions[rows]] - truth).norm()
    assert rotated_error < 0.5 * plain_error


@pytest.mark.parametrize(("head_dim", "dtype"), [(64, torch.bfloat16), (128, torch.float16), (256, torch.bfloat16)], ids=lambda v: str(v))
def test_token_row_pass_rotates_only_the_prefill_rows(head_dim, dtype):
    """The rotated prefill's pre/post pass: tokens query_start_loc[first]..query_start_loc[last]
    rotated (fp32, one rounding), from a strided view or in place; every other row untouched.
    fp16 is bit-exact; the CPU interpreter casts fp32 to bf16 by truncation (the GPU rounds to
    nearest), so bf16 rows are checked to within one unit in the last place of the fp32 result."""
    generator = torch.Generator().manual_seed(head_dim)
    num_tokens, num_heads = 19, 3
    fused = (torch.randn(num_tokens, num_heads, head_dim + 8, generator=generator) * 4).to(dtype)
    src = fused[:, :, :head_dim]  # strided, as vLLM's query views are
    query_start_loc = torch.tensor([0, 1, 2, 9, 16], dtype=torch.int32)  # 2 decodes, then 2 prefills
    first, last = 2, 4  # rows 2..15; rows 16..18 are outside every sequence
    exact = kv_rotation.hadamard_reference(src[2:16])

    def assert_rounded(rows):
        if dtype == torch.float16:
            assert torch.equal(rows, exact.to(dtype))
        else:
            assert ((rows.float() - exact).abs() <= 2.0**-7 * exact.abs()).all()

    dst = torch.full((num_tokens, num_heads, head_dim), 7.0, dtype=dtype)
    kv_rotation.rotate_token_rows(src, dst, query_start_loc, first, last)
    assert_rounded(dst[2:16])
    assert (dst[:2] == 7.0).all() and (dst[16:] == 7.0).all()
    in_place = src.clone()
    kv_rotation.rotate_token_rows(in_place, in_place, query_start_loc, first, last)
    assert_rounded(in_place[2:16])
    assert torch.equal(in_place[:2], src[:2]) and torch.equal(in_place[16:], src[16:])


@pytest.mark.parametrize(("head_dim", "dtype", "num_heads"), [(64, torch.bfloat16, 3), (128, torch.float16, 40), (256, torch.float16, 24)], ids=lambda v: str(v))
def test_decode_row_pass_rotates_only_the_decodes_the_kernels_serve(head_dim, dtype, num_heads):
    """The rotated decode's query pass: the token of each of the first num_decodes sequences
    with query length 1 and KV (seq_len > 0) rotated (fp32, one rounding), from a strided view
    or into another buffer; a padding entry (query length 0), a decode without KV, the
    prefill's rows and rows outside every sequence stay untouched. More heads than one program
    holds (40 at D=128, 24 at D=256) take several programs per decode."""
    generator = torch.Generator().manual_seed(head_dim + num_heads)
    num_tokens = 12
    fused = (torch.randn(num_tokens, num_heads, head_dim + 8, generator=generator) * 4).to(dtype)
    src = fused[:, :, :head_dim]
    # decodes: token 0 (KV), a pad, token 1 (no KV), token 2 (KV); then a prefill of rows 3..9
    query_start_loc = torch.tensor([0, 1, 1, 2, 3, 10], dtype=torch.int32)
    seq_lens = torch.tensor([40, 0, 0, 17, 30], dtype=torch.int32)
    rotated = [0, 2]
    exact = kv_rotation.hadamard_reference(src[rotated])

    def assert_rounded(rows):
        if dtype == torch.float16:
            assert torch.equal(rows, exact.to(dtype))
        else:  # the CPU interpreter truncates fp32 to bf16 (see the prefill pass's test)
            assert ((rows.float() - exact).abs() <= 2.0**-7 * exact.abs()).all()

    untouched = [row for row in range(num_tokens) if row not in rotated]
    dst = torch.full((num_tokens, num_heads, head_dim), 7.0, dtype=dtype)
    kv_rotation.rotate_decode_rows(src, dst, query_start_loc, seq_lens, 4)
    assert_rounded(dst[rotated])
    assert (dst[untouched] == 7.0).all()
    in_place = src.clone()
    kv_rotation.rotate_decode_rows(in_place, in_place, query_start_loc, seq_lens, 4)
    assert_rounded(in_place[rotated])
    assert torch.equal(in_place[untouched], src[untouched])
