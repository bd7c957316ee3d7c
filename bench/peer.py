"""The peer to beat: LibreTranslate 1.9.6 (CTranslate2) on our shipped weights, built offline-repeatable, checked,
and loaded side by side with our service in one run.

    python -m bench.peer build        # .peer/: the venv (PyPI, the only download), CTranslate2 int8 + fp32 of
                                      # model/pretrained/{en-zh,zh-en}, an .argosmodel per direction, installed
    python -m bench.peer verify       # both peers answer POST /translate; translations identical to ours, dev BLEU
    python -m bench.peer compare      # ours (serve run deploy/serve.yaml; /v1/translate and the LibreTranslate route
                                      # with the peer's body) and the two peers, one after the other:
                                      # 400 single-sentence requests and 50 requests of 16 at concurrency 32, beam 4
                                      # and the no-op app beside ours (what Ray Serve alone costs)
    python -m bench.peer compare --ours static continuous int8    # our scheduler and dtype variants, each a run
    python -m bench.peer compare --requests 40 --batch-requests 5    # a smoke run of the same pipeline
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unicodedata
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench import machine, report_command
from bench.engine import convert_ctranslate2
from bench.service import (
    DEFAULT_DATA,
    NOOP_ONE_HOP_PREFIX,
    NOOP_PREFIX,
    PER_MODEL_CONFIG,
    RESULTS,
    SERVE_CONFIG,
    bench_config,
    cpu_seconds,
    exit_on_sigterm,
    read_sentences,
    serve_running,
)
from tests.harness.loadgen import run_load
from tests.harness.processes import free_port, stop_process_group

REPOSITORY = Path(__file__).resolve().parents[1]

logger = logging.getLogger("bench.peer")

PEER = REPOSITORY / ".peer"
VENV = PEER / "venv"
LIBRETRANSLATE_VERSION = "1.9.6"
SPACY_VERSION = "3.8.18"
REQUIREMENTS = [f"libretranslate=={LIBRETRANSLATE_VERSION}", f"spacy=={SPACY_VERSION}"]
CONSTRAINTS = ["torch==2.13.0"]  # the CPU wheel pip finds on this machine; never a CUDA build
PRETRAINED = REPOSITORY / "model" / "pretrained"
DIRECTIONS = {"en-zh": ("en", "zh"), "zh-en": ("zh", "en")}
LANGUAGE_NAMES = {"en": "English", "zh": "Chinese"}
PEER_HOST = "127.0.0.2"
BEAM_SIZE = 4
ARGOS_LENGTH_PENALTY = 0.2  # argostranslate/translate.py apply_packaged_translation
FINAL_PUNCTUATION = "!?.,;。！？，；"
TARGETS = {"single_requests_per_s": 1.0, "single_p50_ms": 1.0, "batch_sentences_per_s": 1.2}
# Our service as deploy/serve.yaml runs it ("static"), and with its scheduler or its models' dtype changed.
OURS = {  # deploy/serve.yaml (colocated) changed; "layout": "per_model" starts from deploy/serve-per-model.yaml
    "static": {},
    "continuous": {"scheduler": "continuous"},
    "int8": {"dtype": "int8"},
    "float32": {"dtype": "float32"},  # the exact mode, one setting away from the default (auto: int8 on a CPU)
    "continuous-int8": {"scheduler": "continuous", "dtype": "int8"},
    "per_model": {"layout": "per_model"},  # a translator deployment per model: two Ray hops a request
    # the per-model layout's own knobs
    "calls2": {"layout": "per_model", "coalesce_max_calls": 2},  # per ingress replica: four calls out per model
    "calls4": {"layout": "per_model", "coalesce_max_calls": 4},
    "calls3": {"layout": "per_model", "coalesce_max_calls": 3},
    "nowait": {"batch_wait_timeout_s": 0},  # a static batch joins without waiting for company
    # the translators' max_ongoing_requests before 2026-12-05
    "ongoing64": {"layout": "per_model", "translator_max_ongoing_requests": 64},
    # one Ingress replica keeping 2 calls out per model
    "ingress1": {"layout": "per_model", "ingress_replicas": 1, "coalesce_max_calls": 2},
}
NOOP_LABEL = "no-op app (Ray Serve alone)"
NOOP_ONE_HOP_LABEL = "no-op app, one hop"
LIBRETRANSLATE_ROUTE = "LT route"


def ours_label(name: str) -> str:
    return "ours" if name == "static" else f"ours {name}"


def ours_config(name: str, port: int, noop: bool = False) -> dict:
    """deploy/serve.yaml, or serve-per-model.yaml, (and, with `noop`, bench/noop.py's apps) with OURS[name]'s
    changes."""
    changes = OURS[name]
    per_model = changes.get("layout") == "per_model"
    config = bench_config(port, None, noop=noop, source=PER_MODEL_CONFIG if per_model else SERVE_CONFIG)
    application = config["applications"][0]
    for key, value in changes.items():
        if key == "dtype":  # per model
            for spec in application["args"]["models"]:
                spec["dtype"] = value
        elif key == "ingress_replicas":
            for deployment in application["deployments"]:
                if deployment["name"] == "Ingress":
                    deployment["num_replicas"] = value
        elif key == "layout":  # the file chosen above
            continue
        elif key == "translator_max_ongoing_requests":  # a deployment option of every translator
            for deployment in application["deployments"]:
                if deployment["name"].startswith("translator-"):
                    deployment["max_ongoing_requests"] = value
        else:  # the app's own args (scheduler, coalesce_max_calls)
            application["args"][key] = value
    return config


@dataclass(frozen=True)
class Variant:
    name: str
    quantization: str  # CTranslate2 conversion and ARGOS_COMPUTE_TYPE
    threads: dict[str, str]  # ARGOS_INTER_THREADS / ARGOS_INTRA_THREADS; {} = argos's defaults
    label: str


VARIANTS = {
    "int8": Variant(
        "int8",
        "int8",
        {"ARGOS_INTER_THREADS": "2", "ARGOS_INTRA_THREADS": "1"},
        "LibreTranslate int8, inter 2 intra 1",
    ),
    "fp32": Variant("fp32", "float32", {}, "LibreTranslate fp32, default threads"),
}


def run(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess:
    logger.info("$ %s", " ".join(str(c) for c in command))
    return subprocess.run([str(c) for c in command], check=True, **kwargs)


# ---- build ------------------------------------------------------------------------------


def venv_python() -> Path:
    return VENV / "bin" / "python"


def ensure_venv(reinstall: bool = False) -> dict[str, str]:
    """.peer/venv with LibreTranslate and spaCy from PyPI (the build's only download); returns its pip freeze."""
    executable = VENV / "bin" / "libretranslate"
    if reinstall and VENV.exists():
        shutil.rmtree(VENV)
    if not executable.exists():
        run([sys.executable, "-m", "venv", VENV])
        constraints = PEER / "constraints.txt"
        constraints.write_text("\n".join(CONSTRAINTS) + "\n")
        run([venv_python(), "-m", "pip", "install", "--quiet", "-c", constraints, *REQUIREMENTS])
    frozen = run([venv_python(), "-m", "pip", "freeze"], capture_output=True, text=True).stdout
    versions = dict(line.split("==", 1) for line in frozen.splitlines() if "==" in line)
    if "torch" in versions and not versions["torch"].startswith("2.13.0"):
        raise RuntimeError(f"the peer's venv has torch {versions['torch']}, expected none or 2.13.0")
    return versions


def convert(model: str, quantization: str, force: bool = False) -> Path:
    """CTranslate2 conversion of model/pretrained/<model>, with add_source_eos: true (argos adds no </s>)."""
    output = PEER / "ct2" / f"{model}-{quantization}"
    if force:
        (output / "source.sha256").unlink(missing_ok=True)
    convert_ctranslate2(PRETRAINED / model, output, quantization)  # redone when the weights changed
    config_path = output / "config.json"
    config = json.loads(config_path.read_text())
    config["add_source_eos"] = True
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    return output


SPACY_SCRIPT = """
import sys, spacy
for lang, path in zip(sys.argv[1::2], sys.argv[2::2]):
    spacy.blank(lang).to_disk(path)
"""


def blank_spacy(pipelines: dict[Path, str]) -> None:
    """Blank spaCy pipelines (tokenizer only; argos adds a rule-based sentencizer) written by the venv's spaCy."""
    for path in pipelines:
        shutil.rmtree(path, ignore_errors=True)
        path.parent.mkdir(parents=True, exist_ok=True)
    run([venv_python(), "-c", SPACY_SCRIPT, *[item for path, lang in pipelines.items() for item in (lang, path)]])


def package_name(source: str, target: str) -> str:
    return f"translate-{source}_{target}-1_0"


def make_package(variant: Variant, model: str, converted: Path, spacy_dir: Path) -> Path:
    """An .argosmodel: a zip of one directory with metadata.json, model/, sentencepiece.model and spacy/."""
    source, target = DIRECTIONS[model]
    name = package_name(source, target)
    staging = PEER / "staging" / variant.name / name
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    metadata = {
        "package_version": "1.0",
        "argos_version": "1.9",
        "type": "translate",
        "from_code": source,
        "from_name": LANGUAGE_NAMES[source],
        "to_code": target,
        "to_name": LANGUAGE_NAMES[target],
        "links": [],
    }
    (staging / "metadata.json").write_text(json.dumps(metadata, indent=2) + "\n")
    (staging / "README.md").write_text(
        f"{LANGUAGE_NAMES[source]} → {LANGUAGE_NAMES[target]}: attention-translate's model/pretrained/{model}, "
        f"CTranslate2 {variant.quantization}, built by `python -m bench.peer build`.\n"
    )
    shutil.copytree(converted, staging / "model")
    shutil.copyfile(PRETRAINED / model / "source.spm", staging / "sentencepiece.model")
    shutil.copytree(spacy_dir, staging / "spacy")
    archive = PEER / "argosmodel" / variant.name / f"{name}.argosmodel"
    archive.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zipped:
        for path in sorted(staging.rglob("*")):
            zipped.write(path, path.relative_to(staging.parent))
    shutil.rmtree(staging.parent)
    return archive


def variant_root(variant: Variant) -> Path:
    return PEER / variant.name


def peer_environment(variant: Variant) -> dict[str, str]:
    """The peer's environment: isolated HOME/XDG dirs and packages, SPACY sentence splitting, no package index."""
    root = variant_root(variant)
    inherited = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("ARGOS_", "LT_", "XDG_", "PYTHON", "VIRTUAL_ENV", "OMP_", "MKL_"))
    }
    return {
        **inherited,
        "HOME": str(root / "home"),
        "XDG_DATA_HOME": str(root / "data"),
        "XDG_CONFIG_HOME": str(root / "config"),
        "XDG_CACHE_HOME": str(root / "cache"),
        "ARGOS_PACKAGES_DIR": str(root / "packages"),
        "ARGOS_PACKAGE_INDEX": "file:///nonexistent/",  # argos only fetches http(s): any index update fails at once
        "ARGOS_CHUNK_TYPE": "SPACY",
        "ARGOS_DEVICE_TYPE": "cpu",
        "ARGOS_COMPUTE_TYPE": variant.quantization,
        "ARGOS_BEAM_SIZE": str(BEAM_SIZE),
        "HF_HUB_OFFLINE": "1",
        **variant.threads,
    }


