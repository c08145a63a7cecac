#!/bin/sh
# One device call of an A/B measured with `vllm bench serve` (by default the 64-layer one,
# scripts/h200/ab_qwen35_64layer_bench_serve.yaml). It leaves the report (json/md/png), the
# server logs and the tool check in $OUT. From the checkout's root on the H200 (the repo root, or
# a copy of it under .dev/NAME):
#   sh scripts/h200/ab_bench_serve.sh --parallel        all three sides at once, one GPU each
#                                                       (nvidia-h200-x4; ~6 min)
#   sh scripts/h200/ab_bench_serve.sh SIDE [SIDE ...]   the named sides one after another on one
#                                                       GPU (~5.5 min each: one side per call)
#   --sides FILE first: another sides file (e.g. ab_qwen35_64layer_tp2.yaml); arguments after
#   the side names and a "--" go to bench/ab.py as they are (e.g. --max-concurrency 4; a capacity
#   sweep split over calls: -- --input-lens 16384 --max-concurrency 16 32, see its sides file)
# The model is the sides file's model: a .device/... path is looked for at the root, then two
# levels up (a .dev/NAME copy); /tmp/NAME with a config in scripts/h200/models/NAME/ is assembled
# first (scripts/h200/assemble_model.sh, with the carried bundle's synthetic tokenizer), e.g.
#   sh scripts/h200/ab_bench_serve.sh --sides scripts/h200/ab_dense128_bench_serve.yaml govinda fa3_bf16
# Join one-side calls' JSONs afterwards with python3 -m bench.ab --report-only (see the sides file).
set -eu
sides=scripts/h200/ab_qwen35_64layer_bench_serve.yaml
if [ "${1:-}" = "--sides" ]; then
    [ "$#" -ge 2 ] || { echo "--sides needs a file" >&2; exit 2; }
    sides=$2
    shift 2
fi
[ "$#" -gt 0 ] || { echo "usage: $0 --parallel | SIDE [SIDE ...] (the sides file's, e.g. triton_bf16 govinda fa3_bf16)" >&2; exit 2; }
OUT_DIR=${OUT:-/tmp/ab-bench-serve}
mkdir -p "$OUT_DIR"
. scripts/h200/env.sh
. scripts/h200/carried.sh

model=$(python3 -c 'import sys; from bench.sides_file import load_sides_file; print(load_sides_file(sys.argv[1]).model or "")' "$sides")
case "$model" in
    .device/*) model=$(carried "$model") ;;
    /tmp/*) if [ -f "scripts/h200/models/${model#/tmp/}/config.json" ]; then
                tokenizer=$(carried .device/models/qwen3_5-27b-shape)
                model=$(sh scripts/h200/assemble_model.sh "${model#/tmp/}" "$tokenizer")
            fi ;;
esac
[ -n "$model" ] || { echo "$sides names no model" >&2; exit 1; }

# A client that cannot start would cost a ~230 s server start-up first: check it now. A sides file
# with `client: session` starts its client beside the server and stops the side when it fails.
client=$(python3 -c 'import sys; from bench.sides_file import load_sides_file; print((load_sides_file(sys.argv[1]).bench or {}).get("client", "process"))' "$sides")
if [ "$client" != session ]; then
    python3 -m vllm.entrypoints.cli.main bench serve --help > "$OUT_DIR/bench_serve_check.log" 2>&1 \
        || { tail -20 "$OUT_DIR/bench_serve_check.log"; exit 1; }
fi

only=""
while [ "$#" -gt 0 ]; do
    case "$1" in
        --) shift; break ;;
        --parallel) only="$only --parallel" ;;
        *) only="$only --only $1" ;;
    esac
    shift
done
# --stop-grace 10: vLLM 0.26 does not exit on SIGTERM within 30 s; the default grace only waits.
# shellcheck disable=SC2086
python3 -m bench.ab --sides "$sides" --model "$model" $only \
    --stop-grace 10 --report-dir "$OUT_DIR" --log-dir "$OUT_DIR" "$@"
