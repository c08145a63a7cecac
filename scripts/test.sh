#!/usr/bin/env bash
# Run the test suite against the real vLLM of each supported line, each in its own environment.
#
#   scripts/test.sh                 # vLLM 0.18.1 (Python 3.10), 0.26.0 and 0.33.0 (Python 3.12)
#   GOVINDA_TEST_LINES=0.18.1 scripts/test.sh -k overlay      # one line, extra pytest arguments
#
# Environments live under $GOVINDA_VENV_ROOT (default <repo>/.venvs) and are created by
# scripts/setup.sh from requirements/vllm-<line>.lock when missing or stale.
# env-doc: GOVINDA_VENV_ROOT | directory | <repo>/.venvs | Where the per-vLLM-line test environments live (CI points it at a cache keyed by the lock files).
# env-doc: GOVINDA_TEST_LINES | space-separated vLLM versions | 0.18.1 0.26.0 0.33.0 | Which supported vLLM lines to test.
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
VENV_ROOT="${GOVINDA_VENV_ROOT:-$REPO/.venvs}"
LINES="${GOVINDA_TEST_LINES:-0.18.1 0.26.0 0.33.0}"

status=0
for line in $LINES; do
  venv="$VENV_ROOT/vllm-$line"
  "$REPO/scripts/setup.sh" --vllm "$line" --venv "$venv" >/dev/null
  echo "=== tests on vLLM $line ($venv)"
  set +e
  (cd "$REPO" && "$venv/bin/python" -m pytest tests -q -p no:cacheprovider "$@")
  rc=$?
  set -e
  if [ "$rc" = 5 ]; then
    echo "=== vLLM $line: pytest collected no tests; treating that as a failure" >&2
    status=1
  elif [ "$rc" != 0 ]; then
    echo "=== vLLM $line: tests failed (pytest exit $rc)" >&2
    status=1
  fi
done
exit "$status"
