"""Service load benchmark: our Ray Serve app against a no-op Ray Serve app and the raw engine, one run.

    python -m bench.service --quick                  # tiny random models, a few hundred requests: a smoke test
    python -m bench.service                          # default models; writes bench/results/service-cpu.json
    python -m bench.service --url http://127.0.0.1:8000 --skip-engine   # load an already running service
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench import machine, report_command
from tests.harness.loadgen import run_load, translate_bodies
from tests.harness.processes import (
    command_line,
    free_port,
    serve_environment,
    session_pids,
    stop_process_group,
)

REPOSITORY = Path(__file__).resolve().parents[1]

logger = logging.getLogger("bench.service")

SERVE_CONFIG = REPOSITORY / "deploy" / "serve.yaml"
PER_MODEL_CONFIG = REPOSITORY / "deploy" / "serve-per-model.yaml"
DEFAULT_DATA = REPOSITORY.parent / "shared" / "data" / "tatoeba-en-zh" / "dev.tsv"
RESULTS = REPOSITORY / "bench" / "results"
NOOP_PREFIX = "/noop"
NOOP_ONE_HOP_PREFIX = "/noop1"
TARGETS = {"single_text_vs_noop": 0.6, "batch_tokens_vs_engine": 0.7}


# ---- the raw engine reference -----------------------------------------------------------


def engine_reference(
    model_path: str,
    sentences: list[str],
    batch_size: int,
    beam_size: int,
    threads: int,
    budget_s: float,
    name: str,
    device: str = "cpu",
    dtype: str | None = None,
) -> dict[str, Any]:
    """model.Translator in this process on the same sentences, in batches of batch_size, for about budget_s."""
    import torch

    from model import Translator

    torch.set_num_threads(threads)
    translator = Translator.from_pretrained(model_path, device=device, dtype=dtype)
    batches = [sentences[i : i + batch_size] for i in range(0, len(sentences) - batch_size + 1, batch_size)]
    translator.translate(batches[0], beam_size=beam_size)  # warm-up
    texts = tokens = 0
    started = time.perf_counter()
    for batch in batches:
        translations = translator.translate(batch, beam_size=beam_size)
        texts += len(batch)
        tokens += sum(len(t.target_tokens) for t in translations)
        if time.perf_counter() - started > budget_s:
            break
    wall = time.perf_counter() - started
    return {
        "name": name,
        "batch_size": batch_size,
        "dtype": dtype or "float32",
        "threads": threads,
        "wall_s": round(wall, 3),
        "texts": texts,
        "texts_per_s": round(texts / wall, 2),
        "tokens_per_s": round(tokens / wall, 1),
    }


# ---- starting the service and the no-op reference ----------------------------------------




def bench_config(
    port: int, model_paths: dict[str, str] | None, coalesce_max_calls: int | None = None, noop: bool = True,
    source: Path = SERVE_CONFIG,
) -> dict:
    """deploy/serve.yaml (or `source`) on loopback at `port`, optionally other model paths, plus (`noop`) the no-op
    apps at /noop (two hops) and /noop1 (one)."""
    config = yaml.safe_load(source.read_text())
    config["http_options"] = {**config.get("http_options", {}), "host": "127.0.0.1", "port": port}
    config["logging_config"] = {**config.get("logging_config", {}), "log_level": "WARNING"}
    application = config["applications"][0]
    if coalesce_max_calls is not None:
        application["args"]["coalesce_max_calls"] = coalesce_max_calls
    for spec in application["args"]["models"]:
        if model_paths and spec["id"] in model_paths:
            spec["path"] = model_paths[spec["id"]]
    config["applications"] = [application]
    if noop:
        config["applications"] += [
            {"name": "noop", "route_prefix": NOOP_PREFIX, "import_path": "bench.noop:app"},
            {"name": "noop1", "route_prefix": NOOP_ONE_HOP_PREFIX, "import_path": "bench.noop:one_hop"},
        ]
    return config


def wait_ready(urls: list[str], process: subprocess.Popen | None, timeout_s: float, log_path: Path | None) -> None:
    deadline = time.monotonic() + timeout_s
    pending = list(urls)
    while pending and time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            tail = log_path.read_text()[-4000:] if log_path else ""
            raise RuntimeError(f"serve run exited with {process.returncode}:\n{tail}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(pending[0], timeout=5).status_code == 200:
                pending.pop(0)
                continue
        time.sleep(1.0)
    if pending:
        raise RuntimeError(f"not ready after {timeout_s:.0f} s: {pending}")






CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
ROLES = (  # command-line prefix → role, first match wins
    ("ray::ProxyActor", "proxy"),
    ("ray::ServeReplica:translate:Ingress", "ingress"),
    ("ray::ServeReplica:translate:translator-", "translators"),
    (f"ray::ServeReplica:{NOOP_PREFIX.strip('/')}:", "noop app"),
    (f"ray::ServeReplica:{NOOP_ONE_HOP_PREFIX.strip('/')}:", "noop app"),
)


def role_of(command: str) -> str | None:
    """The role (ROLES) of a Serve process by its command line, or None."""
    return next((role for prefix, role in ROLES if command.startswith(prefix)), None)


def cpu_seconds(session_id: int | None) -> Counter:
    """CPU seconds (user + system) so far of this process ("load generator") and, by role, of a serve session."""
    times = os.times()
    seconds: Counter = Counter({"load generator": times.user + times.system})
    for pid in session_pids(session_id) if session_id else []:
        with contextlib.suppress(OSError, ValueError):
            stat = Path(f"/proc/{pid}/stat").read_text()
            command = command_line(pid)
            fields = stat[stat.rindex(")") + 2 :].split()
            role = role_of(command) or "ray other"
            seconds[role] += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return seconds


def exit_on_sigterm() -> None:
    """Turn SIGTERM (timeout, kill, a CI runner) into SystemExit so `with` blocks stop what they started."""

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)




@contextlib.contextmanager
def serve_running(
    config: dict, workdir: Path, timeout_s: float = 300.0, started: list | None = None, repository: Path = REPOSITORY
) -> Iterator[str]:
    """`serve run` of config in its own process group; yields the base URL once both apps are ready.

    `started`, if given, receives the serve process's pid: the id of the OS session Ray's processes run in.
    `repository`: the checkout whose code serves (another one: bench/revisions.py).
    """
    config_path = workdir / "serve.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    log_path = workdir / "serve.log"
    serve = Path(sys.executable).with_name("serve")
    command = [str(serve) if serve.exists() else "serve", "run", str(config_path)]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            command,
            cwd=repository,
            env=serve_environment(repository),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    if started is not None:
        started.append(process.pid)
    url = f"http://127.0.0.1:{config['http_options']['port']}"
    try:
        prefixes = [app["route_prefix"].rstrip("/") for app in config["applications"]]
        wait_ready([f"{url}{prefix}/readyz" for prefix in prefixes], process, timeout_s, log_path)
        yield url
    finally:
        stop_process_group(process)


# ---- the benchmark -----------------------------------------------------------------------


def medians(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Each number's median over rounds of the same measurements (other values from the first round)."""
    first = results[0]
    merged: dict[str, Any] = {}
    for key, value in first.items():
        values = [result.get(key) for result in results]
        if isinstance(value, dict):
            merged[key] = medians(values)
        elif (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and all(isinstance(v, int | float) for v in values)
        ):
            merged[key] = round(statistics.median(values), 2)
        else:
            merged[key] = value
    return merged


