"""Nothing is lost under a burst, and a killed translator replica costs clean errors, not hangs or lost ids.

Short, bounded versions of the benchmark scenarios (bench/service.py runs the long ones), all on
the session's Ray Serve instance and on loopback.
"""

import asyncio
import os
import signal
import threading
import time
from urllib.parse import urlsplit

import httpx
import pytest

from tests.harness.loadgen import run_load, translate_bodies
from tests.harness.replica_processes import replica_pids, serving_replicas
from tests.service.conftest import API_KEYS

pytestmark = pytest.mark.slow

ENGLISH = ["I like tea.", "The cat sat on the mat.", "We walk to school today.", "Is the river cold?"]
CHINESE = ["我喜欢茶。", "猫坐在垫子上。", "我们今天去学校。", "河水冷吗？"]
RECOVERY_S = 30.0
HAPROXY_DETECTION_S = 1.0  # RAY_SERVE_HAPROXY_HEALTH_CHECK_FASTINTER (250 ms) × _FALL (2), with room


def assert_nothing_lost(result) -> None:
    summary = result.summary()
    assert summary["lost"] == 0, summary
    assert set(result.statuses) <= {200, 503, 504}, summary


def test_a_burst_gets_every_request_answered(service_url):
    # 32 at once is well within the main application's limits (in-flight, queues, timeouts):
    # every request must be translated, none turned away with a 503 or timed out with a 504
    body_for = translate_bodies(ENGLISH, 1, beam_size=1, max_length=8)
    result = asyncio.run(run_load(f"{service_url}/v1/translate", body_for, 120, 32, timeout_s=60, deadline_s=90))
    assert result.requests == 120
    assert_nothing_lost(result)
    assert result.statuses == {200: 120}, result.summary()
    assert result.texts == 120, result.summary()  # one translation in each answer


def test_an_overloaded_service_answers_503_with_a_json_error_not_a_reset(guarded_url):
    # the guarded app takes one model call at a time and that one times out: the rest are turned away
    body_for = translate_bodies(ENGLISH, 1)
    headers = {"Authorization": f"Bearer {API_KEYS[0]}"}
    result = asyncio.run(
        run_load(f"{guarded_url}/v1/translate", body_for, 48, 16, timeout_s=30, deadline_s=60, headers=headers)
    )
    assert_nothing_lost(result)
    assert result.statuses[503] >= 40 and result.statuses[200] == 0


def zh_en(texts: list[str]) -> dict:
    return {"texts": texts, "source_lang": "zh", "target_lang": "en", "beam_size": 1, "max_length": 8}


def wait_until_translating(client: httpx.Client, deadline: float) -> float:
    """Poll zh-en until it answers 200; the time it did."""
    while time.monotonic() < deadline:
        try:
            if client.post("/v1/translate", json=zh_en(CHINESE[:1]), timeout=10).status_code == 200:
                return time.monotonic()
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"zh-en did not recover within {RECOVERY_S:.0f} s")


def test_killing_a_translator_replica_mid_load_fails_in_flight_requests_cleanly_and_recovers(service_url, client):
    port = urlsplit(service_url).port
    before = client.post("/v1/translate", json=zh_en(CHINESE))
    assert before.status_code == 200, before.text
    ids = [translation["explanation_id"] for translation in before.json()["translations"]]
    explanations = [client.get(f"/v1/explanations/{i}").json() for i in ids]
    (victim,) = replica_pids(port, "translate", "translator-zh-en")  # the only zh-en replica

    outcome: dict = {}
    body_for = lambda index: zh_en([CHINESE[index % len(CHINESE)]])
    load = threading.Thread(
        target=lambda: outcome.update(
            result=asyncio.run(run_load(f"{service_url}/v1/translate", body_for, 400, 4, timeout_s=45, deadline_s=6))
        )
    )
    load.start()
    time.sleep(1.5)  # requests are in flight on the replica
    killed_at = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    load.join(timeout=120)
    assert not load.is_alive(), "requests hung after the replica died"
    result = outcome["result"]
    assert_nothing_lost(result)  # in flight: 200 before the kill, 503/504 with a JSON body after it
    assert result.statuses[200] > 0

    recovered_at = wait_until_translating(client, killed_at + RECOVERY_S)
    assert recovered_at - killed_at <= RECOVERY_S
    replacement = replica_pids(port, "translate", "translator-zh-en")
    assert replacement and victim not in replacement
    for explanation_id, explanation in zip(ids, explanations):
        after = client.get(f"/v1/explanations/{explanation_id}")
        assert after.status_code == 200, after.text
        assert after.json()["cross_attention"] == explanation["cross_attention"]


