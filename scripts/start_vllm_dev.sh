#!/usr/bin/env bash
# Start vLLM with the Govinda overlay like start_vllm_bench.sh, plus dev-only flags.
#
# Usage:  scripts/start_vllm_dev.sh [MODEL [PORT [EXTRA_VLLM_ARGS...]]]
#         (MODEL / PORT may come from the environment; PORT defaults to 8000)
#
# Dev-only flags, appended after the bench flags (argparse keeps the last value, so they can
# also override --max-model-len):
#   - EXTRA_VLLM_ARGS given on the command line (this is how bench/ab.py passes a side's
#     server_args), then
#   - GOVINDA_DEV_ARGS, parsed with shell quoting rules, e.g. for the H200 dummy-weight model:
#       GOVINDA_DEV_ARGS="--served-model-name m --load-format dummy --language-model-only \
#         --additional-config '{\"gdn_prefill_backend\": \"triton\"}'"
#
# Start-up environment and launcher choice (GOVINDA_VLLM_CMD, PYTHON): see start_vllm_bench.sh,
# which this script sources so the two cannot drift apart.
# env-doc: GOVINDA_DEV_ARGS | extra vLLM flags (shell-quoted) | (unset) | Dev-only flags appended after MODEL PORT (never used by start_vllm_bench.sh).
set -eu

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=start_vllm_bench.sh
. "$script_dir/start_vllm_bench.sh"

govinda_model_and_port "${1:-}" "${2:-}"
if [ "$#" -gt 2 ]; then shift 2; else set --; fi
if [ -n "${GOVINDA_DEV_ARGS:-}" ]; then
    # eval keeps quoted arguments (JSON for --additional-config) in one word.
    eval "set -- \"\$@\" $GOVINDA_DEV_ARGS"
fi
govinda_setup_env
govinda_pick_launcher
echo "start_vllm_dev.sh: ${govinda_launcher[*]} serve $govinda_model --port $govinda_port --max-model-len 32768 $*" >&2
exec "${govinda_launcher[@]}" serve "$govinda_model" --port "$govinda_port" --max-model-len 32768 "$@"
