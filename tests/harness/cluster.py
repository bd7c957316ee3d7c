"""A real multi-node Ray cluster on one machine running deploy/serve-per-model.yaml (the scale-out tests,
scripts/cluster.py).
Each node runs in its own OS session on its own loopback address and is stopped by session id, never `ray stop`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import yaml

from tests.harness.processes import TEST_STOP_GRACE_S, command_line, free_port, serve_environment, session_pids

REPOSITORY = Path(__file__).resolve().parents[2]
# the per-model layout: its tests place an ingress and an en-zh translator on every node
SERVE_CONFIG = REPOSITORY / "deploy" / "serve-per-model.yaml"
HEAD_ADDRESS = "127.0.0.2"
APPLICATION = "translate"
PER_NODE = ("Ingress", "translator-en-zh")  # one replica on every node
# HAProxy sends a request again, to another ingress replica, when the connection failed or the replica closed it
# without an answer (its node was lost); Serve's default is conn-failure alone (docs/operations.md). It can only
# when it holds the whole request: a POST whose body came after its headers was forwarded in pieces and answered
# 500, unless `option http-buffer-request`. Serve has no setting for that directive but writes this value verbatim
# into its HAProxy config's defaults section, so it rides on a line of its own (tests/service/test_haproxy_retry.py).
HAPROXY_RETRY_ON = "conn-failure empty-response\noption http-buffer-request"
WORKER_PORTS = 48  # worker processes one node may start (each listens on one port of its range)
# Where `ray start` without --temp-dir records a cluster's address; this cluster writes into its own
# temp dir, but a file here naming it is removed on `down` all the same (and only then).
DEFAULT_CURRENT_CLUSTER_FILE = Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster"
HAPROXY_FOLDERS = Path("/tmp/haproxy-serve")  # Serve's HAProxy config and sockets, a folder per node id
METRICS_FOLDERS = Path(tempfile.gettempdir()) / "attention-translate-metrics"  # service/metrics.py, per node


def _bindable(address: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((address, port))
        except OSError:
            return False
    return True


def free_port_range(count: int, taken: set[int], low: int = 45000, high: int = 60000) -> tuple[int, int]:
    """`count` consecutive ports, free on every address and none of them in `taken`: (first, last)."""
    start = low + (os.getpid() * 97 + time.monotonic_ns()) % (high - low - count)
    for offset in range(0, high - low, count):
        first = low + (start - low + offset) % (high - low - count)
        ports = range(first, first + count)
        if not taken.intersection(ports) and all(_bindable("0.0.0.0", port) for port in ports):
            return first, first + count - 1
    raise RuntimeError(f"no {count} consecutive free ports between {low} and {high}")


@dataclass
class Node:
    """One Ray node: its address, its ports, and the OS session of its `ray start --block`."""

    address: str
    head: bool
    proxy_port: int  # the Serve proxy's HTTP port on this node
    ports: dict[str, int] = field(default_factory=dict)
    serve_environment: dict[str, str] = field(default_factory=dict)  # Serve's per-node switches and ports
    session: int | None = None  # the OS session id (= pid of `ray start --block`)

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.proxy_port}"

    def pids(self) -> list[int]:
        return session_pids(self.session) if self.session else []

    def alive(self) -> bool:
        return any(command_line(pid) for pid in self.pids())


def node_ports(head: bool, taken: set[int]) -> dict[str, int]:
    """Free ports for one node's Ray processes, the worker range apart from them and from `taken`."""
    names = [
        "node-manager-port",
        "object-manager-port",
        "dashboard-agent-listen-port",
        "dashboard-agent-grpc-port",
        "runtime-env-agent-port",
        "metrics-export-port",
    ]
    if head:
        names += ["port", "dashboard-port", "ray-client-server-port"]  # the GCS, the dashboard (serve deploy)
    ports: dict[str, int] = {}
    for name in names:
        port = free_port()
        while port in taken or port in ports.values():
            port = free_port()
        ports[name] = port
    first, last = free_port_range(WORKER_PORTS, taken | set(ports.values()))
    ports.update({"min-worker-port": first, "max-worker-port": last})
    taken.update(ports.values(), range(first, last + 1))
    return ports


