#!/usr/bin/env bash
# Installs the project and its test tools (into .venv when missing), then lints and runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")"
source scripts/venv.sh test
ruff check .
ruff format --check .
set +e
python -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "test.sh: pytest collected no tests; treating that as a failure" >&2
  exit 1
fi
exit "$rc"
