#!/usr/bin/env bash
# One-command check of the overlay on a Hygon DCU / AMD GPU:
#
#     scripts/dcu/check.sh MODEL [--block-size N] [--port PORT] [--out DIR] [--skip-ab] [--skip-startup]
#
# MODEL is a local model folder (its config.json gives the attention shape). Steps, each with
# its output under the report folder (default reports/dcu/<UTC date>/):
#   1. doctor          python -m govinda_patch doctor (targets resolve, kernel self-test)
#   2. shape           the attention shape the server will tune (scripts/dcu/model_shape.py: vLLM's
#                      own configuration of the serve command; --block-size N adds that flag)
#   3. tune            the self-tuner for that shape, through the cache every server process reads
#                      (GOVINDA_TUNE=auto: reuse a cached choice; set GOVINDA_TUNE=force to redo)
#   4. kernel_bench    python -m bench.kernel_bench: our kernels vs vLLM's TRITON_ATTN bf16 (and INT8)
#   5. ab              bench/ab.py: the locked serve command (scripts/start_vllm_bench.sh), stock
#                      (GOVINDA_DISABLE=1) vs overlay, 6K/12K/24K prompts x 256 output tokens
#   6. startup         python -m bench.startup: the same two sides, each started cold (its vLLM,
#                      Triton, Inductor and GOVINDA caches emptied) and warm (caches kept): time to
#                      /health, the logged phases, JIT compiles during requests (issue #29)
#   7. summary.md      scripts/dcu/summarize.py, from the files above
# Steps 3-6 need a GPU; without one they are recorded as skipped. Exit status: 0 when every
# step ran and passed, 1 when a step failed, 3 when GPU steps were skipped, 2 on bad arguments.
#
# env-doc: GOVINDA_DCU_REPORT_DIR | directory | reports/dcu/<UTC date> | Report folder of scripts/dcu/check.sh (or --out).
# env-doc: GOVINDA_DCU_PROMPTS | count | 5 | Prompts per tier in check.sh's serving A/B.
set -u

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
usage() {
    echo "usage: scripts/dcu/check.sh MODEL [--block-size N] [--port PORT] [--out DIR] [--skip-ab] [--skip-startup]" >&2
    exit 2
}

model=""
block_size=""
port=8000
out="${GOVINDA_DCU_REPORT_DIR:-}"
skip_ab=0
skip_startup=0
while [ "$#" -gt 0 ]; do
    case "$1" in
        --block-size) [ "$#" -ge 2 ] || usage; block_size=$2; shift 2 ;;
        --port) [ "$#" -ge 2 ] || usage; port=$2; shift 2 ;;
        --out) [ "$#" -ge 2 ] || usage; out=$2; shift 2 ;;
        --skip-ab) skip_ab=1; shift ;;
        --skip-startup) skip_startup=1; shift ;;
        -h|--help) usage ;;
        -*) echo "check.sh: unknown option $1" >&2; usage ;;
        *) [ -z "$model" ] || usage; model=$1; shift ;;
    esac
done
[ -n "$model" ] || usage
case "$block_size$port" in *[!0-9]*) echo "check.sh: --block-size and --port take numbers" >&2; exit 2 ;; esac
if [ ! -f "$model/config.json" ]; then
    echo "check.sh: $model/config.json not found (MODEL must be a local model folder)" >&2
    exit 2
fi
model=$(cd "$model" && pwd)
out="${out:-$repo/reports/dcu/$(date -u +%Y-%m-%d)}"
mkdir -p "$out" || exit 2
out=$(cd "$out" && pwd)

if [ -n "${PYTHON:-}" ]; then py=$PYTHON
elif [ -x "$repo/.venv/bin/python" ]; then py="$repo/.venv/bin/python"
else py=python3
fi
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
cd "$repo" || exit 2

steps="$out/steps.tsv"
: >"$steps"
failed=0
skipped=0
# record NAME STATUS RC SECONDS NOTE
record() { printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" >>"$steps"; }
# run NAME OUTPUT-FILE COMMAND...: stdout to the file, stderr to NAME.log
run() {
    local name=$1 output=$2 started rc
    shift 2
    echo "== $name: $*" >&2
    started=$(date +%s)
    "$@" >"$output" 2>"$out/$name.log"
    rc=$?
    if [ "$rc" -eq 0 ]; then record "$name" ok 0 $(($(date +%s) - started)) ""
    else record "$name" failed "$rc" $(($(date +%s) - started)) "$(tail -n 1 "$out/$name.log" | tr '\t' ' ')"; failed=1
    fi
    return "$rc"
}
skip() { record "$1" skipped - 0 "$2"; skipped=1; echo "== $1: skipped ($2)" >&2; }

run doctor "$out/doctor.txt" "$py" -m govinda_patch doctor
run shape "$out/shape.json" "$py" scripts/dcu/model_shape.py "$model" ${block_size:+--block-size "$block_size"}

gpu=$("$py" -c 'import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")' 2>/dev/null)
if [ -z "$gpu" ]; then
    for name in tune kernel_bench ab startup; do skip "$name" "no GPU visible to torch"; done
else
    echo "== GPU: $gpu" >&2
    if [ -s "$out/shape.json" ]; then
        run tune "$out/tune.txt" "$py" -m govinda_patch tune --cached --shape "$(cat "$out/shape.json")" &&
            cat "$out/tune.txt"
    else
        skip tune "no shape (see shape.log)"
    fi
    run kernel_bench "$out/kernel_bench.txt" "$py" -m bench.kernel_bench --out "$out/kernel_bench.json"
    sides="$out/ab_sides.yaml"
    cat >"$sides" <<EOF
name: dcu-ab
model: $model
port: $port
server_command: scripts/start_vllm_bench.sh
bench: {input_lens: [6144, 12288, 24576], output_len: 256, num_prompts: ${GOVINDA_DCU_PROMPTS:-5}}
baseline: stock
log_patterns:
  govinda_errors: {regex: 'govinda:? ERROR', max: 0}
sides:
  - name: stock
    env: {GOVINDA_DISABLE: "1"}
  - name: govinda
    env: {GOVINDA_DISABLE: "0"}
    log_patterns:
      govinda_configs: {regex: 'INT8 attention launch configs', min: 1}
EOF
    if [ "$skip_ab" = 1 ]; then
        skip ab "--skip-ab"
    else
        run ab "$out/ab.txt" "$py" -m bench.ab --sides "$sides" --report-dir "$out" --log-dir "$out"
    fi
    if [ "$skip_startup" = 1 ]; then
        skip startup "--skip-startup"
    else
        run startup "$out/startup.txt" "$py" -m bench.startup --sides "$sides" --name dcu-startup \
            --report-dir "$out" --log-dir "$out/startup_logs"
    fi
fi

"$py" scripts/dcu/summarize.py "$out" || failed=1
echo "report: $out/summary.md" >&2
if [ "$failed" = 1 ]; then exit 1; fi
if [ "$skipped" = 1 ]; then exit 3; fi
exit 0
