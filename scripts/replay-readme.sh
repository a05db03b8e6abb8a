#!/usr/bin/env bash
# Follows README.md's set-up as a new user would, and checks the outcome (run by .ci/run):
#   1. a fresh clone of this repository's HEAD into a temp folder;
#   2. the commands of README's set-up block (the ```sh block under "## Set-up"), line by
#      line, each timed: the virtual environment, `make demo`, `make test`;
#   3. checks: every command exited 0; nothing printed an ERROR/Traceback line; `pip check`
#      is clean in the venv; the demo answered its question (7 days in a week);
#      `make test` stayed within its budget: 20 minutes when pip's cache had no oracle wheel
#      (it was built), 13 when it had one (REPLAY_TEST_BUDGET=SECONDS overrides), enforced
#      when the load average before it was below the core count, else only reported (a
#      machine shared with other work is slower for reasons that are not the suite's); the
#      docs' questions are answered right: tests/test_default_answers.py, inside make test;
#   4. the wheel: `make wheel` (with the CUDA fatbin when nvcc is on PATH), installed into
#      another fresh venv with the default model, then a generate run from that venv
#      outside the checkout, whose answer to "The capital of France is" must name Paris.
# The reflex cache (REFLEX_CACHE: default model, tokenizer caches, llama.cpp's test
# vectors) is a fresh folder too; pip's own cache is the user's, so a wheel that pip built
# before (llama-cpp-python: ~15 minutes on 2 cores) is reused, as it would be for them.
#   scripts/replay-readme.sh [--demo-only] [--no-wheel]   (REPLAY_TIMES=FILE: the times as JSON)
set -uo pipefail
ROOT=${REPLAY_REPO:-$(cd "$(dirname "$0")/.." && pwd)}  # the repository to clone
DEMO_ONLY=0; WHEEL=1
for a in "$@"; do
  case $a in --demo-only) DEMO_ONLY=1 ;; --no-wheel) WHEEL=0 ;;
    *) echo "usage: $0 [--demo-only] [--no-wheel]" >&2; exit 2 ;; esac