def en_zh(texts: list[str]) -> dict:
    # at least 96 decoding steps per text: every call lasts long enough that the killed replica has some in flight
    # (with 24-step texts on an idle machine the kill could fall between calls and nothing was sent again)
    options = {"beam_size": 4, "min_length": 96, "max_length": 120}
    return {"texts": texts, "source_lang": "en", "target_lang": "zh", **options}


def test_a_request_whose_replica_is_killed_is_sent_again_to_the_other_replica(service_url, client):
    # en-zh has two replicas: a request in flight on the one killed is retried on the other (translate is a pure
    # function of its input), so the clients see only 200s; the ingress counts the calls it sent again
    from tests.harness.prometheus_text import total

    port = urlsplit(service_url).port
    retries_before = total(client.get("/metrics").text, "translation_replica_retries_total")
    body_for = lambda index: en_zh([f"{ENGLISH[index % len(ENGLISH)]} {index}"])
    for _ in range(3):  # a kill between two of the victim's calls catches nothing in flight: kill again
        victim = serving_replicas(service_url, port, "translator-en-zh")[0]
        outcome: dict = {}
        load = threading.Thread(
            target=lambda outcome=outcome: outcome.update(
                result=asyncio.run(
                    run_load(f"{service_url}/v1/translate", body_for, 400, 6, timeout_s=45, deadline_s=6)
                )
            )
        )
        load.start()
        time.sleep(1.5)  # requests are in flight on both replicas
        os.kill(victim, signal.SIGKILL)
        load.join(timeout=120)
        assert not load.is_alive(), "requests hung after the replica died"
        result = outcome["result"]
        assert_nothing_lost(result)
        assert result.statuses == {200: result.requests}, result.summary()
        serving_replicas(service_url, port, "translator-en-zh")  # the two are back for the tests after this one
        retries = total(client.get("/metrics").text, "translation_replica_retries_total") - retries_before
        if retries >= 1:
            break
    assert retries >= 1


def texts_by_pid(client: httpx.Client, deployment: str, model: str) -> dict[int, float]:
    """Texts each live replica of `deployment` has translated so far, by process id: translation_texts_total's
    replica label joined with translation_replica_info's replica and pid labels."""
    from tests.harness.prometheus_text import by_label, samples

    text = client.get("/metrics").text
    pids = {
        labels["replica"]: int(labels["pid"])
        for name, labels, _ in samples(text)
        if name == "translation_replica_info" and labels.get("deployment") == deployment
    }
    texts = by_label(text, "translation_texts_total", "replica", model=model)
    return {pid: texts.get(replica, 0.0) for replica, pid in pids.items()}


