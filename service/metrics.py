"""Prometheus metrics that add up across replicas: prometheus_client in multiprocess mode, one directory of
sample files per node, merged by GET /metrics (a registry in one process is invisible to a scrape served by another).
"""

from __future__ import annotations

import glob
import http.server
import logging
import os
import re
import tempfile
import threading
import time

from prometheus_client import CONTENT_TYPE_LATEST as PROMETHEUS_CONTENT_TYPE
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess, values

MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TOKEN_BUCKETS = (4, 8, 16, 32, 64, 128, 256, 512)

__all__ = [
    "PROMETHEUS_CONTENT_TYPE",
    "ServiceMetrics",
    "configure_metrics_directory",
    "render_metrics",
    "serve_node_metrics",
    "service_metrics",
]

logger = logging.getLogger("ray.serve")


def default_metrics_directory() -> str:
    """One directory per Ray node and cluster start, so a fresh cluster starts from zero."""
    try:
        import ray

        node = ray.get_runtime_context().get_node_id()[:16]
    except Exception:  # outside Ray (unit use): one directory per machine
        node = "local"
    return os.path.join(tempfile.gettempdir(), "attention-translate-metrics", node)


def configure_metrics_directory(directory: str | None = None) -> str:
    """Point this process's metrics at the shared directory; call before the first metric is created."""
    directory = directory or os.environ.get(MULTIPROCESS_ENV) or default_metrics_directory()
    os.makedirs(directory, exist_ok=True)
    os.environ[MULTIPROCESS_ENV] = directory
    if not getattr(values.ValueClass, "_multiprocess", False):
        # prometheus_client chose its value class when first imported, before the variable was set.
        values.ValueClass = values.MultiProcessValue()
    return directory


class ServiceMetrics:
    """The service's metric families; one instance per process (see `service_metrics`)."""

    def __init__(self) -> None:
        self.requests = Counter(
            "translation_http_requests",
            "HTTP requests answered, by route template and status.",
            ["route", "method", "status"],
        )
        self.request_duration = Histogram(
            "translation_http_request_duration_seconds",
            "Time to answer an HTTP request.",
            ["route"],
            buckets=LATENCY_BUCKETS,
        )
        self.batch_size = Histogram(
            "translation_batch_size",
            "Texts that joined the decode loop together (one encoder pass).",
            ["model"],
            buckets=BATCH_SIZE_BUCKETS,
        )
        self.call_requests = Histogram(
            "translation_call_requests",
            "Translate requests one ingress call to a translator carried (coalesced at the ingress).",
            ["model"],
            buckets=BATCH_SIZE_BUCKETS,
        )
        self.queue_wait = Histogram(
            "translation_batch_queue_wait_seconds",
            "Time a text waited before it joined the decode loop.",
            ["model"],
            buckets=LATENCY_BUCKETS,
        )
        self.batch_duration = Histogram(
            "translation_batch_duration_seconds",
            "Time from a batch joining the decode loop until its last text left it.",
            ["model"],
            buckets=LATENCY_BUCKETS,
        )
        self.texts = Counter(
            "translation_texts", "Texts translated, by the replica that translated them.", ["model", "replica"]
        )
        self.source_tokens = Counter("translation_source_tokens", "Source tokens read (with </s>).", ["model"])
        self.target_tokens = Counter(
            "translation_target_tokens", "Target tokens generated (best hypothesis).", ["model"]
        )
        self.source_length = Histogram(
            "translation_source_length_tokens", "Source tokens per text.", ["model"], buckets=TOKEN_BUCKETS
        )
        self.forced_decodes = Counter(
            "translation_forced_decodes",
            "Forced decodes run for explanations and attributions, by kind: explanation, explain, source_share, "
            "the attribution method, agreement (the reverse model's, one per distinct hypothesis it aligned), or "
            'trust (the reverse model\'s, one per distinct hypothesis assessed in "full" that agreement did not '
            "force already).",
            ["model", "kind"],
        )
        self.trust_score = Histogram(
            "translation_trust_score",
            "trust.score of each translation returned (the best hypothesis), by model and mode (fast, full).",
            ["model", "mode"],
            buckets=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0),
        )
        self.trust_flags = Counter(
            "translation_trust_flags",
            "Findings in translations' trust (best hypothesis), by kind: omission, addition, repetition, "
            "untranslated, truncated.",
            ["model", "kind"],
        )
        self.decoder_rows = Gauge(
            "translation_decoder_rows",
            "Decoder rows in flight in a replica's decode loop (a beam of k is k rows).",
            ["model", "replica"],
            multiprocess_mode="livesum",
        )
        self.cancelled_texts = Counter(
            "translation_cancelled_texts", "Texts whose decode stopped because the client went away.", ["model"]
        )
        self.replica_retries = Counter(
            "translation_replica_retries",
            "Model calls the ingress sent a second time because the replica serving them was lost.",
        )
        self.model_info = Gauge(
            "translation_model_info",
            "A translator replica serving a model (value 1).",
            ["model", "source_lang", "target_lang", "weights_digest", "device", "replica"],
            multiprocess_mode="liveall",
        )
        self.runtime_info = Gauge(
            "translation_runtime_info",
            "What runs a translator replica's decoding steps (value 1): runtime compiled or eager, the precision of "
            "its matmuls, and the CPU it chose its kernels on.",
            ["model", "runtime", "precision", "cpu", "replica"],
            multiprocess_mode="liveall",
        )
        self.replica_info = Gauge(
            "translation_replica_info",
            "A live replica of a deployment (value 1).",
            ["deployment", "replica"],
            multiprocess_mode="liveall",
        )


