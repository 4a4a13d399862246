#!/usr/bin/env bash
# Builds (once) and prints the path of a virtual environment holding TorchRec 1.8.0 on torch 2.13 CPU, the
# reference that benchmarks and TorchRec-interop tests compare against. It lives outside the repository
# (default: ~/.cache/rectrain/torchrec-venv, or $RECTRAIN_TORCHREC_VENV) and never enters the project's venv:
# TorchRec's declared dependencies would pull a CUDA build of fbgemm-gpu, so torchrec goes in with --no-deps
# beside the few packages it really imports.
set -euo pipefail
V="${RECTRAIN_TORCHREC_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/rectrain/torchrec-venv}"
# Tests run in parallel (pytest-xdist) may ask at once: one builds, the others wait for it.
mkdir -p "$(dirname "$V")"
exec 9>"$V.lock"
flock 9
if [ -x "$V/bin/python" ] && "$V/bin/python" -c "import torchrec, safetensors" 2>/dev/null; then
  echo "$V"
  exit 0
fi
echo "building the TorchRec reference environment at $V (first use takes a few minutes)" >&2
mkdir -p "$(dirname "$V")"
"${PYTHON:-python3}" -m venv "$V"
"$V/bin/pip" install -q --disable-pip-version-check torch==2.13.0 fbgemm-gpu-cpu==1.8.0 tensordict \
  torchmetrics==1.0.3 tqdm pyre-extensions iopath numpy safetensors pyyaml >&2
"$V/bin/pip" install -q --disable-pip-version-check --no-deps torchrec==1.8.0 >&2
"$V/bin/python" -c "import torchrec" >&2
echo "$V"
