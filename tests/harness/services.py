"""The service tests' real `serve run`s: their configs (derived from deploy/serve.yaml: tiny random models, free
ports, small CPU reservations), their tiny models, and starting them side by side, waiting for each and stopping
each by its own OS session."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import yaml

from tests.harness.processes import free_port, serve_environment, stop_process_group
from tests.harness.tiny import make_model_dir

REPO = Path(__file__).resolve().parents[2]
SERVE_CONFIG = REPO / "deploy" / "serve.yaml"  # the colocated layout
PER_MODEL_CONFIG = REPO / "deploy" / "serve-per-model.yaml"  # the same service, a translator deployment per model
STARTUP_TIMEOUT_S = float(os.environ.get("SERVICE_STARTUP_TIMEOUT_S", "480"))
STARTUP_ATTEMPTS = 3
API_KEYS = ("test-key-one", "test-key-two")
ALLOWED_ORIGIN = "https://viewer.example"
GUARDED_PREFIX = "/guarded"
COLOCATED_PREFIX = "/colocated"  # the main app's models in the colocated layout (both in its one Ingress replica)
SHIPPED_PREFIX = "/shipped"  # beside the continuous app: the shipped en-zh as deploy/serve.yaml serves it
# The scheduler every test service runs (args.scheduler): static, deploy/serve.yaml's default, unless
# TRANSLATE_TEST_SCHEDULER=continuous runs the whole service suite on the continuous one.
TEST_SCHEDULER = os.environ.get("TRANSLATE_TEST_SCHEDULER")
CONTINUOUS = TEST_SCHEDULER == "continuous"
# The real PostgreSQL .ci/run starts (postgresql://user:password@host:port/database): the main test service keeps
# its glossaries there; unset, in a SQLite file of its own.
TEST_STORE_URL = os.environ.get("TRANSLATE_TEST_POSTGRES_URL")


# An OPUS-MT-style model card of a model trained without guided alignment (OPUS-MT-train's `transformer` type).
UNGUIDED_MODEL_CARD = "# tiny-zh-en\n\n* dataset: synthetic\n* model: transformer\n"


def make_tiny_models(root: Path) -> dict[str, Path]:
    """The service tests' two tiny random models under `root`. en-zh declares an alignment head (as a
    guided-alignment model does); zh-en declares none and its model card names a recipe without guided alignment,
    so its alignments come from the fallback (a head average)."""
    return {
        "en-zh": make_model_dir(root / "tiny-en-zh", shared=True, seed=0, alignment_layer=1, alignment_head=2),
        "zh-en": make_model_dir(root / "tiny-zh-en", shared=False, seed=1, model_card=UNGUIDED_MODEL_CARD),
    }


def make_shift_model(tiny_en_zh: Path, root: Path) -> Path:
    """A copy of the tiny en-zh with "alignment_shift": true in its config.json (SHIFT_MODEL)."""
    shift = root / "tiny-en-zh-shift"
    shutil.copytree(tiny_en_zh, shift)
    config_json = shift / "config.json"
    config_json.write_text(json.dumps({**json.loads(config_json.read_text()), "alignment_shift": True}))
    return shift


def _deployment(application: dict, name: str) -> dict:
    return copy.deepcopy(next(d for d in application["deployments"] if d["name"] == name))


def serve_config_for_tests(models: dict[str, Path], metrics_root: Path, port: int) -> dict:
    """deploy/serve-per-model.yaml with the tiny models and test-sized knobs (the main and the guarded app), and
    deploy/serve.yaml's colocated app on the same models; their structure is the real one."""
    config = yaml.safe_load(PER_MODEL_CONFIG.read_text())
    template = config["applications"][0]
    config["http_options"] = {**config["http_options"], "host": "127.0.0.1", "port": port}
    config["logging_config"] = {**config.get("logging_config", {}), "log_level": "WARNING"}

    main = copy.deepcopy(template)
    # dtype float32, the exact mode: these tests hold decodes and later forced decodes to float32's bounds
    # (tests/service/conftest.py's Tolerance); the default (auto: int8 on a CPU) and its explanation contract are
    # tested in tests/model/test_int8.py
    main["args"]["models"] = [
        {"id": "en-zh", "path": str(models["en-zh"]), "source_lang": "en", "target_lang": "zh", "dtype": "float32"},
        {"id": "zh-en", "path": str(models["zh-en"]), "source_lang": "zh", "target_lang": "en", "dtype": "float32"},
    ]
    main["args"].update(
        max_batch_size=16,
        batch_wait_timeout_s=0.05,
        metrics_dir=str(metrics_root / "translate"),
        store_url=TEST_STORE_URL or f"sqlite:///{metrics_root / 'translate-state.db'}",
        # a short lease: a lost ingress replica's document is taken by the other within seconds
        documents={"queue": "translate", "lease_s": 5},
    )
    if TEST_SCHEDULER:  # the guarded app below keeps the static batcher: its 504 comes from the batch wait
        main["args"]["scheduler"] = TEST_SCHEDULER
    ingress, en_zh, zh_en = (_deployment(template, n) for n in ("Ingress", "translator-en-zh", "translator-zh-en"))
    ingress.update(num_replicas=2)
    en_zh.update(num_replicas=2)
    zh_en.update(num_replicas=1)  # the tests' topology, whatever deploy/serve.yaml's default
    for deployment in (en_zh, zh_en):
        deployment["ray_actor_options"] = {"num_cpus": 0.1}
    main["deployments"] = [ingress, en_zh, zh_en]

    guarded = copy.deepcopy(template)
    guarded.update(name="guarded", route_prefix=GUARDED_PREFIX)
    guarded["runtime_env"] = {"env_vars": {"TRANSLATE_API_KEYS": ",".join(API_KEYS)}}
    guarded["args"]["models"] = copy.deepcopy(main["args"]["models"][:1])
    guarded["args"].update(
        max_batch_size=64,
        batch_wait_timeout_s=4.0,  # every translation waits this long for its batch to fill ...
        request_timeout_s=2.0,  # ... so it always exceeds the timeout: a certain 504
        max_in_flight_requests=1,  # a second request while one waits: a certain 503
        cors_origins=[ALLOWED_ORIGIN],
        metrics_dir=str(metrics_root / "guarded"),
        store_url=f"sqlite:///{metrics_root / 'guarded-state.db'}",
        # no document worker: a job would hold the one in-flight slot the 503 and 504 tests count on
        documents={"queue": "guarded", "workers_per_replica": 0},
    )
    guarded_translator = _deployment(template, "translator-en-zh")
    guarded_translator.update(num_replicas=1, ray_actor_options={"num_cpus": 0.1})
    guarded_ingress = _deployment(template, "Ingress")
    guarded_ingress.update(num_replicas=1)  # one replica: its in-flight limit of 1 is the application's
    guarded["deployments"] = [guarded_ingress, guarded_translator]

    shipped = yaml.safe_load(SERVE_CONFIG.read_text())["applications"][0]
    colocated = copy.deepcopy(main)
    colocated.update(name="colocated", route_prefix=COLOCATED_PREFIX)
    colocated["args"].update(
        layout=shipped["args"]["layout"],
        metrics_dir=str(metrics_root / "colocated"),
        store_url=f"sqlite:///{metrics_root / 'colocated-state.db'}",
        documents={"queue": "colocated"},
    )
    (colocated_ingress,) = copy.deepcopy(shipped["deployments"])
    colocated_ingress.update(num_replicas=1, ray_actor_options={"num_cpus": 0.1})
    colocated["deployments"] = [colocated_ingress]
    config["applications"] = [main, guarded, colocated]
    return config


