#!/usr/bin/env bash
# Set up an environment for the Govinda overlay on a fresh machine.
#
#   scripts/setup.sh                      # .venv (Python 3.10, like the DCU image) with vLLM 0.18.1 from the lock
#   scripts/setup.sh --vllm 0.26.0        # the H200 validation line (Python 3.12)
#   scripts/setup.sh --vllm 0.33.0        # the current upstream line (Python 3.12; tested on CPU only)
#   scripts/setup.sh --venv DIR           # put the environment elsewhere (CI caches it outside the checkout)
#   scripts/setup.sh --system             # DCU images with vLLM preinstalled: only the overlay's own deps
#   scripts/setup.sh --check [--vllm V] [--venv DIR]   # exit 0 if that environment matches the lock, build nothing
#
# A finished environment is stamped with the hash of its lock file and reused while it matches.
# At the end it prints the overlay's plan (python -m govinda_patch status) for that environment.
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
VLLM_LINE=0.18.1
VENV="$REPO/.venv"
SYSTEM=0
CHECK=0
while [ $# -gt 0 ]; do
  case "$1" in
    --vllm) VLLM_LINE="$2"; shift 2 ;;
    --venv) VENV="$2"; shift 2 ;;
    --system) SYSTEM=1; shift ;;
    --check) CHECK=1; shift ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

say() { printf '[setup] %s\n' "$*" >&2; }

if [ "$SYSTEM" = 1 ]; then
  PY="${PYTHON:-python3}"
  say "installing the overlay's runtime deps into $($PY -c 'import sys; print(sys.prefix)') (vLLM/torch untouched)"
  "$PY" -m pip install -q -r "$REPO/requirements/runtime.in"
  PYTHONPATH="$REPO" "$PY" -m govinda_patch status
  exit 0
fi

case "$VLLM_LINE" in
  0.18.1) PY_VERSION=3.10 ;;
  0.26.0|0.33.0) PY_VERSION=3.12 ;;
  *) echo "setup.sh: no lock for vLLM $VLLM_LINE; have: 0.18.1 0.26.0 0.33.0" >&2; exit 2 ;;
esac
LOCK="$REPO/requirements/vllm-$VLLM_LINE.lock"
STAMP="$(sha256sum "$LOCK" | cut -c1-16)"

find_python() {  # an interpreter for $1 (e.g. 3.10): PATH, pyenv, then the usual prefixes
  local v="$1" candidate
  for candidate in "python$v" "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$v".*/bin/"python$v" /usr/bin/"python$v" /usr/local/bin/"python$v"; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys, venv' >/dev/null 2>&1; then
      command -v "$candidate"; return 0
    fi
  done
  return 1
}

# uv, pinned by requirements/tools.lock, installed once per tools lock outside the checkout (the
# builds that scripts/test.sh runs side by side share it; the first to finish puts it in place).
# It downloads in parallel, keeps the wheels in its cache (UV_CACHE_DIR, default ~/.cache/uv) and
# links them into the environment (byte-compiled afterwards, see compile_bytecode).
uv_from_tools_lock() {  # $1: a Python with pip; prints the path of uv
  local tools_lock="$REPO/requirements/tools.lock" dir partial
  dir="${XDG_CACHE_HOME:-$HOME/.cache}/govinda/tools-$(sha256sum "$tools_lock" | cut -c1-16)"
  if [ ! -x "$dir/bin/uv" ]; then
    mkdir -p "$(dirname "$dir")"
    partial="$(mktemp -d "$dir.partial.XXXXXX")"
    "$1" -m pip install -q --no-deps --target "$partial" -r "$tools_lock" >&2 || { rm -rf "$partial"; return 1; }
    mv -T "$partial" "$dir" 2>/dev/null || rm -rf "$partial"  # another build was first
  fi
  [ -x "$dir/bin/uv" ] && echo "$dir/bin/uv"
}

# The stamp is written only after the build imported vLLM, torch and Triton; a check then only
# asks the interpreter for vLLM's metadata (importing vLLM costs ~10 s of CPU per line and check).
matches_lock() {
  [ -f "$VENV/.govinda-lock" ] && [ "$(cat "$VENV/.govinda-lock")" = "$STAMP" ] \
    && "$VENV/bin/python" -c 'from importlib import metadata; metadata.version("vllm")' >/dev/null 2>&1
}

# Every module byte-compiled once, at build time. Python otherwise compiles torch, transformers and
# vLLM from source in every new interpreter wherever it may not write the .pyc files back
# (PYTHONDONTWRITEBYTECODE=1, set on the shared development machine, or a read-only environment):
# about 8 s of CPU per interpreter that imports vLLM, and the tests start hundreds. The pass takes
# ~35 s per line. Files that are not Python 3 (templates, vendored Python 2) fail to compile and
# are left as they are.
compile_bytecode() {
  say "byte-compiling $VENV"
  "$VENV/bin/python" -m compileall -q -j 0 "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" \
    >/dev/null 2>&1 || true
  touch "$VENV/.govinda-bytecode"
}
compiled() { [ -f "$VENV/.govinda-bytecode" ]; }

if [ "$CHECK" = 1 ]; then
  matches_lock && compiled
  exit
fi

if matches_lock; then
  say "reusing $VENV (vLLM $VLLM_LINE, lock $STAMP)"
  compiled || compile_bytecode  # built before the bytecode pass existed
else
  BASE_PY="$(find_python "$PY_VERSION")" || { echo "setup.sh: Python $PY_VERSION not found (install it, e.g. with pyenv)" >&2; exit 1; }
  say "creating $VENV with $BASE_PY for vLLM $VLLM_LINE (lock $STAMP)"
  rm -rf "$VENV"
  "$BASE_PY" -m venv "$VENV"
  # The lock pins every package (torch included), so no resolver surprises on a fresh machine.
  if UV="$(uv_from_tools_lock "$VENV/bin/python")"; then
    "$UV" pip install --quiet --no-deps --python "$VENV/bin/python" -r "$LOCK"
  else
    say "uv from requirements/tools.lock could not be installed; installing with pip (slower)"
    "$VENV/bin/python" -m pip install -q --upgrade pip
    "$VENV/bin/python" -m pip install -q --no-deps -r "$LOCK"
  fi
  compile_bytecode  # first: the import check below then runs on the compiled modules
  "$VENV/bin/python" -c 'import vllm, torch, triton, wrapt, yaml; print("[setup] vllm", vllm.__version__, "torch", torch.__version__, "triton", triton.__version__)' >&2
  echo "$STAMP" > "$VENV/.govinda-lock"
fi
PYTHONPATH="$REPO" "$VENV/bin/python" -m govinda_patch status