def engine_arguments(description: str) -> argparse.ArgumentParser:
    """The arguments every in-process engine benchmark takes: the model, its dev sentences, how many, rounds."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="en-zh")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--texts", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    return parser


def translate_cpu_ms(translator, source_ids: list[list[int]], batch: int) -> tuple[float, list[list[int]]]:
    """The engine translating `source_ids` at beam 4 with alignments (as the service does) in batches of `batch`:
    CPU ms per text, and each text's best token ids."""
    started, ids = time.process_time(), []
    for begin in range(0, len(source_ids), batch):
        nbest = translator.generate(source_ids[begin : begin + batch], beam_size=4, alignment_attention=True)
        ids.extend(hypotheses[0].token_ids for hypotheses in nbest)
    return 1000 * (time.process_time() - started) / len(source_ids), ids


def engine_variants(
    translator, sentences: list[str], rounds: int, variants: dict[str, Callable[[], contextlib.AbstractContextManager]]
) -> tuple[dict[str, dict[str, float]], dict[str, list[list[int]]]]:
    """`translate_cpu_ms` one text at a time and in batches of 16 under each of `variants` (a context manager that
    sets one up), taking turns over `rounds` rounds: per variant the median CPU ms per text ("B=1", "B=16") and
    its token ids (first round)."""
    source_ids = translator.encode_source(sentences)
    cpu_ms: dict[str, dict[str, list[float]]] = {name: {"B=1": [], "B=16": []} for name in variants}
    outputs: dict[str, list[list[int]]] = {}
    for _ in range(rounds):
        for name, variant in variants.items():
            with variant():
                for label, batch in (("B=1", 1), ("B=16", 16)):
                    ms, ids = translate_cpu_ms(translator, source_ids, batch)
                    cpu_ms[name][label].append(ms)
                    outputs.setdefault(name, ids)
    medians_ms = {
        name: {label: round(statistics.median(values), 2) for label, values in by_batch.items()}
        for name, by_batch in cpu_ms.items()
    }
    return medians_ms, outputs


