"""Light facts about the INT8 KV group, importable without vLLM or torch (patches use them at
apply time, when importing vLLM modules could be circular)."""

from __future__ import annotations

BACKEND_NAME = "CUSTOM"  # vLLM maps get_name() back to AttentionBackendEnum[...]
BACKEND_PATH = "govinda_patch.int8_backend.GovindaInt8AttentionBackend"
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
