"""The INT8 KV page in vLLM's terms: the backend's facts and the spec arithmetic.

Importable without vLLM or torch (patches use the facts at apply time, when importing vLLM
modules could be circular); the spec functions import them when called.
"""

from __future__ import annotations

BACKEND_NAME = "CUSTOM"  # vLLM maps get_name() back to AttentionBackendEnum[...]
BACKEND_PATH = "govinda_patch.int8.backend.GovindaInt8AttentionBackend"
SUPPORTED_HEAD_SIZES = (64, 128, 256)
SUPPORTED_DTYPE_NAMES = ("torch.float16", "torch.bfloat16")
SCALE_COLUMNS = 4  # int8 "columns" per (token, head) row that pay for its fp32 scale


def spec_head_size(head_size: int) -> int:
    """head_size reported in the KV-cache spec: data bytes + scale bytes per (token, head) row."""
    return head_size + SCALE_COLUMNS


def model_head_size(spec_head: int) -> int:
    return spec_head - SCALE_COLUMNS


def int8_serves_model(model_config, cache_config, attention_backend) -> tuple[bool, str]:
    """Whether the INT8 backend will be selected for the model's attention layers.

    The hybrid block alignment of vLLM 0.18 runs before backend selection (in the API-server
    process), so it predicts the selection with the rules the backend validates.
    """
    if getattr(model_config, "use_mla", False):
        return False, "MLA model"
    if cache_config.cache_dtype != "auto":
        return False, f"--kv-cache-dtype {cache_config.cache_dtype} set"
    if attention_backend is not None and getattr(attention_backend, "name", attention_backend) != BACKEND_NAME:
        return False, f"attention backend {attention_backend} forced"
    if model_config.get_head_size() not in SUPPORTED_HEAD_SIZES:
        return False, f"head size {model_config.get_head_size()} not in {SUPPORTED_HEAD_SIZES}"
    if str(model_config.dtype) not in SUPPORTED_DTYPE_NAMES:
        return False, f"dtype {model_config.dtype}"
    return True, ""


def int8_serves_layer(vllm_config, spec) -> bool:
    """Whether the INT8 backend would serve a layer with this stock spec (a full-attention layer of
    a model it serves), i.e. whether another backend there needs saying."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    if type(spec) is not FullAttentionSpec or getattr(spec, "sliding_window", None) is not None:
        return False
    if spec.head_size not in SUPPORTED_HEAD_SIZES or str(spec.dtype) not in SUPPORTED_DTYPE_NAMES:
        return False
    serves, _ = int8_serves_model(vllm_config.model_config, vllm_config.cache_config, vllm_config.attention_config.backend)
    return serves


def int8_spec_for(spec):
    """The plain FullAttentionSpec whose page is 2*B*H*(D+4) int8 bytes (see backend.py)."""
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    # Exact type on purpose: vLLM 0.18 looks up KV managers by exact spec type.
    if type(spec) is not FullAttentionSpec or spec.sliding_window is not None:
        raise TypeError(f"Govinda INT8 attention only serves full attention layers, got {spec!r}")
    return FullAttentionSpec(
        block_size=spec.block_size,
        num_kv_heads=spec.num_kv_heads,
        head_size=spec_head_size(spec.head_size),
        head_size_v=spec_head_size(spec.head_size),
        dtype=torch.int8,
    )


def check_hybrid_pages(vllm_config, spec, exact: bool) -> None:
    """The padded mamba page must be a whole number of INT8 attention pages (vLLM unifies page
    sizes by growing the attention block), and exactly one page once the block size is final."""
    padded_mamba_page = vllm_config.cache_config.mamba_page_size_padded
    if padded_mamba_page is None:
        return
    page = spec.page_size_bytes
    if (padded_mamba_page != page) if exact else (padded_mamba_page % page != 0):
        raise RuntimeError(
            f"INT8 attention page ({page} B at block {spec.block_size}) and the padded mamba page "
            f"({padded_mamba_page} B) disagree: the hybrid block alignment did not use INT8 page "
            "sizes in the process that configured vLLM"
        )
