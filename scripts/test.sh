#!/usr/bin/env bash
# Run the test suite against the real vLLM of each supported line, each in its own environment.
#
#   scripts/test.sh                 # vLLM 0.18.1 (Python 3.10), 0.26.0 and 0.33.0 (Python 3.12)
#   GOVINDA_TEST_LINES=0.18.1 scripts/test.sh -k overlay      # one line, extra pytest arguments
#   scripts/test.sh -m ""                                       # every case on every line
#
# The first line runs every case. Each later line runs the cases marked ``vllm`` (they import vLLM
# or depend on the installed line), plus the ``gpu_interpreter`` ones when its lock pins a Triton
# that no earlier line has (the interpreter is Triton's); tests/conftest.py assigns the markers.
# The default order puts the DCU's stack first: Python 3.10, torch 2.10, the AMD compile gate.
#
# Environments live under $GOVINDA_VENV_ROOT (default <repo>/.venvs) and are created by
# scripts/setup.sh from requirements/vllm-<line>.lock when missing or stale; a line whose
# environment is not there yet uses <repo>/.venv (plain scripts/setup.sh) when that matches its lock.
# env-doc: GOVINDA_VENV_ROOT | directory | <repo>/.venvs | Where the per-vLLM-line test environments live (CI points it at a cache keyed by the lock files).
# env-doc: GOVINDA_TEST_LINES | space-separated vLLM versions | 0.18.1 0.26.0 0.33.0 | Which supported vLLM lines to test.
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
VENV_ROOT="${GOVINDA_VENV_ROOT:-$REPO/.venvs}"
LINES="${GOVINDA_TEST_LINES:-0.18.1 0.26.0 0.33.0}"

environment_for() {  # the environment for line $1, built only when no matching one exists
  local line="$1" venv="$VENV_ROOT/vllm-$1"
  if "$REPO/scripts/setup.sh" --check --vllm "$line" --venv "$venv"; then
    echo "$venv"
  elif "$REPO/scripts/setup.sh" --check --vllm "$line" --venv "$REPO/.venv"; then
    echo "$REPO/.venv"
  else
    "$REPO/scripts/setup.sh" --vllm "$line" --venv "$venv" >/dev/null
    echo "$venv"
  fi
}

status=0
first=1
seen_tritons=" "
for line in $LINES; do
  triton="$(grep -m1 '^triton==' "$REPO/requirements/vllm-$line.lock" 2>/dev/null || true)"
  if [ "$first" = 1 ]; then
    selection=()
    what="every case"
  elif [[ "$seen_tritons" != *" $triton "* ]]; then
    selection=(-m "vllm or gpu_interpreter")
    what="vllm and gpu_interpreter cases ($triton is new)"
  else
    selection=(-m vllm)
    what="vllm cases"
  fi
  first=0
  seen_tritons+="$triton "
  venv="$(environment_for "$line")"
  echo "=== tests on vLLM $line ($venv): $what"
  started=$SECONDS
  set +e
  (cd "$REPO" && "$venv/bin/python" -m pytest tests -q -p no:cacheprovider "${selection[@]}" "$@")
  rc=$?
  set -e
  echo "=== vLLM $line: pytest took $((SECONDS - started)) s"
  if [ "$rc" = 5 ]; then
    echo "=== vLLM $line: pytest collected no tests; treating that as a failure" >&2
    status=1
  elif [ "$rc" != 0 ]; then
    echo "=== vLLM $line: tests failed (pytest exit $rc)" >&2
    status=1
  fi
done
exit "$status"
