#!/usr/bin/env bash
# Start vLLM exactly as the scoring harness does, with the Govinda overlay on PYTHONPATH:
#
#     vllm serve MODEL --port PORT --max-model-len 32768
#
# Usage:  scripts/start_vllm_bench.sh [MODEL [PORT]]
#         (or MODEL=... PORT=... in the environment; PORT defaults to 8000)
#
# The scored command line is locked, so this script refuses any other vLLM flag: everything
# else is an environment variable (GOVINDA_DISABLE=1 turns the overlay off, GOVINDA_PATCHES_FILE,
# GOVINDA_LOG_LEVEL, ...). Dev-only flags go through scripts/start_vllm_dev.sh.
#
# Launcher (which vLLM to run), first match wins:
#   GOVINDA_VLLM_CMD   command words before "serve", e.g. "python3 -m vllm.entrypoints.cli.main"
#                      (the H200 bundle has no `vllm` entry point)
#   PYTHON             runs "$PYTHON -m vllm.entrypoints.cli.main"
#   <repo>/.venv       the environment scripts/setup.sh creates, if present
#   `vllm` on PATH, else "python3 -m vllm.entrypoints.cli.main"
# (Our own variables avoid the VLLM_ prefix: vLLM warns about unknown VLLM_* variables.)
#
# Sourced by start_vllm_dev.sh, this file only defines its functions, so both scripts share
# one definition of the start-up environment.
set -eu

govinda_repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# env-doc: MODEL | path or HF id | (required) | Model to serve (or the first argument).
# env-doc: PORT | port number | 8000 | Port to serve on (or the second argument).
# env-doc: GOVINDA_VLLM_CMD | command words | (unset) | Launcher words before "serve", e.g. "python3 -m vllm.entrypoints.cli.main".
# env-doc: PYTHON | interpreter path | (unset) | Run "$PYTHON -m vllm.entrypoints.cli.main" when GOVINDA_VLLM_CMD is unset.
# env-doc: GOVINDA_SERVE_CACHE_ROOT | directory | ~/.cache/govinda-serve | Root of the persistent compile caches below.
# env-doc: VLLM_CACHE_ROOT | directory | $GOVINDA_SERVE_CACHE_ROOT/vllm | vLLM caches incl. torch.compile graphs (warm restarts skip recompiling).
# env-doc: TRITON_CACHE_DIR | directory | $GOVINDA_SERVE_CACHE_ROOT/triton | Compiled Triton kernels (ours and vLLM's).
# env-doc: TORCHINDUCTOR_CACHE_DIR | directory | $GOVINDA_SERVE_CACHE_ROOT/inductor | Inductor cache (default is under /tmp).
# env-doc: GOVINDA_CACHE_DIR | directory | $GOVINDA_SERVE_CACHE_ROOT/govinda | The overlay's kernel self-test verdict, tuned launch configs and dispatch counters (a warm restart skips self-test and tuning).
# env-doc: MIOPEN_USER_DB_PATH | directory | $GOVINDA_SERVE_CACHE_ROOT/miopen/db | MIOpen find-db (ROCm/DTK only).
# env-doc: MIOPEN_CUSTOM_CACHE_DIR | directory | $GOVINDA_SERVE_CACHE_ROOT/miopen/cache | MIOpen compiled kernels (ROCm/DTK only).
# env-doc: PYTORCH_HIP_ALLOC_CONF | allocator options | expandable_segments:True (only if no allocator config is set) | ROCm caching allocator: less fragmentation; `export PYTORCH_HIP_ALLOC_CONF=` opts out.
# env-doc: VLLM_NO_USAGE_STATS | 0, 1 | 1 | No usage-stats upload (a blocked network must not stall start-up).
# env-doc: DO_NOT_TRACK | 0, 1 | 1 | Same, for libraries honouring DO_NOT_TRACK.
# Start-up environment. Nothing here changes what the server computes or how fast it serves a
# request; it only keeps compiled artefacts between restarts. A variable the caller already
# set, even to an empty value, is left alone (${VAR=default} assigns only when unset).
govinda_setup_env() {
    # The overlay is a set of import-time patches found through PYTHONPATH.
    export PYTHONPATH="$govinda_repo_root${PYTHONPATH:+:$PYTHONPATH}"

    # One persistent root for every compile cache; the defaults are partly in /tmp
    # (TorchInductor) or under $HOME, which some containers reset or mount read-only.
    local cache_root="${GOVINDA_SERVE_CACHE_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/govinda-serve}"
    # torch.compile graphs and vLLM's other caches: a warm restart skips recompilation.
    export VLLM_CACHE_ROOT="${VLLM_CACHE_ROOT=$cache_root/vllm}"
    # Compiled Triton kernels (ours and vLLM's): skips JIT compilation after a restart.
    export TRITON_CACHE_DIR="${TRITON_CACHE_DIR=$cache_root/triton}"
    # Inductor's own cache (default /tmp/torchinductor_$USER, lost on reboot).
    export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR=$cache_root/inductor}"
    # The overlay's self-test verdict and tuned launch configs (default ~/.cache/govinda): beside
    # the others, so one persistent volume makes a restart warm for the overlay too.
    export GOVINDA_CACHE_DIR="${GOVINDA_CACHE_DIR=$cache_root/govinda}"
    # MIOpen (ROCm) find-db and compiled kernels; ignored on CUDA.
    export MIOPEN_USER_DB_PATH="${MIOPEN_USER_DB_PATH=$cache_root/miopen/db}"
    export MIOPEN_CUSTOM_CACHE_DIR="${MIOPEN_CUSTOM_CACHE_DIR=$cache_root/miopen/cache}"
    local dir
    for dir in "$VLLM_CACHE_ROOT" "$TRITON_CACHE_DIR" "$TORCHINDUCTOR_CACHE_DIR" "$GOVINDA_CACHE_DIR" \
        "$MIOPEN_USER_DB_PATH" "$MIOPEN_CUSTOM_CACHE_DIR"; do
        if [ -n "$dir" ]; then mkdir -p "$dir" 2>/dev/null || true; fi
    done

    # ROCm caching allocator: expandable segments cut fragmentation. Read by ROCm builds of
    # PyTorch only, so the CUDA (H200) path is unchanged. Set only when no allocator config is
    # given at all; opt out with `export PYTORCH_HIP_ALLOC_CONF=` (empty).
    if [ -z "${PYTORCH_ALLOC_CONF+x}${PYTORCH_CUDA_ALLOC_CONF+x}${PYTORCH_HIP_ALLOC_CONF+x}" ]; then
        export PYTORCH_HIP_ALLOC_CONF=expandable_segments:True
    fi

    # No usage-stats upload: a blocked network must not stall or slow start-up.
    export VLLM_NO_USAGE_STATS="${VLLM_NO_USAGE_STATS=1}"
    export DO_NOT_TRACK="${DO_NOT_TRACK=1}"
}

