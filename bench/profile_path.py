"""Where a request's CPU goes, per process and per stage: our service under single-sentence load (the LibreTranslate
route or /v1/translate, beam 4, concurrency 32), every Serve process sampled by py-spy meanwhile.

    python -m bench.profile_path                          # LibreTranslate route; bench/results/profile-path.json
    python -m bench.profile_path --route v1 --seconds 20 --keep runs/prof-v1 --output bench/results/profile-path-v1.json
    python -m bench.profile_path --reclassify --keep runs/prof-v1 --output bench/results/profile-path-v1.json

Each sample is a stack of one thread that was running (py-spy's default: idle threads are not counted). A stage
is the first frame of a stack that STAGES names, searched from the innermost frame outward, so a sample counts
for the most specific stage it is in; the rest count as "other". A role's share is its samples over all samples:
the py-spy rate is the same for every process, so shares compare across processes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import shutil
import subprocess
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from bench import close_report, report_command
from bench.peer import ours_config
from bench.service import DEFAULT_DATA, cpu_seconds, exit_on_sigterm, read_sentences, role_of, serve_running
from tests.harness.loadgen import run_load
from tests.harness.processes import command_line, free_port, session_pids

logger = logging.getLogger("bench.profile_path")

# (stage, a substring of a frame "function (file)"), innermost match wins; listed from the engine outwards
STAGES = (
    ("waiting (read as running)", "Condition.wait (threading.py"),
    ("waiting (read as running)", "_worker (concurrent/futures/thread.py"),
    ("decode: encoder", "encoded (model/decoding/search.py"),
    ("decode: search step", "step (model/decoding/scheduler.py"),
    ("build translations", "translations (model/translation.py"),
    ("finish: align, assess", "finish (service/finishing.py"),
    ("finish: records", "_record (service/finishing.py"),
    ("tokenize", "encode_source (model/"),
    ("detokenize", "source_text (model/tokenizer.py"),
    ("protected spans", "service/protection"),
    ("glossary", "service/glossar"),
    ("answer JSON", "json_response ("),
    ("answer JSON", "render ("),
    ("pydantic", "pydantic"),
    ("request parsing", "request_fields ("),
    ("compat route", "service/compat/"),
    ("middleware", "service/middleware.py"),
    ("pickle", "pickle"),
    ("ray: serialization", "ray/_private/serialization"),
    ("ray: core worker (native)", "Worker.main_loop (ray/_private/worker.py"),
    ("serve: router", "ray/serve/_private/router"),
    ("serve: replica", "ray/serve/_private/replica"),
    ("serve: proxy", "ray/serve/_private/proxy"),
    ("ray core", "ray/_private"),
    ("ray core", "ray/_raylet"),
    ("grpc", "grpc"),
    ("http server", "uvicorn"),
    ("http server", "starlette"),
    ("http server", "fastapi"),
    ("asyncio", "asyncio/"),
    ("metrics", "prometheus_client/"),
    ("metrics", "ray/util/metrics.py"),
    ("a thread in C code (event loop)", "Thread.run (threading.py"),  # uvloop's loop, gRPC's threads
)


def stage_of(frames: list[str]) -> str:
    """The stage of one stack, innermost frame first."""
    for frame in frames:
        for stage, marker in STAGES:
            if marker in frame:
                return stage
    return "other"


def read_collapsed(path: Path) -> Counter:
    """py-spy's raw output (one `frame;frame;... count` line per stack, outermost first) → samples per stage."""
    stages: Counter = Counter()
    if not path.exists():
        return stages
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        stages[stage_of(list(reversed(stack.split(";"))))] += int(count)
    return stages


def role_pids(session: int) -> dict[str, list[int]]:
    roles: dict[str, list[int]] = {}
    for pid in session_pids(session):
        role = role_of(command_line(pid))
        if role is not None:
            roles.setdefault(role, []).append(pid)
    return roles


def record(pids: dict[str, list[int]], seconds: float, workdir: Path) -> list[tuple[str, int, Path, subprocess.Popen]]:
    """One py-spy per process (native frames off, 100 Hz), started together."""
    running = []
    for role, group in pids.items():
        for pid in group:
            out = workdir / f"{role.replace(' ', '-')}-{pid}.txt"
            command = ["py-spy", "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "100",
                       "--format", "raw", "--output", str(out), "--nonblocking"]
            running.append((role, pid, out, subprocess.Popen(command, stdout=subprocess.DEVNULL,
                                                              stderr=subprocess.DEVNULL)))
    return running


