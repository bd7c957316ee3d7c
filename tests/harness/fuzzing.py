"""Schemathesis against a running service's /openapi.json: no 5xx, and every error in the documented shape.
Used by tests/service/test_fuzz.py and by `python -m scripts.fuzz` (the 1,000+ case run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import schemathesis

REPOSITORY = Path(__file__).resolve().parents[2]
CHECKS = "not_a_server_error,response_schema_conformance,content_type_conformance,error_body_shape"


@schemathesis.check
def error_body_shape(ctx, response, case) -> None:  # noqa: ARG001 - Schemathesis passes all three
    """Every error answer is the service's error object, nothing else."""
    if response.status_code < 400:
        return
    try:
        payload = json.loads(response.content)
    except ValueError:
        raise AssertionError(f"{response.status_code} body is not JSON: {response.content[:200]!r}") from None
    error = payload.get("error") if isinstance(payload, dict) else None
    valid = isinstance(error, dict) and set(error) == {"code", "message"}
    if not (valid and isinstance(error["code"], str) and isinstance(error["message"], str)):
        raise AssertionError(f"{response.status_code} body is not {{'error': {{'code', 'message'}}}}: {payload!r:.200}")


@dataclass
class FuzzResult:
    returncode: int
    cases: int
    failures: int
    output: str


def run_schemathesis(url: str, max_examples: int, seed: int = 1, timeout_s: float = 900.0) -> FuzzResult:
    """`st run` against url's /openapi.json with this module's checks; the counts from its JSON report.

    Examples, coverage and fuzzing phases, positive and negative data, with the checks not_a_server_error,
    response_schema_conformance and content_type_conformance, plus this module's own check, loaded as a
    Schemathesis hook: an answer of 400 or more must be {"error": {"code": str, "message": str}} — on every
    route, documented status or not.
    """
    st = Path(sys.executable).with_name("st")
    with tempfile.TemporaryDirectory(prefix="fuzz-") as scratch:
        report = Path(scratch) / "report.json"
        command = [
            str(st) if st.exists() else "st",
            "run",
            f"{url.rstrip('/')}/openapi.json",
            "--checks",
            CHECKS,
            "--max-examples",
            str(max_examples),
            "--seed",
            str(seed),
            "--generation-database",
            "none",
            "--workers",
            "1",
            "--request-timeout",
            "60",
            "--no-color",
            "--report",
            "json",
            "--report-json-path",
            str(report),
        ]
        environment = {
            **os.environ,
            "SCHEMATHESIS_HOOKS": "tests.harness.fuzzing",
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPOSITORY), os.environ.get("PYTHONPATH", "")) if p),
        }
        completed = subprocess.run(
            command, cwd=scratch, env=environment, capture_output=True, text=True, timeout=timeout_s
        )
        cases = failures = 0
        if report.exists():
            counts = json.loads(report.read_text())["test_cases"]
            cases, failures = counts["generated"], counts["with_failures"] + counts["errored"]
    return FuzzResult(completed.returncode, cases, failures, completed.stdout + completed.stderr)
