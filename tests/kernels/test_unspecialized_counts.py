"""No kernel of ours compiles a new specialization because a step's counts changed (issue #29).

Triton compiles one kernel per class of each integer argument (equal to 1, divisible by 16, other)
unless the argument is in ``do_not_specialize``. Token, sequence, decode and split counts change
from step to step, so a specialized count compiles kernels while requests wait (vLLM's "JIT
compilation during inference"): e.g. a rotated prefill whose batch holds one decode where the
warm-up had none.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from govinda_patch.kernel_package import import_kernel

KERNEL_MODULES = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "kernels").glob("*.py") if p.stem != "__init__")
# Arguments that carry a step's counts (or rows of the batch) rather than the model's shape.
PER_STEP = {"num_tokens", "num_splits", "num_decodes", "num_seqs", "num_q_blocks", "first_seq", "last_seq"}


def _launched_kernels():
    for name in KERNEL_MODULES:
        module = import_kernel(name)
        for attr, value in sorted(vars(module).items()):
            # Each kernel once, under the module that defines it (others import it).
            if attr.endswith("_kernel") and hasattr(value, "arg_names") and value.fn.__module__.rsplit(".", 1)[-1] == name:
                yield f"{name}.{attr}", value


def _unspecialized(kernel) -> set:
    """Argument names in ``do_not_specialize``: compiled (``params``) and interpreted functions alike."""
    if hasattr(kernel, "params"):
        return {p.name for p in kernel.params if p.do_not_specialize}
    listed = kernel.kwargs.get("do_not_specialize") or ()
    return {kernel.arg_names[item] if isinstance(item, int) else item for item in listed}


KERNELS = dict(_launched_kernels())


def test_the_kernels_are_found():
    assert {"int8_kv_store._store_kv_int8_kernel", "int8_decode_attention.decode_split_kernel",
            "kv_rotation._rotate_token_rows_kernel", "kv_rotation._rotate_decode_rows_kernel"} <= set(KERNELS)


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_per_step_counts_are_not_specialized(name):
    kernel = KERNELS[name]
    counts = PER_STEP & set(kernel.arg_names)
    assert counts <= _unspecialized(kernel), f"{name} specializes on {sorted(counts - _unspecialized(kernel))}"