done
WORK=$(mktemp -d "${TMPDIR:-/tmp}/reflex-replay.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
chmod 755 "$WORK"  # mktemp makes it 0700: a test that runs reflex as another user must read the clone
export REFLEX_CACHE="$WORK/cache"
unset PYTHONPATH VIRTUAL_ENV REFLEX_MODEL
fail() { echo "replay: FAILED: $*"; exit 1; }
times=()

git clone -q "$ROOT" "$WORK/reflex-ipc" || fail "git clone"
cd "$WORK/reflex-ipc"
echo "replay: fresh clone of $(git rev-parse --short HEAD) in $PWD"

# the set-up block of README.md, one command per line (comments dropped)
mapfile -t CMDS < <(awk '/^## Set-up/ {s=1} s && /^```sh/ {b=1; next} b && /^```/ {exit} b' README.md \
  | sed 's/[[:space:]]*#.*$//' | grep -v '^[[:space:]]*$')
[ ${#CMDS[@]} -ge 3 ] || fail "README.md's set-up block has ${#CMDS[@]} commands"
# the set-up block runs in one shell, so that its `. .venv/bin/activate` carries over
oracle_cached=0
# (the listings are read whole before grep: with pipefail, grep -q closing the pipe at its first
# match fails the lister with SIGPIPE, and the pipeline with it, at random)
grep -q 'llama_cpp_python-0.3.36-' <<<"$(python3 -m pip cache list 2>/dev/null)" && oracle_cached=1
test_load=
for c in "${CMDS[@]}"; do
  case $c in "make test"*) [ $DEMO_ONLY = 1 ] && { echo "replay: skipping '$c' (--demo-only)"; continue; }
    test_load=$(cut -d' ' -f1 /proc/loadavg) ;; esac
  echo "replay: \$ $c  (load average $(cut -d' ' -f1-3 /proc/loadavg))"
  start=$SECONDS
  # not a pipe: the command runs in this shell (its `. .venv/bin/activate` must stay)
  eval "$c" > >(tee -a "$WORK/setup.log") 2>&1
  rc=$?
  took=$((SECONDS - start))
  times+=("$(printf '%5d s  %s' $took "$c")")
  echo "replay: '$c' took $took s (exit $rc; load average now $(cut -d' ' -f1-3 /proc/loadavg))"
  [ "$rc" = 0 ] || fail "'$c' exited $rc"
  case $c in "make test"*) test_took=$took ;; esac
done

# the outcome
[ -n "${VIRTUAL_ENV:-}" ] || fail "the set-up block left no virtual environment active"
if grep -nE '^(ERROR|error)\b|Traceback \(most recent' "$WORK/setup.log"; then
  fail "the set-up printed the error lines above"
fi
python -m pip check || fail "pip check"
python -m pip show -q llm >/dev/null 2>&1 && fail "the set-up installed the llm tool"
answer=$(awk '/^== reflex generate/ {f=1; next} f && /^(== |\[)/ {exit} f' "$WORK/setup.log")
echo "replay: the demo answered: $(echo $answer)"
grep -qiwE "7|seven" <<<"$answer" || fail "make demo's answer does not say 7 days"
if [ -n "${test_took:-}" ]; then
  # 13 / 20 minutes: pytest -n 2 took 499 s at load ~2 (2,938 tests, none over 65 s since the
  # two-target nvcc build and the aarch64 check were cut), plus ~35 s of client suites;
  # replays of 3,075 tests took 567, 595, 608 and 673 s at load 1-2.4 (660 s was too tight);
  # the 8-minute target is still missed (by the suite's long tail, not one test)
  budget=${REPLAY_TEST_BUDGET:-$([ $oracle_cached = 1 ] && echo 780 || echo 1200)}
  what="make test took ${test_took} s (budget ${budget} s, the oracle $([ $oracle_cached = 1 ] \
    && echo "from pip's cache" || echo "built"); load average before it ${test_load} on $(nproc) cores)"
  if [ "$test_took" -le "$budget" ]; then echo "replay: $what: within"
  elif awk -v l="$test_load" -v n="$(nproc)" 'BEGIN {exit !(l < n)}'; then fail "$what: over"
  else echo "replay: warning: $what: over, on a machine loaded by other work: not enforced"; fi
fi
echo "replay: set-up ok (pip check clean, no error lines, the demo answered)"

if [ $WHEEL = 1 ]; then
  start=$SECONDS
  echo "replay: \$ make wheel"
  make wheel 2>&1 | tee "$WORK/wheel.log"
  [ "${PIPESTATUS[0]}" = 0 ] || fail "make wheel"
  whl=$(ls dist/reflex_ipc-*.whl) || fail "no wheel in dist/"
  times+=("$(printf '%5d s  %s' $((SECONDS - start)) "make wheel")")
  if command -v nvcc >/dev/null 2>&1; then
    grep -q 'reflex_ipc/kernels/reflex_kernels.fatbin' <<<"$(python -m zipfile -l "$whl")" \
      || fail "the wheel has no fatbin although nvcc is present"
  fi
  start=$SECONDS
  deactivate
  python3 -m venv "$WORK/wheel-venv" || fail "venv for the wheel"
  "$WORK/wheel-venv/bin/python" -m pip install -qq "$whl" || fail "pip install the wheel"
  "$WORK/wheel-venv/bin/python" -m pip check || fail "pip check in the wheel's venv"
  "$WORK/wheel-venv/bin/python" -m reflex_ipc.defaultmodel >/dev/null || fail "default model"
  out=$(cd "$WORK" && "$WORK/wheel-venv/bin/reflex" generate --max-tokens 8 "The capital of France is") \
    || fail "reflex generate from the wheel"
  echo "replay: from the wheel: $out"
  grep -q Paris <<<"$out" || fail "the wheel's reflex generate did not answer Paris"
  times+=("$(printf '%5d s  %s' $((SECONDS - start)) "wheel: fresh venv, pip install, generate")")
fi

echo "replay: times (this machine, $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); oracle wheel $([ $oracle_cached = 1 ] && echo "in pip's cache" || echo built)):"
# make test's own steps, from its output (scripts/progress's "done in N s" lines)
grep -aE '^   .*: done in [0-9]+ s$' "$WORK/setup.log" | sed 's/^ */  step: /'
grep -aE '^[0-9]+ passed|^=+ .*(passed|failed).* in [0-9.]+s' "$WORK/setup.log" | sed 's/^/  pytest: /' | tail -1
printf '  %s\n' "${times[@]}"
if [ -n "${REPLAY_TIMES:-}" ]; then  # the figures as a bench result file
  printf '%s\n' "${times[@]}" | python3 -c '
import json, os, platform, subprocess, sys
steps = [{"seconds": int(l.split(" s ", 1)[0]), "step": l.split(" s ", 1)[1].strip()}
         for l in sys.stdin if l.strip()]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(json.dumps({"bench": "setup-times", "commit": sys.argv[1], "machine": {
    "cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
    "loadavg_end": open("/proc/loadavg").read().split()[:3]}, "steps": steps}, indent=1))
' "$(git rev-parse --short HEAD)" > "$REPLAY_TIMES"
fi
echo "replay: ok"
