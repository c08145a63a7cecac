"""A stand-in for AMD's ``amdsmi`` that reports one Hygon-DCU-like gfx90a device.

Put this folder on PYTHONPATH (tests do it through the ``dcu_env`` fixture) so vLLM's ROCm
platform plugin activates and ``vllm.platforms.rocm`` imports on a CPU-only machine.
Only the functions vLLM 0.18/0.26/0.33 call at import and platform detection are provided.
"""

GFX_ARCH = "gfx90a"


class AmdSmiException(Exception):
    pass


class _Handle:
    def __init__(self, index):
        self.index = index


_HANDLES = [_Handle(0)]


def amdsmi_init(*args, **kwargs):
    return None


def amdsmi_shut_down(*args, **kwargs):
    return None


def amdsmi_get_processor_handles():
    return list(_HANDLES)


def amdsmi_get_gpu_asic_info(handle):
    return {
        "market_name": "Hygon DCU (simulated)",
        "vendor_id": "0x1d94",
        "device_id": "0x6320",
        "target_graphics_version": GFX_ARCH,
    }


def amdsmi_topo_get_link_type(handle, peer_handle):
    return {"hops": 1, "type": 2}


def amdsmi_get_gpu_device_uuid(handle):
    return "00000000-0000-0000-0000-%012d" % handle.index


class AmdSmiMemoryType:
    VRAM = 0
    VIS_VRAM = 1
    GTT = 2


def amdsmi_get_gpu_memory_total(handle, memory_type=AmdSmiMemoryType.VRAM):
    return 64 * 1024**3  # a 64 GiB DCU


def amdsmi_topo_get_numa_node_number(handle):
    return 0
