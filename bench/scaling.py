"""Scaling on a running cluster: `serve deploy` from 1 to 2 translator replicas under load, then autoscaling.

    python -m bench.scaling --quick     # tiny random models (about 3 minutes); writes bench/results/scaling-quick.json
    python -m bench.scaling             # deploy/serve.yaml's models

Operations as a person runs them, on loopback: `ray start --head --block` (its own OS session,
free ports, token auth off), `serve deploy` of deploy/serve.yaml's application, then:

1. redeploy: load en-zh at a steady concurrency, `serve deploy` the same config with
   translator-en-zh at num_replicas: 2, wait until both replicas run; every request sent
   meanwhile must be answered 200 (the old replica keeps serving while the new one starts);
2. autoscaling: `serve deploy` with an autoscaling_config (1..2 replicas, a small
   target_ongoing_requests, short delays), load until it scales up, go idle until it scales
   back down; the seconds each took are reported.

Slow (a cluster start and three deploys), so a benchmark script rather than a test.
The cluster is stopped by ending the OS session it runs in; `ray stop` is never used
(it would stop every Ray cluster on the machine, including other sessions' tests).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

REPOSITORY = Path(__file__).resolve().parents[1]
if str(REPOSITORY) not in sys.path:
    sys.path.insert(0, str(REPOSITORY))

from bench.service import (  # noqa: E402
    DEFAULT_DATA,
    RESULTS,
    bench_config,
    exit_on_sigterm,
    read_sentences,
    tiny_models,
)
from tests.loadgen import run_load, translate_bodies  # noqa: E402
from tests.processes import free_port, serve_environment, stop_process_group  # noqa: E402

logger = logging.getLogger("bench.scaling")

TRANSLATOR = "translator-en-zh"
AUTOSCALING = {
    "min_replicas": 1,
    "max_replicas": 2,
    "target_ongoing_requests": 2,
    "upscale_delay_s": 2,
    "downscale_delay_s": 10,
    "look_back_period_s": 2,
    "metrics_interval_s": 1,
}


def cluster_environment() -> dict[str, str]:
    """serve_environment() without RAY_ADDRESS=local: here the commands address the started cluster."""
    environment = serve_environment()
    environment.pop("RAY_ADDRESS", None)
    return environment


# Where `ray start` records the running cluster's address (Ray's default temp dir on Linux).
CURRENT_CLUSTER_FILE = Path(os.environ.get("RAY_TMPDIR", "/tmp")) / "ray" / "ray_current_cluster"


class Cluster:
    """A single-node Ray cluster started by `ray start --head --block` in its own session."""

    def __init__(self, workdir: Path, num_cpus: int) -> None:
        self.workdir = workdir
        self.num_cpus = num_cpus
        self.dashboard = f"http://127.0.0.1:{free_port()}"
        self.port = 0
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> Cluster:
        ray = Path(sys.executable).with_name("ray")
        self.port = free_port()
        command = [
            str(ray) if ray.exists() else "ray", "start", "--head", "--block", "--disable-usage-stats",
            f"--port={self.port}", f"--num-cpus={self.num_cpus}", "--include-dashboard=true",
            "--dashboard-host=127.0.0.1", f"--dashboard-port={self.dashboard.rsplit(':', 1)[1]}",
            f"--dashboard-agent-listen-port={free_port()}", f"--ray-client-server-port={free_port()}",
        ]
        log = open(self.workdir / "ray.log", "wb")  # noqa: SIM115 - the cluster outlives this call
        self.process = subprocess.Popen(
            command, cwd=REPOSITORY, env=cluster_environment(), stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.dashboard}/api/version", timeout=5).status_code == 200:
                    return self
            if self.process.poll() is not None:
                break
            time.sleep(1)
        self.__exit__()
        raise RuntimeError(f"ray start failed:\n{(self.workdir / 'ray.log').read_text()[-3000:]}")

    def __exit__(self, *exc_info: object) -> None:
        if self.process is not None:
            stop_process_group(self.process, grace_s=20)
        # `ray start` records its address here and `ray stop` would remove it; a later `serve run` or
        # ray.init() on this machine would otherwise try to join the dead cluster and wait forever.
        with contextlib.suppress(OSError):
            if CURRENT_CLUSTER_FILE.read_text().strip().endswith(f":{self.port}"):
                CURRENT_CLUSTER_FILE.unlink()

    def deploy(self, config: dict, name: str) -> None:
        path = self.workdir / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        serve = Path(sys.executable).with_name("serve")
        subprocess.run(
            [str(serve) if serve.exists() else "serve", "deploy", "-a", self.dashboard, str(path)],
            cwd=REPOSITORY, env=cluster_environment(), check=True, capture_output=True, timeout=120,
        )

    def deployment(self, name: str) -> dict:
        """The Serve REST API's details of a deployment of the "translate" application ({} while unknown)."""
        with contextlib.suppress(httpx.HTTPError, KeyError, TypeError, ValueError):
            status = httpx.get(f"{self.dashboard}/api/serve/applications/", timeout=10).json()
            return status["applications"]["translate"]["deployments"][name]
        return {}

    def wait_for(self, name: str, replicas: int, timeout_s: float, decided: bool = False) -> float | None:
        """Seconds until `replicas` replicas run (decided: until the controller targets that many), or None."""
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            details = self.deployment(name)
            running = sum(1 for replica in details.get("replicas", []) if replica["state"] == "RUNNING")
            if (details.get("target_num_replicas") if decided else running) == replicas:
                return time.monotonic() - started
            time.sleep(0.5)
        return None


