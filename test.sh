#!/usr/bin/env bash
# Installs the project and its test tools (into .venv when missing), then lints and runs the whole test suite.
# Then, unless RECTRAIN_SKIP_TRITON_ENV is set, runs the Triton tests in .venv-triton: the project installed
# beside tritonclient[grpc] in one resolve (protobuf 6 and the grpcio packages that accept it); there the real
# tritonclient drives every call of a live server, so the serving stack runs under protobuf 6 too.
set -euo pipefail
cd "$(dirname "$0")"

run_pytest() {
  set +e
  python -m pytest "$@"
  local rc=$?
  set -e
  if [ "$rc" -eq 5 ]; then
    echo "test.sh: pytest collected no tests; treating that as a failure" >&2
    return 1
  fi
  return "$rc"
}

(
  source scripts/venv.sh test
  ruff check .
  ruff format --check .
  # One pytest process per core (pytest-xdist): most slow tests wait on subprocesses, sockets and timeouts.
  # Work stealing: a worker that runs out takes queued tests from the other, so one long test does not
  # hold a queue behind it while the other worker sits idle (--dist load hands out fixed chunks).
  # The slowest tests are printed so that the suite's length (kept under 15 minutes) is watched.
  run_pytest -n "${RECTRAIN_TEST_PROCESSES:-auto}" --dist worksteal --durations=20 "$@"
)
if [ -z "${RECTRAIN_SKIP_TRITON_ENV:-}" ]; then
  (
    export RECTRAIN_VENV=.venv-triton
    source scripts/venv.sh test,triton
    python -c "import google.protobuf as p, tritonclient; print('protobuf', p.__version__, 'with tritonclient')"
    run_pytest -q tests/serving/test_tritonclient.py tests/serving/test_triton_ext.py tests/serving/test_protogen.py
  )
fi
