#!/usr/bin/env bash
# The whole CPU test suite, as the README and CI run it.
#  1. the main tree (registration, reference, build checks, ...) in one pytest process;
#  2. tests/interp in its own process: TRITON_INTERPRET must be set before any kernel module is
#     imported, so those tests cannot share a process with the rest.
# pytest exit code 5 ("no tests collected") is a failure for the main tree and accepted for the
# optional trees, whose every test may skip on a machine without their toolchain.
set -uo pipefail
cd "$(dirname "$0")/.."

status=0
run_pytest() {  # $1: "required" or "optional", rest: pytest args
  local kind=$1; shift
  python -m pytest "$@"  # the interpreter on PATH, never another environment's pytest script
  local rc=$?
  if [ "$rc" -eq 5 ] && [ "$kind" = optional ]; then rc=0; fi
  if [ "$rc" -ne 0 ]; then status=$rc; fi
}

run_pytest required tests --ignore=tests/interp --durations=10 "$@"
if [ -d tests/interp ]; then
  TRITON_INTERPRET=1 run_pytest optional tests/interp "$@"
fi
exit $status