_metrics: ServiceMetrics | None = None


def service_metrics(directory: str | None = None) -> ServiceMetrics:
    """This process's metrics, writing to the node's shared directory."""
    global _metrics
    if _metrics is None:
        configure_metrics_directory(directory)
        _metrics = ServiceMetrics()
    return _metrics


def replica_identity() -> tuple[str, str]:
    """(deployment name, replica id) of the calling Serve replica, for info labels."""
    try:
        from ray import serve

        context = serve.get_replica_context()
        return context.deployment, context.replica_id.unique_id
    except Exception:  # not inside a replica
        return "local", str(os.getpid())


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def forget_dead_processes(directory: str) -> None:
    """Drop the live gauges (replica and model info) of processes that have exited on this node.

    Counters and histograms of exited processes stay: what they counted did happen.
    """
    pids = set()
    for path in glob.glob(os.path.join(directory, "gauge_live*_*.db")):
        match = re.search(r"_(\d+)\.db$", path)
        if match:
            pids.add(int(match.group(1)))
    for pid in pids:
        if not _pid_alive(pid):
            multiprocess.mark_process_dead(pid, directory)


def render_metrics(directory: str) -> bytes:
    """The Prometheus text exposition of every process writing to `directory`."""
    forget_dead_processes(directory)
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=directory)
    return generate_latest(registry)


def node_address() -> str:
    """This Ray node's address (the one the other nodes and Ray's Prometheus discovery file know it by)."""
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:  # outside Ray
        return "127.0.0.1"


class _NodeMetricsHandler(http.server.BaseHTTPRequestHandler):
    directory = ""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path.split("?", 1)[0] != "/metrics":
            self.send_error(404, "only /metrics here")
            return
        body = render_metrics(self.directory)
        self.send_response(200)
        self.send_header("Content-Type", PROMETHEUS_CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:  # scrapes are not worth a log line each
        pass


def serve_node_metrics(directory: str, host: str, port: int, retry_s: float = 5.0) -> threading.Thread:
    """Serve the node's metrics (every process writing to `directory`) at http://host:port/metrics from a thread.

    A per-node scrape target: with HAProxy in front, GET /metrics through a node's proxy may be answered by
    an ingress replica on another node, so a node's own numbers need an address of their own. One ingress
    replica per node serves it; while another process of the node holds the port (two ingress replicas
    side by side during a redeploy) this one tries again every `retry_s` seconds.
    """
    handler = type("NodeMetricsHandler", (_NodeMetricsHandler,), {"directory": directory})

    def serve() -> None:
        while True:
            try:
                server = http.server.ThreadingHTTPServer((host, port), handler)
            except OSError:
                time.sleep(retry_s)
                continue
            logger.info("node metrics at http://%s:%d/metrics", host, port)
            server.serve_forever()

    thread = threading.Thread(target=serve, name="node-metrics", daemon=True)
    thread.start()
    return thread
