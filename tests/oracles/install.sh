#!/usr/bin/env bash
# The attribution oracle's own environment: inseq 0.7.1 on transformers 4.57.3 (inseq's value zeroing fails on
# transformers 5), beside the installed CPU torch (the venv sees the system site-packages; the constraint keeps
# pip from replacing torch with a CUDA build). tests/model/test_attribution.py runs it as a subprocess.
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=.oracle/venv
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv --system-site-packages "$venv"
fi
torch_version=$(python3 -c 'import torch; print(torch.__version__.split("+")[0])')
echo "torch==$torch_version" > .oracle/constraints.txt
"$venv/bin/python" -m pip install -q --disable-pip-version-check -c .oracle/constraints.txt \
  inseq==0.7.1 transformers==4.57.3 2>&1 | grep -v "does not provide the extra" || true
"$venv/bin/python" -c 'import inseq, transformers; assert transformers.__version__ == "4.57.3"'
