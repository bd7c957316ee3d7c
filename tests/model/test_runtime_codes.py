"""The codes Python passes the compiled step are its own enums' (pybind11 Kernel, Activation, Capture), and its
step takes named arguments: step_at for the static search's cache, step_rows for the continuous scheduler's rows."""

from __future__ import annotations

import pytest

from model.runtime import CAPTURE, compiled_extension
from model.runtime.step import ACTIVATIONS, KERNELS

pytestmark = pytest.mark.skipif(compiled_extension() is None, reason="the compiled runtime is not built here")


def test_the_python_codes_are_the_compiled_enums():
    extension = compiled_extension()
    assert {int(v): name for name, v in extension.Kernel.__members__.items()} == KERNELS
    assert {name: int(v) for name, v in extension.Capture.__members__.items()} == CAPTURE
    assert set(ACTIVATIONS.values()) <= {int(v) for v in extension.Activation.__members__.values()}


def test_the_step_bindings_name_their_arguments():
    docs = compiled_extension().Runtime.step_at.__doc__ + compiled_extension().Runtime.step_rows.__doc__
    for name in ("position", "positions", "width", "self_mask", "source_mask", "need_weights"):
        assert f"{name}:" in docs
