"""A real Prometheus (Debian's package) scrapes the running service with deploy/prometheus.yml's job.

The test copies deploy/prometheus.yml, points its service job at the test instance with a 1 s
scrape interval, runs /usr/bin/prometheus on loopback and asks its HTTP API: the target is up,
and the counts it scraped moved by exactly what the test sent, over two en-zh replicas.
"""

import contextlib
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import yaml

from tests.harness.processes import free_port, stop_process_group

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
PROMETHEUS_CONFIG = REPO / "deploy" / "prometheus.yml"
JOB = "attention-translate"
SENT = 24


def binary(name: str) -> str:
    path = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None)
    if path is None:
        pytest.skip(f"{name} is not installed (apt-get install prometheus; .ci/run does)")
    return path


def test_promtool_accepts_the_shipped_config():
    result = subprocess.run(
        [binary("promtool"), "check", "config", str(PROMETHEUS_CONFIG)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def shipped_job(name: str) -> dict:
    """A scrape job of deploy/prometheus.yml, by name."""
    (job,) = [job for job in yaml.safe_load(PROMETHEUS_CONFIG.read_text())["scrape_configs"] if job["job_name"] == name]
    return job


@contextlib.contextmanager
def prometheus_server(jobs: list[dict], root: Path) -> Iterator[str]:
    """Debian's Prometheus running deploy/prometheus.yml's global settings with `jobs`, scraping every second;
    yields its base URL, and stops it by its own process group."""
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    config["global"] = {**config.get("global", {}), "scrape_interval": "1s", "evaluation_interval": "1s"}
    config["scrape_configs"] = jobs
    (root / "prometheus.yml").write_text(yaml.safe_dump(config))
    address = f"127.0.0.1:{free_port()}"
    command = [
        binary("prometheus"),
        f"--config.file={root / 'prometheus.yml'}",
        f"--storage.tsdb.path={root / 'data'}",
        f"--web.listen-address={address}",
        "--log.level=warn",
    ]
    with open(root / "prometheus.log", "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://{address}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and process.poll() is None:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/-/ready", timeout=2).status_code == 200:
                    break
            time.sleep(0.5)
        else:
            pytest.fail(f"prometheus did not start:\n{(root / 'prometheus.log').read_text()[-3000:]}")
        yield url
    finally:
        stop_process_group(process, grace_s=10)


@pytest.fixture(scope="module")
def prometheus(service_url, tmp_path_factory):
    """Prometheus scraping the test instance every second; yields its base URL."""
    job = shipped_job(JOB)
    job["static_configs"] = [{"targets": [urlsplit(service_url).netloc]}]
    with prometheus_server([job], tmp_path_factory.mktemp("prometheus")) as url:
        yield url


def query(prometheus: str, expression: str) -> float | None:
    """The value of a one-series instant query, or None while Prometheus has no sample."""
    response = httpx.get(f"{prometheus}/api/v1/query", params={"query": expression}, timeout=10)
    response.raise_for_status()
    result = response.json()["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def settled(prometheus: str, expression: str, timeout_s: float = 20.0) -> float:
    """The value once two scrapes in a row agree (no request is in flight meanwhile)."""
    deadline = time.monotonic() + timeout_s
    previous = None
    while time.monotonic() < deadline:
        value = query(prometheus, expression)
        if value is not None and value == previous:
            return value
        previous = value
        time.sleep(1.5)
    raise AssertionError(f"{expression} did not settle: last {previous}")


def test_prometheus_scrapes_the_service(prometheus):
    deadline = time.monotonic() + 20
    while query(prometheus, f'up{{job="{JOB}"}}') != 1.0:
        assert time.monotonic() < deadline, "the service target never came up"
        time.sleep(0.5)
    assert query(prometheus, 'count(translation_replica_info{deployment="translator-en-zh"})') == 2


def test_scraped_counts_match_what_was_sent(prometheus, client):
    texts = f'sum(translation_texts_total{{job="{JOB}",model="en-zh"}})'
    requests = f'sum(translation_http_requests_total{{job="{JOB}",route="/v1/translate",status="200"}})'
    before_texts, before_requests = settled(prometheus, texts), settled(prometheus, requests)
    for index in range(SENT):  # sequential, so the two replicas share them in turn
        body = {"texts": [f"I like tea {index}."], "source_lang": "en", "target_lang": "zh", "max_length": 4}
        assert client.post("/v1/translate", json=body).status_code == 200
    time.sleep(1.5)
    assert settled(prometheus, texts) - before_texts == SENT
    assert settled(prometheus, requests) - before_requests == SENT