INSTALL_SCRIPT = """
import sys
from argostranslate import package
for path in sys.argv[1:]:
    package.install_from_path(path)
print(sorted(f"{p.from_code}-{p.to_code}" for p in package.get_installed_packages()))
"""


def install(variant: Variant, archives: list[Path], spacy_xx: Path) -> None:
    """Both packages into the variant's own ARGOS_PACKAGES_DIR, and the spaCy cache argos checks at import."""
    root = variant_root(variant)
    shutil.rmtree(root, ignore_errors=True)
    for name in ("home", "data", "config", "cache", "packages"):
        (root / name).mkdir(parents=True)
    # argostranslate.sbd calls networking.cache_spacy() at import with ARGOS_CHUNK_TYPE=SPACY: it downloads
    # xx_sent_ud_sm unless <cache>/argos-translate/spacy/senter/model exists. A blank multilingual pipeline there.
    cache = root / "cache" / "argos-translate" / "spacy"
    shutil.copytree(spacy_xx, cache)
    (cache / "senter").mkdir()
    (cache / "senter" / "model").write_text("blank pipeline: bench/peer.py; sentences split by argos's sentencizer\n")
    out = run(
        [venv_python(), "-c", INSTALL_SCRIPT, *archives],
        env=peer_environment(variant),
        cwd=root,
        capture_output=True,
        text=True,
    )
    installed = out.stdout.strip().splitlines()[-1]
    if installed != str(sorted(DIRECTIONS)):
        raise RuntimeError(f"{variant.name}: installed packages {installed}, expected {sorted(DIRECTIONS)}")