def test_a_beam_stream_whose_replica_is_killed_ends_with_its_result_or_an_error_never_hangs(service_url, client):
    # A beam-search stream sends its settled tokens as they settle. A stream whose replica dies before a
    # sentence's call has answered is sent again on the other replica, as a unary call is (the ingress counts
    # it); one whose tokens have begun ends with an `error` event after them. Every stream ends one way or the
    # other, in order, and none is an HTTP error or hangs.
    from service.client import AsyncTranslationClient
    from tests.harness.prometheus_text import total

    port = urlsplit(service_url).port
    options = en_zh([])
    options.pop("texts")

    def busy_replica() -> int:
        # The victim is a replica that has finished one of this test's streams: the routers are sending it work,
        # so with six streams always in flight some are on it. (Not merely the oldest: a router's cached queue
        # length for a replica that took the test before's retries can keep every new stream on the other one.)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            texts = texts_by_pid(client, "translator-en-zh", "en-zh")
            busy = [pid for pid in replicas if texts.get(pid, 0.0) > texts_before.get(pid, 0.0)]
            if busy:
                return busy[0]
            time.sleep(0.2)
        raise AssertionError("no en-zh replica finished a stream within 60 s")

    async def worker(http: AsyncTranslationClient, number: int) -> list[list[str]]:
        outcomes = []
        while time.monotonic() < window["until"]:  # streams one after another, so some are always in flight
            text = f"{ENGLISH[number % len(ENGLISH)]} {number} {len(outcomes)}"
            try:
                outcomes.append([event["type"] async for event in http.translate_stream(text, **options)])
            except Exception as error:  # an HTTP error or a broken stream: recorded, never lost
                outcomes.append([repr(error)])
        return outcomes

    async def streams() -> list:
        async with AsyncTranslationClient(service_url, timeout=90, max_retries=0) as http:
            tasks = [asyncio.create_task(worker(http, number)) for number in range(6)]
            await asyncio.sleep(1.5)  # streams are decoding on both replicas
            victim = await asyncio.to_thread(busy_replica)
            os.kill(victim, signal.SIGKILL)
            window["until"] = time.monotonic() + 4.5
            return [outcome for outcomes in await asyncio.gather(*tasks) for outcome in outcomes]

    # A kill can still fall where no stream is on the victim (the routers may have moved them all to the other
    # replica since it finished one): nothing to send again, and nothing lost. Then again, once it is back:
    # 0 retries in one run of three fresh-clone CI runs, with six streams of 96+ steps in flight.
    for _ in range(3):
        replicas = serving_replicas(service_url, port, "translator-en-zh")  # the two serving (one may be replaced)
        texts_before = texts_by_pid(client, "translator-en-zh", "en-zh")
        retries_before = total(client.get("/metrics").text, "translation_replica_retries_total")
        window = {"until": time.monotonic() + 120}  # streams go on until a few seconds after the kill
        outcomes = asyncio.run(streams())
        # each text is two sentences ("I like tea. 3 5"): its tokens and a `sentence` event after each
        clean = ["start", "token", "sentence", "token", "sentence", "result"]
        collapsed = [[t for i, t in enumerate(o) if not (t == "token" and i and o[i - 1] == "token")] for o in outcomes]
        assert collapsed, outcomes
        for outcome in collapsed:
            ended = outcome == clean or (outcome[-1] == "error" and outcome[:-1] == clean[: len(outcome) - 1])
            assert ended, outcome
        retries = total(client.get("/metrics").text, "translation_replica_retries_total") - retries_before
        if retries >= 1 or any(outcome[-1] == "error" for outcome in collapsed):
            break
    assert retries >= 1 or any(outcome[-1] == "error" for outcome in collapsed), "the kill met no stream"
    serving_replicas(service_url, port, "translator-en-zh")  # the two replicas are back for the tests after this one


def test_losing_one_of_two_ingress_replicas_under_load_loses_only_its_in_flight_requests_and_traffic_goes_on(
    service_url, client
):
    # deploy/serve.yaml runs two Ingress replicas behind Serve's HAProxy, as this instance does: when one dies,
    # what it held in flight is all that may go unanswered; requests sent after the kill are answered by the
    # other one at once (with one replica they wait for its replacement: bench/ingress_loss.py), and the
    # replacement comes up
    port = urlsplit(service_url).port
    victim, _survivor = serving_replicas(service_url, port, "Ingress")
    body_for = translate_bodies(ENGLISH, 1, beam_size=1, max_length=16)
    concurrency, outcome = 8, {}
    load = threading.Thread(
        target=lambda: outcome.update(
            result=asyncio.run(
                run_load(f"{service_url}/v1/translate", body_for, 10**6, concurrency, timeout_s=45, deadline_s=8)
            )
        )
    )
    load.start()
    time.sleep(2.5)
    killed_at = time.perf_counter()
    os.kill(victim, signal.SIGKILL)
    load.join(timeout=120)
    assert not load.is_alive(), "requests hung after an ingress replica died"
    timeline = outcome["result"].timeline
    unclean = [(sent - killed_at, kind) for sent, _, kind in timeline if kind not in ("200", "503", "504")]
    # what the lost replica held: requests in flight on it, and those HAProxy sent it before its health checks
    # marked it down (Serve's HAProxy checks a server that stops answering every 250 ms, down after 2 misses)
    assert all(sent < HAPROXY_DETECTION_S for sent, _ in unclean), unclean  # none sent later went unanswered
    assert len(unclean) <= concurrency, unclean
    answered = sorted(done for _, done, kind in timeline if kind == "200" and done > killed_at)
    sent_after = sum(sent > killed_at and kind == "200" for sent, _, kind in timeline)
    assert sent_after >= 20, f"traffic stopped after the kill: {sent_after} requests sent after it answered"
    marks = [killed_at, *answered]
    assert max(b - a for a, b in zip(marks, marks[1:], strict=False)) < 1.0, "traffic waited after the kill"
    replacement = serving_replicas(service_url, port, "Ingress")
    assert victim not in replacement
