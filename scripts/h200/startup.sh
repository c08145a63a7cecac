#!/bin/sh
# Issue #29: the start-up benchmark (python -m bench.startup) on the H200, dense D=128 shape
# (Llama-3-8B shape, dummy weights: scripts/h200/ab_dense128_bench_serve.yaml, whose model
# /tmp/llama8b-shape is assembled here as ab_bench_serve.sh does). Each side's server starts twice:
# cold (empty VLLM_CACHE_ROOT, TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR, GOVINDA_CACHE_DIR under
# one per-side root) and warm (the caches the cold start left), each followed by a ~1K- and a
# ~4K-token request (max_tokens 8), then stopped.
#
# One side per call of a one-GPU machine: bundle install ~30 s, cold start ~95-190 s, warm start
# less, two stops of ~10 s; --health-timeout 230 and --request-timeout 60 cap a call near
# 30 + 2 x (230 + 10) s plus the requests (seconds when healthy). From the checkout's root on the H200:
#   sh scripts/h200/startup.sh govinda
#   sh scripts/h200/startup.sh fa3_bf16
# Each call leaves in $OUT h200-dense128-startup.json/.md (the comparison needs both sides), the
# server logs <side>.cold.server.log and <side>.warm.server.log, and install.log. Join two calls:
#   python3 -m bench.startup --report-only A/h200-dense128-startup.json B/h200-dense128-startup.json \
#       --report-dir reports/h200
# Arguments after the side go to bench/startup.py as they are (e.g. --prompt-tokens 1024 8192).
# SHAPE=qwen35 measures the 64-layer Qwen3.5 shape instead (on an 80 GB H100 add
# GOVINDA_DEV_ARGS="--max-num-seqs 256" for every side: vLLM refuses 1,024 sequences there; sides of
# ab_qwen35_64layer_bench_serve.yaml, report h200-qwen35-64layer-startup): a side's cold start there
# is ~220-300 s and its warm one ~100-150 s, so one side per call still fits a 600 s call.
# SIDES=scripts/h200/ab_qwen35_64layer_startup.yaml adds its A/A side: fa3_bf16, govinda, then
# fa3_bf16_again, one call each on one warm machine; join the three JSONs with --report-only (a side
# joined from two calls counts as a second start of it: the report adds means and the A/A spread).
set -eu
[ "$#" -ge 1 ] || { echo "usage: $0 SIDE [bench.startup args ...]   (SIDE: govinda or fa3_bf16; one per call)" >&2; exit 2; }
side=$1
shift
shape=${SHAPE:-dense128}
case $shape in
    dense128) default_sides=scripts/h200/ab_dense128_bench_serve.yaml; name=h200-dense128-startup; health=230 ;;
    qwen35) default_sides=scripts/h200/ab_qwen35_64layer_bench_serve.yaml; name=h200-qwen35-64layer-startup; health=330 ;;
    *) echo "SHAPE must be dense128 or qwen35, not '$shape'" >&2; exit 2 ;;
esac
sides=${SIDES:-$default_sides}  # SIDES=scripts/h200/ab_dense128_startup.yaml adds govinda_inline
OUT_DIR=${OUT:-/tmp/startup}
mkdir -p "$OUT_DIR"
. scripts/h200/env.sh
. scripts/h200/carried.sh

tokenizer=$(carried .device/models/qwen3_5-27b-shape)
if [ "$shape" = qwen35 ]; then
    model=$tokenizer
else
    model=$(sh scripts/h200/assemble_model.sh llama8b-shape "$tokenizer")
fi

# --stop-grace 10: vLLM 0.26 does not exit on SIGTERM within 30 s; the default grace only waits.
python3 -m bench.startup --sides "$sides" --name "$name" --model "$model" --only "$side" --baseline fa3_bf16 \
    --health-timeout $health --request-timeout 60 --stop-grace 10 --report-dir "$OUT_DIR" --log-dir "$OUT_DIR" "$@"
