#!/usr/bin/env bash
# Run one tier of the test suite with its set-up, and say where the time went:
#   bash scripts/run_tests.sh ci     # make test: what CI runs (pytest -m "not full"), budget 30 minutes fresh
#   bash scripts/run_tests.sh full   # make test-full: the whole matrix, every run, control and kill
# It sets up .venv (scripts/setup_dev.sh) and, beside it, the e2e environment (scripts/setup_e2e.sh, once per
# machine), then runs pytest on TEST_WORKERS workers (default 2; 0 runs in one process) with --durations, and
# ends with the set-up and test wall times. verl 0.9.1's environment (setup_e2e.sh --base 0.9.1, the stack of both
# recipes' default base, which the CI tier's launches and kills run on) builds in the background from the start: the
# tests that need it wait for it (its fixture takes the same lock), the others run meanwhile. PYTEST_ARGS adds pytest
# options (e.g. PYTEST_ARGS="-x").
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1

case "${1:-}" in
  ci) select=(-m "not full") ;;
  full) select=() ;;
  -h|--help) sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "run_tests.sh: the tier is ci or full, not '${1:-}'; run with --help" >&2; exit 2 ;;
esac
tier=$1
workers=${TEST_WORKERS:-2}
now() { date +%s; }

start=$(now)
# The e2e environment (~3 GB the first time) downloads while .venv is built; both scripts are idempotent.
e2e_log=$(mktemp)
e2e091_log=$(mktemp)
trap 'rm -f "$e2e_log" "$e2e091_log" "$e2e091_log.rc"' EXIT
# verl 0.9.1's (~2.5 GB the first time), beside both and then beside the tests, until one of them needs it
( bash scripts/setup_e2e.sh --base 0.9.1 >"$e2e091_log" 2>&1; echo $? >"$e2e091_log.rc" ) &
e2e091_pid=$!
( bash scripts/setup_e2e.sh >"$e2e_log" 2>&1; echo $? >>"$e2e_log.rc" ) &
e2e_pid=$!
bash scripts/setup_dev.sh || { kill "$e2e_pid" "$e2e091_pid" 2>/dev/null; wait; exit 1; }
venv_done=$(now)
wait "$e2e_pid"
cat "$e2e_log"
e2e_rc=$(cat "$e2e_log.rc" 2>/dev/null || echo 1)
rm -f "$e2e_log.rc"
setup_done=$(now)
# A failed e2e set-up is not the end: the e2e_python fixture tries again and tells a missing wheel (a failure)
# from an unreachable index (a skip, but a failure under CI=true) in the tests' own report.
[ "$e2e_rc" = 0 ] || echo "tests: scripts/setup_e2e.sh failed (above); the tests that need it will say why"

xdist=()
[ "$workers" = 0 ] || xdist=(-n "$workers")
# tests/durations.py writes where the tier's time went, per test file, to tests/durations/<tier>.tsv (committed after
# a measured run: CONTRIBUTING.md); RECIPES_DURATIONS_OUT= (empty) writes nothing
# shellcheck disable=SC2086
RECIPES_DURATIONS_OUT=${RECIPES_DURATIONS_OUT-tests/durations/$tier.tsv} .venv/bin/python -m pytest "${xdist[@]}" "${select[@]}" --durations=30 ${PYTEST_ARGS:-}
rc=$?
# verl 0.9.1's environment: done by now when a test needed it; a run that selected none waits for it here
wait "$e2e091_pid"
e2e091_done=$(cat "$e2e091_log.rc" 2>/dev/null || echo 1)
if [ "$e2e091_done" = 0 ]; then
  tail -n 1 "$e2e091_log"
else
  cat "$e2e091_log"
  echo "tests: scripts/setup_e2e.sh --base 0.9.1 failed in the background (above); its tests said why"
fi
end=$(now)
# pytest's exit 5 (no test collected) is a failure here: a tier that runs nothing has checked nothing
echo "tests: tier $tier (make $( [ "$tier" = ci ] && echo test || echo test-full )): pytest $((end - setup_done)) s, exit $rc"
echo "tests: set-up $((setup_done - start)) s (.venv $((venv_done - start)) s; the e2e environment beside it, ready at $((setup_done - start)) s); total $((end - start)) s"
exit $rc