# The second service's extra models: the shipped en-zh (it decodes slowly enough for a client to hang up mid-answer)
# and the tiny en-zh with "alignment_shift": true in its config.json, as a model trained with shifted guided
# alignment declares.
SHIPPED_MODEL = "en-zh-shipped"
SHIFT_MODEL = "en-zh-shift"


def continuous_config_for_tests(models: dict[str, Path], metrics_root: Path, port: int) -> dict:
    """The test config's main application on `scheduler: continuous` with the shipped and the shift model beside
    the tiny ones (one replica each); beside it at SHIPPED_PREFIX, deploy/serve.yaml's app on the shipped en-zh
    alone (its defaults: int8, colocated, one replica here)."""
    config = serve_config_for_tests(models, metrics_root, port)
    main = config["applications"][0]
    main["args"].update({"scheduler": "continuous", "max_rows": 8})
    main["args"]["store_url"] = f"sqlite:///{metrics_root / 'continuous-state.db'}"
    main["args"]["documents"] = {"queue": "continuous"}
    for model_id, path in ((SHIPPED_MODEL, "en-zh"), (SHIFT_MODEL, str(models[SHIFT_MODEL]))):
        main["args"]["models"].append(
            {"id": model_id, "path": path, "source_lang": "en", "target_lang": "zh", "dtype": "float32"}
        )
        main["deployments"].append(
            {"name": f"translator-{model_id}", "num_replicas": 1, "ray_actor_options": {"num_cpus": 0.1}}
        )
    shipped = copy.deepcopy(yaml.safe_load(SERVE_CONFIG.read_text())["applications"][0])
    shipped.update(name="shipped", route_prefix=SHIPPED_PREFIX)
    shipped["args"].update(
        models=[{"id": "en-zh", "path": "en-zh", "source_lang": "en", "target_lang": "zh"}],
        metrics_dir=str(metrics_root / "shipped"),
        store_url=f"sqlite:///{metrics_root / 'shipped-state.db'}",
        documents={"queue": "shipped"},
    )
    (ingress,) = shipped["deployments"]
    ingress.update(num_replicas=1, ray_actor_options={"num_cpus": 0.1})
    config["applications"] = [main, shipped]
    return config


