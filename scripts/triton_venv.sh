#!/usr/bin/env bash
# Builds (once) and prints the path of a virtual environment holding NVIDIA Triton Inference Server's
# `tritonserver` binary (bundled in the nvidia-pytriton wheel) and what its Python backend needs to host a
# recserve package (bench/serve_vs_triton.py). It lives outside the repository (default:
# ~/.cache/rectrain/triton-venv, or $RECTRAIN_TRITON_VENV). The backend's stub is built against numpy 1.x (under
# numpy 2 its tensors read as garbage), so this venv pins numpy<2 and brings its own torch and FBGEMM; recserve
# itself comes from the checkout (PYTHONPATH). The stub embeds the libpython of the interpreter's minor version:
# build this venv with the same Python as the project's.
set -euo pipefail
V="${RECTRAIN_TRITON_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/rectrain/triton-venv}"
check='import numpy, torch, fbgemm_gpu, safetensors, pytriton; assert numpy.__version__ < "2"'
if [ -x "$V/bin/python" ] && "$V/bin/python" -c "$check" 2>/dev/null; then
  echo "$V"
  exit 0
fi
echo "building the Triton reference environment at $V (first use takes a few minutes)" >&2
mkdir -p "$(dirname "$V")"
"${PYTHON:-python3}" -m venv "$V"
"$V/bin/pip" install -q --disable-pip-version-check nvidia-pytriton==0.7.0 torch==2.13.0 fbgemm-gpu-cpu==1.8.0 \
  safetensors "numpy<2" >&2
"$V/bin/python" -c "$check" >&2
echo "$V"