def read_sentences(path: Path, limit: int) -> list[str]:
    if path.is_file():
        lines = path.read_text(encoding="utf-8").splitlines()
        sentences = [line.split("\t")[0].strip() for line in lines if line.strip()]
    else:
        from tests.harness.tiny import synthetic_corpus

        sentences = [english for english, _ in synthetic_corpus(limit)]
    return sentences[:limit]


def tiny_models(root: Path) -> dict[str, str]:
    """The service tests' tiny models (for --quick runs)."""
    from tests.harness.services import make_tiny_models

    return {name: str(path) for name, path in make_tiny_models(root).items()}


def translator_threads(config: dict) -> int:
    """The threads of a replica's decode loop: its deployment's num_cpus (the Ingress's, where colocated)."""
    deployments = {d["name"]: d for d in config["applications"][0]["deployments"]}
    translator = deployments.get("translator-en-zh", deployments["Ingress"])
    return max(1, int(translator.get("ray_actor_options", {}).get("num_cpus", 1)))


def model_path(config: dict, model_id: str = "en-zh") -> str:
    spec = next(m for m in config["applications"][0]["args"]["models"] if m["id"] == model_id)
    return os.path.expanduser(os.path.expandvars(spec["path"]))


def model_dtype(config: dict, model_id: str = "en-zh") -> str:
    """The precision the service decodes `model_id` in (its entry's dtype; auto: int8 on a CPU)."""
    spec = next(m for m in config["applications"][0]["args"]["models"] if m["id"] == model_id)
    return spec.get("dtype", "auto")


@dataclass
class Plan:
    requests: int
    concurrency: int
    batch_requests: int  # requests of 16 texts
    nothing_lost_requests: int
    nothing_lost_concurrency: int
    engine_budget_s: float
    sentences: int


def plan_for(args: argparse.Namespace) -> Plan:
    if args.quick:
        plan = Plan(args.requests or 200, args.concurrency or 16, args.batch_requests or 16, 0, 64, 5.0, 256)
    else:
        plan = Plan(args.requests or 1000, args.concurrency or 32, args.batch_requests or 100, 2000, 64, 30.0, 1000)
    if args.nothing_lost_requests is not None:
        plan.nothing_lost_requests = args.nothing_lost_requests
    if args.engine_budget_s is not None:
        plan.engine_budget_s = args.engine_budget_s
    return plan