def build(args: argparse.Namespace) -> dict[str, Any]:
    PEER.mkdir(exist_ok=True)
    versions = ensure_venv(args.reinstall)
    spacy_root = PEER / "spacy"
    pipelines = {spacy_root / lang: lang for lang in ("en", "zh", "xx")}
    blank_spacy(pipelines)
    for variant in VARIANTS.values():
        archives = [
            make_package(
                variant, model, convert(model, variant.quantization, args.force), spacy_root / DIRECTIONS[model][0]
            )
            for model in DIRECTIONS
        ]
        install(variant, archives, spacy_root / "xx")
        logger.info("%s: installed %s", variant.name, [a.name for a in archives])
    report = {
        "libretranslate": versions.get("libretranslate"),
        "argos-translate-lt": versions.get("argos-translate-lt"),
        "ctranslate2": versions.get("ctranslate2"),
        "spacy": versions.get("spacy"),
        "torch": versions.get("torch"),
        "venv": str(VENV.relative_to(REPOSITORY)),
        "variants": {  # what the build decides of the peer's environment (HOME and XDG dirs: .peer/<variant>/)
            name: {k: v for k, v in peer_environment(variant).items() if k.startswith("ARGOS_") and "DIR" not in k}
            for name, variant in VARIANTS.items()
        },
    }
    (PEER / "build.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


# ---- running the peer -------------------------------------------------------------------


def peer_command(port: int) -> list[str]:
    return [str(VENV / "bin" / "libretranslate"), "--host", PEER_HOST, "--port", str(port), "--load-only", "en,zh"]


@contextlib.contextmanager
def peer_running(variant: Variant, timeout_s: float = 120.0, started: list | None = None) -> Iterator[str]:
    """LibreTranslate in its own OS session; yields its base URL once it has translated a sentence."""
    if not (variant_root(variant) / "packages").is_dir():
        raise RuntimeError(f"no peer build for {variant.name}: run `python -m bench.peer build` first")
    port = free_port()
    log_path = variant_root(variant) / "libretranslate.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            peer_command(port),
            cwd=variant_root(variant),
            env=peer_environment(variant),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    if started is not None:
        started.append(process.pid)
    url = f"http://{PEER_HOST}:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"libretranslate exited with {process.returncode}:\n{log_path.read_text()[-4000:]}")
            with contextlib.suppress(httpx.HTTPError):
                answer = httpx.post(
                    f"{url}/translate", json={"q": "Hello.", "source": "en", "target": "zh"}, timeout=30
                )
                if answer.status_code == 200 and answer.json().get("translatedText"):
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"libretranslate not ready after {timeout_s:.0f} s:\n{log_path.read_text()[-4000:]}")
            time.sleep(0.5)
        if "Updating language models" in log_path.read_text(errors="replace"):
            raise RuntimeError(f"libretranslate tried to fetch its package index at boot: see {log_path}")
        yield url
    finally:
        stop_process_group(process, grace_s=10.0)


