"""deploy/serve-per-model.yaml on a real two-node Ray cluster (tests/harness/cluster.py): placement, both proxies, ids
across nodes, per-node metrics summed by a real Prometheus, and the worker node lost under load.

One cluster for the module: head 127.0.0.2 and worker 127.0.0.3, each its own `ray start` in its own OS session,
one ingress and one en-zh translator per node, Serve's high-throughput mode (HAProxy). The node-loss test runs
last: it kills the worker's whole session, checks every request was answered cleanly, and starts the worker again.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx
import pytest
import yaml

from tests.harness.cluster import Cluster, running_cluster
from tests.harness.loadgen import is_error_body
from tests.harness.prometheus_text import total
from tests.harness.services import TEST_STORE_URL
from tests.service.test_prometheus import binary, prometheus_server, query, settled, shipped_job

pytestmark = pytest.mark.slow

NODES_JOB = "attention-translate-nodes"
EN_ZH = {"source_lang": "en", "target_lang": "zh"}
RATE_PER_S = 12  # the load of issue #15's trial, through the head's proxy
RECOVERY_S = 30.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, tiny_models) -> Cluster:
    workdir = tmp_path_factory.mktemp("cluster")
    # the glossary store both nodes share: the real PostgreSQL where .ci/run started one, else a SQLite file
    store_url = TEST_STORE_URL or f"sqlite:///{workdir / 'state.db'}"
    models = {k: str(v) for k, v in tiny_models.items()}
    with running_cluster(workdir, models, store_url=store_url) as started:
        yield started


def translate(url: str, text: str, **options) -> httpx.Response:
    return httpx.post(f"{url}/v1/translate", json={"texts": [text], **EN_ZH, **options}, timeout=60)


def test_one_ingress_and_one_en_zh_translator_run_on_each_node(cluster):
    addresses = [node.address for node in cluster.nodes]
    assert addresses == ["127.0.0.2", "127.0.0.3"]
    assert cluster.replica_addresses("Ingress") == addresses
    assert cluster.replica_addresses("translator-en-zh") == addresses
    assert cluster.alive_node_addresses() == addresses


def test_each_nodes_proxy_translates(cluster):
    for node in cluster.nodes:
        response = translate(node.url, "I like tea.", max_length=6)
        assert response.status_code == 200, (node.address, response.text)
        assert response.json()["translations"][0]["target_tokens"]


def test_an_explanation_id_issued_through_one_node_is_fetched_through_the_other(cluster):
    head, worker = cluster.nodes
    issued = translate(head.url, "The cat sat on the mat.", max_length=8).json()["translations"][0]
    fetched = httpx.get(f"{worker.url}/v1/explanations/{issued['explanation_id']}", timeout=60)
    assert fetched.status_code == 200, fetched.text
    assert fetched.json()["target_tokens"] == issued["target_tokens"]
    back = httpx.get(f"{head.url}/v1/explanations/{issued['explanation_id']}", timeout=60).json()
    assert back["cross_attention"] == fetched.json()["cross_attention"]


def test_a_glossary_made_through_one_node_is_used_through_the_other(cluster):
    head, worker = cluster.nodes
    made = httpx.post(
        f"{head.url}/v2/glossaries",
        json={"name": "nodes", "source_lang": "en", "target_lang": "zh", "entries": "cat\t猫"},
        timeout=60,
    )
    assert made.status_code == 201, made.text
    glossary_id = made.json()["glossary_id"]
    try:
        for _ in range(4):  # both nodes' ingress replicas, whichever the worker's proxy picks
            translation = translate(worker.url, "A cat.", glossary_id=glossary_id).json()["translations"][0]
            assert translation["terms"][0]["target"] == "猫" and "猫" in translation["text"]
    finally:
        assert httpx.delete(f"{worker.url}/v2/glossaries/{glossary_id}", timeout=60).status_code == 204
    assert httpx.get(f"{head.url}/v2/glossaries/{glossary_id}", timeout=60).status_code == 404


def test_every_node_answers_metrics_and_serves_its_own_at_its_address(cluster):
    for node in cluster.nodes:
        assert httpx.get(f"{node.url}/metrics", timeout=30).status_code == 200
        own = httpx.get(f"http://{node.address}:{cluster.node_metrics_port}/metrics", timeout=30)
        assert own.status_code == 200
        # this node's replicas only: one ingress and one translator per model placed here
        assert total(own.text, "translation_replica_info", deployment="Ingress") == 1
        assert total(own.text, "translation_replica_info", deployment="translator-en-zh") == 1


def test_the_cluster_uses_its_own_ports_and_temp_dir(cluster):
    # nothing in common with a `serve run` elsewhere: no default Ray ports, its own temp dir and address file
    ports = [port for node in cluster.nodes for port in node.ports.values()]
    assert 6379 not in ports and 8265 not in ports
    head_ports = cluster.head.ports
    for node in cluster.nodes:
        assert not node.ports["min-worker-port"] <= head_ports["port"] <= node.ports["max-worker-port"]
    assert (cluster.discovery_file().parent / "ray_current_cluster").read_text().strip() == cluster.gcs_address
    assert urlsplit(cluster.dashboard).hostname == "127.0.0.2"


def prometheus_nodes_job(cluster: Cluster) -> dict:
    """deploy/prometheus.yml's per-node job, reading this cluster's discovery file, relabelled to its metrics port."""
    job = shipped_job(NODES_JOB)
    job["file_sd_configs"] = [{"files": [str(cluster.discovery_file())]}]
    relabel = job["relabel_configs"][0]
    assert relabel["replacement"] == "${1}:9108"  # the shipped port, here the free one the cluster chose
    relabel["replacement"] = f"${{1}}:{cluster.node_metrics_port}"
    return job


def test_prometheus_discovering_every_node_counts_exactly_the_requests_sent(cluster, tmp_path):
    binary("prometheus")
    sent = 20
    with prometheus_server([prometheus_nodes_job(cluster)], tmp_path) as prometheus:
        deadline = time.monotonic() + 30
        while query(prometheus, f'count(up{{job="{NODES_JOB}"}} == 1)') != 2.0:
            assert time.monotonic() < deadline, (tmp_path / "prometheus.log").read_text()[-2000:]
            time.sleep(0.5)
        requests = f'sum(translation_http_requests_total{{job="{NODES_JOB}",route="/v1/translate",status="200"}})'
        texts = f'sum(translation_texts_total{{job="{NODES_JOB}",model="en-zh"}})'
        before_requests, before_texts = settled(prometheus, requests), settled(prometheus, texts)
        for index in range(sent):  # half through each node's proxy; HAProxy spreads them over both ingresses
            node = cluster.nodes[index % 2]
            assert translate(node.url, f"I like tea {index}.", max_length=4).status_code == 200
        time.sleep(1.5)
        assert settled(prometheus, requests) - before_requests == sent
        assert settled(prometheus, texts) - before_texts == sent
        per_node = f'sum by (instance) (translation_texts_total{{job="{NODES_JOB}",model="en-zh"}})'
        per_node = httpx.get(f"{prometheus}/api/v1/query", params={"query": per_node}, timeout=10).json()
        per_node = per_node["data"]["result"]
        assert len(per_node) == 2  # both nodes translated some


@dataclass
class PacedLoad:
    """What requests sent at a fixed rate got back, by the second they were sent."""

    outcomes: list[tuple[float, str, float]] = field(default_factory=list)  # (sent at, outcome, seconds to answer)
    closed_then_retried: int = 0

    def statuses(self) -> Counter:
        return Counter(outcome for _, outcome, _ in self.outcomes)


async def paced_load(url: str, rate_per_s: float, duration_s: float, timeout_s: float, on_second=None) -> PacedLoad:
    """POST single-text translations at `rate_per_s` for `duration_s`; on_second(t) is called each second.

    An answer is "200", "503+retry-after+json" (the service's clean refusal), or what else came back. A keep-alive
    connection closed without an answer is sent once more: HAProxy closes a reused client connection that way when
    the ingress replica serving its request is lost, and leaves the retry to the client (translate is a pure
    function of its input); the retry's answer is what counts.
    """
    result = PacedLoad()
    body = {"texts": ["The quick brown fox jumps over the lazy dog by the river today."], **EN_ZH}
    body.update(beam_size=4, max_length=32)

    async def one(client: httpx.AsyncClient, started: float) -> None:
        sent = time.monotonic()
        for attempt in (1, 2):
            try:
                response = await client.post(url, json=body)
                break
            except httpx.RemoteProtocolError:
                if attempt == 2:
                    result.outcomes.append((sent - started, "closed twice", time.monotonic() - sent))
                    return
                result.closed_then_retried += 1
            except httpx.HTTPError as error:
                result.outcomes.append((sent - started, type(error).__name__, time.monotonic() - sent))
                return
        outcome = "200" if response.status_code == 200 else f"{response.status_code} {response.text[:200]}"
        if response.status_code == 503:
            clean = "retry-after" in response.headers and is_error_body(response.json())
            outcome = "503+retry-after+json" if clean else "503 without retry-after or json"
        result.outcomes.append((sent - started, outcome, time.monotonic() - sent))

    async with httpx.AsyncClient(timeout=timeout_s, limits=httpx.Limits(max_connections=256)) as client:
        started = time.monotonic()
        tasks, second = [], 0
        while (elapsed := time.monotonic() - started) < duration_s:
            if on_second is not None and elapsed >= second:
                on_second(second)
                second += 1
            tasks.append(asyncio.create_task(one(client, started)))
            await asyncio.sleep(1 / rate_per_s)
        await asyncio.gather(*tasks)
    return result


def test_losing_the_worker_node_under_load_costs_no_500_and_no_hang_and_serve_recovers(cluster):
    head, worker = cluster.nodes
    timeout_s = yaml.safe_load((cluster.workdir / "serve.yaml").read_text())["applications"][0]["args"][
        "request_timeout_s"
    ]
    kill_at_s = 5
    killed = {}

    def on_second(second: int) -> None:
        if second == kill_at_s:
            cluster.kill_node(worker)  # the node's whole OS session at once: raylet, replicas, HAProxy
            killed["at"] = second

    load = asyncio.run(paced_load(f"{head.url}/v1/translate", RATE_PER_S, 20, timeout_s + 5, on_second))
    statuses = load.statuses()
    assert killed and not worker.alive()
    # no 500 of any kind: not the service's, and not HAProxy's error page (its 502 rewritten to 500 by Serve's error
    # file) for a request in flight at the lost node's ingress, which HAProxy sends to the head's ingress instead
    # (tests/harness/cluster.py HAPROXY_RETRY_ON, tests/service/test_haproxy_retry.py, docs/operations.md)
    unclean = [o for o in load.outcomes if o[1] not in ("200", "503+retry-after+json")]
    assert not unclean, (unclean, cluster.log_lines("unexpected error", "Traceback", "Error", "was lost"))
    assert max(seconds for _, _, seconds in load.outcomes) <= timeout_s + 1
    recovered = [sent for sent, outcome, _ in load.outcomes if outcome == "200" and sent > kill_at_s]
    assert recovered and recovered[0] - kill_at_s <= RECOVERY_S, statuses
    assert statuses["200"] >= 0.9 * len(load.outcomes), statuses
    first_200_s = recovered[0] - kill_at_s

    # Serve notices the loss, and once capacity returns (the worker node starts again) places the lost replicas there
    deadline = time.monotonic() + 60
    while cluster.replica_addresses("translator-en-zh") != [head.address]:
        assert time.monotonic() < deadline, cluster.serve_details()
        time.sleep(1)
    cluster.start_node(worker)
    restarted = time.monotonic()
    cluster.wait_until_serving(120)
    assert cluster.replica_addresses("translator-en-zh") == [head.address, worker.address]
    assert translate(worker.url, "I like tea.", max_length=6).status_code == 200
    print(
        f"\nnode lost under {RATE_PER_S} req/s: {dict(statuses)}, {load.closed_then_retried} closed connections sent"
        f" again, first 200 sent {first_200_s:.2f} s after the kill; worker back: replicas on both nodes after"
        f" {time.monotonic() - restarted:.1f} s"
    )
