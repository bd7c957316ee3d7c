"""The CPU instruction set the decoding runtime may use: this CPU's best (`auto`), or a lower one asked for with
TRANSLATE_CPU_ISA, so that the AVX2 path (the one an AVX2-only server runs) can be measured on any x86 CPU, as
CTranslate2's CT2_FORCE_CPU_ISA does for it.

    TRANSLATE_CPU_ISA=avx2 python -m bench.fast_modes ...     # or: python -m bench.fast_modes --cpu-isa avx2

The limit reaches every library a decode runs through: the runtime's own loops and its VNNI tiles (csrc/common.h's
set_cpu_isa, called when the compiled step loads), fbgemm's int8 (fbgemmForceIsa, from the same call), and, through
their environment variables, ATen's vectorized kernels (ATEN_CPU_CAPABILITY), oneDNN (ONEDNN_MAX_CPU_ISA) and MKL
(MKL_ENABLE_INSTRUCTIONS). Those three read them once, at their first use, so `limit_libraries()` runs when the
`model` package is imported, before any tensor work; a variable already set is left as it is. No torch here.
"""

from __future__ import annotations

import os

ISA_ENV = "TRANSLATE_CPU_ISA"
# name → csrc/common.h's CpuIsa level
LEVELS = {"auto": 3, "avx512": 3, "avx2": 2, "x86-64": 1}
NAMES = {3: "avx512", 2: "avx2", 1: "x86-64"}
LIBRARY_ENV = {
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "x86-64": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
}


def requested() -> str:
    """TRANSLATE_CPU_ISA, checked: auto (unset), avx512, avx2 or x86-64."""
    value = os.environ.get(ISA_ENV, "").strip().lower() or "auto"
    if value not in LEVELS:
        raise ValueError(f"{ISA_ENV}={value!r}: expected one of {', '.join(LEVELS)}")
    return value


def limit_libraries() -> None:
    """Set the libraries' own instruction-set limits for TRANSLATE_CPU_ISA (before their first use)."""
    for name, value in LIBRARY_ENV.get(requested(), {}).items():
        os.environ.setdefault(name, value)
