"""Where a rotated decode's extra time goes (issue #24, target 3): ``bench.kernel_bench --rotation``
with one of the two decode kernels' rotation switched off.

``MODE=split_only``: the split kernel rotates the query, the reduce does not rotate the output back;
``MODE=reduce_only``: the reverse; any other value: both, as shipped. The outputs of the first two
are wrong on purpose (only their times mean anything); the unrotated contender is the same in all
three. From the repository root on the device, after ``. scripts/h200/env.sh``::

    for M in none split_only reduce_only; do
        MODE=$M PYTHONPATH=$PWD:/tmp/site python3 scripts/h200/rotation_split_probe.py \\
            --rotation --geometry qwen35 --sections decode --out $OUT/rot_$M.json
    done
"""

from __future__ import annotations

import os
import sys

from govinda_patch.kernel_package import import_kernel


class _RotationOff:
    """A Triton kernel whose launches run with ``ROTATE=False`` (and never write the output directly)."""

    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def run(*args, **kwargs):
            kwargs["ROTATE"] = False
            if "WRITE_OUTPUT" in kwargs:
                kwargs["WRITE_OUTPUT"] = False
            return launch(*args, **kwargs)

        return run


def main() -> int:
    mode = os.environ.get("MODE", "none")
    attention = import_kernel("int8_paged_attention")
    if mode == "split_only":
        attention.decode_reduce_kernel = _RotationOff(attention.decode_reduce_kernel)
    elif mode == "reduce_only":
        attention.decode_split_kernel = _RotationOff(attention.decode_split_kernel)
    from bench import kernel_bench

    return kernel_bench.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