def run_benchmark(
    args: argparse.Namespace, url: str, noop_url: str | None, config: dict, session: int | None = None
) -> dict[str, Any]:
    plan = plan_for(args)
    sentences = read_sentences(args.data, plan.sentences)
    options = {"beam_size": args.beam_size}
    rows: list[dict[str, Any]] = []
    engines: dict[int, dict] = {}
    if not args.skip_engine:
        threads = args.engine_threads or translator_threads(config)
        for batch_size in (1, args.texts_per_request):
            budget = plan.engine_budget_s
            engines[batch_size] = engine_reference(
                model_path(config),
                sentences,
                batch_size,
                args.beam_size,
                threads,
                budget,
                f"engine B={batch_size}",
                dtype=model_dtype(config),  # the precision the service decodes in
            )
            rows.append(engines[batch_size])
            logger.info("%s", engines[batch_size])

    def load(name: str, target: str, requests: int, concurrency: int, texts: int, service: bool = True) -> dict:
        body_for = translate_bodies(sentences, texts, **options)
        asyncio.run(run_load(target, body_for, min(concurrency, 8), min(concurrency, 8), name="warm-up"))
        before = batch_counts(url) if service else None
        cpu_before = cpu_seconds(session)
        result = asyncio.run(run_load(target, body_for, requests, concurrency, name=name, deadline_s=args.deadline_s))
        cpu_used = cpu_seconds(session) - cpu_before
        row = result.summary()
        if result.answered:  # where the CPU went, per answered request (machine-wide view: every process of the run)
            row["cpu_ms_per_request"] = {
                role: round(1000 * used / result.answered, 2) for role, used in sorted(cpu_used.items()) if used > 0
            }
        if before is not None:
            after = batch_counts(url)
            batches = after[1] - before[1]
            row["mean_batch_size"] = round((after[0] - before[0]) / batches, 2) if batches else None
        logger.info("%s", row)
        rows.append(row)
        return row

    noop = None
    if noop_url:
        noop = load("noop 1 text", f"{noop_url}/v1/translate", plan.requests, plan.concurrency, 1, service=False)
    single = load("service 1 text", f"{url}/v1/translate", plan.requests, plan.concurrency, 1)
    k = args.texts_per_request
    batched = load(f"service {k} texts", f"{url}/v1/translate", plan.batch_requests, plan.concurrency, k)
    nothing_lost = None
    if plan.nothing_lost_requests:
        nothing_lost = load(
            "nothing lost", f"{url}/v1/translate", plan.nothing_lost_requests, plan.nothing_lost_concurrency, 1
        )

    checks: dict[str, Any] = {}
    if noop and noop["requests_per_s"]:
        ratio = single["requests_per_s"] / noop["requests_per_s"]
        checks["single_text_vs_noop"] = {"ratio": round(ratio, 3), "target": TARGETS["single_text_vs_noop"]}
    if k in engines and engines[k]["tokens_per_s"]:
        ratio = batched["tokens_per_s"] / engines[k]["tokens_per_s"]
        checks["batch_tokens_vs_engine"] = {"ratio": round(ratio, 3), "target": TARGETS["batch_tokens_vs_engine"]}
    if nothing_lost is not None:
        checks["nothing_lost"] = {"lost": nothing_lost["lost"], "statuses": nothing_lost["statuses"], "target": 0}
    for check in checks.values():
        check["met"] = check["lost"] == 0 if "lost" in check else check["ratio"] >= check["target"]
    return {
        "command": report_command("bench.service"),
        "machine": machine(),
        "model": model_path(config),
        "beam_size": args.beam_size,
        "coalesce_max_calls": config["applications"][0]["args"].get("coalesce_max_calls"),
        "scheduler": config["applications"][0]["args"].get("scheduler"),
        "rows": rows,
        "checks": checks,
    }