# Fills the array `govinda_launcher` with the command words that precede "serve".
govinda_pick_launcher() {
    if [ -n "${GOVINDA_VLLM_CMD:-}" ]; then
        read -r -a govinda_launcher <<<"$GOVINDA_VLLM_CMD"
    elif [ -n "${PYTHON:-}" ]; then
        govinda_launcher=("$PYTHON" -m vllm.entrypoints.cli.main)
    elif [ -x "$govinda_repo_root/.venv/bin/python" ]; then
        govinda_launcher=("$govinda_repo_root/.venv/bin/python" -m vllm.entrypoints.cli.main)
    elif command -v vllm >/dev/null 2>&1; then
        govinda_launcher=(vllm)
    else
        govinda_launcher=(python3 -m vllm.entrypoints.cli.main)
    fi
}

# Sets govinda_model and govinda_port from $1 $2 or MODEL / PORT.
govinda_model_and_port() {
    govinda_model="${1:-${MODEL:-}}"
    govinda_port="${2:-${PORT:-8000}}"
    if [ -z "$govinda_model" ]; then
        echo "usage: $0 MODEL [PORT]   (or set MODEL and PORT)" >&2
        exit 2
    fi
}

if [ "${BASH_SOURCE[0]}" != "$0" ]; then
    return 0  # sourced: definitions only
fi

if [ "$#" -gt 2 ]; then
    echo "start_vllm_bench.sh: the bench command is locked (MODEL PORT only); got extra: ${*:3}" >&2
    echo "use environment variables, or scripts/start_vllm_dev.sh for dev-only flags" >&2
    exit 2
fi
govinda_model_and_port "$@"
govinda_setup_env
govinda_pick_launcher
echo "start_vllm_bench.sh: ${govinda_launcher[*]} serve $govinda_model --port $govinda_port --max-model-len 32768" >&2
exec "${govinda_launcher[@]}" serve "$govinda_model" --port "$govinda_port" --max-model-len 32768