def peer_translate(url: str, texts: list[str], source: str, target: str, chunk: int = 32) -> list[str]:
    out: list[str] = []
    with httpx.Client(timeout=300) as client:
        for start in range(0, len(texts), chunk):
            body = {"q": texts[start : start + chunk], "source": source, "target": target}
            answer = client.post(f"{url}/translate", json=body)
            answer.raise_for_status()
            out.extend(answer.json()["translatedText"])
    return out


# ---- verify -----------------------------------------------------------------------------


def dev_set(path: Path, model: str) -> tuple[list[str], list[list[str]]]:
    from model.training.data import dev_references, read_pairs

    source_column, target_column = (0, 1) if model == "en-zh" else (1, 0)
    return dev_references(read_pairs(str(path), source_column, target_column))


def ours_translate(model: str, texts: list[str], length_penalty: float, threads: int, batch: int = 32) -> list[str]:
    """What POST /v1/translate answers, from the engine in this process: a text of several sentences is decoded
    sentence by sentence and joined again (service/split_texts.py, the API's default), one sentence whole."""
    import torch

    from model import Translator
    from service.text.sentences import join
    from service.text.split_texts import plan_texts

    source, target = DIRECTIONS[model]
    plans = plan_texts(texts, source, split_sentences=True)
    sentences = [piece.sentence for text, plan in zip(texts, plans) for piece in (plan or []) if piece.sentence] + [
        text for text, plan in zip(texts, plans) if plan is None
    ]
    torch.set_num_threads(threads)
    translator = Translator.from_pretrained(model, device="cpu")
    translated: dict[str, str] = {}
    for start in range(0, len(sentences), batch):
        chunk = sentences[start : start + batch]
        options = {"beam_size": BEAM_SIZE, "length_penalty": length_penalty}
        translated.update((s, t.text) for s, t in zip(chunk, translator.translate(chunk, **options)))
    return [
        translated[text]
        if plan is None
        else join(plan, [translated[piece.sentence] if piece.sentence else "" for piece in plan], target)
        for text, plan in zip(texts, plans)
    ]


