#!/usr/bin/env bash
# The one command, run on a machine with network, that prepares what scripts/device_check.sh installs on a GPU
# machine without network (torch 2.11 + CUDA 13, Python 3.12, x86_64; docs/gpu.md):
#
#   bash scripts/gpu_wheels.sh            # -> wheels/base/ (small wheels) and wheels/part-NN/ (<= 60 MiB each)
#   bash scripts/gpu_wheels.sh --check    # only ask the indexes that every pinned wheel exists (no download)
#
# wheels/ is git-ignored. Only what that machine lacks is fetched (its image has torch, numpy, pyarrow, numba,
# aiohttp, pytest, hypothesis, ...; KINDS.md of the lending tool lists them): fbgemm-gpu 1.6.0, the CUDA build
# for torch 2.11; TorchRec 1.6.1 and the few packages it imports (installed with --no-deps, as
# scripts/torchrec_venv.sh does: its declared dependencies would pull another torch); the gRPC and protobuf
# versions this project's tests pass with here; and this project as a wheel (pip wheel --no-deps .). The
# fbgemm-gpu wheel (~440 MB) is then cut into parts that each fit one trip (scripts/wheel_parts.py).
#
# Environment: PYTHON (whose pip downloads and builds; default .venv/bin/python, else python3), WHEELS (the
# folder, default wheels), PART_MB (largest part, default 60), FBGEMM_INDEX (default
# https://download.pytorch.org/whl/cu130, where fbgemm-gpu 1.6.0+cu130 lives; if it cannot be reached, PyPI's
# fbgemm-gpu 1.6.0, also a CUDA build, is taken and the script says so), FBGEMM_WHEEL (an fbgemm-gpu wheel
# already downloaded: used instead of downloading ~440 MB again), EXTRA (more NAME==VERSION to carry).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
WHEELS="${WHEELS:-wheels}"
PART_MB="${PART_MB:-60}"
FBGEMM_INDEX="${FBGEMM_INDEX:-https://download.pytorch.org/whl/cu130}"
FBGEMM="fbgemm-gpu==1.6.0"
CHECK=0
[ "${1:-}" = "--check" ] && CHECK=1

# The versions this machine's suite passes with, for the packages whose versions must agree (generated stubs).
pinned() {
  "$PY" - "$@" <<'EOF'
import importlib.metadata as md
import sys
for name in sys.argv[1:]:
    try:
        print(f"{name}=={md.version(name)}")
    except md.PackageNotFoundError:
        print(name)
EOF
}
# shellcheck disable=SC2207
PACKAGES=(
  torchrec==1.6.1 tensordict==0.15.3 pyvers==0.2.3 iopath==0.1.9 torchmetrics==1.0.3
  $(pinned grpcio grpcio-tools grpcio-health-checking grpcio-reflection protobuf)
  ${EXTRA:-}
)
TARGET=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)

if ((CHECK)); then
  # pip index asks for the list of files only: nothing large is downloaded.
  for spec in "$FBGEMM" "${PACKAGES[@]}"; do
    name="${spec%%==*}" want=""
    [[ "$spec" == *==* ]] && want="${spec#*==}"
    found="$("$PY" -m pip index versions "$name" "${TARGET[@]}" 2>/dev/null || true)"
    if grep -q "Available versions:.*\b${want//./\\.}\b" <<<"$found"; then
      echo "ok       $spec"
    else
      echo "MISSING  $spec (for cp312 manylinux x86_64)"
      CHECK=2
    fi
  done
  if "$PY" -m pip index versions fbgemm-gpu --index-url "$FBGEMM_INDEX" "${TARGET[@]}" >/dev/null 2>&1; then
    echo "ok       $FBGEMM_INDEX serves fbgemm-gpu"
  else
    echo "note     $FBGEMM_INDEX unreachable from here: PyPI's $FBGEMM would be taken"
  fi
  exit $((CHECK == 2))
fi

rm -rf "$WHEELS/base" "$WHEELS"/part-* # what an earlier run left
mkdir -p "$WHEELS/base"
download() { "$PY" -m pip download -q --no-deps "${TARGET[@]}" -d "$WHEELS/base" "$@"; }

if [ -n "${FBGEMM_WHEEL:-}" ]; then
  cp "$FBGEMM_WHEEL" "$WHEELS/base/"
  echo "fbgemm-gpu: $FBGEMM_WHEEL (given)" >"$WHEELS/base/SOURCES.txt"
elif echo "fbgemm-gpu: trying $FBGEMM_INDEX" >&2 && download --index-url "$FBGEMM_INDEX" "$FBGEMM"; then
  echo "fbgemm-gpu from $FBGEMM_INDEX" >"$WHEELS/base/SOURCES.txt"
else
  echo "fbgemm-gpu: $FBGEMM_INDEX unreachable; taking PyPI's $FBGEMM (a CUDA build too)" >&2
  download "$FBGEMM"
  echo "fbgemm-gpu from PyPI" >"$WHEELS/base/SOURCES.txt"
fi
download "${PACKAGES[@]}"
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$WHEELS/base" . ||
  "$PY" -m pip wheel -q --no-deps -w "$WHEELS/base" .
git rev-parse HEAD >>"$WHEELS/base/SOURCES.txt" 2>/dev/null || true

"$PY" scripts/wheel_parts.py split "$WHEELS" --mb "$PART_MB"
echo
du -sh "$WHEELS"/base "$WHEELS"/part-* 2>/dev/null
echo "carry $WHEELS/base and each $WHEELS/part-NN to the GPU machine (docs/gpu.md), then run" \
  "bash scripts/device_check.sh there"
