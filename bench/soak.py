"""Soak test: `serve run deploy/serve.yaml` (README command 1, high-throughput mode) under mixed traffic for N minutes,
sampling every translator replica's and the ingress's resident memory; every answer must be a 200.

    python -m bench.soak --minutes 10 --concurrency 16      # writes bench/results/soak-cpu.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import random
import re
import sys
import tempfile
import time
from collections import Counter, deque
from pathlib import Path
from typing import Any

import httpx

from bench import report_command
from bench.service import DEFAULT_DATA, RESULTS, bench_config, exit_on_sigterm, serve_running
from service.config import ServiceConfig
from tests.harness.loadgen import exception_kind, translate_bodies
from tests.harness.processes import command_line, free_port, session_pids

SAMPLE_EVERY_S = 30.0
# Each stream walks this cycle from its own offset: mostly single texts, some batches, explanations.
ROUTE_CYCLE = ("en-zh", "zh-en", "batch-4", "en-zh", "zh-en", "explanation", "explain", "zh-en", "en-zh", "batch-4")


def read_pairs(path: Path) -> list[tuple[str, str]]:
    """(English, Chinese) sentence pairs from a Tatoeba TSV (English, Chinese, attribution)."""
    rows = [line.split("\t") for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [(row[0].strip(), row[1].strip()) for row in rows if len(row) >= 2]


def resident_mib(pid: int) -> float | None:
    """VmRSS of `pid` in MiB (None once it is gone)."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    return None


def watched_processes(session: int, deployments: list[str]) -> dict[str, int]:
    """'deployment/pid' → pid for the replicas of `deployments` in the serve session (process titles as
    tests/harness/replica_processes.py reads them)."""
    found = {}
    for pid in sorted(session_pids(session)):
        # "ray::ServeReplica:translate:<name>", while busy with a method also "...:<name>.<method>"
        title = re.search(r"ServeReplica:translate:([\w-]+)", command_line(pid).split(" ", 1)[0])
        name = title and title.group(1)
        if name in deployments:
            found[f"{name}/{pid}"] = pid
    return found


class Soak:
    """The mixed traffic of `concurrency` streams for `duration_s`, and what it got back."""

    def __init__(self, url: str, pairs: list[tuple[str, str]], duration_s: float, concurrency: int) -> None:
        self.url, self.pairs, self.concurrency = url, pairs, concurrency
        self.stop_at = time.monotonic() + duration_s
        self.started = time.monotonic()
        self.statuses: dict[str, Counter] = {}  # route → status (or exception kind) → count
        self.failures: list[dict[str, Any]] = []  # every answer that was not a 200
        self.explanation_ids: deque[str] = deque(maxlen=256)
        self.english = translate_bodies([en for en, _ in pairs], 1, source_lang="en", target_lang="zh")
        self.chinese = translate_bodies([zh for _, zh in pairs], 1, source_lang="zh", target_lang="en")
        self.english_batches = translate_bodies([en for en, _ in pairs], 4, source_lang="en", target_lang="zh")
        self.chinese_batches = translate_bodies([zh for _, zh in pairs], 4, source_lang="zh", target_lang="en")

    def request_for(self, route: str, index: int) -> tuple[str, str, dict | None]:
        """(method, path, body) of request `index` of a route."""
        english, chinese = self.pairs[index % len(self.pairs)]
        if route == "explanation":
            return "GET", f"/v1/explanations/{random.choice(self.explanation_ids)}", None
        if route == "explain":
            body = {"source": english, "source_lang": "en", "target_lang": "zh"}
            if index % 2:
                body["target"] = chinese  # a given translation, force-decoded
            return "POST", "/v1/explain", body
        if route == "batch-4":
            return "POST", "/v1/translate", (self.chinese_batches if index % 2 else self.english_batches)(index)
        return "POST", "/v1/translate", (self.chinese if route == "zh-en" else self.english)(index)

    async def stream(self, client: httpx.AsyncClient, offset: int) -> None:
        for step in itertools.count():
            if time.monotonic() >= self.stop_at:
                return
            route = ROUTE_CYCLE[(offset + step) % len(ROUTE_CYCLE)]
            if route == "explanation" and not self.explanation_ids:
                route = "en-zh"  # no id seen yet
            method, path, body = self.request_for(route, offset * 100_003 + step)
            try:
                response = await client.request(method, self.url + path, json=body)
                outcome: int | str = response.status_code
            except httpx.HTTPError as error:
                response, outcome = None, exception_kind(error)
            self.statuses.setdefault(route, Counter())[str(outcome)] += 1
            if outcome != 200:
                detail = response.text[:300] if response is not None else ""
                at = round(time.monotonic() - self.started, 1)
                self.failures.append({"at_s": at, "route": route, "path": path, "outcome": outcome, "body": detail})
            elif path == "/v1/translate":
                ids = (t.get("explanation_id") for t in response.json().get("translations", []))
                self.explanation_ids.extend(i for i in ids if i)

    async def run(self) -> None:
        limits = httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency)
        async with httpx.AsyncClient(timeout=60.0, limits=limits) as client:
            await asyncio.gather(*(self.stream(client, i) for i in range(self.concurrency)))


