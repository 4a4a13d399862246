#!/usr/bin/env bash
# The main job: installs the project (into .venv when missing) and runs the demo end to end.
set -euo pipefail
cd "$(dirname "$0")"
source scripts/venv.sh
exec rectrain demo "$@"
