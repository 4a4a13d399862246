#!/usr/bin/env bash
# The main job: installs the project (into .venv when missing), then runs the whole path on embedded defaults:
# synthetic Criteo data -> DLRM on 2 local ranks (torchrun) -> checkpoint -> int8 package -> gRPC server ->
# queries + load test -> summary. Artefacts go to runs/main (--out DIR); `./run.sh --help` lists the flags.
set -euo pipefail
cd "$(dirname "$0")"
source scripts/venv.sh ""  # "" = runtime extra only (sourcing without it would pass on our own arguments)
# ./run.sh --recommend: the recommendation recipe instead (two-tower + DLRM pipeline, docs/recommend.md#recipe).
if [ "${1:-}" = "--recommend" ]; then
  shift
  exec python -m recserve.recommend.recipe "$@"
fi
exec python -m recserve.mainjob "$@"
