"""One real Ray Serve instance for the whole test session, started from deploy/serve.yaml.

The fixture derives a test config from deploy/serve.yaml (tiny random models instead of the
shipped ones, a free port, small CPU reservations) and runs `serve run` on it in a
subprocess. It holds two applications:

- "translate" at /          two ingress replicas, two en-zh translator replicas, one zh-en;
- "guarded"   at /guarded   API keys, CORS for one origin, a 1-request in-flight limit and a
                            batch wait longer than the request timeout (so 503 and 504 are certain).

`service_url` (the base URL of the main application) is shared with other suites, e.g. the viewer's.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.harness.processes import serve_environment, stop_process_group
from tests.harness.tiny import make_model_dir

REPO = Path(__file__).resolve().parents[2]
SERVE_CONFIG = REPO / "deploy" / "serve.yaml"
STARTUP_TIMEOUT_S = float(os.environ.get("SERVICE_STARTUP_TIMEOUT_S", "480"))
STARTUP_ATTEMPTS = 3
API_KEYS = ("test-key-one", "test-key-two")
ALLOWED_ORIGIN = "https://viewer.example"
GUARDED_PREFIX = "/guarded"
# The scheduler every test service runs (args.scheduler): static, deploy/serve.yaml's default, unless
# TRANSLATE_TEST_SCHEDULER=continuous runs the whole service suite on the continuous one.
TEST_SCHEDULER = os.environ.get("TRANSLATE_TEST_SCHEDULER")
CONTINUOUS = TEST_SCHEDULER == "continuous"
# Tests of the static batcher's own behaviour (batches, coalesced calls, their metrics).
static_batcher_only = pytest.mark.skipif(CONTINUOUS, reason="the static batcher's behaviour; continuous has no batches")


# ---- float32 bounds between two runs of the same computation ----------------------------------------------------
FLOAT32_EPS = 2.0**-23  # one ulp of 1.0: float32 keeps 24 significant bits


class Tolerance:
    """How far apart two answers computed by the same float32 arithmetic may be.

    The service computes a number twice when a test compares two answers: the decode against the forced decode of
    an explanation fetched later, two forced decodes on different replicas, in different batches, on a different
    kernel path (fused scaled-dot-product attention, or the explicit softmax that returns the encoder's weights), or
    in this process against a replica (1 thread against 2). A GEMM blocked differently rounds each d_model-term dot
    product differently by a few ulps; the bounds follow from that, measured on a 2-core AMD EPYC (AVX2, no AMX).
    """

    # Attention weights lie in [0, 1]: softmaxes over the source positions of scores that went through every layer,
    # each rounded as above. Two runs differ by a few tens of ulps of 1.0 (at most 2.4e-6, about 20 ulps, between
    # decode and forced decode or between kernel paths on the tiny models); the bound leaves a factor of 4.
    ATTENTION = 84 * FLOAT32_EPS  # ≈ 1e-5
    # Token log-probabilities: log_softmax over the vocabulary, whose logits (magnitude ~10) carry the same relative
    # rounding; measured at most 3.7e-6 between decode and forced decode.
    SCORE = 840 * FLOAT32_EPS  # ≈ 1e-4
    # Gradient attributions and ALTI+ shares: sums of d_model-term products normalised by row totals near 1
    # (measured at most 6.4e-7 between 1 and 2 threads).
    ATTRIBUTION = 84 * FLOAT32_EPS  # ≈ 1e-5
    # Value zeroing: each score is 1 − cosine(clean, corrupted) of two float32 layer outputs, normalised by its
    # row's total. A rounding difference of a few ulps of 1.0 in the cosine becomes a few FLOAT32_EPS / total after
    # the normalisation, and the tiny models' rows total as little as 0.004 (FLOAT32_EPS / 0.004 ≈ 3e-5; measured
    # at most 1.1e-5). Bound: a few ulps of the cosine over the smallest total.
    VALUE_ZEROING = 3.4 * FLOAT32_EPS / 0.004  # ≈ 1e-4


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _deployment(application: dict, name: str) -> dict:
    return copy.deepcopy(next(d for d in application["deployments"] if d["name"] == name))


def serve_config_for_tests(models: dict[str, Path], metrics_root: Path, port: int) -> dict:
    """deploy/serve.yaml with the tiny models and test-sized knobs; its structure is the real one."""
    config = yaml.safe_load(SERVE_CONFIG.read_text())
    template = config["applications"][0]
    config["http_options"] = {**config["http_options"], "host": "127.0.0.1", "port": port}
    config["logging_config"] = {**config.get("logging_config", {}), "log_level": "WARNING"}

    main = copy.deepcopy(template)
    main["args"]["models"] = [
        {"id": "en-zh", "path": str(models["en-zh"]), "source_lang": "en", "target_lang": "zh"},
        {"id": "zh-en", "path": str(models["zh-en"]), "source_lang": "zh", "target_lang": "en"},
    ]
    main["args"].update(max_batch_size=16, batch_wait_timeout_s=0.05, metrics_dir=str(metrics_root / "translate"))
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
    )
    guarded_translator = _deployment(template, "translator-en-zh")
    guarded_translator.update(num_replicas=1, ray_actor_options={"num_cpus": 0.1})
    guarded["deployments"] = [_deployment(template, "Ingress"), guarded_translator]
    config["applications"] = [main, guarded]
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


# An OPUS-MT-style model card of a model trained without guided alignment (OPUS-MT-train's `transformer` type).
UNGUIDED_MODEL_CARD = "# tiny-zh-en\n\n* dataset: synthetic\n* model: transformer\n"


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {
        # en-zh declares an alignment head (as a guided-alignment model does); zh-en declares none and its model
        # card names a recipe without guided alignment, so its alignments come from the fallback (a head average).
        "en-zh": make_model_dir(root / "tiny-en-zh", shared=True, seed=0, alignment_layer=1, alignment_head=2),
        "zh-en": make_model_dir(root / "tiny-zh-en", shared=False, seed=1, model_card=UNGUIDED_MODEL_CARD),
    }


class ServeExitedError(RuntimeError):
    """`serve run` exited during startup (on an overloaded machine Ray's node can time out starting)."""


def serve_started(
    root: Path, make_config: Callable[[int, Path], dict], ready_paths: tuple[str, ...] = ("/readyz",)
) -> Iterator[tuple[str, dict, Path]]:
    """Start `serve run` of make_config(port, metrics folder), wait for ready_paths, yield (url, config, log);
    stop it by its own process group afterwards. An overloaded machine can time out starting Ray's node:
    up to STARTUP_ATTEMPTS tries."""
    for attempt in range(1, STARTUP_ATTEMPTS + 1):
        folder = root / f"attempt{attempt}"
        folder.mkdir(parents=True, exist_ok=True)
        port = _free_port()
        config = make_config(port, folder / "metrics")
        config_path = folder / "serve.yaml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        log_path = folder / "serve.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                _serve_command(config_path),
                cwd=REPO,
                env=serve_environment(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        url = f"http://127.0.0.1:{port}"
        try:
            for path in ready_paths:
                _wait_ready(f"{url}{path}", process, log_path)
        except ServeExitedError:
            _stop(process)
            if attempt == STARTUP_ATTEMPTS:
                raise
            continue
        except BaseException:
            _stop(process)
            raise
        try:
            yield url, config, log_path
        finally:
            _stop(process)
        return


@pytest.fixture(scope="session")
def serve_instance(tmp_path_factory: pytest.TempPathFactory, tiny_models: dict[str, Path]) -> Iterator[dict]:
    """A running `serve run` of the test config: {"url", "guarded_url", "config", "log"}."""
    root = tmp_path_factory.mktemp("serve")
    for url, config, log_path in serve_started(
        root,
        lambda port, metrics: serve_config_for_tests(tiny_models, metrics, port),
        ("/readyz", f"{GUARDED_PREFIX}/readyz"),
    ):
        yield {"url": url, "guarded_url": url + GUARDED_PREFIX, "config": config, "log": log_path}


def _serve_command(config_path: Path) -> list[str]:
    serve = Path(sys.executable).with_name("serve")
    return [str(serve) if serve.exists() else "serve", "run", str(config_path)]


def _stop(process: subprocess.Popen) -> None:
    """Ctrl-C for `serve run` (it shuts Serve and Ray down), then every process left in its OS session: killing
    only its process group left Serve's haproxy (a group of its own) running, orphaned, after the tests."""
    stop_process_group(process)


# The second service's extra models: the shipped en-zh (it decodes slowly enough for a client to hang up mid-answer)
# and the tiny en-zh with "alignment_shift": true in its config.json, as a model trained with shifted guided
# alignment declares.
SHIPPED_MODEL = "en-zh-shipped"
SHIFT_MODEL = "en-zh-shift"


def continuous_config_for_tests(models: dict[str, Path], metrics_root: Path, port: int) -> dict:
    """The test config's main application alone, on `scheduler: continuous` with the shipped and the shift model
    beside the tiny ones (one replica each)."""
    config = serve_config_for_tests(models, metrics_root, port)
    main = config["applications"][0]
    main["args"].update({"scheduler": "continuous", "max_rows": 8})
    for model_id, path in ((SHIPPED_MODEL, "en-zh"), (SHIFT_MODEL, str(models[SHIFT_MODEL]))):
        main["args"]["models"].append({"id": model_id, "path": path, "source_lang": "en", "target_lang": "zh"})
        main["deployments"].append(
            {"name": f"translator-{model_id}", "num_replicas": 1, "ray_actor_options": {"num_cpus": 0.1}}
        )
    config["applications"] = [main]
    return config


@pytest.fixture(scope="session")
def continuous_service_url(tmp_path_factory: pytest.TempPathFactory, tiny_models: dict[str, Path]) -> Iterator[str]:
    """Base URL of a second `serve run`, shared by every suite that needs the continuous scheduler or the shift
    model (one start instead of one per suite): the tiny models first (a pair's default model is its first),
    then SHIPPED_MODEL and SHIFT_MODEL."""
    root = tmp_path_factory.mktemp("continuous")
    shift = root / "tiny-en-zh-shift"
    shutil.copytree(tiny_models["en-zh"], shift)
    config_json = shift / "config.json"
    config_json.write_text(json.dumps({**json.loads(config_json.read_text()), "alignment_shift": True}))
    models = {**tiny_models, SHIFT_MODEL: shift}
    for url, _, _ in serve_started(root, lambda port, metrics: continuous_config_for_tests(models, metrics, port)):
        yield url


@pytest.fixture(scope="session")
def service_url(serve_instance: dict) -> str:
    """Base URL of the main application (tiny en-zh and zh-en models), e.g. http://127.0.0.1:PORT."""
    return serve_instance["url"]


@pytest.fixture(scope="session")
def guarded_url(serve_instance: dict) -> str:
    """Base URL of the application with API keys, CORS, a 1-request limit and a short timeout."""
    return serve_instance["guarded_url"]


@pytest.fixture(scope="session")
def client(service_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=service_url, timeout=60) as session:
        yield session