async def soak_with_samples(soak: Soak, session: int, deployments: list[str]) -> list[dict[str, Any]]:
    """Run the soak; sample RSS at its start, every SAMPLE_EVERY_S, and at its end."""
    samples: list[dict[str, Any]] = []

    def sample() -> None:
        processes = watched_processes(session, deployments)
        rss = {name: resident_mib(pid) for name, pid in processes.items()}
        samples.append({"at_s": round(time.monotonic() - soak.started, 1), "rss_mib": rss})

    async def sampler() -> None:
        while time.monotonic() < soak.stop_at:
            sample()
            await asyncio.sleep(min(SAMPLE_EVERY_S, max(0.0, soak.stop_at - time.monotonic())))

    traffic = asyncio.ensure_future(soak.run())
    await asyncio.gather(sampler(), traffic)
    sample()
    return samples


def growth(samples: list[dict[str, Any]], begin: int) -> dict[str, float]:
    """MiB each process grew from samples[begin] to the last sample (processes present in both)."""
    first, last = samples[begin]["rss_mib"], samples[-1]["rss_mib"]
    return {name: round(last[name] - first[name], 1) for name in first if first[name] and last.get(name)}


def print_report(report: dict[str, Any]) -> None:
    names = sorted({name for sample in report["samples"] for name in sample["rss_mib"]})
    print(f"{'t (s)':>7} " + " ".join(f"{name:>24}" for name in names))
    for sample in report["samples"]:
        cells = (sample["rss_mib"].get(name) for name in names)
        print(f"{sample['at_s']:>7} " + " ".join(f"{c if c is not None else '-':>24}" for c in cells))
    print("\nMiB growth, first -> last sample:", report["growth_mib"]["whole_run"])
    print("MiB growth, second half (settles):", report["growth_mib"]["second_half"])
    total = sum(n for counts in report["requests"].values() for n in counts.values())
    print(f"\nrequests: {total} in {report['minutes']} min; per route and status:", report["requests"])
    print(f"non-200 answers: {len(report['failures'])}")
    for failure in report["failures"]:
        print("  ", failure)
    print("\nCPU:", report["cpu_model"])
    for model in report["models"]:
        if "runtime" in model:
            print(f"model {model['id']}: runtime {json.dumps(model['runtime'])}; keys {sorted(model)}")
        else:
            print(f"model {model.get('id')}: no 'runtime' in /v1/models; keys {sorted(model)}")
    print("command:", report["command"])


def serve_and_soak(
    config: dict, deployments: list[str], pairs: list[tuple[str, str]], args: argparse.Namespace
) -> tuple[Soak, list[dict[str, Any]], list[dict[str, Any]]]:
    """Start the service, soak it, read /v1/models, stop it (its whole process group, also on errors or Ctrl-C)."""
    with tempfile.TemporaryDirectory(prefix="bench-soak-") as scratch:
        started: list[int] = []
        with serve_running(config, Path(scratch), timeout_s=args.ready_timeout_s, started=started) as url:
            print(f"ready at {url}; soaking {args.minutes} min at concurrency {args.concurrency}", flush=True)
            soak = Soak(url, pairs, 60 * args.minutes, args.concurrency)
            samples = asyncio.run(soak_with_samples(soak, started[0], deployments))
            try:
                models = httpx.get(f"{url}/v1/models", timeout=30).json()["models"]
            except (httpx.HTTPError, ValueError, KeyError) as error:
                models = [{"id": "?", "error": repr(error)}]
    return soak, samples, models


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=16, help="parallel request streams")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="Tatoeba TSV: English, Chinese, ...")
    parser.add_argument("--output", type=Path, default=RESULTS / "soak-cpu.json")
    parser.add_argument("--ready-timeout-s", type=float, default=600.0)
    args = parser.parse_args(argv)
    exit_on_sigterm()
    from model.runtime.extension import cpu_model

    config = bench_config(free_port(), None)
    config["applications"] = config["applications"][:1]  # deploy/serve.yaml's app only, without bench's no-op
    application = config["applications"][0]
    deployments = ServiceConfig.model_validate(application["args"]).deployment_names()
    try:
        soak, samples, models = serve_and_soak(config, deployments, read_pairs(args.data), args)
    except KeyboardInterrupt:
        print("interrupted: the service is stopped, no report written", file=sys.stderr)
        return 130
    half = next(i for i, s in enumerate(samples) if s["at_s"] >= samples[-1]["at_s"] / 2)
    report = {
        "command": report_command("bench.soak", argv),
        "cpu_model": cpu_model(),
        "minutes": args.minutes,
        "concurrency": args.concurrency,
        "requests": {route: dict(counts) for route, counts in sorted(soak.statuses.items())},
        "failures": soak.failures,
        "samples": samples,
        "growth_mib": {"whole_run": growth(samples, 0), "second_half": growth(samples, half)},
        "models": models,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    print_report(report)
    print(f"wrote {args.output}")
    return 1 if soak.failures else 0


if __name__ == "__main__":
    sys.exit(main())