@dataclass
class Cluster:
    """A head node and worker nodes on loopback addresses, started with `up()` and stopped with `down()`.

    Each node is its own `ray start --block` (own raylet, object store, workers and Serve proxy) on its own
    loopback address — head 127.0.0.2, workers 127.0.0.3 and up, because Ray rewrites 127.0.0.1 and localhost
    to the host's address — in its own OS session, so that a node is stopped, or killed to simulate losing the
    machine, by session id: never `ray stop`, never by process name. Every port is chosen free (the GCS port
    outside the worker port ranges, each node its own worker port range, Serve's HAProxy ports per node), and
    the cluster has its own --temp-dir, so it never collides with a `serve run` elsewhere on the machine.
    Token authentication is set the same way (RAY_AUTH_MODE) on every node and on the commands that address it.

    The state (addresses, ports, sessions) is a JSON file in `workdir`, so one process can start the
    cluster and another stop it (scripts/cluster.py's `up` and `down`).
    """

    workdir: Path
    nodes: list[Node]
    num_cpus: int = 2  # logical CPUs per node: what Serve may place there, not cores
    node_metrics_port: int = 0
    temp_dir: str = ""

    @classmethod
    def plan(cls, workdir: Path, workers: int = 1, num_cpus: int = 2) -> Cluster:
        taken: set[int] = set()
        nodes = []
        for index in range(workers + 1):
            head = index == 0
            proxy_port = free_port()
            ports = node_ports(head, taken | {proxy_port})
            taken.add(proxy_port)
            environment = _serve_node_environment(proxy_port, head)
            taken.update(int(value) for key, value in environment.items() if key.endswith("_PORT"))
            nodes.append(Node(f"127.0.0.{2 + index}", head, proxy_port, ports, environment))
        metrics_port = free_port()
        while metrics_port in taken or not all(_bindable(node.address, metrics_port) for node in nodes):
            metrics_port = free_port()
        # Unix sockets live under the temp dir: keep its path short (108-byte socket paths).
        temp_dir = tempfile.mkdtemp(prefix="rc-", dir="/tmp")
        return cls(Path(workdir), nodes, num_cpus, metrics_port, temp_dir)

    # ---- state ---------------------------------------------------------------------------
    @property
    def state_file(self) -> Path:
        return self.workdir / "cluster.json"

    def save(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        state = {**asdict(self), "workdir": str(self.workdir)}
        self.state_file.write_text(json.dumps(state, indent=2))

    @classmethod
    def load(cls, workdir: Path) -> Cluster:
        state = json.loads((Path(workdir) / "cluster.json").read_text())
        nodes = [Node(**node) for node in state.pop("nodes")]
        return cls(**{**state, "workdir": Path(state["workdir"]), "nodes": nodes})

    @property
    def head(self) -> Node:
        return self.nodes[0]

    @property
    def workers(self) -> list[Node]:
        return self.nodes[1:]

    @property
    def gcs_address(self) -> str:
        return f"{self.head.address}:{self.head.ports['port']}"

    @property
    def dashboard(self) -> str:
        return f"http://{self.head.address}:{self.head.ports['dashboard-port']}"

    def discovery_file(self) -> Path:
        """Ray's Prometheus file-discovery list of the live nodes' metrics addresses (the head writes it)."""
        return Path(self.temp_dir) / "prom_metrics_service_discovery.json"

    def environment(self) -> dict[str, str]:
        """For every command addressing this cluster: the same token-auth mode as the nodes, no other cluster."""
        environment = serve_environment()  # RAY_AUTH_MODE=disabled, no usage stats, the repository importable
        environment.pop("RAY_ADDRESS", None)
        return environment

    # ---- nodes -----------------------------------------------------------------------------
    def start_node(self, node: Node, timeout_s: float = 120.0) -> None:
        ray = Path(sys.executable).with_name("ray")
        command = [
            str(ray) if ray.exists() else "ray",
            "start",
            "--block",
            "--disable-usage-stats",
            f"--node-ip-address={node.address}",
            f"--num-cpus={self.num_cpus}",
            f"--temp-dir={self.temp_dir}",
            *(f"--{name}={port}" for name, port in node.ports.items()),
        ]
        if node.head:
            command += ["--head", "--include-dashboard=true", f"--dashboard-host={node.address}"]
        else:
            command += [f"--address={self.gcs_address}"]
        log = open(self.workdir / f"node-{node.address}.log", "ab")  # noqa: SIM115 - the node outlives this call
        process = subprocess.Popen(
            command,
            cwd=REPOSITORY,
            env={**self.environment(), **node.serve_environment},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        node.session = process.pid
        self.save()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"ray start on {node.address} exited:\n{self.log_tail(node)}")
            if node.address in self.alive_node_addresses():
                return
            time.sleep(1.0)
        raise RuntimeError(f"node {node.address} did not join within {timeout_s:.0f} s:\n{self.log_tail(node)}")

    def log_tail(self, node: Node, characters: int = 4000) -> str:
        with contextlib.suppress(OSError):
            return (self.workdir / f"node-{node.address}.log").read_text(errors="replace")[-characters:]
        return ""

    def log_lines(self, *patterns: str, limit: int = 40) -> list[str]:
        """Lines of the nodes' Ray and Serve logs (replicas, proxies, controller) containing any of `patterns`."""
        found = []
        for path in sorted(Path(self.temp_dir).glob("session_*/logs/**/*.log")):
            with contextlib.suppress(OSError):
                for line in path.read_text(errors="replace").splitlines():
                    if any(pattern in line for pattern in patterns):
                        found.append(f"{path.name}: {line[:300]}")
        return found[-limit:]

    def alive_node_addresses(self) -> list[str]:
        """Addresses of the nodes the GCS counts alive (via the dashboard's state API)."""
        with contextlib.suppress(httpx.HTTPError, KeyError, TypeError, ValueError):
            answer = httpx.get(f"{self.dashboard}/api/v0/nodes", params={"limit": 100}, timeout=10).json()
            return sorted(row["node_ip"] for row in answer["data"]["result"]["result"] if row.get("state") == "ALIVE")
        return []

    def kill_node(self, node: Node) -> None:
        """SIGKILL every process of a node at once, as if its machine were lost (nothing shuts down cleanly)."""
        for pid in node.pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def stop_node(self, node: Node, grace_s: float = 15.0) -> None:
        """SIGTERM the node's `ray start --block` (it stops its processes), then SIGKILL what is left of its session."""
        if node.session is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(node.session, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and node.alive():
            time.sleep(0.5)
        for _ in range(3):
            self.kill_node(node)
            if not node.alive():
                break
            time.sleep(0.5)

    def up(self, config: dict, timeout_s: float = 300.0) -> None:
        """Start every node, deploy `config`, wait until the application runs with its replicas placed."""
        try:
            self.save()
            for node in self.nodes:
                self.start_node(node)
            self.deploy(config)
            self.wait_until_serving(timeout_s)
        except BaseException:
            self.down()
            raise

    def down(self, keep_temp_dir: bool = False, grace_s: float = 15.0) -> None:
        """Stop the nodes (workers first) by session, then remove what only they used: the address file if it names
        this cluster, their HAProxy and metrics folders (by node id), the temp dir unless `keep_temp_dir` (logs)."""
        node_ids = self.node_ids()
        for node in reversed(self.nodes):
            self.stop_node(node, grace_s)
        for address_file in (Path(self.temp_dir) / "ray_current_cluster", DEFAULT_CURRENT_CLUSTER_FILE):
            with contextlib.suppress(OSError):
                if address_file.read_text().strip() == self.gcs_address:
                    address_file.unlink()
        for node_id in node_ids:
            shutil.rmtree(HAPROXY_FOLDERS / node_id, ignore_errors=True)
            shutil.rmtree(METRICS_FOLDERS / node_id[:16], ignore_errors=True)  # service.metrics' default per node
        if not keep_temp_dir and self.temp_dir:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
        self.save()

    def node_ids(self) -> list[str]:
        """Ray node ids, alive or dead, of this cluster's nodes (a restarted node has a new one)."""
        with contextlib.suppress(httpx.HTTPError, KeyError, TypeError, ValueError):
            answer = httpx.get(f"{self.dashboard}/api/v0/nodes", params={"limit": 100}, timeout=10).json()
            return [row["node_id"] for row in answer["data"]["result"]["result"] if row.get("node_id")]
        return []

    def survivors(self) -> list[tuple[int, str]]:
        """(pid, command line) of every process still running in the sessions this cluster started."""
        return [(pid, command_line(pid)) for node in self.nodes for pid in node.pids() if command_line(pid)]

    # ---- Serve -----------------------------------------------------------------------------
    def deploy(self, config: dict) -> None:
        path = self.workdir / "serve.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        serve = Path(sys.executable).with_name("serve")
        result = subprocess.run(
            [str(serve) if serve.exists() else "serve", "deploy", "-a", self.dashboard, str(path)],
            cwd=REPOSITORY,
            env=self.environment(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        if result.returncode != 0:
            raise RuntimeError(f"serve deploy failed:\n{result.stdout}\n{result.stderr}")

    def serve_details(self) -> dict:
        """The Serve REST API's details of the application ({} while unknown)."""
        with contextlib.suppress(httpx.HTTPError, KeyError, TypeError, ValueError):
            answer = httpx.get(f"{self.dashboard}/api/serve/applications/", timeout=10).json()
            return answer["applications"][APPLICATION]
        return {}

    def replica_addresses(self, deployment: str) -> list[str]:
        """Node addresses of the RUNNING replicas of a deployment, sorted."""
        details = self.serve_details().get("deployments", {}).get(deployment, {})
        return sorted(r["node_ip"] for r in details.get("replicas", []) if r.get("state") == "RUNNING")

    def serving_everywhere(self) -> bool:
        addresses = sorted(node.address for node in self.nodes)
        if self.serve_details().get("status") != "RUNNING":
            return False
        if any(self.replica_addresses(name) != addresses for name in PER_NODE):
            return False
        for node in self.nodes:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{node.url}/readyz", timeout=5).status_code == 200:
                    continue
            return False
        return True

    def wait_until_serving(self, timeout_s: float) -> float:
        """Seconds until the application runs, one ingress and one en-zh translator on every node, every proxy ready."""
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            if self.serving_everywhere():
                return time.monotonic() - started
            time.sleep(1.0)
        details = json.dumps(self.serve_details())[:3000]
        raise RuntimeError(f"not serving on every node after {timeout_s:.0f} s: {details}")

    def status(self) -> dict:
        return {
            "dashboard": self.dashboard,
            "gcs_address": self.gcs_address,
            "nodes": [
                {"address": n.address, "head": n.head, "proxy": n.url, "session": n.session, "alive": n.alive()}
                for n in self.nodes
            ],
            "alive_in_gcs": self.alive_node_addresses(),
            "node_metrics": [f"http://{n.address}:{self.node_metrics_port}/metrics" for n in self.nodes],
            "application": self.serve_details().get("status"),
            "replicas": {name: self.replica_addresses(name) for name in (*PER_NODE, "translator-zh-en")},
        }


def _serve_node_environment(proxy_port: int, head: bool) -> dict[str, str]:
    """Serve's switches for one node: its mode and free HAProxy ports (serve_environment), the worker's proxy port,
    and HAProxy retrying a request whose ingress replica closed the connection without an answer (a lost node:
    translate and explain are pure functions of their input, so a second replica may answer it)."""
    environment = {key: value for key, value in serve_environment().items() if key.startswith("RAY_SERVE_")}
    environment["RAY_SERVE_HAPROXY_RETRY_ON"] = HAPROXY_RETRY_ON
    if not head:
        environment["RAY_SERVE_WORKER_PROXY_HTTP_PORT"] = str(proxy_port)
    return environment


def cluster_serve_config(
    cluster: Cluster, models: dict[str, str] | None = None, source: Path = SERVE_CONFIG, log_level: str = "WARNING",
    store_url: str | None = None,
) -> dict:
    """deploy/serve-per-model.yaml for `cluster`: proxies on every node at the head's proxy port, one ingress and one
    en-zh translator per node, every node's metrics at its address on cluster.node_metrics_port; `models` replaces
    model paths (e.g. the tests' tiny models), `store_url` the glossary store every node shares."""
    config = yaml.safe_load(source.read_text())
    config["http_options"] = {**config.get("http_options", {}), "host": "0.0.0.0", "port": cluster.head.proxy_port}
    config["logging_config"] = {**config.get("logging_config", {}), "log_level": log_level}
    application = next(a for a in config["applications"] if a["name"] == APPLICATION)
    config["applications"] = [application]
    application["args"]["node_metrics_port"] = cluster.node_metrics_port
    if store_url is not None:
        application["args"]["store_url"] = store_url
    for spec in application["args"]["models"]:
        if models and spec["id"] in models:
            spec["path"] = str(models[spec["id"]])
    for deployment in application["deployments"]:
        if deployment["name"] in PER_NODE:
            deployment.update(num_replicas=len(cluster.nodes), max_replicas_per_node=1)
    return config


@contextlib.contextmanager
def running_cluster(
    workdir: Path, models: dict[str, str] | None = None, workers: int = 1, store_url: str | None = None
):
    """A started cluster serving cluster_serve_config; stopped (and checked stopped) on exit."""
    cluster = Cluster.plan(workdir, workers=workers)
    cluster.up(cluster_serve_config(cluster, models, store_url=store_url))
    try:
        yield cluster
    finally:
        cluster.down(grace_s=TEST_STOP_GRACE_S)  # the tests assert nothing of a clean shutdown
    if cluster.survivors():
        raise RuntimeError(f"processes of the cluster survived down(): {cluster.survivors()}")
