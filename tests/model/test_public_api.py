"""The package's public names (model/__init__.py) load on first use: every one resolves, and the names a request
is checked with load no torch (in a fresh interpreter)."""

from __future__ import annotations

import sys

import model
from tests.harness.processes import python_output


def test_every_public_name_resolves():
    assert sorted(model.__all__) == sorted(model._PUBLIC)
    for name in model.__all__:
        value = getattr(model, name)
        assert value is not None
        module, attribute = model._PUBLIC[name]
        assert value is getattr(sys.modules[module], attribute)


def test_the_request_side_names_load_no_torch():
    script = (
        "import sys\n"
        "from model import (ALIGNMENT_METHODS, ATTRIBUTION_METHODS, DEFAULT_ALIGNMENT, DEFAULT_TRUST_MODE,"
        " FLAG_KINDS, MAX_BEAM_SIZE, TRUST_MODES, AlignmentMethod, DecodingOptions, InputTooLongError,"
        " InvalidInputError)\n"
        "assert DecodingOptions(beam_size=2).beam_size == 2 and AlignmentMethod('head') == 'head'\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n"
    )
    assert python_output(script) == "[]"
