"""Weight bytes of a decoder from its config alone (no weights read): what the KV cache must share
the GPU with.

Covers the families the overlay is measured on: dense decoders with grouped-query attention and a
gated MLP (Llama, Mistral, Qwen2/3 dense) and the Qwen3-Next / Qwen3.5 hybrid (gated-delta-net
linear attention plus gated full attention). Counted: embeddings (vocabulary padded as vLLM pads
it), the LM head unless tied, every projection, bias and norm vector; not counted: buffers such as
the rotary cache, which vLLM's "Model loading took" also measures (about 0.1 GiB for Qwen3.5-27B).
Anything else (MoE, MLA, a vision tower without ``--language-model-only``) raises
``UnsupportedModel``: pass the weight size explicitly instead.
"""

from __future__ import annotations

from typing import Any, Dict

# vLLM's VocabParallelEmbedding pads the vocabulary to a multiple of this (DEFAULT_VOCAB_PADDING_SIZE).
VOCAB_PADDING = 64


class UnsupportedModel(ValueError):
    pass


def _get(config, name: str, default: Any = None) -> Any:
    value = getattr(config, name, None)
    return default if value is None else value


def _padded_vocab(vocab: int) -> int:
    return -(-vocab // VOCAB_PADDING) * VOCAB_PADDING


def _attention_parameters(text, hidden: int, head_dim: int) -> int:
    heads = _get(text, "num_attention_heads")
    kv_heads = _get(text, "num_key_value_heads", heads)
    gate = 2 if _get(text, "attn_output_gate", False) else 1  # Qwen3.5: q_proj also yields a gate
    q = hidden * heads * head_dim * gate
    kv = 2 * hidden * kv_heads * head_dim
    out = heads * head_dim * hidden
    bias = (heads * head_dim * gate + 2 * kv_heads * head_dim) if _get(text, "attention_bias", False) else 0
    qk_norm = 2 * head_dim if str(_get(text, "model_type", "")).startswith(("qwen3",)) else 0
    return q + kv + out + bias + qk_norm


def _gated_delta_net_parameters(text, hidden: int) -> int:
    key_dim = _get(text, "linear_num_key_heads") * _get(text, "linear_key_head_dim")
    value_heads = _get(text, "linear_num_value_heads")
    value_dim = value_heads * _get(text, "linear_value_head_dim")
    conv_dim = 2 * key_dim + value_dim
    in_proj = hidden * (2 * key_dim + 2 * value_dim) + hidden * 2 * value_heads  # qkvz and ba
    conv = conv_dim * _get(text, "linear_conv_kernel_dim")
    per_head = 2 * value_heads  # dt_bias, A_log
    norm = _get(text, "linear_value_head_dim")
    return in_proj + conv + per_head + norm + value_dim * hidden


def parameter_count(model_config, language_model_only: bool) -> Dict[str, Any]:
    """{"parameters", "bytes", "family"} for vLLM's ModelConfig of the served model."""
    text = model_config.hf_text_config
    if model_config.hf_config is not text and getattr(model_config.hf_config, "vision_config", None) is not None \
            and not language_model_only:
        raise UnsupportedModel("the model has a vision tower, which this count does not cover: pass "
                               "--language-model-only (if you serve it so) or the weight size")
    if _get(text, "num_experts") or _get(text, "num_local_experts") or _get(text, "n_routed_experts"):
        raise UnsupportedModel("mixture-of-experts models are not covered: pass the weight size")
    if getattr(model_config, "use_mla", False) or _get(text, "kv_lora_rank"):
        raise UnsupportedModel("MLA models are not covered: pass the weight size")
    hidden = _get(text, "hidden_size")
    layers = _get(text, "num_hidden_layers")
    head_dim = model_config.get_head_size()
    kinds = list(_get(text, "layer_types", []) or ["full_attention"] * layers)
    unknown = set(kinds) - {"full_attention", "linear_attention"}
    if unknown:
        raise UnsupportedModel(f"layer types {sorted(unknown)} are not covered: pass the weight size")
    if "linear_attention" in kinds and _get(text, "linear_num_key_heads") is None:
        raise UnsupportedModel("linear-attention layers other than Qwen3-Next/Qwen3.5's are not covered")
    vocab = _padded_vocab(_get(text, "vocab_size"))
    intermediate = _get(text, "intermediate_size")
    mlp = 3 * hidden * intermediate + (2 * intermediate + hidden if _get(text, "mlp_bias", False) else 0)
    per_layer = {
        "full_attention": _attention_parameters(text, hidden, head_dim),
        "linear_attention": _gated_delta_net_parameters(text, hidden) if "linear_attention" in kinds else 0,
    }
    tied = bool(_get(text, "tie_word_embeddings", _get(model_config.hf_config, "tie_word_embeddings", False)))
    total = vocab * hidden * (1 if tied else 2) + hidden  # embeddings, LM head, final norm
    total += sum(per_layer[kind] + mlp + 2 * hidden for kind in kinds[:layers])
    element = model_config.dtype.itemsize if hasattr(model_config.dtype, "itemsize") else 2
    family = "qwen3.5 hybrid" if "linear_attention" in kinds else "dense decoder"
    return {"parameters": int(total), "bytes": int(total * element), "family": family}
