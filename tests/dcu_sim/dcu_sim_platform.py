"""The simulated DCU's device facts for the stand-in platform plugins of tests/platform_plugins.

A vLLM platform plugin's ``Platform`` subclass answers for the device (capability, name, memory)
and for the attention backend. The stand-ins differ only in the second part, which is what the
overlay deals with; this mixin gives them the first, on a CPU host with the fake ``amdsmi``, for
vLLM 0.18, 0.26 and 0.33 (enough to build an engine config and its attention layers).
"""

from __future__ import annotations

import amdsmi  # tests/dcu_sim/amdsmi.py
from vllm.platforms.interface import DeviceCapability, PlatformEnum


class SimulatedDcuDevice:
    _enum = PlatformEnum.ROCM
    device_name: str = "hip"
    device_type: str = "cuda"
    dispatch_key: str = "CUDA"
    ray_device_key: str = "GPU"
    dist_backend: str = "nccl"
    device_control_env_var: str = "CUDA_VISIBLE_DEVICES"

    @classmethod
    def _handle(cls, device_id: int = 0):
        return amdsmi.amdsmi_get_processor_handles()[device_id]

    @classmethod
    def get_device_capability(cls, device_id: int = 0) -> DeviceCapability:
        # gfx90a -> 9.0, gfx942 -> 9.4 (as vLLM's ROCm platform maps them)
        arch = amdsmi.amdsmi_get_gpu_asic_info(cls._handle(device_id))["target_graphics_version"]
        return DeviceCapability(major=int(arch[3:-2]), minor=int(arch[-2], 16))

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return amdsmi.amdsmi_get_gpu_asic_info(cls._handle(device_id))["market_name"]

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return amdsmi.amdsmi_get_gpu_memory_total(cls._handle(device_id))

    @classmethod
    def device_count(cls) -> int:
        return len(amdsmi.amdsmi_get_processor_handles())

    @classmethod
    def is_async_output_supported(cls, enforce_eager) -> bool:
        return True

    @classmethod
    def support_hybrid_kv_cache(cls) -> bool:
        return True

    @classmethod
    def check_and_update_config(cls, vllm_config) -> None:
        cache_config = vllm_config.cache_config
        if cache_config is not None and not getattr(cache_config, "user_specified_block_size", False):
            cache_config.block_size = 16
        parallel_config = vllm_config.parallel_config
        if parallel_config.worker_cls == "auto":
            parallel_config.worker_cls = "vllm.v1.worker.gpu_worker.Worker"