def with_translator(config: dict, **settings: Any) -> dict:
    """config with translator-en-zh's deployment settings replaced by `settings`."""
    config = copy.deepcopy(config)
    for deployment in config["applications"][0]["deployments"]:
        if deployment["name"] == TRANSLATOR:
            deployment.pop("num_replicas", None)
            deployment.pop("autoscaling_config", None)
            deployment.update(settings)
    return config


class BackgroundLoad:
    """run_load in a thread: steady single-text requests until the block ends or `deadline_s` passes."""

    def __init__(self, url: str, sentences: list[str], concurrency: int, deadline_s: float) -> None:
        body_for = translate_bodies(sentences, 1, beam_size=1, max_length=16)
        self.result = None
        self.stop = threading.Event()
        coroutine = run_load(url, body_for, 100_000, concurrency, timeout_s=60, deadline_s=deadline_s, stop=self.stop)
        self.thread = threading.Thread(target=lambda: setattr(self, "result", asyncio.run(coroutine)))

    def __enter__(self) -> BackgroundLoad:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop.set()
        self.thread.join()


def seconds(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def wait_ready(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                return
        time.sleep(1)
    raise RuntimeError(f"{url} not ready after {timeout_s:.0f} s")


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    model_paths = tiny_models(workdir) if args.quick else {}
    config = bench_config(free_port(), model_paths)
    config["applications"] = config["applications"][:1]  # the service alone; no no-op app here
    url = f"http://127.0.0.1:{config['http_options']['port']}"
    sentences = read_sentences(args.data, 200)
    report: dict[str, Any] = {"command": " ".join(["python -m bench.scaling", *sys.argv[1:]])}
    with Cluster(workdir, num_cpus=4) as cluster:  # logical CPUs: three translators at num_cpus 1 fit
        started = time.monotonic()
        cluster.deploy(with_translator(config, num_replicas=1), "one-replica")
        wait_ready(url, 300)
        report["first_deploy_s"] = seconds(time.monotonic() - started)

        # 1. redeploy 1 -> 2 replicas while requests are in flight
        with BackgroundLoad(url + "/v1/translate", sentences, 8, deadline_s=args.load_s) as load:
            time.sleep(3)
            cluster.deploy(with_translator(config, num_replicas=2), "two-replicas")
            scaled = cluster.wait_for(TRANSLATOR, 2, timeout_s=args.load_s)
            time.sleep(3)  # and some requests served by both
        report["redeploy"] = {
            "two_replicas_running_after_s": seconds(scaled),
            "load": load.result.summary(),
            "met": scaled is not None and set(load.result.statuses) == {200} and load.result.lost == 0,
        }
        logger.info("redeploy: %s", report["redeploy"])

        # 2. autoscaling: up under load, down when idle. As the README's recipe says, the ingress sends every
        # request in a call of its own here, so the translator's ongoing requests are the clients' requests.
        autoscaled = with_translator(config, autoscaling_config=AUTOSCALING)
        autoscaled["applications"][0]["args"]["coalesce_max_calls"] = 0
        cluster.deploy(autoscaled, "autoscaling")
        idle = cluster.wait_for(TRANSLATOR, 1, timeout_s=90)  # idle: back to min_replicas first
        with BackgroundLoad(url + "/v1/translate", sentences, 8, deadline_s=args.load_s) as load:
            up_decided = cluster.wait_for(TRANSLATOR, 2, timeout_s=args.load_s, decided=True)
            up = cluster.wait_for(TRANSLATOR, 2, timeout_s=args.load_s)
            up = None if up is None or up_decided is None else up + up_decided
        idle_from = time.monotonic()
        down_decided = cluster.wait_for(TRANSLATOR, 1, timeout_s=120, decided=True)
        down = cluster.wait_for(TRANSLATOR, 1, timeout_s=120)
        report["autoscaling"] = {
            "config": AUTOSCALING,
            "coalesce_max_calls": autoscaled["applications"][0]["args"]["coalesce_max_calls"],
            "back_to_min_replicas_s": seconds(idle),
            "under_load_target_2_after_s": seconds(up_decided),
            "under_load_2_running_after_s": seconds(up),
            "idle_target_1_after_s": seconds(down_decided),
            "idle_1_running_after_s": seconds(None if down is None else time.monotonic() - idle_from),
            "load": load.result.summary(),
            "met": up is not None and down is not None and load.result.lost == 0,
        }
        logger.info("autoscaling: %s", report["autoscaling"])
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny random models")
    parser.add_argument("--load-s", type=float, default=90.0, help="longest load (and wait) for each scale-up")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    exit_on_sigterm()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    output = args.output or RESULTS / f"scaling{'-quick' if args.quick else ''}.json"
    with tempfile.TemporaryDirectory(prefix="bench-scaling-") as scratch:
        report = run(args, Path(scratch))
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2) + "\n")
    for phase in ("redeploy", "autoscaling"):
        figures = {k: v for k, v in report[phase].items() if k not in ("load", "config")}
        load = report[phase]["load"]
        print(f"{phase}: {figures}; load {load['requests']} requests, statuses {load['statuses']}, "
              f"exceptions {load['exceptions'] or 'none'}")
    return 0 if report["redeploy"]["met"] and report["autoscaling"]["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
