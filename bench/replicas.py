"""How the translators use the machine's cores: replica and thread layouts side by side, one run.

    python -m bench.replicas                   # the layouts below, shipped en-zh, dev sentences
    python -m bench.replicas --layouts default one-replica
    python -m bench.replicas --layouts default shallow-queues --rounds 3 --batch-concurrency 32 --batch-requests 80

Each layout is deploy/serve.yaml with its translator deployments changed (one service at a time, same
machine): `default` (as shipped: two replicas per model at num_cpus 0.5, one torch thread each, each taking up
to 64 calls), `shallow-queues` (the same with max_ongoing_requests: 4 per translator replica, so calls beyond
that wait at the ingress's handle for whichever replica frees a slot first),
`one-replica` (one replica per model at num_cpus 1), `two-threads` (one replica per model, two torch threads).
Load on en-zh only, beam 4: single-text requests at concurrency 32 and 16-text requests at concurrency 8
(--batch-concurrency). With --rounds N the layouts take turns N times (this machine is noisy) and the table
gives each figure's median. Also reported: the whole machine's CPU use during each load (all of the serve
session's processes and the load generator, in cores). Writes bench/results/replicas-cpu.json.
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

from bench import service  # noqa: E402
from bench.service import DEFAULT_DATA, RESULTS, bench_config, read_sentences, serve_running  # noqa: E402
from tests.loadgen import run_load, translate_bodies  # noqa: E402
from tests.processes import free_port  # noqa: E402

LAYOUTS = ("default", "shallow-queues", "one-replica", "two-threads")


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
        if name == "shallow-queues":
            deployment["max_ongoing_requests"] = 4
    return config


def loaded(url: str, bodies, requests: int, concurrency: int, session: int) -> dict[str, Any]:
    """One closed-loop load's summary, with the cores the machine's serving and load generation used meanwhile."""
    before = service.cpu_seconds(session)
    result = asyncio.run(run_load(f"{url}/v1/translate", bodies, requests, concurrency))
    used = sum((service.cpu_seconds(session) - before).values())
    summary = result.summary()
    summary["cores_busy"] = round(used / result.wall_s, 2)
    return summary


def measure(
    url: str, sentences: list[str], singles: int, batches: int, beam_size: int, batch_concurrency: int, session: int
) -> dict[str, Any]:
    single = translate_bodies(sentences, 1, beam_size=beam_size)
    batch = translate_bodies(sentences, 16, beam_size=beam_size)
    asyncio.run(run_load(f"{url}/v1/translate", single, 64, 32))  # warm-up
    return {
        "single": loaded(url, single, singles, 32, session),
        "sixteen": loaded(url, batch, batches, batch_concurrency, session),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=LAYOUTS)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--single-requests", type=int, default=400)
    parser.add_argument("--batch-requests", type=int, default=40)
    parser.add_argument("--batch-concurrency", type=int, default=8, help="concurrency of the 16-text requests")
    parser.add_argument("--rounds", type=int, default=1, help="times the layouts take turns; medians reported")
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument(
        "--serve-env", action="append", default=[], metavar="NAME=VALUE",
        help="environment for `serve run` (Ray Serve's own switches, e.g. RAY_SERVE_ENABLE_HA_PROXY=1); repeatable",
    )
    parser.add_argument("--output", type=Path, default=RESULTS / "replicas-cpu.json")
    args = parser.parse_args(argv)
    service.exit_on_sigterm()  # a timeout or kill still stops the serve session this run started
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
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in args.layouts}
    for _ in range(args.rounds):
        for name in args.layouts:
            started: list[int] = []
            with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as scratch:
                with serve_running(layout_config(name), Path(scratch), started=started) as url:
                    figures = measure(
                        url, sentences, args.single_requests, args.batch_requests, args.beam_size,
                        args.batch_concurrency, started[0],
                    )
            rounds[name].append(figures)
            single, sixteen = figures["single"], figures["sixteen"]
            print(
                f"{name}: single {single['texts_per_s']} texts/s (p50 {single['p50_ms']} ms, "
                f"{single['cores_busy']} cores busy), 16-text {sixteen['texts_per_s']} texts/s "
                f"(p50 {sixteen['p50_ms']} ms, {sixteen['cores_busy']} cores busy)",
                flush=True,
            )
    report["rounds"] = args.rounds
    report["batch_concurrency"] = args.batch_concurrency
    report["layouts"] = {name: {"median": service.medians(runs), "runs": runs} for name, runs in rounds.items()}
    print(f"medians of {args.rounds} round(s)")
    print("| layout | single-text texts/s | p50 ms | cores busy | 16-text texts/s | p50 ms | cores busy |")
    print("|---|---|---|---|---|---|---|")
    for name, figures in report["layouts"].items():
        single, sixteen = figures["median"]["single"], figures["median"]["sixteen"]
        cells = [single[key] for key in ("texts_per_s", "p50_ms", "cores_busy")]
        cells += [sixteen[key] for key in ("texts_per_s", "p50_ms", "cores_busy")]
        print(f"| {name} | " + " | ".join(str(cell) for cell in cells) + " |")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
