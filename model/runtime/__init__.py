"""The decoding runtime: one compiled call per decoding step (every decoder layer, the output projection), with the
matmul kernels measured on the real weights when a model loads, and the lecture model's eager step as the fallback.

`load_step(model, precision)` gives what the search and the continuous scheduler step through; `build()` compiles
the C++ step (model/runtime/csrc/, over ATen) ahead of time, as the Dockerfile and CI do.
"""

from __future__ import annotations

from model.runtime.eager import cast_weights
from model.runtime.extension import CAPTURE, build, compiled_extension
from model.runtime.step import (
    RUNTIME_ENV,
    CompiledStep,
    EagerStep,
    RuntimeInfo,
    load_step,
)

__all__ = [
    "CAPTURE", "RUNTIME_ENV", "CompiledStep", "EagerStep", "RuntimeInfo", "build", "compiled_extension", "cast_weights",
    "load_step",
]