def _wait_ready(url: str, process: subprocess.Popen, log_path: Path) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServeExitedError(f"serve run exited with {process.returncode}:\n{log_path.read_text()[-6000:]}")
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    raise RuntimeError(f"{url} not ready after {STARTUP_TIMEOUT_S:.0f} s:\n{log_path.read_text()[-6000:]}")


class ServeExitedError(RuntimeError):
    """`serve run` exited during startup (on an overloaded machine Ray's node can time out starting)."""


class ServiceLaunch:
    """A `serve run` of make_config(port, metrics folder) in `root`: `start` spawns it and returns at once, `ready`
    waits for ready_paths and returns (url, config, log), `stop` ends it by its own OS session. Starting every
    service the session needs before waiting for any lets their startups (a minute each, much of it waiting on
    Ray) overlap. An overloaded machine can time out starting Ray's node: up to STARTUP_ATTEMPTS tries."""

    def __init__(
        self, root: Path, make_config: Callable[[int, Path], dict], ready_paths: tuple[str, ...] = ("/readyz",)
    ) -> None:
        self.root, self.make_config, self.ready_paths = root, make_config, ready_paths
        self.attempt, self.process, self.waited = 0, None, False

    def start(self) -> None:
        if self.process is not None:
            return
        self.attempt += 1
        folder = self.root / f"attempt{self.attempt}"
        folder.mkdir(parents=True, exist_ok=True)
        port = free_port()
        self.config = self.make_config(port, folder / "metrics")
        config_path = folder / "serve.yaml"
        config_path.write_text(yaml.safe_dump(self.config, sort_keys=False))
        self.log_path = folder / "serve.log"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                _serve_command(config_path),
                cwd=REPO,
                env=serve_environment(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.url = f"http://127.0.0.1:{port}"

    def ready(self) -> tuple[str, dict, Path]:
        self.start()
        while not self.waited:
            try:
                for path in self.ready_paths:
                    _wait_ready(f"{self.url}{path}", self.process, self.log_path)
                self.waited = True
            except ServeExitedError:
                self.stop()
                if self.attempt == STARTUP_ATTEMPTS:
                    raise
                self.start()
            except BaseException:
                self.stop()
                raise
        return self.url, self.config, self.log_path

    def stop(self) -> None:
        """Ctrl-C for `serve run` (it shuts Serve and Ray down), then every process left in its OS session: killing
        only its process group left Serve's haproxy (a group of its own) running, orphaned, after the tests."""
        if self.process is not None:
            stop_process_group(self.process)
            self.process, self.waited = None, False


class ServiceLaunches:
    """The session's shared services by the fixture name that uses each. The first one asked for starts every one
    the collected tests use (each test's fixture closure names them), so their startups run side by side; each test
    waits only for its own. (Started at the session's first test instead, beside the model tests, they cost those
    tests as much as they saved: the suite is CPU-bound on two cores.)"""

    def __init__(self, session, recipes: dict[str, Callable[[], ServiceLaunch]]) -> None:
        self.session, self.recipes, self.launches = session, recipes, {}

    def ready(self, name: str) -> tuple[str, dict, Path]:
        if name not in self.launches:  # the first ask: start every service a collected test uses, then wait
            needed = {name} | {n for item in self.session.items for n in item.fixturenames if n in self.recipes}
            for other in sorted(needed - set(self.launches)):
                self.launches[other] = self.recipes[other]()
                self.launches[other].start()
        return self.launches[name].ready()

    def stop(self) -> None:
        for launch in self.launches.values():
            launch.stop()


def _serve_command(config_path: Path) -> list[str]:
    serve = Path(sys.executable).with_name("serve")
    return [str(serve) if serve.exists() else "serve", "run", str(config_path)]
