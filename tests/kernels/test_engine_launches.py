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


def test_a_launch_whose_max_model_len_fits_one_block_gets_tables_one_block_wide(monkeypatch):
    # The widths follow the launch's explicit --max-model-len; without one, both stride classes.
    assert engine_launches.table_widths(1552, None) == engine_launches.TABLE_WIDTHS == (16, 17)
    assert engine_launches.table_widths(1552, 1553) == (16, 17)
    assert engine_launches.table_widths(1552, 1552) == engine_launches.table_widths(1552, 1024) == (1,)
    shape = tuner.TuneShape(head_dim=64, num_q_heads=4, num_kv_heads=2, block_size=16, dtype="bf16")
    strides = []

    def spy_attention(query, cache, output, starts, seq_lens, table, **kwargs):
        strides.append(table.stride(0))
        return real_attention(query, cache, output, starts, seq_lens, table, **kwargs)

    real_attention = attention.paged_attention_int8
    monkeypatch.setattr(attention, "paged_attention_int8", spy_attention)
    done = engine_launches.compile_engine_launches(shape, torch.device("cpu"), TABLE, "none", widths=(1,))
    # Triton specializes an integer equal to 1: a one-block-wide table is its own class.
    assert strides and set(strides) == {1} and done["launches"] == 1 + len(strides)


def test_the_background_passes_the_launchs_table_widths(monkeypatch):
    shape = tuner.TuneShape(head_dim=64, num_q_heads=4, num_kv_heads=2, block_size=1552, dtype="bf16")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(lc, "interpreting", lambda: False)
    seen = []
    monkeypatch.setattr(engine_launches, "compile_engine_launches",
                        lambda *args: seen.append(args[-1]) or {"launches": 1, "seconds": 0.0})
    for argv, widths in ((["vllm", "serve", "m", "--max-model-len", "1K"], (1,)),
                         (["vllm", "serve", "m", "--max-model-len", "32768"], (16, 17)),
                         (["vllm", "serve", "m"], (16, 17))):
        assert selftest_prefetch._compile_engine_launches(shape, 0, TABLE, argv).startswith("the engine's other launches compiled")
        assert seen[-1] == widths, argv


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
