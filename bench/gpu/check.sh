#!/usr/bin/env bash
# The GPU path checked in one command on a GPU machine (under 10 minutes): see bench/gpu/check.py.
#
#   bash bench/gpu/check.sh [--output DIR] [more bench.gpu.check options]
#
# torch 2.13.0's default Linux x86_64 wheel on PyPI is the CUDA 13 build (it pulls the CUDA libraries as
# nvidia-*-cu13 wheels; the driver must be 580 or later). This installs it when the python here has no
# CUDA-enabled torch, and the project's dev dependencies (transformers, sacrebleu, ray[serve], ...) when
# they are missing. CTranslate2's CUDA build links CUDA 12's cuBLAS: for its rows also
# `pip install nvidia-cublas-cu12` and put its lib/ directory on LD_LIBRARY_PATH; without it the
# engine stage reports CTranslate2 as not measured and goes on.
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 - <<'PY' || python3 -m pip install "torch==2.13.0" --index-url https://pypi.org/simple
import sys, torch
sys.exit(0 if torch.cuda.is_available() else 1)
PY
python3 -c "import transformers, sacrebleu, ray.serve, httpx, yaml, pytest" 2>/dev/null || python3 -m pip install -e '.[dev]'
exec python3 -m bench.gpu.check "$@"