def body_for(route: str, sentences: list[str]):
    if route == "libretranslate":
        return lambda i: {"q": sentences[i % len(sentences)], "source": "en", "target": "zh", "format": "text"}
    return lambda i: {"texts": [sentences[i % len(sentences)]], "source_lang": "en", "target_lang": "zh",
                      "beam_size": 4}


def profile(args: argparse.Namespace) -> dict[str, Any]:
    sentences = read_sentences(args.data, 400)
    path = "/translate" if args.route == "libretranslate" else "/v1/translate"
    config = ours_config("static", free_port())
    with tempfile.TemporaryDirectory(prefix="profile-path-") as scratch:
        workdir = Path(scratch)
        started: list[int] = []
        with serve_running(config, workdir, started=started) as base:
            url, session = base + path, started[0]
            body = body_for(args.route, sentences)
            answer = httpx.post(url, json=body(0), timeout=60)
            answer.raise_for_status()
            asyncio.run(run_load(url, body, 64, 8, name="warm-up"))
            outcome: dict[str, Any] = {}

            def load() -> None:  # outlasts the sampling by 2 s either side
                outcome["result"] = asyncio.run(run_load(url, body, 10**7, args.concurrency, name="profiled",
                                                         deadline_s=args.seconds + 4))

            before = cpu_seconds(session)
            loader = threading.Thread(target=load, daemon=True)
            loader.start()
            time.sleep(2)
            spies = record(role_pids(session), args.seconds, workdir)
            for *_, spy in spies:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    spy.wait(timeout=args.seconds + 60)
            loader.join(timeout=180)
            used = cpu_seconds(session) - before
            result = outcome["result"].summary()
            per_role: dict[str, Counter] = {}
            for role, _pid, out, _spy in spies:
                per_role.setdefault(role, Counter()).update(read_collapsed(out))
                if args.keep is not None:
                    args.keep.mkdir(parents=True, exist_ok=True)
                    if out.exists():
                        shutil.copy(out, args.keep / out.name)
    answered = result["statuses"].get("200", 0)
    report: dict[str, Any] = {
        "command": report_command("bench.profile_path"),
        "route": args.route,
        "concurrency": args.concurrency,
        "load": {key: result[key] for key in ("requests", "requests_per_s", "p50_ms", "statuses", "lost")},
        "cpu_ms_per_request": {role: round(1000 * s / answered, 2) for role, s in sorted(used.items())} if answered
        else {},
    }
    report.update(stage_tables(per_role))
    return report


def stage_tables(per_role: dict[str, Counter]) -> dict[str, Any]:
    total = sum(sum(c.values()) for c in per_role.values()) or 1
    return {
        "samples": {role: dict(c.most_common()) for role, c in per_role.items()},
        "shares": {role: {stage: round(100 * n / total, 1) for stage, n in c.most_common()}
                   for role, c in per_role.items()},
    }


def reclassify(report_path: Path, stacks: Path) -> dict[str, Any]:
    """An earlier report's samples sorted again (after a change to STAGES) from the stacks --keep kept."""
    report = json.loads(report_path.read_text())
    per_role: dict[str, Counter] = {}
    for path in sorted(stacks.glob("*.txt")):
        role = path.stem.rsplit("-", 1)[0].replace("-", " ")
        per_role.setdefault(role, Counter()).update(read_collapsed(path))
    report.update(stage_tables(per_role))
    return report


def format_table(report: dict[str, Any]) -> str:
    load = report["load"]
    lines = [
        f"{report['route']} route, concurrency {report['concurrency']}: {load['requests_per_s']} req/s, p50 "
        f"{load['p50_ms']} ms; CPU ms per request: "
        + ", ".join(f"{role} {ms}" for role, ms in report["cpu_ms_per_request"].items()),
        "| process | stage | % of all samples |",
        "|---|---|---|",
    ]
    for role, shares in report["shares"].items():
        for stage, share in shares.items():
            if share >= 0.5:
                lines.append(f"| {role} | {stage} | {share} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--route", choices=("libretranslate", "v1"), default="libretranslate")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long py-spy samples")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--output", help="JSON report (default bench/results/profile-path.json)")
    parser.add_argument("--keep", type=Path, help="a folder to keep py-spy's raw stacks in (one file per process)")
    parser.add_argument("--reclassify", action="store_true", help="sort --keep's stacks again into --output's report")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    exit_on_sigterm()
    if args.reclassify:
        if args.keep is None or args.output is None:
            parser.error("--reclassify needs --keep (the stacks) and --output (the report to sort again)")
        report = reclassify(Path(args.output), args.keep)
        Path(args.output).write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")
        print(format_table(report))
        return 0
    report = profile(args)
    return close_report(report, args.output, "profile-path.json", format_table)


if __name__ == "__main__":
    raise SystemExit(main())
