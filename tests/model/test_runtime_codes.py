"""The codes Python passes the compiled step are its own enums' (pybind11 Kernel, Activation, Capture), and its
decode loop takes named arguments; the build digest covers every source."""

from __future__ import annotations

import pytest

from model.runtime import CAPTURE, compiled_extension
from model.runtime.extension import ACTIVATIONS, KERNELS

needs_compiled = pytest.mark.skipif(compiled_extension() is None, reason="the compiled runtime is not built here")


@needs_compiled
def test_the_python_codes_are_the_compiled_enums():
    extension = compiled_extension()
    assert {int(v): name for name, v in extension.Kernel.__members__.items()} == KERNELS
    assert {name: int(v) for name, v in extension.Capture.__members__.items()} == CAPTURE
    assert set(ACTIVATIONS.values()) <= {int(v) for v in extension.Activation.__members__.values()}


@needs_compiled
def test_the_loop_bindings_name_their_arguments():
    extension = compiled_extension()
    joined = extension.CompiledLoop.join.__doc__
    for name in ("hidden", "lengths", "beams", "budgets", "min_new_tokens", "length_penalties", "captures", "streams",
                 "constraints", "forced"):
        assert f"{name}:" in joined


def test_the_build_digest_covers_every_source(tmp_path, monkeypatch):
    """A built step is reused only while every source under csrc/ (bindings.cpp and each header) is unchanged."""
    import shutil

    from model.runtime import extension as step

    copy = tmp_path / "csrc"
    shutil.copytree(step.CSRC, copy)
    monkeypatch.setattr(step, "CSRC", copy)
    sources = step.source_files()
    assert {p.name for p in sources} >= {"bindings.cpp", "model.h", "runtime.h", "decoding.h", "linear.h", "vnni.h"}
    before = step.source_digest()
    for source in sources:
        original = source.read_bytes()
        source.write_bytes(original + b"\n")
        assert step.source_digest() != before, source.name
        source.write_bytes(original)
    assert step.source_digest() == before
