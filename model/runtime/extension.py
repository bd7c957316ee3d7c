"""The compiled runtime as a Python extension: its sources (csrc/: bindings.cpp and the headers it includes), their
build with torch's cpp_extension into a directory keyed by their digest, loading it once per process (None, with the
reason, where it cannot be built), and the codes Python passes it (its Kernel, Activation and Capture enums)."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
import os
import platform
import sys
import time
import warnings
from pathlib import Path

import torch

from model import cpu_isa

logger = logging.getLogger("model.runtime")

BUILD_DIR_ENV = "TRANSLATE_RUNTIME_BUILD_DIR"
CSRC = Path(__file__).parent / "csrc"
SOURCE = CSRC / "bindings.cpp"  # the one translation unit: it includes every header of csrc/
# -fopenmp-simd: the `omp simd` loops use vector lanes (no OpenMP runtime); each loop is compiled for several CPU
# levels in one build and each call goes to this CPU's copy, or TRANSLATE_CPU_ISA's, so no -march
# USE_FBGEMM: torch's own build flag, which an extension does not get; set where this torch has fbgemm and ships its
# headers, so that TRANSLATE_CPU_ISA also holds fbgemm's int8 kernels to the level (`limit_cpu_isa`)
_FBGEMM = "fbgemm" in torch.backends.quantized.supported_engines and (
    Path(torch.__file__).parent / "include" / "fbgemm" / "Utils.h"
).is_file()
# -fno-trapping-math: a clamp in a loop may then be a lane-wise select, so GCC vectorises it; values are unchanged
# (no reassociation, no finite-math assumptions).
CFLAGS = ["-O2", "-fopenmp-simd", "-fno-trapping-math", *(["-DUSE_FBGEMM"] if _FBGEMM else [])]
KERNELS = {0: "linear", 1: "transposed", 2: "int8", 3: "onednn", 4: "tiles"}  # the runtime's Kernel enum
QUANTIZED = ("int8", "tiles")  # fbgemm's dynamic int8 linear; the runtime's own int8 tiles (AVX-512 VNNI or AVX2)
ACTIVATIONS = {"swish": 0, "silu": 0, "relu": 1, "gelu": 2, "gelu_new": 3, "gelu_fast": 3, "gelu_pytorch_tanh": 3}
CAPTURE = {"nothing": 0, "every_head": 1, "one_head": 2}  # the runtime's Capture: what a search keeps

_extension: object | None = None
_extension_error: str | None = None


@functools.cache
def cpu_model() -> str:
    """The CPU's model name and its widest vector units, e.g. "AMD EPYC (AVX-512, VNNI)": what every speed figure
    is reported against (a virtual machine may name only the vendor, and the same name covers CPUs with and
    without AVX-512)."""
    name, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="ascii", errors="ignore").splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    units = [label for flag, label in (("avx512f", "AVX-512"), ("avx512_vnni", "VNNI"), ("amx_int8", "AMX"))
             if flag in flags]
    if not units and "avx2" in flags:
        units = ["AVX2"]
    return f"{name} ({', '.join(units)})" if units else name


def build_directory() -> Path:
    default = Path.home() / ".cache" / "attention-translate" / f"runtime-torch{torch.__version__.split('+')[0]}"
    return Path(os.environ.get(BUILD_DIR_ENV) or default)


def source_files() -> list[Path]:
    """Every source of the compiled step: bindings.cpp and the headers (and .inc parts) under csrc/."""
    return sorted(p for p in CSRC.rglob("*") if p.suffix in (".cpp", ".h", ".inc"))


def source_digest() -> str:
    """What a built step must match: every source file (its path and bytes), its compiler flags, this torch and
    this Python."""
    key = b"".join(str(p.relative_to(CSRC)).encode() + b"\0" + p.read_bytes() for p in source_files())
    key += f"|{CFLAGS}|{torch.__version__}|{sys.version_info[:2]}".encode()
    return hashlib.sha256(key).hexdigest()


def _prebuilt(directory: Path):
    """The step built earlier into `directory` for this source, torch and Python (no compiler needed to load it)."""
    library, digest = directory / "translation_runtime.so", directory / "source.sha256"
    try:
        if not library.is_file() or digest.read_text(encoding="ascii").strip() != source_digest():
            return None
    except OSError:
        return None
    spec = importlib.util.spec_from_file_location("translation_runtime", library)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(verbose: bool = False):
    """The C++ step: loaded as built earlier, else compiled now with torch.utils.cpp_extension (a C++ compiler,
    Python's headers and ninja); raises when it cannot be built."""
    directory = build_directory()
    module = _prebuilt(directory)
    if module is not None:
        return module
    from torch.utils.cpp_extension import load

    directory.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module = load(
            name="translation_runtime", sources=[str(SOURCE)], build_directory=str(directory),
            extra_cflags=CFLAGS, verbose=verbose,
        )
    (directory / "source.sha256").write_text(source_digest() + "\n", encoding="ascii")
    return module


def compiled_extension():
    """The compiled step's module, built once per process; None (with the reason logged once) when it cannot be."""
    global _extension, _extension_error
    if _extension is not None or _extension_error is not None:
        return _extension
    started = time.perf_counter()
    try:
        module = build()
        check_codes(module)
    except Exception as error:  # no compiler, no Python headers, no ninja: the eager step still decodes
        _extension_error = f"{type(error).__name__}: {str(error).strip().splitlines()[-1] if str(error) else ''}"[:300]
        logger.warning(
            "decoding runtime: the compiled step could not be built, decoding eagerly (%s)", _extension_error
        )
        return None
    requested = cpu_isa.requested()
    level = module.set_cpu_isa(cpu_isa.LEVELS[requested])
    if requested != "auto":
        logger.info("decoding runtime: %s=%s: the compiled step runs at %s", cpu_isa.ISA_ENV, requested,
                    cpu_isa.NAMES[level])
    _extension = module
    logger.info("decoding runtime: compiled step ready in %.1f s", time.perf_counter() - started)
    return _extension


def check_codes(extension) -> None:
    """The codes Python passes are the compiled step's: KERNELS and CAPTURE name its Kernel and Capture enums'
    values, ACTIVATIONS map onto its Activation's."""
    kernels = {int(value): name for name, value in extension.Kernel.__members__.items()}
    captures = {name: int(value) for name, value in extension.Capture.__members__.items()}
    activations = {int(value) for value in extension.Activation.__members__.values()}
    if kernels != KERNELS or captures != CAPTURE or not set(ACTIVATIONS.values()) <= activations:
        raise RuntimeError("the Python codes disagree with the compiled runtime's enums")


def failure() -> str | None:
    """Why the compiled step could not be built in this process (after `compiled_extension` returned None)."""
    return _extension_error
