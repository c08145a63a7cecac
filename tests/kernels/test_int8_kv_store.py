"""store_kv_int8 (Triton, CPU interpreter) must write exactly the bytes of the torch reference."""

import pytest
import torch

from govinda_patch.kernel_package import import_kernel

layout = import_kernel("int8_kv_layout")
store = import_kernel("int8_kv_store")
launch_configs = import_kernel("launch_configs")
# Tokens per program: one (the GPU tables) and several (the interpreter's table; 29 tokens leave
# a partial last program).
ROWS = {"one_row": launch_configs.KernelConfig(block_m=1, num_warps=1),
        "eight_rows": launch_configs.KernelConfig(block_m=8, num_warps=1)}


def fused_qkv_views(num_tokens, num_kv_heads, head_dim, dtype, generator, scale=3.0):
    """K and V as vLLM hands them over: strided slices of one fused qkv projection output."""
    width = (2 + 2 * num_kv_heads) * head_dim + 8  # a q part, k, v, and padding: token stride != H*D
    qkv = (torch.randn(num_tokens, width, generator=generator) * scale).to(dtype)
    start = 2 * head_dim
    key = qkv[:, start : start + num_kv_heads * head_dim].view(num_tokens, num_kv_heads, head_dim)
    start += num_kv_heads * head_dim
    value = qkv[:, start : start + num_kv_heads * head_dim].view(num_tokens, num_kv_heads, head_dim)
    assert not key.is_contiguous() and not value.is_contiguous()
    return key, value


def random_cache(num_blocks, block_size, num_kv_heads, head_dim, generator):
    """Random bytes everywhere, so a write to the wrong place (or a missing write) shows."""
    shape = layout.cache_shape(num_blocks, block_size, num_kv_heads, head_dim)
    return torch.randint(-128, 128, shape, dtype=torch.int8, generator=generator)


def store_both(key, value, cache, slot_mapping, block_size, config=None):
    """Run the kernel and the reference on copies of ``cache``; return both results."""
    ours, expected = cache.clone(), cache.clone()
    store.store_kv_int8(key, value, ours, slot_mapping, block_size=block_size, config=config)
    num_tokens = min(key.shape[0], slot_mapping.shape[0])
    layout.store_reference(key[:num_tokens], value[:num_tokens], expected, slot_mapping[:num_tokens], block_size)
    return ours, expected


@pytest.mark.parametrize("rows", sorted(ROWS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize(("head_dim", "block_size"), [(64, 16), (128, 48), (256, 80)], ids=lambda v: str(v))
def test_store_is_bit_exact(dtype, head_dim, block_size, rows):
    generator = torch.Generator().manual_seed(head_dim + block_size)
    num_tokens, num_kv_heads = 29, 3
    key, value = fused_qkv_views(num_tokens, num_kv_heads, head_dim, dtype, generator)
    key[4] = 0.0  # all-zero row: the scale floor
    value[9, 1] *= 1000.0  # one very large row
    num_blocks = -(-num_tokens // block_size) + 3
    cache = random_cache(num_blocks, block_size, num_kv_heads, head_dim, generator)
    slot_mapping = torch.randperm(num_blocks * block_size, generator=generator)[:num_tokens]
    slot_mapping[[0, 11, 28]] = -1  # padding
    ours, expected = store_both(key, value, cache, slot_mapping, block_size, ROWS[rows])
    assert torch.equal(ours, expected)
    # The padded tokens' rows, and all slots not mapped, kept their random bytes.
    assert not torch.equal(ours, cache)


@pytest.mark.parametrize("num_slots", [17, 40], ids=["fewer_slots", "more_slots"])
def test_store_processes_min_of_tokens_and_slots_with_int32_slots(num_slots):
    generator = torch.Generator().manual_seed(num_slots)
    num_tokens, num_kv_heads, head_dim, block_size = 24, 2, 64, 16
    key, value = fused_qkv_views(num_tokens, num_kv_heads, head_dim, torch.bfloat16, generator)
    num_blocks = 5
    cache = random_cache(num_blocks, block_size, num_kv_heads, head_dim, generator)
    slot_mapping = torch.randperm(num_blocks * block_size, generator=generator)[:num_slots].to(torch.int32)
    ours, expected = store_both(key, value, cache, slot_mapping, block_size)
    assert torch.equal(ours, expected)


def test_store_rounds_half_to_even_and_floors_the_scale():
    """Checked against hand-computed values, not only against the reference."""
    head_dim, block_size = 64, 16
    row = torch.zeros(head_dim)
    # absmax 127 -> scale exactly 1.0, so these values are the exact quotients.
    ties = [127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, 3.25, -3.75]
    row[: len(ties)] = torch.tensor(ties)
    key = torch.stack([row, torch.zeros(head_dim)]).view(2, 1, head_dim).to(torch.bfloat16)
    value = key.flip(0).clone()
    cache = torch.zeros(layout.cache_shape(1, block_size, 1, head_dim), dtype=torch.int8)
    store.store_kv_int8(key, value, cache, torch.tensor([3, 7]), block_size=block_size)
    with pytest.raises(ValueError, match="block_m"):  # tokens per program: a power of two
        store.store_kv_int8(key, value, cache.clone(), torch.tensor([3, 7]), block_size=block_size,
                            config=launch_configs.KernelConfig(block_m=3))

    views = layout.split_cache(cache, block_size, 1, head_dim)
    expected_q = [127, 0, 2, 2, 0, -2, -2, 126, 3, -4]
    assert views.k_data[0, 0, 3, : len(ties)].tolist() == expected_q
    assert views.k_scale[0, 0, 3].item() == 1.0
    assert views.v_data[0, 0, 7, : len(ties)].tolist() == expected_q
    # The all-zero rows: scale floor, zero data.
    assert views.k_scale[0, 0, 7].item() == pytest.approx(layout.SCALE_FLOOR)
    assert views.v_scale[0, 0, 3].item() == pytest.approx(layout.SCALE_FLOOR)
    assert not views.k_data[0, 0, 7].any() and not views.v_data[0, 0, 3].any()
