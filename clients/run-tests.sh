#!/usr/bin/env bash
# Runs the three client suites (Node, Go, Python) and the README examples; exits
# non-zero if any fails.
# The real server is `reflex stdio` unless $REFLEX_CMD says otherwise.
set -u
cd "$(dirname "$0")"
PY=${PY:-python3}
status=0
run() {
  local name=$1; shift
  echo "== clients/$name: $*"
  if "$@"; then echo "== clients/$name: ok"; else echo "== clients/$name: FAILED"; status=1; fi
}
run node bash -c 'cd node && node --test --test-concurrency=1 test/*.test.js'
run go bash -c 'cd go && go test -count=1 ./...'
run python bash -c "cd python && $PY -m pytest -q -p no:cacheprovider tests"
# the README examples as complete programs, installed and run the way the READMEs say
run snippets "$PY" ../scripts/check_readme_snippets.py
exit $status
