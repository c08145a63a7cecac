"""Instruction mix of the decode split kernel compiled for sm90 on this machine (no GPU needed).

Compiles the real wrapper's decode launch (``govinda_patch.amd_aot.capture_variant`` with the
``cuda_sm90`` table) for an sm90 target, disassembles the cubin with the ``nvdisasm`` that ships in
Triton's NVIDIA backend, and prints per head_dim and rotation the instruction count and the most
frequent opcodes. Used to see what a rotated decode adds to the kernel (issue #24, target 3)::

    PYTHONPATH=. python scripts/sm90_decode_sass.py    # from the repo root, no TRITON_INTERPRET
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
import tempfile

CASES = ((256, 6), (128, 4))  # (head_dim, query heads per KV head): Qwen3.5-27B, Llama-3-8B


def opcodes(cubin: bytes) -> list:
    import triton

    nvdisasm = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
        handle.write(cubin)
        handle.flush()
        listing = subprocess.run([nvdisasm, "-c", handle.name], capture_output=True, text=True, check=True).stdout
    found = []
    for line in listing.splitlines():
        match = re.match(r"\s+/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)
        if match:
            found.append(match.group(1))
    return found


def main() -> int:
    from triton.backends.compiler import GPUTarget

    from govinda_patch import amd_aot
    from govinda_patch.kernel_package import import_kernel

    table = import_kernel("launch_configs").ARCH_TABLES["cuda_sm90"]
    for head_dim, group in CASES:
        for rotation in ("none", "hadamard"):
            variant = amd_aot.Variant("table", ("decode",), table, table.decode_config(head_dim).label)
            launches = amd_aot.capture_variant(variant, amd_aot.Case(head_dim, "bf16", group, rotation))
            split = next(launch for kind, launch in launches if kind == "decode_split")
            kernel = amd_aot.compile_launch(split, "sm90", GPUTarget("cuda", 90, 32))
            ops = opcodes(kernel.asm["cubin"])
            top = ", ".join(f"{name} {count}" for name, count in collections.Counter(ops).most_common(8))
            print(f"D={head_dim} rotation={rotation}: {len(ops)} instructions; {top}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
