#!/usr/bin/env bash
# Packs what bench/gpu_check.py needs beyond a GPU machine's own Python image into .gpu/ (git-ignored),
# for a machine that cannot reach a package registry (this workplace's lent GPU machines):
#
#   bash bench/gpu_bundle.sh            # here, with pip access: writes .gpu/site.tar.xz and .gpu/dev.tsv
#   # there, from the repository root:
#   mkdir -p /tmp/site && tar -xJf .gpu/site.tar.xz -C /tmp/site && export PYTHONPATH=/tmp/site
#   python3 -m bench.gpu_check --data .gpu/dev.tsv --output "$OUT"
#
# The image there (workplace 'cuda', Python 3.12) has torch, transformers, sacrebleu, sentencepiece, numpy,
# aiohttp, grpcio 1.84, protobuf, pyyaml, httpx, uvloop and prometheus-client, but not ray, pydantic, fastapi,
# starlette, uvicorn or the service's own dependencies. The bundle carries those, slimmed to fit the 64 MiB a
# call may carry with the checkout (ray's Java jar, dashboard frontend, RLlib, Data, Train and Tune removed;
# binaries stripped: ~23 MB as xz). lingua-language-detector (170 MB) cannot travel: a stub module stands in,
# which is enough because the check sends explicit languages and never detects one.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
           --platform manylinux_2_27_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_5_x86_64
           --platform manylinux1_x86_64 --platform any)
python3 -m pip install -q --target "$work/site" --python-version 3.12 --implementation cp --only-binary=:all: \
  "${platforms[@]}" "ray[serve]==2.60.0" "grpcio-reflection==1.84.0" "grpcio==1.84.0" \
  fastapi-offline sentencex python-multipart wcwidth
mkdir -p "$work/slim/google"
keep=(ray pydantic pydantic_core annotated_types typing_inspection fastapi fastapi_offline annotated_doc starlette
      uvicorn jsonschema jsonschema_specifications referencing rpds colorful aiohttp_cors opencensus opentelemetry
      smart_open wrapt watchfiles websockets httptools dotenv proto grpc_reflection sentencex multipart
      python_multipart wcwidth)
for name in "${keep[@]}"; do
  [ -e "$work/site/$name" ] && cp -r "$work/site/$name" "$work/slim/"
  cp -r "$work/site/$name"-*.dist-info "$work/slim/" 2>/dev/null || true
done
cp -r "$work/site/"{opencensus_context,opentelemetry_*,grpcio_reflection,protobuf}-*.dist-info "$work/slim/" 2>/dev/null || true
for part in api_core api rpc type logging longrunning protobuf _upb; do
  [ -e "$work/site/google/$part" ] && cp -r "$work/site/google/$part" "$work/slim/google/"
done
(cd "$work/slim/ray" && rm -rf jars dashboard/client/build rllib data train tune llm air/examples serve/tests tests \
  && strip --strip-unneeded _raylet.so core/src/ray/gcs/gcs_server core/src/ray/raylet/raylet)
# Ray's dashboard refuses to start without its frontend; an empty build directory is enough for Serve.
mkdir -p "$work/slim/ray/dashboard/client/build/static"
printf '<!doctype html><title>dashboard not bundled</title>\n' > "$work/slim/ray/dashboard/client/build/index.html"
mkdir -p "$work/slim/lingua"
cat > "$work/slim/lingua/__init__.py" <<'PY'
"""Stand-in for lingua-language-detector (170 MB) in the GPU check's bundle: the check never detects a language."""


class _Codes:
    def __getattr__(self, name):
        return name


IsoCode639_1 = _Codes()


class LanguageDetectorBuilder:
    @staticmethod
    def from_iso_codes_639_1(*codes):
        raise RuntimeError("language detection is not bundled for the GPU check")
PY
find "$work/slim" -name __pycache__ -prune -exec rm -rf {} +
mkdir -p .gpu
tar -C "$work/slim" -cf - . | xz -9e -T0 > .gpu/site.tar.xz
cp ../shared/data/tatoeba-en-zh/dev.tsv .gpu/dev.tsv
rm -rf "$work"
du -sh .gpu/site.tar.xz
