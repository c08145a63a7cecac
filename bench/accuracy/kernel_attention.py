"""SmolLM2's attention through Govinda's Triton kernels, for the CPU accuracy gate.

Every attention layer of a transformers Llama model hands its post-RoPE K/V to
``store_kv_int8`` (a fresh paged INT8 cache per layer and call) and its query to
``paged_attention_int8`` (one prefill sequence), exactly the calls vLLM's worker makes; the
kernels run under ``TRITON_INTERPRET=1`` on the CPU. The kernels take fp16/bf16, so q/k/v are
rounded to fp16 on the way in (far below the INT8 error). The window is scored in one forward
pass without a transformers cache (``use_cache=False``), so the current tokens are read back
from the INT8 cache as in vLLM's prefill.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools

import torch
from transformers import AttentionInterface

from govinda_patch.kernel_package import import_kernel

_layout = import_kernel("int8_kv_layout")
_store = import_kernel("int8_kv_store")
_attention = import_kernel("int8_paged_attention")
_launch_configs = import_kernel("launch_configs")

BLOCK_SIZE = 64
KERNEL_DTYPE = torch.float16
_NAME = "govinda_int8_kernels"


@functools.lru_cache(maxsize=None)
def launch_configs():
    """The interpreter's table with 64-wide prefill tiles (the GPU tables' KV tile) and 64 tokens
    per store program. The interpreter runs each program in Python, so its table's 16-wide test
    tiles cost about 6x here; tests/kernels checks those against the references."""
    base = _launch_configs.get_launch_configs(torch.device("cpu"))
    tile = _launch_configs.KernelConfig(block_m=64, block_n=BLOCK_SIZE, num_warps=4, num_stages=1)
    return dataclasses.replace(base, prefill={head_dim: tile for head_dim in base.prefill},
                               store=dataclasses.replace(base.store, block_m=64))


def _kernel_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """``query [1, Hq, T, D]``, ``key``/``value`` ``[1, Hkv, T, D]`` -> ``([1, T, Hq, D], None)``."""
    if query.shape[0] != 1:
        raise ValueError("the kernel attention path scores one sequence at a time")
    rotation = module.config.govinda_kv_rotation
    num_tokens, num_kv_heads, head_dim = query.shape[2], key.shape[1], key.shape[3]
    q = query[0].transpose(0, 1).to(KERNEL_DTYPE)  # [T, Hq, D]
    k = key[0].transpose(0, 1).to(KERNEL_DTYPE)
    v = value[0].transpose(0, 1).to(KERNEL_DTYPE)
    num_blocks = -(-num_tokens // BLOCK_SIZE)
    cache = torch.zeros(_layout.cache_shape(num_blocks, BLOCK_SIZE, num_kv_heads, head_dim), dtype=torch.int8)
    configs = launch_configs()
    _store.store_kv_int8(k, v, cache, torch.arange(num_tokens), block_size=BLOCK_SIZE, config=configs.store,
                         rotation=rotation)
    output = torch.empty_like(q)
    _attention.paged_attention_int8(
        q,
        cache,
        output,
        torch.tensor([0, num_tokens], dtype=torch.int32),
        torch.tensor([num_tokens], dtype=torch.int32),
        torch.arange(num_blocks, dtype=torch.int32)[None],
        block_size=BLOCK_SIZE,
        num_kv_heads=num_kv_heads,
        softmax_scale=scaling,
        max_query_len=num_tokens,
        max_seq_len=num_tokens,
        num_decodes=0,
        rotation=rotation,
        configs=configs,
    )
    return output.to(query.dtype)[None], None


AttentionInterface.register(_NAME, _kernel_attention)


@contextlib.contextmanager
def kernels_as_attention(model, rotation: str):
    """Inside the block, the model's attention layers run our kernels with ``rotation``."""
    config = model.config
    previous = config._attn_implementation
    config.govinda_kv_rotation = rotation
    config._attn_implementation = _NAME
    try:
        yield
    finally:
        config._attn_implementation = previous
        del config.govinda_kv_rotation


@torch.no_grad()
def final_hidden_states(model, input_ids: torch.Tensor, rotation: str) -> torch.Tensor:
    """Last-layer hidden states ``[T, hidden]`` with attention computed by our kernels."""
    with kernels_as_attention(model, rotation):
        return model.model(input_ids=input_ids, use_cache=False).last_hidden_state[0]
