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
# A -m expression is combined with each job's own selection; -m "" runs every case on every line.
# On the later lines every case also counts as ``slow`` (they repeat the first line's cases), so the
# inner loop, -m "not slow", runs the first line's quick cases only: a line that an expression
# leaves no case of is not started at all (-m slow runs exactly what the inner loop leaves out).
# The default order puts the DCU's stack first: Python 3.10, torch 2.10, the AMD compile gate.
#
# The runs are independent processes, so they run side by side, GOVINDA_TEST_JOBS at a time
# (a case mostly waits on one core: a child interpreter importing vLLM, or the Triton
# interpreter). Each line's run is split in two jobs on the ``vllm`` marker, which partition it
# exactly; with other pytest arguments (-k, paths) a line stays one job. Each job's output is
# printed whole when it ends, then one summary line per environment and per job.
#
# Environments live under $GOVINDA_VENV_ROOT (default <repo>/.venvs) and are created by
# scripts/setup.sh from requirements/vllm-<line>.lock when missing or stale; a line whose
# environment is not there yet uses <repo>/.venv (plain scripts/setup.sh) when that matches its
# lock. Builds run beside the pytest jobs, outside their slots (downloads, unpacking, one bytecode pass),
# and a line's jobs start as soon as its environment is there.
# env-doc: GOVINDA_VENV_ROOT | directory | <repo>/.venvs | Where the per-vLLM-line test environments live (CI points it at a cache keyed by the lock files).
# env-doc: GOVINDA_TEST_LINES | space-separated vLLM versions | 0.18.1 0.26.0 0.33.0 | Which supported vLLM lines to test.
# env-doc: GOVINDA_TEST_JOBS | integer >= 1 | number of CPUs | How many pytest runs scripts/test.sh runs side by side (environment builds run beside them); 1 runs everything one at a time with live output.
# env-doc: GOVINDA_TEST_LATER_LINE | 0, 1 | 0 | Set by scripts/test.sh for its pytest runs: 1 on a line after the first, where tests/conftest.py marks every case slow (the inner loop, -m "not slow", runs the first line only).
# env-doc: GOVINDA_TEST_FRESH_CHILDREN | 0, 1 | 0 | 1: every child of tests/overlay_testing.run_child and run_module, and every program started through the warm launcher, is a new interpreter instead of a fork of the session's warm one (tests/warm_interpreter.py).
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
# A marker expression given with -m is combined with each job's own ("A" becomes "(A) and (EXPR)");
# -m "" keeps the documented meaning, every case on every line. Other arguments pass through.
user_mark=""
user_mark_set=0
other_args=()
while [ "$#" -gt 0 ]; do
  case "$1" in
    -m) [ "$#" -ge 2 ] || { echo "test.sh: -m needs an expression" >&2; exit 2; }
        user_mark="$2"; user_mark_set=1; shift 2 ;;
    -m*) user_mark="${1#-m}"; user_mark_set=1; shift ;;
    *) other_args+=("$1"); shift ;;
  esac
done
# Whether the -m expression $1 can hold for a case marked slow, whatever its other markers (every
# combination is tried). Anything beyond names, and, or, not and parentheses counts as "it can".
may_select_slow() {
  python3 - "$1" <<'PY' || [ "$?" != 1 ]
import itertools, re, sys
expr = sys.argv[1]
names = sorted(set(re.findall(r"[A-Za-z_]\w*", expr)) - {"and", "or", "not", "slow"})
if not re.fullmatch(r"[\w\s()]*", expr):
    sys.exit(0)
try:
    sys.exit(0 if any(eval(expr, {"__builtins__": {}}, dict(zip(names, bits), slow=True))
                      for bits in itertools.product((False, True), repeat=len(names))) else 1)
except Exception:
    sys.exit(0)
PY
}
RUN_LINES=("${LINE_LIST[0]}")  # the first line always runs; later ones unless -m leaves none of their cases
not_run_lines=()
for line in "${LINE_LIST[@]:1}"; do
  if [ -n "$user_mark" ] && ! may_select_slow "$user_mark"; then not_run_lines+=("$line"); else RUN_LINES+=("$line"); fi
