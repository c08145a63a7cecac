"""Stand-in ``vllm_hcu.platforms.hcu``: a ``Platform`` of its own with its own backend priorities."""

from __future__ import annotations

from functools import cache

from dcu_sim_platform import SimulatedDcuDevice
from vllm.platforms.interface import Platform
from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend


@cache
def _get_backend_priorities(use_mla: bool, use_sparse: bool) -> list:
    if use_sparse:
        return [AttentionBackendEnum.FLASHMLA_SPARSE]
    if use_mla:
        return [AttentionBackendEnum.TRITON_MLA]
    return [AttentionBackendEnum.TRITON_ATTN, AttentionBackendEnum.FLASH_ATTN]


def register_attention_backends() -> None:
    if not AttentionBackendEnum.TRITON_ATTN.is_overridden():
        register_backend(
            AttentionBackendEnum.TRITON_ATTN,
            class_path="vllm_hcu.v1.attention.backends.triton_attn.HcuTritonAttentionBackend",
        )


class HCUPlatform(SimulatedDcuDevice, Platform):
    @classmethod
    def get_valid_backends(cls, device_capability, attn_selector_config, num_heads=None):
        register_attention_backends()
        valid, invalid = [], {}
        priorities = _get_backend_priorities(attn_selector_config.use_mla, attn_selector_config.use_sparse)
        for priority, backend in enumerate(priorities):
            try:
                reasons = backend.get_class().validate_configuration(
                    device_capability=device_capability, **attn_selector_config._asdict()
                )
            except ImportError:
                reasons = ["ImportError"]
            if reasons:
                invalid[backend] = reasons
            else:
                valid.append((backend, priority))
        return valid, invalid

    @classmethod
    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None, **kwargs) -> str:
        register_attention_backends()
        device_capability = cls.get_device_capability()
        attn_selector_config = attn_selector_config._replace(block_size=None)
        if selected_backend is not None:
            reasons = selected_backend.get_class().validate_configuration(
                device_capability=device_capability, **attn_selector_config._asdict()
            )
            if reasons:
                raise ValueError(f"Selected backend {selected_backend} is not valid: {reasons}")
            return selected_backend.get_path()
        valid, invalid = cls.get_valid_backends(device_capability, attn_selector_config, num_heads)
        if not valid:
            raise ValueError(f"No valid attention backend for {cls.device_name}: {invalid}")
        return min(valid, key=lambda pair: pair[1])[0].get_path()


register_attention_backends()