ARGOS_SCRIPT = """
import json, sys
from argostranslate import translate
work = json.load(sys.stdin)
out = {}
for direction, texts in work.items():
    source, target = direction.split("-")
    translation = translate.get_translation_from_codes(source, target)
    out[direction] = [translation.translate(text) for text in texts]
json.dump(out, sys.stdout, ensure_ascii=False)
"""


def argos_translate(variant: Variant, work: dict[str, list[str]]) -> dict[str, list[str]]:
    """argostranslate itself in the peer's venv and environment: the peer's translations before LibreTranslate
    rewrites their final punctuation (its improve_translation_formatting)."""
    out = subprocess.run(
        [str(venv_python()), "-c", ARGOS_SCRIPT],
        input=json.dumps(work),
        env=peer_environment(variant),
        cwd=variant_root(variant),
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


def normalized(text: str) -> str:
    """NFKC, the final punctuation mark set aside: what LibreTranslate's formatting and our detokenizer change."""
    return unicodedata.normalize("NFKC", text).strip().rstrip(FINAL_PUNCTUATION).strip().lower()


def identical(a: list[str], b: list[str], key: Callable[[str], str] = lambda s: s) -> float:
    return round(100 * sum(key(x) == key(y) for x, y in zip(a, b, strict=True)) / len(a), 2)


def verify(args: argparse.Namespace) -> dict[str, Any]:
    from model.training.evaluate import score_translations

    dev = {model: dev_set(args.data, model) for model in DIRECTIONS}
    if args.limit:
        dev = {model: (sources[: args.limit], refs[: args.limit]) for model, (sources, refs) in dev.items()}
    translations: dict[str, dict[str, list[str]]] = {model: {} for model in DIRECTIONS}
    for model, (sources, _) in dev.items():
        translations[model]["ours"] = ours_translate(model, sources, 1.0, args.threads)
        translations[model]["ours, length_penalty 0.2"] = ours_translate(
            model, sources, ARGOS_LENGTH_PENALTY, args.threads
        )
    for variant in VARIANTS.values():
        with peer_running(variant) as url:
            for model, (sources, _) in dev.items():
                source, target = DIRECTIONS[model]
                translations[model][variant.label] = peer_translate(url, sources, source, target)
        raw = argos_translate(variant, {model: sources for model, (sources, _) in dev.items()})
        for model in DIRECTIONS:
            translations[model][f"{variant.label}: argos before LT formatting"] = raw[model]
    rows = []
    for model, (sources, references) in dev.items():
        tokenize = "zh" if DIRECTIONS[model][1] == "zh" else "13a"
        ours = translations[model]["ours"]
        ours_lp = translations[model]["ours, length_penalty 0.2"]
        for name, hypotheses in translations[model].items():
            row = {
                "direction": model,
                "system": name,
                "sentences": len(sources),
                "bleu": score_translations(hypotheses, references, tokenize)["bleu"],
                "tokenize": tokenize,
                "identical_to_ours_pct": identical(hypotheses, ours),
                "identical_to_ours_normalized_pct": identical(hypotheses, ours, normalized),
                "identical_to_ours_lp02_pct": identical(hypotheses, ours_lp),
                "identical_to_ours_lp02_normalized_pct": identical(hypotheses, ours_lp, normalized),
            }
            rows.append(row)
            logger.info("%s", row)
        examples = [
            {"source": s, **{name: t[i] for name, t in translations[model].items()}} for i, s in enumerate(sources[:5])
        ]
        rows.append({"direction": model, "examples": examples})
    return {
        "command": report_command("bench.peer"),
        "data": str(args.data.name),
        "beam_size": BEAM_SIZE,
        "peer_length_penalty": ARGOS_LENGTH_PENALTY,
        "normalized": "NFKC, lower-cased, final punctuation mark removed, on both sides",
        "build": json.loads((PEER / "build.json").read_text()) if (PEER / "build.json").is_file() else None,
        "rows": rows,
    }


def print_verify(report: dict[str, Any]) -> None:
    print("identical to ours (%): exactly / normalized (NFKC, lower case, final mark aside); ours at lp 1.0 and 0.2")
    print(f"{'direction':<6} {'system':<66} {'BLEU':>6} {'lp 1.0':>7} {'norm':>7} {'lp 0.2':>7} {'norm':>7}")
    for row in report["rows"]:
        if "system" in row:
            print(
                f"{row['direction']:<6} {row['system']:<66} {row['bleu']:>6} {row['identical_to_ours_pct']:>7} "
                f"{row['identical_to_ours_normalized_pct']:>7} {row['identical_to_ours_lp02_pct']:>7} "
                f"{row['identical_to_ours_lp02_normalized_pct']:>7}"
            )


# ---- compare ----------------------------------------------------------------------------


def ours_body(sentences: list[str], k: int) -> Callable[[int], dict]:
    """/v1/translate, alignments returned as the API returns them by default."""

    def body_for(index: int) -> dict:
        texts = [sentences[(index * k + j) % len(sentences)] for j in range(k)]
        return {"texts": texts, "source_lang": "en", "target_lang": "zh", "beam_size": BEAM_SIZE}

    return body_for


def peer_body(sentences: list[str], k: int) -> Callable[[int], dict]:
    """LibreTranslate's /translate: q a string for one sentence (as a client sends it), a list for several."""

    def body_for(index: int) -> dict:
        texts = [sentences[(index * k + j) % len(sentences)] for j in range(k)]
        return {"q": texts[0] if k == 1 else texts, "source": "en", "target": "zh"}

    return body_for


def answered_sentences(payload: Any) -> int:
    """Non-empty translations in an answer: ours ({"translations": [...]}) or LibreTranslate's ({"translatedText"})."""
    if "translations" in payload:
        return sum(bool(t.get("text")) for t in payload["translations"])
    texts = payload.get("translatedText")
    return sum(bool(t) for t in ([texts] if isinstance(texts, str) else texts or []))


def load_scenarios(
    service: str,
    url: str,
    body: Callable[[list[str], int], Callable[[int], dict]],
    session: int,
    sentences: list[str],
    args: argparse.Namespace,
    scenarios: tuple[str, ...] | None = None,
) -> list[dict[str, Any]]:
    rows = []
    for scenario, requests, k in (
        ("1 sentence", args.requests, 1),
        (f"{args.sentences_per_request} sentences", args.batch_requests, args.sentences_per_request),
    ):
        if not requests or (scenarios is not None and scenario not in scenarios):
            continue
        body_for = body(sentences, k)
        answer = httpx.post(url, json=body_for(0), timeout=60)
        if answer.status_code != 200 or answered_sentences(answer.json()) != k:
            raise RuntimeError(f"{service}: {k} sentences answered {answer.status_code} {answer.text[:500]}")
        warm = min(args.concurrency, 8)
        asyncio.run(run_load(url, body_for, warm, warm, name="warm-up"))
        before = cpu_seconds(session)
        result = asyncio.run(run_load(url, body_for, requests, args.concurrency, name=scenario))
        used = cpu_seconds(session) - before
        summary = result.summary()
        ok = result.statuses.get(200, 0)
        server_s = sum(seconds for role, seconds in used.items() if role != "load generator")
        row = {
            "service": service,
            "scenario": scenario,
            "sentences_per_request": k,
            **{key: summary[key] for key in ("requests", "concurrency", "wall_s", "requests_per_s")},
            "sentences_per_s": round(ok * k / result.wall_s, 2) if result.wall_s else None,
            **{key: summary[key] for key in ("p50_ms", "p95_ms", "p99_ms", "statuses", "exceptions", "lost")},
            "server_cpu_ms_per_sentence": round(1000 * server_s / (ok * k), 2) if ok else None,
            "server_cores_busy": round(server_s / result.wall_s, 2) if result.wall_s else None,
            "load_generator_cpu_ms_per_sentence": round(1000 * used["load generator"] / (ok * k), 2) if ok else None,
        }
        logger.info("%s", row)
        rows.append(row)
    return rows


def compare(args: argparse.Namespace) -> dict[str, Any]:
    sentences = read_sentences(args.data, 1000)
    rows: list[dict[str, Any]] = []
    for index, name in enumerate(args.ours):
        config = ours_config(name, free_port(), noop=args.noop and not index)  # the no-op apps beside the first
        with tempfile.TemporaryDirectory(prefix="bench-peer-") as scratch:
            started: list[int] = []
            logger.info("starting serve run deploy/serve.yaml (%s)", name)
            with serve_running(copy.deepcopy(config), Path(scratch), started=started) as url:
                if "v1" in args.routes:
                    rows += load_scenarios(ours_label(name), f"{url}/v1/translate", ours_body, started[0], sentences,
                                           args)
                if "libretranslate" in args.routes:  # the peer's own body and route, served by us
                    rows += load_scenarios(f"{ours_label(name)} {LIBRETRANSLATE_ROUTE}", f"{url}/translate",
                                           peer_body, started[0], sentences, args)
                if not index and args.noop:  # what Ray Serve alone costs a one-sentence request, two hops and one
                    for label, prefix in ((NOOP_LABEL, NOOP_PREFIX), (NOOP_ONE_HOP_LABEL, NOOP_ONE_HOP_PREFIX)):
                        rows += load_scenarios(label, f"{url}{prefix}/v1/translate", ours_body, started[0],
                                               sentences, args, scenarios=("1 sentence",))
    for name in args.peers:
        variant = VARIANTS[name]
        started = []
        logger.info("starting %s", variant.label)
        with peer_running(variant, started=started) as url:
            rows += load_scenarios(variant.label, f"{url}/translate", peer_body, started[0], sentences, args)
    return {
        "command": report_command("bench.peer"),
        "machine": machine(),
        "beam_size": BEAM_SIZE,
        "peer": {
            name: {"threads": v.threads or "argos defaults", "compute_type": v.quantization}
            for name, v in VARIANTS.items()
        },
        "peer_command": " ".join(peer_command(0)).replace(" 0 ", " <free> "),
        "rows": rows,
        "ratios": ratios(rows),
    }


def ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """ours / peer for each of our variants, each peer and scenario: req/s, p50 (lower is better), sentences/s,
    server CPU per sentence; and each variant's single-sentence CPU against the no-op app's."""
    out = []
    labels = {ours_label(name) for name in OURS} | {f"{ours_label(name)} {LIBRETRANSLATE_ROUTE}" for name in OURS}
    ours_rows = [row for row in rows if row["service"] in labels]
    for mine in ours_rows:
        for row in rows:
            if row["service"] in labels or row["scenario"] != mine["scenario"]:
                continue
            out.append(ratio(mine, row))
    return out


def ratio(mine: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    """ours / peer in one scenario (the no-op app's row carries no target)."""
    entry: dict[str, Any] = {"ours": mine["service"], "peer": row["service"], "scenario": row["scenario"]}
    for key in ("requests_per_s", "p50_ms", "sentences_per_s", "server_cpu_ms_per_sentence"):
        if mine.get(key) and row.get(key):
            entry[key] = round(mine[key] / row[key], 3)
    if row["sentences_per_request"] == 1 and "requests_per_s" in entry and "p50_ms" in entry:
        entry["targets"] = {
            f"requests_per_s >= {TARGETS['single_requests_per_s']}": (
                entry["requests_per_s"] >= TARGETS["single_requests_per_s"]
            ),
            f"p50 <= {TARGETS['single_p50_ms']}": entry["p50_ms"] <= TARGETS["single_p50_ms"],
        }
    elif "sentences_per_s" in entry:
        entry["targets"] = {
            f"sentences_per_s >= {TARGETS['batch_sentences_per_s']}": (
                entry["sentences_per_s"] >= TARGETS["batch_sentences_per_s"]
            )
        }
    if row["service"] in (NOOP_LABEL, NOOP_ONE_HOP_LABEL):
        entry.pop("targets", None)
    return entry


def print_compare(report: dict[str, Any]) -> None:
    header = f"{'service':<38} {'scenario':<13} {'req':>5} {'req/s':>7} {'sent/s':>7} {'p50 ms':>7} {'p95 ms':>7} "
    print(header + f"{'p99 ms':>7} {'srv CPU ms/sent':>15}  errors")
    for row in report["rows"]:
        errors = {k: v for k, v in row["statuses"].items() if k != "200"} | row["exceptions"]
        print(
            f"{row['service']:<38} {row['scenario']:<13} {row['requests']:>5} {row['requests_per_s']:>7} "
            f"{row['sentences_per_s']:>7} {row['p50_ms']:>7} {row['p95_ms']:>7} {row['p99_ms']:>7} "
            f"{row['server_cpu_ms_per_sentence']:>15}  {errors or 'none'}"
        )
    print("\nours / peer")
    for entry in report["ratios"]:
        figures = " ".join(f"{k} {v}" for k, v in entry.items() if k not in ("peer", "scenario", "targets"))
        met = " ".join(f"[{k}: {'met' if v else 'NOT MET'}]" for k, v in entry.get("targets", {}).items())
        figures = " ".join(f"{k} {v}" for k, v in entry.items() if k not in ("ours", "peer", "scenario", "targets"))
        print(f"{entry['ours']:<22} / {entry['peer']:<38} {entry['scenario']:<13} {figures} {met}")


# ---- command line -----------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    build_parser = commands.add_parser("build", help="the venv, conversions, packages, installs under .peer/")
    build_parser.add_argument("--reinstall", action="store_true", help="recreate .peer/venv")
    build_parser.add_argument("--force", action="store_true", help="reconvert the models")
    verify_parser = commands.add_parser("verify", help="identical-translation rate and dev BLEU, ours and the peers")
    verify_parser.add_argument("--limit", type=int, help="first N distinct dev sources per direction")
    verify_parser.add_argument("--threads", type=int, default=2, help="torch threads of our engine")
    compare_parser = commands.add_parser("compare", help="ours and the peers under the same load, one run")
    compare_parser.add_argument("--requests", type=int, default=400, help="single-sentence requests")
    compare_parser.add_argument("--batch-requests", type=int, default=50, help="requests of --sentences-per-request")
    compare_parser.add_argument("--sentences-per-request", type=int, default=16)
    compare_parser.add_argument("--concurrency", type=int, default=32)
    compare_parser.add_argument("--peers", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    compare_parser.add_argument(
        "--ours",
        nargs="*",
        default=["static"],
        choices=list(OURS),
        help="our service's variants, each its own serve run: deploy/serve.yaml (static), continuous, int8, ...",
    )
    compare_parser.add_argument(
        "--noop",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also load bench/noop.py's apps beside the first variant (single sentences): Ray Serve's own cost",
    )
    compare_parser.add_argument(
        "--routes", nargs="+", default=["v1", "libretranslate"], choices=["v1", "libretranslate"],
        help="our routes to load: /v1/translate, and the LibreTranslate route with the peer's own body",
    )
    for sub in (verify_parser, compare_parser):
        sub.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the tatoeba en-zh dev TSV")
        sub.add_argument("--output", type=Path, help="JSON report (default bench/results/peer-<command>.json)")
    args = parser.parse_args(argv)
    exit_on_sigterm()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if args.command == "build":
        print(json.dumps(build(args), indent=2))
        return 0
    report = verify(args) if args.command == "verify" else compare(args)
    output = args.output or RESULTS / f"peer-{args.command}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    (print_verify if args.command == "verify" else print_compare)(report)
    print(f"wrote {output.relative_to(REPOSITORY) if output.is_relative_to(REPOSITORY) else output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