def batch_counts(url: str, model: str = "en-zh") -> tuple[float, float]:
    """(texts decoded, batches) of `model` so far, from the service's translation_batch_size histogram."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    found = {}
    for line in text.splitlines():
        for part in ("sum", "count"):
            if line.startswith(f"translation_batch_size_{part}{{") and f'model="{model}"' in line:
                found[part] = found.get(part, 0.0) + float(line.rsplit(" ", 1)[1])
    return found.get("sum", 0.0), found.get("count", 0.0)


def print_table(report: dict[str, Any]) -> None:
    header = f"{'scenario':<18} {'requests':>8} {'conc':>5} {'req/s':>8} {'texts/s':>8} {'tok/s':>8} "
    header += f"{'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'batch':>6}  errors"
    print(header)
    for row in report["rows"]:
        if row["name"].startswith("engine"):
            rates = f"{row['texts_per_s']:>8} {row['tokens_per_s']:>8}"
            print(f"{row['name']:<18} {row['texts']:>8} {'-':>5} {'-':>8} {rates}")
            continue
        errors = {k: v for k, v in row["statuses"].items() if k != "200"} | row["exceptions"]
        if row["bad_error_bodies"]:
            errors["bad_error_body"] = row["bad_error_bodies"]
        print(
            f"{row['name']:<18} {row['requests']:>8} {row['concurrency']:>5} {row['requests_per_s']:>8} "
            f"{row['texts_per_s']:>8} {row['tokens_per_s']:>8} {_cell(row['p50_ms'])} {_cell(row['p95_ms'])} "
            f"{_cell(row['p99_ms'])} {row.get('mean_batch_size') or '-':>6}  {errors or 'none'}"
        )
    cpu_rows = [row for row in report["rows"] if row.get("cpu_ms_per_request")]
    if cpu_rows:
        roles = sorted({role for row in cpu_rows for role in row["cpu_ms_per_request"]})
        print(f"\nCPU ms per answered request (all processes of the run; {os.cpu_count()} cores)")
        print(f"{'scenario':<18} " + " ".join(f"{role:>15}" for role in roles) + f" {'total':>8}")
        for row in cpu_rows:
            cells = [row["cpu_ms_per_request"].get(role) for role in roles]
            total = round(sum(c for c in cells if c), 1)
            shown = " ".join(f"{c if c is not None else '-':>15}" for c in cells)
            print(f"{row['name']:<18} {shown} {total:>8}")
        print()
    for name, check in report["checks"].items():
        figure = f"lost {check['lost']}" if "lost" in check else f"{check['ratio']:.2f} (target >= {check['target']})"
        print(f"{name}: {figure} {'met' if check['met'] else 'NOT MET'}")


def _cell(value: float | None) -> str:
    return f"{value:>8}" if value is not None else f"{'-':>8}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny random models, few requests: a smoke test")
    parser.add_argument("--url", help="load this running service instead of starting one (no no-op unless --noop-url)")
    parser.add_argument("--noop-url", help="with --url: a running bench.noop app, e.g. http://127.0.0.1:8000/noop")
    parser.add_argument("--model", help="Marian directory for en-zh (default: deploy/serve.yaml's)")
    parser.add_argument("--requests", type=int, help="single-text requests per row (quick 200, full 1000)")
    parser.add_argument("--concurrency", type=int, help="concurrent clients (quick 16, full 32)")
    parser.add_argument("--batch-requests", type=int, help="requests of --texts-per-request texts (quick 16, full 100)")
    parser.add_argument("--texts-per-request", type=int, default=16)
    parser.add_argument("--nothing-lost-requests", type=int, help="'nothing lost' row, concurrency 64 (0 skips)")
    parser.add_argument("--engine-budget-s", type=float, help="seconds per engine row (quick 5, full 30)")
    parser.add_argument("--beam-size", type=int, default=4, help="the API's default is 4")
    parser.add_argument(
        "--engine-threads", type=int, help="torch threads of the engine rows (default: translator num_cpus)"
    )
    parser.add_argument(
        "--coalesce-max-calls", type=int, help="override the app's coalesce_max_calls (0: no coalescing at the ingress)"
    )
    parser.add_argument("--scheduler", choices=["static", "continuous"], help="override the app's args.scheduler")
    parser.add_argument("--skip-engine", action="store_true")
    parser.add_argument("--deadline-s", type=float, default=300.0, help="stop issuing a row's requests after this")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="TSV whose first column is English")
    parser.add_argument("--output", type=Path, help="JSON report (default bench/results/service-cpu[-quick].json)")
    args = parser.parse_args(argv)
    exit_on_sigterm()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    output = args.output or RESULTS / f"service-cpu{'-quick' if args.quick else ''}.json"

    with tempfile.TemporaryDirectory(prefix="bench-service-") as scratch:
        workdir = Path(scratch)
        model_paths = tiny_models(workdir) if args.quick else {}
        if args.model:
            model_paths["en-zh"] = args.model
        config = bench_config(free_port(), model_paths, args.coalesce_max_calls)
        if args.scheduler:
            config["applications"][0]["args"]["scheduler"] = args.scheduler
        if args.url:
            report = run_benchmark(args, args.url.rstrip("/"), args.noop_url, config)
        else:
            logger.info("starting serve run (deploy/serve.yaml + bench.noop at %s)", NOOP_PREFIX)
            started: list[int] = []
            with serve_running(copy.deepcopy(config), workdir, started=started) as url:
                report = run_benchmark(args, url, url + NOOP_PREFIX, config, session=started[0])
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2) + "\n")
    print_table(report)
    print(f"wrote {output.relative_to(REPOSITORY) if output.is_relative_to(REPOSITORY) else output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
