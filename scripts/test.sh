#!/usr/bin/env bash
# Run the test suite against the real vLLM of each supported line, each in its own environment.
#
#   scripts/test.sh                 # vLLM 0.18.1 (Python 3.10), 0.26.0 and 0.33.0 (Python 3.12)
#   GOVINDA_TEST_LINES=0.18.1 scripts/test.sh -k overlay      # one line, extra pytest arguments
#   scripts/test.sh -m ""                                       # every case on every line
#   GOVINDA_TEST_JOBS=1 scripts/test.sh                         # one pytest at a time, output live
#
# The first line runs every case. Each later line runs the cases marked ``vllm`` (they import vLLM
# or depend on the installed line), plus the ``gpu_interpreter`` ones when its lock pins a Triton
# that no earlier line has (the interpreter is Triton's); tests/conftest.py assigns the markers.
# The default order puts the DCU's stack first: Python 3.10, torch 2.10, the AMD compile gate.
#
# The lines are independent processes, so they run side by side, GOVINDA_TEST_JOBS at a time
# (a case mostly waits on one core: a child interpreter importing vLLM, or the Triton
# interpreter). Without extra pytest arguments the first line's run is split in two jobs,
# ``-m vllm`` and ``-m "not vllm"``, which partition it exactly. Each job's output is printed
# whole when it ends, then one summary line per job.
#
# Environments live under $GOVINDA_VENV_ROOT (default <repo>/.venvs) and are created by
# scripts/setup.sh from requirements/vllm-<line>.lock when missing or stale (side by side too);
# a line whose environment is not there yet uses <repo>/.venv (plain scripts/setup.sh) when that
# matches its lock.
# env-doc: GOVINDA_VENV_ROOT | directory | <repo>/.venvs | Where the per-vLLM-line test environments live (CI points it at a cache keyed by the lock files).
# env-doc: GOVINDA_TEST_LINES | space-separated vLLM versions | 0.18.1 0.26.0 0.33.0 | Which supported vLLM lines to test.
# env-doc: GOVINDA_TEST_JOBS | integer >= 1 | number of CPUs | How many pytest runs (and environment builds) scripts/test.sh runs side by side; 1 streams the output live.
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
VENV_ROOT="${GOVINDA_VENV_ROOT:-$REPO/.venvs}"
LINES="${GOVINDA_TEST_LINES:-0.18.1 0.26.0 0.33.0}"
JOBS="${GOVINDA_TEST_JOBS:-$(nproc 2>/dev/null || echo 1)}"
if ! [[ "$JOBS" =~ ^[1-9][0-9]*$ ]]; then
  echo "test.sh: GOVINDA_TEST_JOBS must be an integer >= 1, got '$JOBS'" >&2
  exit 2