done
WORK="$(mktemp -d "${TMPDIR:-/tmp}/govinda-test.XXXXXX")"
cleanup() {  # stop jobs still running (an interrupted run), then drop the logs; keeps the exit code
  local pids
  pids="$(jobs -p)"
  [ -z "$pids" ] || kill $pids 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

# --- a small job pool: spawn NAME CMD... runs CMD in the background, output in $WORK/NAME.log ----
# Environment builds (mostly downloads and unpacking) run beside the pytest jobs and do not take
# one of the GOVINDA_TEST_JOBS slots; a line's pytest jobs start as soon as its environment is there.
pytest_pids=()
running_pytests() {
  local pid alive=()
  for pid in ${pytest_pids[@]+"${pytest_pids[@]}"}; do
    kill -0 "$pid" 2>/dev/null && alive+=("$pid")
  done
  pytest_pids=(${alive[@]+"${alive[@]}"})
  echo "${#pytest_pids[@]}"
}
spawn() {
  local name="$1"; shift
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
  case "$name" in setup-*) ;; *) pytest_pids+=("$!") ;; esac
}
# Until some background job ends. bash >= 4.3 has `wait -n`; the bash 4.2 of CentOS 7-based DTK
# images does not, so there the running jobs are polled once a second.
wait_for_a_job() {
  if [ "${BASH_VERSINFO[0]}" -gt 4 ] || { [ "${BASH_VERSINFO[0]}" = 4 ] && [ "${BASH_VERSINFO[1]}" -ge 3 ]; }; then
    wait -n || true
    return
  fi
  local running
  running="$(jobs -rp | wc -l)"
  [ "$running" -gt 0 ] || return 0
  while [ "$(jobs -rp | wc -l)" -ge "$running" ]; do sleep 1; done
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

# --- environments: reuse what matches each lock, build the rest --------------------------------
existing_environment() {  # line $1: record a matching environment in $WORK/venv-$1, if there is one
  local line="$1" venv
  for venv in "$VENV_ROOT/vllm-$line" "$REPO/.venv"; do
    if "$REPO/scripts/setup.sh" --check --vllm "$line" --venv "$venv"; then
      echo "$venv" > "$WORK/venv-$line"
      echo "0 0" > "$WORK/setup-$line.rc"
      touch "$WORK/setup-$line.shown"
      return 0
    fi
  done
  return 1
}
build_environment() {  # line $1
  local venv="$VENV_ROOT/vllm-$1"
  "$REPO/scripts/setup.sh" --vllm "$1" --venv "$venv" >/dev/null || return 1
  echo "$venv" > "$WORK/venv-$1"
}
started_all=$SECONDS
for line in "${RUN_LINES[@]}"; do  # checks first (quick), so that cached lines start in order
  existing_environment "$line" || true
done
for line in "${RUN_LINES[@]}"; do
  [ -s "$WORK/venv-$line" ] || spawn "setup-$line" build_environment "$line"
done

# --- the pytest jobs ---------------------------------------------------------------------------
run_pytest() {  # line, then pytest arguments
  local line="$1"; shift
  local venv later=1
  venv="$(cat "$WORK/venv-$line")"
  [ "$line" != "${LINE_LIST[0]}" ] || later=0
  echo "--- vLLM $line ($venv): pytest $(printf '%q ' "$@")"
  # vLLM names its model-info cache files (VLLM_CACHE_ROOT/modelinfos) by class, not by version,
  # and replaces an entry made from another line's source: with lines side by side, children would
  # keep re-inspecting Qwen3.5 and Llama in an extra interpreter (~15 s each). A root per line.
  # GOVINDA_TEST_LATER_LINE=1 (not the first line): tests/conftest.py marks every case slow.
  cd "$REPO" && VLLM_CACHE_ROOT="$vllm_cache/govinda-tests-$line" GOVINDA_TEST_LATER_LINE="$later" \
    "$venv/bin/python" -m pytest tests -q -p no:cacheprovider --durations=15 "$@"
}
vllm_cache="${VLLM_CACHE_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/vllm}"
jobs_names=()
jobs_lines=()
first_line_jobs=0  # the first line's jobs come first in jobs_names
add_job() {  # name, line, the job's own marker expression ("" = every case)
  local name="$1" line="$2" mark="$3" args=()
  if [ "$user_mark_set" = 1 ]; then
    if [ -z "$user_mark" ]; then mark=""; elif [ -n "$mark" ]; then mark="($mark) and ($user_mark)"; else mark="$user_mark"; fi
  fi
  [ -z "$mark" ] || args=(-m "$mark")
  [ "$user_mark_set" = 0 ] || [ -n "$mark" ] || args=(-m "")
  jobs_names+=("$name"); jobs_lines+=("$line")
  printf '%s\0' "$line" ${args[@]+"${args[@]}"} ${other_args[@]+"${other_args[@]}"} > "$WORK/args-${#jobs_names[@]}"
}
# Each line's run is split in two jobs that partition it exactly (on the vllm marker), so that
# shorter jobs fill the slots; with other pytest arguments (-k, a path) it stays one job, which
# then must collect something.
split=1
[ "${#other_args[@]}" = 0 ] && { [ "$user_mark_set" = 0 ] || [ -n "$user_mark" ]; } || split=0
seen_tritons=" "
for line in "${RUN_LINES[@]}"; do
  triton="$(grep -m1 '^triton==' "$REPO/requirements/vllm-$line.lock" 2>/dev/null || true)"
  if [ "$first_line_jobs" = 0 ]; then  # the first line: every case
    line_mark=""
  elif [[ "$seen_tritons" != *" $triton "* ]]; then
    line_mark="vllm or gpu_interpreter"
  else
    line_mark="vllm"
  fi
  if [ "$split" = 1 ]; then
    add_job "vllm-$line-vllm-cases" "$line" "vllm"
    case "$line_mark" in
      "") add_job "vllm-$line-other-cases" "$line" "not vllm" ;;
      "vllm or gpu_interpreter") add_job "vllm-$line-gpu_interpreter-cases" "$line" "gpu_interpreter and not vllm" ;;
    esac
  else
    add_job "vllm-$line-${line_mark:+${line_mark// /-}-}cases" "$line" "$line_mark"
  fi
  [ "$first_line_jobs" != 0 ] || first_line_jobs=${#jobs_names[@]}
  seen_tritons+="$triton "
done
# Longest first: by the seconds each job took in the last default run ($TIMES, kept beside the
# environments; its last line for a job name counts), else the later lines' runs, newest first (a new Triton
# adds the interpreter cases), then the first line's. A job waits only for its own line's
# environment. The order decides only when jobs start, never what runs.
TIMES="$VENV_ROOT/.govinda-test-seconds"
order=()
for ((i = ${#jobs_names[@]}; i > first_line_jobs; i--)); do order+=("$i"); done
for ((i = 1; i <= first_line_jobs; i++)); do order+=("$i"); done
if [ -r "$TIMES" ]; then
  ranked=()
  for ((k = 0; k < ${#order[@]}; k++)); do
    i="${order[k]}"
    last="$(awk -v job="${jobs_names[i - 1]}" '$1 == job { s = $2 } END { print s + 0 }' "$TIMES")"
    ranked+=("$last $k $i")
  done
  order=()
  while read -r _ _ i; do order+=("$i"); done < <(printf '%s\n' "${ranked[@]}" | sort -k1,1nr -k2,2n)
fi
queue=("${order[@]}")
status=0
while [ "${#queue[@]}" -gt 0 ]; do
  waiting=()
  for i in "${queue[@]}"; do
    line="${jobs_lines[i - 1]}"
    if [ -s "$WORK/venv-$line" ] && [ "$(running_pytests)" -lt "$JOBS" ]; then
      args=()
      while IFS= read -r -d '' word; do args+=("$word"); done < "$WORK/args-$i"
      spawn "${jobs_names[i - 1]}" run_pytest "${args[@]}"
    elif [ -e "$WORK/setup-$line.rc" ] && [ ! -s "$WORK/venv-$line" ]; then
      echo "=== vLLM $line: no environment (setup failed, see above): ${jobs_names[i - 1]} not run" >&2
      echo "1 0" > "$WORK/${jobs_names[i - 1]}.rc"
      touch "$WORK/${jobs_names[i - 1]}.shown"
      status=1
    else
      waiting+=("$i")
    fi
  done
  queue=(${waiting[@]+"${waiting[@]}"})
  if [ "${#queue[@]}" -gt 0 ]; then
    wait_for_a_job
    report_finished
  fi
done
while [ -n "$(jobs -rp)" ]; do
  wait_for_a_job
  report_finished
done
wait || true
report_finished

echo "=== summary (${JOBS} side by side, environments included, $((SECONDS - started_all)) s in all):"
for line in "${RUN_LINES[@]}"; do
  read -r rc took < "$WORK/setup-$line.rc"
  [ "$rc" = 0 ] || { echo "=== setup-$line: FAILED, $took s"; status=1; continue; }
  echo "=== environment $line: $(cat "$WORK/venv-$line") ($([ "$took" = 0 ] && echo "matches its lock" || echo "built, $took s"))"
done
for line in ${not_run_lines[@]+"${not_run_lines[@]}"}; do
  echo "=== vLLM $line: not run (the -m expression leaves out every case of a later line: they all count as slow)"
done
ran_cases=" "  # lines of which some job ran cases
for i in "${order[@]}"; do
  read -r rc took < "$WORK/${jobs_names[i - 1]}.rc"
  [ "$rc" = 5 ] || ran_cases+="${jobs_lines[i - 1]} "
done
for i in "${order[@]}"; do
  name="${jobs_names[i - 1]}"
  read -r rc took < "$WORK/$name.rc"
  if [ "$rc" = 0 ]; then
    verdict="passed"
  elif [ "$rc" = 5 ] && [ "$split" = 1 ] && [[ "$ran_cases" == *" ${jobs_lines[i - 1]} "* ]]; then
    verdict="no case of this part selected (the line's other part ran)"
  elif [ "$rc" = 5 ]; then
    verdict="FAILED: pytest collected no tests"
    status=1
  else
    verdict="FAILED (pytest exit $rc)"
    status=1
  fi
  echo "=== $name: $verdict, $took s"
  # Recorded for the default run only (a -m or -k run's jobs share its names but not its cases).
  [ "$rc" != 0 ] || [ "$user_mark_set$split" != 01 ] || { mkdir -p "$VENV_ROOT" && echo "$name $took" >> "$TIMES"; } 2>/dev/null || true
done
exit "$status"
