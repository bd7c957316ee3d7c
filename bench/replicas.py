"""How the translators use the machine's cores: replica and thread layouts side by side, one run.

    python -m bench.replicas                   # the layouts below, shipped en-zh, dev sentences
    python -m bench.replicas --layouts default one-replica

Each layout is deploy/serve.yaml with its translator deployments changed (one service at a time, same
machine): `default` (as shipped: two replicas per model at num_cpus 0.5, one torch thread each),
`one-replica` (one replica per model at num_cpus 1), `two-threads` (one replica per model, two torch threads).
Load on en-zh only, beam 4: single-text requests at concurrency 32 and 16-text requests at concurrency 8.
Prints texts/s and p50 per layout and writes bench/results/replicas-cpu.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

REPOSITORY = Path(__file__).resolve().parents[1]
if str(REPOSITORY) not in sys.path:
    sys.path.insert(0, str(REPOSITORY))

from bench.service import DEFAULT_DATA, RESULTS, bench_config, read_sentences, serve_running  # noqa: E402
from tests.loadgen import run_load, translate_bodies  # noqa: E402
from tests.processes import free_port  # noqa: E402

LAYOUTS = ("default", "one-replica", "two-threads")


def layout_config(name: str) -> dict:
    config = bench_config(free_port(), None)
    translators = [d for d in config["applications"][0]["deployments"] if d["name"].startswith("translator-")]
    for deployment in translators:
        options = deployment.setdefault("ray_actor_options", {})
        if name in ("one-replica", "two-threads"):
            deployment["num_replicas"] = 1
            options["num_cpus"] = 1
        if name == "two-threads":
            options["runtime_env"] = {"env_vars": {"OMP_NUM_THREADS": "2"}}
    return config


def measure(url: str, sentences: list[str], singles: int, batches: int, beam_size: int) -> dict[str, Any]:
    single = translate_bodies(sentences, 1, beam_size=beam_size)
    batch = translate_bodies(sentences, 16, beam_size=beam_size)
    asyncio.run(run_load(f"{url}/v1/translate", single, 64, 32))  # warm-up
    return {
        "single": asyncio.run(run_load(f"{url}/v1/translate", single, singles, 32)).summary(),
        "sixteen": asyncio.run(run_load(f"{url}/v1/translate", batch, batches, 8)).summary(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=LAYOUTS)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--single-requests", type=int, default=400)
    parser.add_argument("--batch-requests", type=int, default=40)
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument(
        "--serve-env", action="append", default=[], metavar="NAME=VALUE",
        help="environment for `serve run` (Ray Serve's own switches, e.g. RAY_SERVE_ENABLE_HA_PROXY=1); repeatable",
    )
    parser.add_argument("--output", type=Path, default=RESULTS / "replicas-cpu.json")
    args = parser.parse_args(argv)
    serve_env = dict(item.split("=", 1) for item in args.serve_env)
    os.environ.update(serve_env)  # serve_running passes this process's environment to `serve run`
    sentences = read_sentences(args.data, 1000)
    report: dict[str, Any] = {
        "command": " ".join(["python -m bench.replicas", *sys.argv[1:]]),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "beam_size": args.beam_size,
        "serve_env": serve_env,
        "layouts": {},
    }
    for name in args.layouts:
        with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as scratch:
            with serve_running(layout_config(name), Path(scratch)) as url:
                report["layouts"][name] = measure(
                    url, sentences, args.single_requests, args.batch_requests, args.beam_size
                )
        figures = report["layouts"][name]
        print(
            f"{name}: single {figures['single']['texts_per_s']} texts/s (p50 {figures['single']['p50_ms']} ms), "
            f"16-text {figures['sixteen']['texts_per_s']} texts/s (p50 {figures['sixteen']['p50_ms']} ms)",
            flush=True,
        )
    print("| layout | single-text texts/s | p50 ms | 16-text texts/s | p50 ms |")
    print("|---|---|---|---|---|")
    for name, figures in report["layouts"].items():
        single, sixteen = figures["single"], figures["sixteen"]
        cells = [single["texts_per_s"], single["p50_ms"], sixteen["texts_per_s"], sixteen["p50_ms"]]
        print(f"| {name} | " + " | ".join(str(cell) for cell in cells) + " |")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