fi
read -r -a LINE_LIST <<< "$LINES"
[ "${#LINE_LIST[@]}" -gt 0 ] || { echo "test.sh: GOVINDA_TEST_LINES names no line" >&2; exit 2; }
WORK="$(mktemp -d "${TMPDIR:-/tmp}/govinda-test.XXXXXX")"
cleanup() {  # stop jobs still running (an interrupted run), then drop the logs; keeps the exit code
  local pids
  pids="$(jobs -p)"
  [ -z "$pids" ] || kill $pids 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

# --- a small job pool: spawn NAME CMD... runs CMD with its output in $WORK/NAME.log ----------
spawn() {
  local name="$1"; shift
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do
    wait -n || true
    report_finished
  done
  case "$name" in setup-*) ;; *) echo "=== started $name" ;; esac
  if [ "$JOBS" = 1 ]; then  # one at a time: stream the output as it comes
    local started=$SECONDS rc=0
    "$@" 2>&1 | tee "$WORK/$name.log" || rc=${PIPESTATUS[0]}
    echo "$rc $((SECONDS - started))" > "$WORK/$name.rc"
    touch "$WORK/$name.shown"
    return
  fi
  (
    started=$SECONDS
    set +e
    "$@" > "$WORK/$name.log" 2>&1
    echo "$? $((SECONDS - started))" > "$WORK/$name.rc"
  ) &
}
report_finished() {  # print each finished job's log once, in the order they finish
  local rc_file name
  for rc_file in "$WORK"/*.rc; do
    [ -e "$rc_file" ] || continue
    name="$(basename "$rc_file" .rc)"
    [ -e "$WORK/$name.shown" ] && continue
    touch "$WORK/$name.shown"
    echo "=== $name finished (exit $(cut -d' ' -f1 "$rc_file"), $(cut -d' ' -f2 "$rc_file") s):"
    cat "$WORK/$name.log"
  done
}
wait_all() {
  while [ -n "$(jobs -rp)" ]; do
    wait -n || true
    report_finished
  done
  wait || true
  report_finished
}

# --- environments: reuse what matches each lock, build the rest --------------------------------
build_environment() {  # line $1: record the environment to use in $WORK/venv-$1
  local line="$1" venv="$VENV_ROOT/vllm-$1"
  if "$REPO/scripts/setup.sh" --check --vllm "$line" --venv "$venv"; then
    :
  elif "$REPO/scripts/setup.sh" --check --vllm "$line" --venv "$REPO/.venv"; then
    venv="$REPO/.venv"
  else
    "$REPO/scripts/setup.sh" --vllm "$line" --venv "$venv" >/dev/null || return 1
  fi
  echo "$venv" > "$WORK/venv-$line"
}
for line in "${LINE_LIST[@]}"; do
  spawn "setup-$line" build_environment "$line"
done
wait_all
status=0
for line in "${LINE_LIST[@]}"; do
  if [ ! -s "$WORK/venv-$line" ]; then
    echo "=== vLLM $line: no environment (setup failed, see above)" >&2
    status=1
  fi
done
[ "$status" = 0 ] || exit 1

# --- the pytest jobs ---------------------------------------------------------------------------
run_pytest() {  # line, then pytest arguments
  local line="$1"; shift
  local venv
  venv="$(cat "$WORK/venv-$line")"
  echo "--- vLLM $line ($venv): pytest $(printf '%q ' "$@")"
  cd "$REPO" && "$venv/bin/python" -m pytest tests -q -p no:cacheprovider "$@"
}
jobs_names=()
first_line_jobs=0  # the first line's jobs come first in jobs_names
add_job() {  # name, then the line and its pytest arguments (kept NUL-separated on disk)
  jobs_names+=("$1"); shift
  printf '%s\0' "$@" > "$WORK/args-${#jobs_names[@]}"
}
seen_tritons=" "
for line in "${LINE_LIST[@]}"; do
  triton="$(grep -m1 '^triton==' "$REPO/requirements/vllm-$line.lock" 2>/dev/null || true)"
  if [ "$first_line_jobs" = 0 ]; then  # the first line: every case
    if [ "$#" = 0 ]; then
      add_job "vllm-$line-vllm-cases" "$line" -m vllm
      add_job "vllm-$line-other-cases" "$line" -m "not vllm"
    else
      add_job "vllm-$line-every-case" "$line" "$@"
    fi
    first_line_jobs=${#jobs_names[@]}
  elif [[ "$seen_tritons" != *" $triton "* ]]; then
    add_job "vllm-$line-vllm-and-gpu_interpreter-cases" "$line" -m "vllm or gpu_interpreter" "$@"
  else
    add_job "vllm-$line-vllm-cases" "$line" -m vllm "$@"
  fi
  seen_tritons+="$triton "
done
# Longest first: the later lines' runs, newest first (a new Triton adds the interpreter cases),
# then the first line's.
order=()
for ((i = ${#jobs_names[@]}; i > first_line_jobs; i--)); do order+=("$i"); done
for ((i = 1; i <= first_line_jobs; i++)); do order+=("$i"); done
started_all=$SECONDS
for i in "${order[@]}"; do
  args=()
  while IFS= read -r -d '' word; do args+=("$word"); done < "$WORK/args-$i"
  spawn "${jobs_names[i - 1]}" run_pytest "${args[@]}"
done
wait_all

echo "=== summary (${JOBS} side by side, $((SECONDS - started_all)) s in all):"
for i in "${order[@]}"; do
  name="${jobs_names[i - 1]}"
  read -r rc took < "$WORK/$name.rc"
  if [ "$rc" = 0 ]; then
    verdict="passed"
  elif [ "$rc" = 5 ]; then
    verdict="FAILED: pytest collected no tests"
    status=1
  else
    verdict="FAILED (pytest exit $rc)"
    status=1
  fi
  echo "=== $name: $verdict, $took s"
done
exit "$status"
