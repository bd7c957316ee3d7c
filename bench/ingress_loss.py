"""What losing an Ingress replica under load costs, with one Ingress replica and with two: README command 1's
deploy/serve.yaml with the Ingress's num_replicas changed (and `coalesce_max_calls` with it, so that the translate
calls out per model stay deploy/serve.yaml's: 2 calls from one ingress, 1 from each of two), single-sentence en-zh
requests at concurrency 32 (beam 4), one Ingress replica killed (SIGKILL) a few seconds in, the load going on.

    python -m bench.ingress_loss                         # 1 and 2 Ingress replicas, one after the other
    python -m bench.ingress_loss --replicas 2 --seconds 20 --output /tmp/ingress-loss.json

For each count it reports the Ingress processes' resident memory, the throughput before the kill, the requests
that got no answer or an unclean one (sent before the kill: in flight on it; sent after: traffic that found no
ingress), the longest time after the kill with no request answered 200, and the throughput after the kill. It
runs Serve as README command 1 does (HAProxy, Serve's default retry-on); `--retry-on buffered` sets
RAY_SERVE_HAPROXY_RETRY_ON as the Docker image and the KubeRay manifests do, so that a request in flight on the
lost replica is sent again.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from bench import machine, report_command
from bench.service import DEFAULT_DATA, RESULTS, bench_config, exit_on_sigterm, read_sentences, serve_running
from bench.soak import resident_mib
from tests.harness.cluster import HAPROXY_RETRY_ON
from tests.harness.loadgen import LoadResult, run_load
from tests.harness.processes import free_port
from tests.harness.replica_processes import serving_replicas

logger = logging.getLogger("bench.ingress_loss")
CONCURRENCY = 32
BEAM_SIZE = 4


def longest_gap(times: list[float], start: float, end: float) -> float:
    """The longest stretch within [start, end] with no time in `times`."""
    marks = [start, *sorted(t for t in times if start <= t <= end), end]
    return max(b - a for a, b in zip(marks, marks[1:], strict=False))


def one_count(replicas: int, sentences: list[str], args: argparse.Namespace) -> dict[str, Any]:
    port = free_port()
    config = bench_config(port, None, noop=False)
    application = config["applications"][0]
    (ingress,) = (d for d in application["deployments"] if d["name"] == "Ingress")
    calls_per_model = ingress["num_replicas"] * application["args"]["coalesce_max_calls"]
    ingress["num_replicas"] = replicas
    application["args"]["coalesce_max_calls"] = max(1, calls_per_model // replicas)

    def body_for(index: int) -> dict:
        text = sentences[index % len(sentences)]
        return {"texts": [text], "source_lang": "en", "target_lang": "zh", "beam_size": BEAM_SIZE}

    with tempfile.TemporaryDirectory(prefix="bench-ingress-") as scratch:
        logger.info("starting serve run deploy/serve.yaml with %d Ingress replica(s)", replicas)
        with serve_running(config, Path(scratch)) as url:
            ingresses = serving_replicas(url, port, "Ingress", replicas, timeout_s=120.0)
            asyncio.run(run_load(f"{url}/v1/translate", body_for, 64, 8, name="warm-up"))
            memory = [round(resident_mib(pid), 1) for pid in ingresses]
            outcome: dict[str, LoadResult] = {}
            load = threading.Thread(
                target=lambda: outcome.update(
                    result=asyncio.run(
                        run_load(f"{url}/v1/translate", body_for, 10**6, CONCURRENCY, deadline_s=args.seconds)
                    )
                )
            )
            began = time.perf_counter()
            load.start()
            time.sleep(args.kill_at)
            victim = ingresses[0]
            killed_at = time.perf_counter() - began
            os.kill(victim, signal.SIGKILL)
            logger.info("killed Ingress replica %d at %.2f s", victim, killed_at)
            replaced_at = None
            while load.is_alive():
                if replaced_at is None:
                    with contextlib.suppress(AssertionError, httpx.HTTPError):  # not yet, or no ingress to ask
                        now = set(serving_replicas(url, port, "Ingress", replicas, timeout_s=0.5))
                        if victim not in now:
                            replaced_at = time.perf_counter() - began
                time.sleep(0.25)
            load.join()
            result = outcome["result"]
    calls = application["args"]["coalesce_max_calls"]
    return summarize(replicas, calls, memory, result, began, killed_at, replaced_at, args.seconds)


def summarize(
    replicas: int,
    coalesce_max_calls: int,
    memory: list[float],
    result: LoadResult,
    began: float,
    killed_at: float,
    replaced_at: float | None,
    seconds: float,
) -> dict[str, Any]:
    """Times in s since the load began (result.timeline holds perf_counter readings)."""
    timeline = [(sent - began, done - began, outcome) for sent, done, outcome in result.timeline]
    end = max(done for _, done, _ in timeline)
    ok_done = [done for _, done, outcome in timeline if outcome == "200"]
    unclean = [(sent, outcome) for sent, _, outcome in timeline if outcome not in ("200", "503", "504")]
    shed = [sent for sent, _, outcome in timeline if outcome in ("503", "504")]
    after = [t for t in ok_done if t > killed_at]
    lost_in_flight = sum(sent <= killed_at for sent, _ in unclean)
    return {
        "ingress_replicas": replicas,
        "coalesce_max_calls": coalesce_max_calls,
        "ingress_resident_mib": memory,
        "requests": len(timeline),
        "requests_per_s_before_kill": round(sum(t <= killed_at for t in ok_done) / killed_at, 1),
        "requests_per_s_after_kill": round(len(after) / max(end - killed_at, 1e-9), 1),
        "p50_ms": result.summary()["p50_ms"],
        "unclean_in_flight_at_kill": lost_in_flight,
        "unclean_sent_after_kill": len(unclean) - lost_in_flight,
        "unclean_kinds": dict(sorted(Counter(outcome for _, outcome in unclean).items())),
        "shed_503_504": len(shed),
        "longest_gap_without_200_after_kill_s": round(longest_gap(ok_done, killed_at, end), 2),
        "killed_at_s": round(killed_at, 2),
        "replacement_serving_after_s": None if replaced_at is None else round(replaced_at - killed_at, 1),
        "seconds": seconds,
    }


COLUMNS = (
    ("ingress_replicas", "ingress"),
    ("coalesce_max_calls", "calls each"),
    ("ingress_resident_mib", "RSS MiB each"),
    ("requests_per_s_before_kill", "req/s before"),
    ("requests_per_s_after_kill", "req/s after"),
    ("unclean_in_flight_at_kill", "lost in flight"),
    ("unclean_sent_after_kill", "lost after"),
    ("shed_503_504", "503/504"),
    ("longest_gap_without_200_after_kill_s", "longest gap s"),
    ("replacement_serving_after_s", "replaced after s"),
)


def print_report(report: dict[str, Any]) -> None:
    print(f"{report['machine']['cpu']}, {report['machine']['cpus']} CPUs; retry-on {report['retry_on']}")
    print("| " + " | ".join(title for _, title in COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    for row in report["rows"]:
        print("| " + " | ".join(str(row[key]) for key, _ in COLUMNS) + " |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2], help="Ingress replica counts to run")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long the load runs")
    parser.add_argument("--kill-at", type=float, default=5.0, help="when one Ingress replica is killed, s")
    parser.add_argument("--retry-on", choices=("default", "buffered"), default="default")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--output", type=Path, default=RESULTS / "ingress-loss.json")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    exit_on_sigterm()
    if args.retry_on == "buffered":  # serve_environment copies this process's environment into serve run's
        os.environ["RAY_SERVE_HAPROXY_RETRY_ON"] = HAPROXY_RETRY_ON
    sentences = read_sentences(args.data, 1000)
    rows = [one_count(replicas, sentences, args) for replicas in args.replicas]
    report = {
        "command": report_command("bench.ingress_loss"),
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d"),
        "retry_on": args.retry_on,
        "concurrency": CONCURRENCY,
        "beam_size": BEAM_SIZE,
        "rows": rows,
    }
    print_report(report)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
