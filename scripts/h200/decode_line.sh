#!/bin/sh
# One device call: the decode line of issue #24 on the H200, raw JSON and logs into $OUT.
#   1. python -m bench.kernel_bench --fa3 (FA3 bf16, stock TRITON_ATTN bf16, ours; copy and
#      streaming-read yardsticks) on both geometries, decode cases only;
#   2. python -m bench.kernel_bench --rotation (ours unrotated vs rotated) on both geometries;
#   3. python -m bench.tune_decode sweeps of tile x slice x register cap x split count;
#   4. (prefetch, not in the default) the table's decode entry with 0-3 KV tiles prefetched into
#      the L2 ahead, at 4 and 2 programs per SM (unrotated);
#   5. (check, not in the default) scripts/h200/decode_rotation_check.py: every slice width,
#      rotated and not, against the fp32 reference, one process per launch configuration.
# Usage, from the repo root on the device (carry .device): sh scripts/h200/decode_line.sh [PARTS]
# PARTS: any of fa3 rotation sweep prefetch check (default: fa3 rotation sweep), e.g.
# `sh scripts/h200/decode_line.sh rotation check` (the rotated decode's timing and correctness).
set -eu
OUT_DIR=${OUT:-/tmp/decode-line}
mkdir -p "$OUT_DIR"
. scripts/h200/env.sh
export PYTHONPATH=/tmp/site  # the benches import our kernels from the checkout; vLLM stays stock
parts=${*:-fa3 rotation sweep}
cases=1x4096,1x16384,1x32768,8x8192,32x4096
for part in $parts; do
    if [ "$part" = check ]; then  # geometry-independent: its own list of shapes
        PYTHONPATH="$PWD:/tmp/site" python3 scripts/h200/decode_rotation_check.py \
            > "$OUT_DIR/decode_rotation_check.log" 2>&1 || echo "decode_rotation_check.py failed" >&2
        tail -n 25 "$OUT_DIR/decode_rotation_check.log"
        continue
    fi
    for geometry in qwen35 dense128; do
        case "$part" in
            fa3) python3 -m bench.kernel_bench --fa3 --geometry "$geometry" --sections copy,stream,decode \
                     --time-budget-s 110 --out "$OUT_DIR/kernel_bench_fa3_decode_$geometry.json" \
                     > "$OUT_DIR/kernel_bench_fa3_decode_$geometry.log" 2>&1 ;;
            rotation) python3 -m bench.kernel_bench --rotation --geometry "$geometry" --sections copy,decode \
                     --time-budget-s 60 --out "$OUT_DIR/kernel_bench_rotation_decode_$geometry.json" \
                     > "$OUT_DIR/kernel_bench_rotation_decode_$geometry.log" 2>&1 ;;
            sweep) python3 -m bench.tune_decode --geometry "$geometry" --cases "$cases" --block-n 64,128 \
                     --d-slice 64,128 --max-registers 0,128 --programs-per-sm 2,4,8 --time-budget-s 70 \
                     --out "$OUT_DIR/decode_sweep_$geometry.json" > "$OUT_DIR/decode_sweep_$geometry.log" 2>&1 ;;
            prefetch) python3 -m bench.tune_decode --geometry "$geometry" --cases "$cases" --block-n 64 --warps 4 \
                     --d-slice 128 --max-registers 128 --programs-per-sm 4,2 --l2-prefetch 0,1,2,3 --time-budget-s 70 \
                     --out "$OUT_DIR/decode_prefetch_$geometry.json" > "$OUT_DIR/decode_prefetch_$geometry.log" 2>&1 ;;
            *) echo "unknown part $part (fa3 rotation sweep prefetch check)" >&2; exit 2 ;;
        esac
        tail -n 40 "$OUT_DIR"/*"$geometry".log | grep -v "^$" | tail -n 25 || true
    done
done
