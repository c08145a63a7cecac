"""govinda_patch/int8/engine_launches.py under the CPU interpreter: the background process runs the
engine's launches that the self-test and the tuning leave out, through the real kernels."""

from __future__ import annotations

import pytest
import torch

from govinda_patch.int8 import engine_launches, selftest_prefetch, tuner
from govinda_patch.kernel_package import import_kernel

lc = import_kernel("launch_configs")
attention = import_kernel("int8_paged_attention")
store = import_kernel("int8_kv_store")
TABLE = lc.ARCH_TABLES["interpreter"]


@pytest.mark.parametrize("rotation", ["none", "hadamard"])
def test_the_store_the_one_split_decode_and_both_block_table_classes_run(monkeypatch, rotation):
    shape = tuner.TuneShape(head_dim=64, num_q_heads=4, num_kv_heads=2, block_size=16, dtype="bf16")
    stores, steps = [], []

    def spy_store(key, value, cache, slots, **kwargs):
        stores.append((tuple(key.shape), kwargs))
        return real_store(key, value, cache, slots, **kwargs)

    def spy_attention(query, cache, output, starts, seq_lens, table, **kwargs):
        out = real_attention(query, cache, output, starts, seq_lens, table, **kwargs)
        assert bool(torch.isfinite(out).all())
        steps.append((kwargs["num_decodes"], query.shape[0], table.stride(0), kwargs.get("gathered_prefill")))
        return out

    real_store, real_attention = store.store_kv_int8, attention.paged_attention_int8
    monkeypatch.setattr(store, "store_kv_int8", spy_store)
    monkeypatch.setattr(attention, "paged_attention_int8", spy_attention)
    done = engine_launches.compile_engine_launches(shape, torch.device("cpu"), TABLE, rotation)

    # The store at the model's shape and block size, as do_kv_cache_update calls it (the device table's entry).
    assert stores == [((2, 2, 64), {"block_size": 16, "rotation": rotation})]
    wide = engine_launches.one_split_decodes(2, TABLE.default_sm_count, TABLE.decode_splits)
    assert wide > 1 and lc.decode_num_splits(wide, 2, TABLE.default_sm_count, TABLE.decode_splits) == 1
    assert lc.decode_num_splits(wide - 1, 2, TABLE.default_sm_count, TABLE.decode_splits) > 1
    # For each class of the block table's row stride: a split-KV decode, the one-split decode grid
    # (the output written directly, unrotated) and a two-token prefill on the builder's path.
    assert sorted((d, rows, stride % 16 == 0) for d, rows, stride, _ in steps) == sorted(
        (d, rows, divisible) for divisible in (True, False) for d, rows in ((1, 1), (wide, wide), (0, 2)))
    assert all(plan is None for *_, plan in steps)  # no FA3 on the CPU: the Triton prefill
    assert done["launches"] == 1 + len(steps) and done["seconds"] >= 0


def test_the_background_compiles_them_only_for_a_gpu_and_reports_a_failure(monkeypatch):
    shape = tuner.TuneShape(head_dim=64, num_q_heads=4, num_kv_heads=2, block_size=16, dtype="bf16")
    assert selftest_prefetch._compile_engine_launches(shape, 0, TABLE) == ""  # the interpreter: nothing to compile
    assert selftest_prefetch._compile_engine_launches(shape, 0, None) == ""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(lc, "interpreting", lambda: False)

    def boom(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(engine_launches, "compile_engine_launches", boom)
    assert selftest_prefetch._compile_engine_launches(shape, 0, TABLE) == (
        "the engine's other launches not compiled (RuntimeError: boom)")
    monkeypatch.setattr(engine_launches, "compile_engine_launches", lambda *a: {"launches": 7, "seconds": 3.21})
    assert selftest_prefetch._compile_engine_launches(shape, 0, TABLE) == "the engine's other launches compiled (7 in 3.2 s)"
