"""tests/interpreter_device_calls.py changes how often Triton's interpreter patches triton.language,
never what a kernel computes: a mixed decode + prefill step (both rotations) gives bit-identical
output with and without it, while the patching runs once per launch instead of once per call."""

import pytest
import torch
from triton.runtime import interpreter

import interpreter_device_calls
from test_int8_paged_attention import Batch


def _run_counting_patches(batch, monkeypatch):
    calls = []
    patch_lang = interpreter._patch_lang
    monkeypatch.setattr(interpreter, "_patch_lang", lambda fn: calls.append(fn) or patch_lang(fn))
    output = batch.run()
    monkeypatch.setattr(interpreter, "_patch_lang", patch_lang)
    return output, len(calls)


@pytest.mark.parametrize("rotation", ["none", "hadamard"])
def test_skipping_the_repeated_patch_leaves_every_output_bit_identical(rotation, monkeypatch):
    batch = Batch(num_q_heads=4, num_kv_heads=2, head_dim=64, block_size=16, query_lens=[1, 1, 5],
                  seq_lens=[19, 40, 21], num_decodes=2, rotation=rotation, seed=3)
    installed = bool(interpreter_device_calls._originals)
    interpreter_device_calls.uninstall()
    try:
        stock, stock_patches = _run_counting_patches(batch, monkeypatch)
        assert interpreter_device_calls.install()
        shared, shared_patches = _run_counting_patches(batch, monkeypatch)
    finally:
        interpreter_device_calls.uninstall()
        if installed:
            interpreter_device_calls.install()
    assert torch.equal(shared, stock)
    # Each launch patches once; without the shim every device-function call patched again.
    assert 0 < shared_patches < stock_patches, (shared_patches, stock_patches)
