#!/usr/bin/env bash
# The whole test suite, step by step, with the time each step took (the CI budget is 90 min).
# Called by `make test` (the README's test command) and therefore by .ci/run.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
declare -a SUMMARY=()
T0=$(date +%s)

summary() {
  echo
  echo "==== step times ===="
  for line in "${SUMMARY[@]}"; do echo "  $line"; done
  echo "  total: $(( $(date +%s) - T0 ))s"
}

step() {
  local name=$1; shift
  local start; start=$(date +%s)
  echo
  echo "==== $name: $*"
  "$@"
  local rc=$?
  # pytest exit code 5 = no tests collected in that group: say so, do not fail the run.
  if [ $rc -eq 5 ] && [[ "$1" == *pytest ]]; then echo "(no tests in this group yet)"; rc=0; fi
  local took=$(( $(date +%s) - start ))
  SUMMARY+=("$(printf '%-12s %5ss  %s' "$name" "$took" "$([ $rc -eq 0 ] && echo ok || echo "FAILED rc=$rc")")")
  if [ $rc -ne 0 ]; then
    summary
    exit $rc
  fi
}

step setup       make --no-print-directory install
step prometheus  ./scripts/ensure_prometheus.sh
step browser     ./scripts/ensure_browser.sh
step binaries    "$BIN/gpufed" local build
step lint        make --no-print-directory lint
step unit        "$BIN/pytest" tests/unit
step integration "$BIN/pytest" tests/integration
step e2e         "$BIN/pytest" tests/e2e
summary
