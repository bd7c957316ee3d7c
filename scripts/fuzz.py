"""Schemathesis against a running service's /openapi.json: no 5xx, and every error in the documented shape.

python -m scripts.fuzz                                   # starts deploy/serve.yaml with tiny models; 1,000+ cases
python -m scripts.fuzz --url http://127.0.0.1:8000       # a running service instead
python -m scripts.fuzz --max-examples 25                 # the size tests/service/test_fuzz.py runs
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from tests.harness.fuzzing import CHECKS, run_schemathesis

REPOSITORY = Path(__file__).resolve().parents[1]


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
        from bench.service import bench_config, serve_running, tiny_models
        from tests.harness.processes import free_port

        with tempfile.TemporaryDirectory(prefix="fuzz-service-") as scratch:
            config = bench_config(free_port(), tiny_models(Path(scratch)))
            config["applications"] = config["applications"][:1]
            with serve_running(config, Path(scratch)) as url:
                result = run_schemathesis(url, args.max_examples, args.seed)
    print(result.output[-4000:])
    summary = {
        "command": " ".join(["python -m scripts.fuzz", *sys.argv[1:]]),
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
