"""The warm-up prefill (govinda_patch/int8/prefill_warmup.py): it runs the path the builder
picked once per kernel set, on scratch rows, and reads the cache without writing it."""

import torch

from govinda_patch.int8 import prefill_warmup
from test_int8_kv_gather import varlen_reference
from test_int8_paged_attention import Batch

from govinda_patch.kernel_package import import_kernel

launch_configs = import_kernel("launch_configs")


def warm(batch, configs, varlen, rotation="none"):
    return prefill_warmup.warm_prefill(
        batch.query, batch.kv_cache, batch.block_table, block_size=batch.block_size, num_kv_heads=batch.num_kv_heads,
        softmax_scale=batch.head_dim**-0.5, configs=configs, rotation=rotation, varlen=varlen,
    )


def test_warm_up_runs_the_chosen_path_once_and_leaves_the_cache_alone():
    prefill_warmup.reset()
    batch = Batch(num_q_heads=4, num_kv_heads=2, head_dim=64, block_size=16, query_lens=[1, 1], seq_lens=[20, 9], num_decodes=2)
    cache_before = batch.kv_cache.clone()
    configs = launch_configs.ARCH_TABLES["interpreter"]
    calls = []
    varlen = varlen_reference(calls)
    assert warm(batch, configs, varlen)
    # Gather + varlen kernel over a 2-token prefill of row 0 (query_len 2: never taken for a decode).
    assert calls == [(prefill_warmup.WARMUP_TOKENS, prefill_warmup.WARMUP_TOKENS, 2, 2)]
    assert not warm(batch, configs, varlen)  # the same kernels: nothing to add
    assert len(calls) == 1
    # The Triton prefill (no varlen kernel) and another rotation are other kernel sets.
    assert warm(batch, configs, None)
    assert warm(batch, configs, varlen, rotation="hadamard")
    assert len(calls) == 2
    assert torch.equal(batch.kv_cache, cache_before)
    prefill_warmup.reset()
    assert warm(batch, configs, varlen)
    prefill_warmup.reset()
