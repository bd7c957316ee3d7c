"""Schemathesis against the running service's /openapi.json: no 5xx, every error in the documented shape.

A test-sized run (about 330 generated cases); `python -m scripts.fuzz --url URL` runs the 1,000+ case
version with the same checks (see tests/harness/fuzzing.py).
"""

import pytest

from tests.harness.fuzzing import run_schemathesis

pytestmark = pytest.mark.slow

MAX_EXAMPLES = 25


def test_generated_requests_get_no_server_error_and_well_formed_errors(service_url):
    result = run_schemathesis(service_url, MAX_EXAMPLES, timeout_s=300)
    assert result.returncode == 0 and result.failures == 0, result.output[-6000:]
    assert result.cases >= 250, result.output[-2000:]
