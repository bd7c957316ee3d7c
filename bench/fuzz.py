"""Schemathesis against a running service's /openapi.json: no 5xx, and every error in the documented shape.

    python -m bench.fuzz                                   # starts deploy/serve.yaml with tiny models; 1,000+ cases
    python -m bench.fuzz --url http://127.0.0.1:8000       # a running service instead
    python -m bench.fuzz --max-examples 25                 # the size tests/service/test_fuzz.py runs

It runs `st run` (examples, coverage and fuzzing phases, positive and negative data) with the
checks not_a_server_error, response_schema_conformance and content_type_conformance, plus this
module's own check, loaded as a Schemathesis hook: an answer of 400 or more must be
{"error": {"code": str, "message": str}} — on every route, documented status or not.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import schemathesis

REPOSITORY = Path(__file__).resolve().parents[1]
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
    """`st run` against url's /openapi.json with this module's checks; the counts from its JSON report."""
    st = Path(sys.executable).with_name("st")
    with tempfile.TemporaryDirectory(prefix="fuzz-") as scratch:
        report = Path(scratch) / "report.json"
        command = [
            str(st) if st.exists() else "st", "run", f"{url.rstrip('/')}/openapi.json",
            "--checks", CHECKS, "--max-examples", str(max_examples), "--seed", str(seed),
            "--generation-database", "none", "--workers", "1", "--request-timeout", "60", "--no-color",
            "--report", "json", "--report-json-path", str(report),
        ]
        environment = {
            **os.environ,
            "SCHEMATHESIS_HOOKS": "bench.fuzz",
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running service, e.g. http://127.0.0.1:8000 (default: start one, tiny models)")
    parser.add_argument("--max-examples", type=int, default=250, help="per operation and phase (250: 1,000+ cases)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--output", type=Path, default=REPOSITORY / "bench" / "results" / "fuzz.json")
    args = parser.parse_args(argv)
    if args.url:
        result = run_schemathesis(args.url, args.max_examples, args.seed)
    else:
        from bench.service import bench_config, free_port, serve_running, tiny_models

        with tempfile.TemporaryDirectory(prefix="fuzz-service-") as scratch:
            config = bench_config(free_port(), tiny_models(Path(scratch)))
            config["applications"] = config["applications"][:1]
            with serve_running(config, Path(scratch)) as url:
                result = run_schemathesis(url, args.max_examples, args.seed)
    print(result.output[-4000:])
    summary = {
        "command": " ".join(["python -m bench.fuzz", *sys.argv[1:]]),
        "checks": CHECKS.split(","),
        "max_examples": args.max_examples,
        "seed": args.seed,
        "cases": result.cases,
        "failures": result.failures,
        "exit_code": result.returncode,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"{result.cases} cases generated, {result.failures} with failures, st exit code {result.returncode}")
    return 0 if result.returncode == 0 and result.failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
