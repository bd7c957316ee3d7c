"""CPU fast modes on the shipped models: speed and fidelity of fp32, bf16 and int8 beside CTranslate2 int8, one run.

    python -m bench.fast_modes                          # both shipped models, whole dev set for fidelity
    python -m bench.fast_modes --models en-zh --limit 200 --speed-texts 16 --rounds 2    # a quick look
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from bench import machine, report_command, write_report
from bench.engine import convert_ctranslate2
from bench.fidelity import DEFAULT_DEV, DIRECTIONS, dev_rows
from model.cpu_isa import ISA_ENV
from model.loading import resolve_model_path
from model.runtime import EagerStep
from model.translator import Translator

logger = logging.getLogger("bench.fast_modes")

# label → how to build it: ours with a dtype (and int8 options), or CTranslate2 with a compute type
ENGINES = {
    "fp32": ("ours", {"dtype": "float32"}),  # the decoding runtime (compiled where it builds)
    "int8": ("ours", {"dtype": "int8"}),
    # kernels chosen without the runtime's own int8 tiles (fbgemm's int8 where int8 pays): what the tiles gain
    "int8 fbgemm": ("ours", {"dtype": "int8", "without": ("tiles",)}),
    "eager fp32": ("ours", {"dtype": "float32", "eager": True}),  # the lecture model's own step
    "bf16": ("ours", {"dtype": "bfloat16"}),
    "ct2 int8": ("ct2", {"compute_type": "int8"}),
    "ct2 fp32": ("ct2", {"compute_type": "float32"}),
}
BATCH_SIZES = (1, 16)


class Ours:
    def __init__(self, name: str, dtype: str, eager: bool = False, without: tuple[str, ...] = ()) -> None:
        self.translator = Translator.from_pretrained(name, device="cpu", dtype=dtype)
        if eager:
            self.translator.step = EagerStep(self.translator.model)
        if without:  # the kernels chosen again without these
            self.translator.step.choose(dtype, without=without)

    def translate(self, source_ids: list[list[int]], beam_size: int) -> list[list[int]]:
        return [nbest[0].token_ids for nbest in self.translator.generate(source_ids, beam_size=beam_size)]


class CTranslate2:
    def __init__(self, name: str, compute_type: str, cache: Path, tokenizer, threads: int) -> None:
        import ctranslate2

        quantization = "int8" if compute_type == "int8" else None
        converted = convert_ctranslate2(
            resolve_model_path(name), cache / f"{Path(name).name}-{quantization or 'none'}", quantization
        )
        self.translator = ctranslate2.Translator(
            str(converted), device="cpu", compute_type=compute_type, intra_threads=threads, inter_threads=1
        )
        self.tokenizer = tokenizer

    def translate(self, source_ids: list[list[int]], beam_size: int) -> list[list[int]]:
        tokens = [self.tokenizer.source_tokens(ids) for ids in source_ids]  # with </s>, as our ids have it
        results = self.translator.translate_batch(tokens, beam_size=beam_size, max_batch_size=len(tokens))
        vocab, unknown = self.tokenizer.target_vocab, self.tokenizer.target_unk_id
        return [[vocab.get(piece, unknown) for piece in result.hypotheses[0]] for result in results]


def build(label: str, name: str, cache: Path, tokenizer, threads: int):
    kind, options = ENGINES[label]
    if kind == "ours":
        return Ours(name, **options)
    return CTranslate2(name, options["compute_type"], cache, tokenizer, threads)


def batches(source_ids: list[list[int]], size: int) -> list[list[list[int]]]:
    return [source_ids[i : i + size] for i in range(0, len(source_ids), size)]


def measure_speed(engines: dict, source_ids: list[list[int]], beam_size: int, rounds: int) -> dict:
    """Per engine and batch size: wall seconds and process CPU seconds of each round, engines interleaved."""
    times = {label: {size: {"wall": [], "cpu": []} for size in BATCH_SIZES} for label in engines}
    for engine in engines.values():  # warm-up
        engine.translate(source_ids[:16], beam_size)
    for _ in range(rounds):
        for label, engine in engines.items():
            for size in BATCH_SIZES:
                wall, cpu = time.perf_counter(), time.process_time()
                for batch in batches(source_ids, size):
                    engine.translate(batch, beam_size)
                times[label][size]["wall"].append(time.perf_counter() - wall)
                times[label][size]["cpu"].append(time.process_time() - cpu)
    texts = len(source_ids)
    out = {}
    for label, by_size in times.items():
        out[label] = {}
        for size, measured in by_size.items():
            out[label][f"B={size}"] = {
                "texts_per_s": texts / min(measured["wall"]),
                "cpu_ms_per_text": 1000 * statistics.median(measured["cpu"]) / texts,
                "wall_s": measured["wall"],
                "cpu_s": measured["cpu"],
            }
    return out


def speed_ratios(speed: dict) -> dict:
    """texts/s and CPU per text of each engine relative to CTranslate2 int8's and our fp32's, same run."""
    ratios = {}
    for label, by_size in speed.items():
        for setting, figure in by_size.items():
            for reference in ("ct2 int8", "ct2 fp32", "eager fp32", "int8 fbgemm"):
                if reference in speed and reference != label:
                    other = speed[reference][setting]
                    ratios.setdefault(label, {})[f"{setting} texts/s vs {reference}"] = round(
                        figure["texts_per_s"] / other["texts_per_s"], 3
                    )
                    ratios[label][f"{setting} CPU per text vs {reference}"] = round(
                        figure["cpu_ms_per_text"] / other["cpu_ms_per_text"], 3
                    )
    return ratios


def translate_all(engine, source_ids: list[list[int]], beam_size: int) -> list[list[int]]:
    """Outputs in input order, decoded in batches of 16 sentences of similar length."""
    order = sorted(range(len(source_ids)), key=lambda i: len(source_ids[i]))
    outputs: list[list[int]] = [[] for _ in source_ids]
    for begin in range(0, len(order), 16):
        chunk = order[begin : begin + 16]
        for index, ids in zip(chunk, engine.translate([source_ids[i] for i in chunk], beam_size), strict=True):
            outputs[index] = ids
    return outputs


def measure_fidelity(engines: dict, tokenizer, source_ids, references, tokenize: str, beam_size: int) -> dict:
    import sacrebleu

    texts = {label: [tokenizer.detokenize(ids) for ids in translate_all(engine, source_ids, beam_size)]
             for label, engine in engines.items()}
    reference = texts.get("fp32")
    out = {}
    for label, outputs in texts.items():
        entry = {"bleu": sacrebleu.corpus_bleu(outputs, [references], tokenize=tokenize).score}
        if reference is not None:
            entry["identical_to_fp32"] = sum(a == b for a, b in zip(outputs, reference, strict=True)) / len(outputs)
        if label == "ct2 int8" and "ct2 fp32" in texts:
            entry["identical_to_ct2_fp32"] = sum(
                a == b for a, b in zip(outputs, texts["ct2 fp32"], strict=True)
            ) / len(outputs)
        out[label] = entry
    if "fp32" in out:
        for entry in out.values():
            entry["bleu_delta_vs_fp32"] = entry["bleu"] - out["fp32"]["bleu"]
    return out


def print_tables(report: dict) -> None:
    for name, entry in report["models"].items():
        print(f"\n{name}: beam {report['beam_size']}, {report['threads']} thread(s), {report['speed_texts']} texts "
              f"per setting, {report['rounds']} rounds; fidelity on {report['fidelity_sentences']} dev sentences")
        labels = list(entry["speed"] or entry["fidelity"])
        print("| engine | B=1 texts/s | B=1 CPU ms/text | B=16 texts/s | B=16 CPU ms/text | B=1 vs ct2 int8 "
              "| B=16 vs ct2 int8 | identical to fp32 | BLEU |")
        print("|---|---|---|---|---|---|---|---|---|")
        for label in labels:
            speed = entry["speed"].get(label, {})
            ratios = entry["ratios"].get(label, {})
            fidelity = entry["fidelity"].get(label, {})
            cells = [label]
            for setting in ("B=1", "B=16"):
                figure = speed.get(setting)
                cells += [f"{figure['texts_per_s']:.1f}", f"{figure['cpu_ms_per_text']:.1f}"] if figure else ["", ""]
            for setting in ("B=1", "B=16"):
                ratio = ratios.get(f"{setting} texts/s vs ct2 int8")
                cells.append(f"{ratio:.2f}x" if ratio else "")
            identical = fidelity.get("identical_to_fp32")
            cells.append(f"{identical:.1%}" if identical is not None else "")
            cells.append(f"{fidelity['bleu']:.2f}" if "bleu" in fidelity else "")
            print("| " + " | ".join(cells) + " |")
        own = entry["fidelity"].get("ct2 int8", {}).get("identical_to_ct2_fp32")
        if own is not None:
            print(f"ct2 int8 identical to ct2 fp32: {own:.1%}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=sorted(DIRECTIONS), help="shipped model names")
    parser.add_argument("--engines", nargs="+", default=["eager fp32", "fp32", "int8", "ct2 fp32", "ct2 int8"],
                        choices=list(ENGINES))
    parser.add_argument("--speed-models", nargs="+", default=["en-zh"], help="models whose speed is measured")
    parser.add_argument("--dev", default=str(DEFAULT_DEV))
    parser.add_argument("--limit", type=int, default=1000, help="dev sentences for fidelity (0: none)")
    parser.add_argument("--speed-texts", type=int, default=32, help="dev sentences decoded per speed setting")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cache", default="/tmp/bench-fast-modes", help="CTranslate2 conversions are kept here")
    parser.add_argument("--output", help="JSON path (default bench/results/fast-modes-cpu.json)")
    parser.add_argument(
        "--cpu-isa",
        choices=["avx2", "avx512"],
        help="run both engines at this instruction set: TRANSLATE_CPU_ISA for ours (model/cpu_isa.py), "
        "CT2_FORCE_CPU_ISA for CTranslate2 (the process starts again with them set, before any library reads them)",
    )
    args = parser.parse_args(argv)
    if args.cpu_isa and os.environ.get(ISA_ENV) != args.cpu_isa:
        os.environ.update({ISA_ENV: args.cpu_isa, "CT2_FORCE_CPU_ISA": args.cpu_isa.upper()})
        again = argv if argv is not None else sys.argv[1:]
        os.execv(sys.executable, [sys.executable, "-m", "bench.fast_modes", *again])
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(args.threads)
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)

    rows = dev_rows(args.dev)
    report = {
        "command": report_command("bench.fast_modes", argv),
        "machine": machine(
            cpu_capability=torch.backends.cpu.get_cpu_capability(),
            cpu_isa_forced=os.environ.get(ISA_ENV),
            ct2_force_cpu_isa=os.environ.get("CT2_FORCE_CPU_ISA"),
        ),
        "versions": {"torch": torch.__version__},
        "beam_size": args.beam_size, "threads": args.threads, "speed_texts": args.speed_texts,
        "rounds": args.rounds, "fidelity_sentences": min(args.limit, len(rows)), "models": {},
    }
    try:
        import ctranslate2

        report["versions"]["ctranslate2"] = ctranslate2.__version__
    except ImportError:
        pass
    for name in args.models:
        source_column, target_column, tokenize = DIRECTIONS[Path(name).name]
        tokenizer = Translator.from_pretrained(name, device="cpu").tokenizer
        engines = {label: build(label, name, cache, tokenizer, args.threads) for label in args.engines}
        source_ids = [tokenizer.encode_source(row[source_column]) for row in rows]
        speed = {}
        if name in args.speed_models and args.speed_texts:
            speed = measure_speed(engines, source_ids[: args.speed_texts], args.beam_size, args.rounds)
            for label, by_size in speed.items():
                logger.info("%s %-12s %s", name, label, "  ".join(
                    f"{s}: {f['texts_per_s']:.1f} texts/s, {f['cpu_ms_per_text']:.1f} CPU ms/text"
                    for s, f in by_size.items()))
        fidelity = {}
        if args.limit:
            chosen = rows[: args.limit]
            fidelity = measure_fidelity(
                engines, tokenizer, source_ids[: len(chosen)], [row[target_column] for row in chosen], tokenize,
                args.beam_size,
            )
        report["models"][name] = {"speed": speed, "ratios": speed_ratios(speed), "fidelity": fidelity}
    forced = f", forced to {args.cpu_isa} (ours and CTranslate2)" if args.cpu_isa else ""
    print(f"CPU: {report['machine']['cpu']}, {args.threads} thread(s){forced}")
    print_tables(report)
    write_report(report, args.output, "fast-modes-cpu.json")


if __name__ == "__main__":
    main()
