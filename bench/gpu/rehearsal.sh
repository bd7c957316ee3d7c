#!/usr/bin/env bash
# Rehearses the GPU check's bundle on this machine, before a lent GPU machine's minutes are spent on it:
# a fresh virtual environment with only the packages of the GPU machines' image that the bundle counts on
# (bench/gpu/image_packages.txt), the bundle built for this Python unpacked beside it, and the check's serve
# stages (GPU_REHEARSAL_STAGES: which) and engine tests run on the CPU (`--device cpu`: no num_gpus, float32). A module
# the bundle lacks fails here as it would there.
#
#   bash bench/gpu/rehearsal.sh [output folder]     # ~10 minutes
set -euo pipefail
cd "$(dirname "$0")/../.."
output=${1:-$(mktemp -d /tmp/gpu-rehearsal.XXXXXX)}
python=$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
venv=$(mktemp -d /tmp/gpu-rehearsal-venv.XXXXXX)
site=$(mktemp -d /tmp/gpu-rehearsal-site.XXXXXX)
bundle=$(mktemp -d /tmp/gpu-rehearsal-bundle.XXXXXX)  # not .gpu/: that bundle is for the GPU machines' Python
trap 'rm -rf "$venv" "$site" "$bundle"' EXIT
python3 -m venv "$venv"
# The image's packages the bundle counts on, and what the check itself runs (torch there is a CUDA build).
"$venv/bin/pip" install -q torch==2.13.0 transformers sacrebleu sentencepiece safetensors pytest \
  -r bench/gpu/image_packages.txt
BUNDLE_PYTHON="$python" BUNDLE_DIR="$bundle" bash bench/gpu/bundle.sh
tar -xJf "$bundle/site.tar.xz" -C "$site"
PYTHONPATH="$site" "$venv/bin/python" -m bench.gpu.check --device cpu --data "$bundle/dev.tsv" --output "$output" \
  --stages ${GPU_REHEARSAL_STAGES:-environment serve serve-continuous tests} --port "${GPU_REHEARSAL_PORT:-8000}"
"$venv/bin/python" - "$output/gpu-check.json" <<'PY'
import json, sys

report = json.load(open(sys.argv[1]))
failed = [row for row in report["rows"] if row["ok"] is False]
errors = {name: stage["error"] for name, stage in report["stages"].items() if "error" in stage}
if failed or errors:
    sys.exit(f"rehearsal failed: {failed or ''} {errors or ''}")
print("rehearsal passed: on the image's packages and the bundle, the GPU config serves and the engine tests pass")
PY
