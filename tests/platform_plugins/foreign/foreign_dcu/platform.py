"""A ``Platform`` with its own backend priorities (simulated DCU device, tests/dcu_sim)."""

from __future__ import annotations

from dcu_sim_platform import SimulatedDcuDevice
from vllm.platforms.interface import Platform
from vllm.v1.attention.backends.registry import AttentionBackendEnum


def backend_order(use_mla: bool) -> list:
    return [AttentionBackendEnum.TRITON_MLA] if use_mla else [AttentionBackendEnum.TRITON_ATTN]


class ForeignDcuPlatform(SimulatedDcuDevice, Platform):
    @classmethod
    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None, **kwargs) -> str:
        config = attn_selector_config._replace(block_size=None)
        for backend in [selected_backend] if selected_backend is not None else backend_order(config.use_mla):
            if not backend.get_class().validate_configuration(device_capability=cls.get_device_capability(), **config._asdict()):
                return backend.get_path()
        raise ValueError(f"no valid attention backend for {config!r}")
