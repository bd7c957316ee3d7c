"""Engine benchmark: our engine against transformers' generate and CTranslate2, same weights, same inputs, one run.

    python -m bench.engine                    # full table (small and base models), writes bench/results/engine-cpu.json
    python -m bench.engine --quick            # tiny sizes, a few seconds: a smoke test
    python -m bench.engine --device cuda      # the same on a GPU: ours and transformers in fp32, bf16 and fp16,
                                              # CTranslate2 float16/int8_float16 (its CUDA build needs CUDA 12's
                                              # cuBLAS: pip install nvidia-cublas-cu12; torch from PyPI is CUDA 13)
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from bench import machine, report_command
from model.runtime import EagerStep
from model.tokenizer import MarianTokenizer
from model.translator import Translator
from tests.harness.tiny import synthetic_corpus, train_spm

REPOSITORY = Path(__file__).resolve().parents[1]

logger = logging.getLogger("bench.engine")

DEFAULT_DATA = REPOSITORY.parent / "shared" / "data" / "tatoeba-en-zh" / "train.tsv"


@dataclass(frozen=True)
class ModelSize:
    name: str
    d_model: int
    layers: int  # encoder and decoder each
    heads: int
    ffn_dim: int
    vocab_size: int


SIZES = {
    "small": ModelSize("small", 256, 3, 4, 1024, 8000),
    "base": ModelSize("base", 512, 6, 8, 2048, 32000),  # OPUS-MT's shape (their vocabularies run 32k-65k)
    "quick": ModelSize("quick", 64, 2, 4, 128, 1000),
}


@dataclass(frozen=True)
class Setting:
    name: str
    beam_size: int
    batch_size: int
    inputs: int  # sentences decoded per timed run, in batches of batch_size


def settings_for(quick: bool) -> list[Setting]:
    if quick:
        return [Setting("greedy B=1", 1, 1, 2), Setting("greedy B=32", 1, 32, 32), Setting("beam4 B=8", 4, 8, 8)]
    return [Setting("greedy B=1", 1, 1, 8), Setting("greedy B=32", 1, 32, 64), Setting("beam4 B=8", 4, 8, 16)]


# ---- models and inputs ----------------------------------------------------------------


def read_corpus(path: Path, quick: bool) -> list[tuple[str, str]]:
    """(English, Chinese) pairs: the Tatoeba data when present, else the tests' synthetic corpus."""
    if path.is_file() and not quick:
        pairs = []
        for line in path.read_text(encoding="utf-8").splitlines():
            columns = line.split("\t")
            if len(columns) >= 2:
                pairs.append((columns[0], columns[1]))
        return pairs
    return synthetic_corpus(count=2000 if not quick else 400)


def write_tokenizer(directory: Path, pairs: list[tuple[str, str]], pieces: int) -> None:
    """source.spm and target.spm trained on the corpus, once; model directories link to them."""
    directory.mkdir(parents=True, exist_ok=True)
    if not (directory / "source.spm").is_file():
        train_spm(directory / "source.spm", [p[0] for p in pairs], pieces)
        train_spm(directory / "target.spm", [p[1] for p in pairs], pieces)


def write_vocab(directory: Path, spm_directory: Path, vocab_size: int) -> dict[str, int]:
    """A shared OPUS-MT-layout vocab.json (</s>=0, <unk>=1, pieces…, <pad> last), filled up to vocab_size."""
    import sentencepiece

    vocab = {"</s>": 0, "<unk>": 1}
    for name in ("source.spm", "target.spm"):
        processor = sentencepiece.SentencePieceProcessor()
        processor.Load(str(spm_directory / name))
        for i in range(processor.GetPieceSize()):
            if len(vocab) < vocab_size - 1:
                vocab.setdefault(processor.IdToPiece(i), len(vocab))
        (directory / name).write_bytes((spm_directory / name).read_bytes())
    filler = 0
    while len(vocab) < vocab_size - 1:  # unused rows: the output projection still costs a full vocabulary
        vocab[f"<unused{filler}>"] = len(vocab)
        filler += 1
    vocab["<pad>"] = len(vocab)
    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    return vocab


def build_model(directory: Path, spm_directory: Path, size: ModelSize, seed: int = 0) -> Path:
    """A random MarianMTModel of `size`, saved by transformers with our tokenizer files."""
    from transformers import MarianConfig, MarianMTModel

    if (directory / "model.safetensors").is_file():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    vocab = write_vocab(directory, spm_directory, size.vocab_size)
    config = MarianConfig(
        vocab_size=len(vocab),
        decoder_vocab_size=len(vocab),
        d_model=size.d_model,
        encoder_layers=size.layers,
        decoder_layers=size.layers,
        encoder_attention_heads=size.heads,
        decoder_attention_heads=size.heads,
        encoder_ffn_dim=size.ffn_dim,
        decoder_ffn_dim=size.ffn_dim,
        activation_function="swish",
        scale_embedding=True,
        max_position_embeddings=512,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
        pad_token_id=vocab["<pad>"],
        eos_token_id=0,
        decoder_start_token_id=vocab["<pad>"],
        forced_eos_token_id=0,
        dropout=0.0,
    )
    torch.manual_seed(seed)
    MarianMTModel(config).eval().save_pretrained(directory)
    (directory / "tokenizer_config.json").write_text(json.dumps({"separate_vocabs": False}), encoding="utf-8")
    return directory


def pick_inputs(tokenizer: MarianTokenizer, pairs: list[tuple[str, str]], count: int, seed: int = 0) -> list[list[int]]:
    """`count` source sentences of ordinary length (4-40 pieces), as ids ending in </s>."""
    rng = random.Random(seed)
    shuffled = pairs[:]
    rng.shuffle(shuffled)
    chosen = []
    for english, _ in shuffled:
        ids = tokenizer.encode_source(english)
        if 4 <= len(ids) <= 40:
            chosen.append(ids)
        if len(chosen) == count:
            break
    return chosen


# ---- engines --------------------------------------------------------------------------


class OurEngine:
    def __init__(
        self, directory: Path, device: str, dtype: torch.dtype, return_attention: bool = False, eager: bool = False
    ) -> None:
        self.translator = Translator.from_pretrained(directory, device=device, dtype=dtype)
        if eager:  # the lecture model's own step: the compiled runtime's fallback, and a GPU's step before graphs
            self.translator.step = EagerStep(self.translator.model)
        self.return_attention = return_attention

    def generate(self, batch: list[list[int]], beam_size: int, new_tokens: int) -> list[list[int]]:
        nbest = self.translator.generate(
            batch, beam_size=beam_size, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
            return_attention=self.return_attention,
        )
        return [hypotheses[0].token_ids for hypotheses in nbest]


class TransformersEngine:
    def __init__(self, directory: Path, device: str, attention: str, dtype: torch.dtype = torch.float32) -> None:
        from transformers import MarianMTModel

        model = MarianMTModel.from_pretrained(directory, attn_implementation=attention)
        self.model = model.to(device=device, dtype=dtype).eval()
        self.device = device
        self.pad = self.model.config.pad_token_id

    @torch.inference_mode()
    def generate(self, batch: list[list[int]], beam_size: int, new_tokens: int) -> list[list[int]]:
        width = max(len(ids) for ids in batch)
        input_ids = torch.tensor([ids + [self.pad] * (width - len(ids)) for ids in batch], device=self.device)
        attention_mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids in batch], device=self.device)
        beam_options = {"early_stopping": True, "length_penalty": 1.0} if beam_size > 1 else {}
        output = self.model.generate(
            input_ids=input_ids, attention_mask=attention_mask, num_beams=beam_size, do_sample=False,
            max_new_tokens=new_tokens, min_new_tokens=new_tokens, **beam_options,
        )
        return [[t for t in row[1:] if t != self.pad] for row in output.tolist()]


class CTranslate2Engine:
    def __init__(
        self, converted: Path, tokenizer: MarianTokenizer, device: str, compute_type: str, threads: int
    ) -> None:
        import ctranslate2

        self.translator = ctranslate2.Translator(
            str(converted), device=device, compute_type=compute_type, intra_threads=threads, inter_threads=1
        )
        self.tokenizer = tokenizer

    def generate(self, batch: list[list[int]], beam_size: int, new_tokens: int) -> list[list[int]]:
        tokens = [self.tokenizer.source_tokens(ids) for ids in batch]
        results = self.translator.translate_batch(
            tokens, beam_size=beam_size, max_batch_size=len(batch), max_decoding_length=new_tokens,
            min_decoding_length=new_tokens, return_end_token=True,
        )
        vocab = self.tokenizer.target_vocab
        return [[vocab.get(piece, 1) for piece in result.hypotheses[0]] for result in results]


def convert_ctranslate2(directory: Path, output: Path, quantization: str | None) -> Path:
    """CTranslate2's conversion of `directory` into `output`, kept while the weights it came from are unchanged
    (their digest is stored beside it: a conversion of earlier weights under the same name is redone)."""
    import hashlib

    import ctranslate2

    digest = hashlib.sha256((Path(directory) / "model.safetensors").read_bytes()).hexdigest()
    stamp = output / "source.sha256"
    fresh = (output / "model.bin").is_file() and stamp.is_file() and stamp.read_text().strip() == digest
    if not fresh:
        ctranslate2.converters.TransformersConverter(str(directory)).convert(
            str(output), quantization=quantization, force=True
        )
        stamp.write_text(digest + "\n")
    return output


# ---- measurement ----------------------------------------------------------------------


def measure(engine, inputs: list[list[int]], setting: Setting, new_tokens: int, repeats: int) -> dict:
    """Best-of-`repeats` wall time to decode all inputs in batches, after one warm-up batch."""
    batches = [inputs[i : i + setting.batch_size] for i in range(0, setting.inputs, setting.batch_size)]
    engine.generate(batches[0], setting.beam_size, new_tokens)
    times, outputs = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        outputs = [ids for batch in batches for ids in engine.generate(batch, setting.beam_size, new_tokens)]
        times.append(time.perf_counter() - start)
    tokens = sum(len(ids) for ids in outputs)
    best = min(times)
    return {
        "tokens": tokens,
        "seconds": best,
        "seconds_median": statistics.median(times),
        "tokens_per_s": tokens / best,
        "outputs": outputs,
    }


def agreement(ours: list[list[int]], reference: list[list[int]]) -> float:
    """Share of sequences equal to the reference's (the final, forced token aside: engines force it differently)."""
    same = sum(a[:-1] == b[:-1] for a, b in zip(ours, reference, strict=True))
    return same / max(1, len(reference))


def engine_specs(device: str, quick: bool, hf_attention: list[str]) -> list[tuple[str, str, dict]]:
    """(label, kind, options) for every engine measured."""
    fast = torch.bfloat16
    specs = [("ours fp32", "ours", {"dtype": torch.float32})]
    specs.append(("ours fp32 +attn", "ours", {"dtype": torch.float32, "return_attention": True}))
    # the eager step: what the compiled runtime falls back to on a CPU, and the step before its CUDA graphs on a GPU
    specs.append(("ours eager fp32", "ours", {"dtype": torch.float32, "eager": True}))
    if device == "cpu":  # the compiled runtime's int8
        specs.append(("ours int8", "ours", {"dtype": torch.int8}))
    else:
        specs.append(("ours bf16", "ours", {"dtype": fast}))
    if device == "cuda":  # half precision runs natively on a GPU: ours and transformers in each
        specs.append(("ours fp16", "ours", {"dtype": torch.float16}))
        specs.append(("ours fp16 +attn", "ours", {"dtype": torch.float16, "return_attention": True}))
    for attention in hf_attention:
        specs.append((f"transformers {attention}", "transformers", {"attention": attention}))
    if device == "cuda":
        specs.append(("transformers bf16", "transformers", {"attention": "sdpa", "dtype": torch.bfloat16}))
        specs.append(("transformers fp16", "transformers", {"attention": "sdpa", "dtype": torch.float16}))
        specs.append(("ct2 float16", "ct2", {"compute_type": "float16"}))
        specs.append(("ct2 int8", "ct2", {"compute_type": "int8_float16"}))
    else:
        specs.append(("ct2 int8", "ct2", {"compute_type": "int8"}))
        specs.append(("ct2 fp32", "ct2", {"compute_type": "float32"}))
    return specs


def run(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    work = Path(args.cache) if args.cache else Path(tempfile.mkdtemp(prefix="bench-engine-"))
    pairs = read_corpus(Path(args.data), args.quick)
    spm_directory = work / ("spm-quick" if args.quick else "spm")
    write_tokenizer(spm_directory, pairs, pieces=120 if args.quick else 4000)
    sizes = ["quick"] if args.quick else args.sizes
    settings = settings_for(args.quick)
    new_tokens = 8 if args.quick else args.new_tokens
    repeats = 1 if args.quick else args.repeats
    results = []
    failures = []  # engines that could not run here (CTranslate2 without its CUDA libraries, say)
    for size_name in sizes:
        size = SIZES[size_name]
        directory = build_model(work / size.name, spm_directory, size)
        tokenizer = MarianTokenizer.from_directory(directory)
        inputs = pick_inputs(tokenizer, pairs, max(s.inputs for s in settings))
        logger.info("%s: %d inputs, mean source length %.1f", size.name, len(inputs), statistics.mean(map(len, inputs)))
        for label, kind, options in engine_specs(args.device, args.quick, args.hf_attention):
            if args.engines and not any(label.startswith(prefix) for prefix in args.engines):
                continue
            try:
                if kind == "ours":
                    engine = OurEngine(directory, args.device, **options)
                elif kind == "transformers":
                    engine = TransformersEngine(directory, args.device, **options)
                else:
                    quantization = {"int8": "int8", "int8_float16": "int8"}.get(options["compute_type"])
                    converted = work / f"{size.name}-ct2-{quantization or 'none'}"
                    convert_ctranslate2(directory, converted, quantization)
                    engine = CTranslate2Engine(converted, tokenizer, args.device, options["compute_type"], args.threads)
                    engine.generate(inputs[:1], 1, 2)  # CUDA libraries load at the first call
            except (ImportError, RuntimeError, OSError, ValueError) as error:
                logger.warning("%s %s: not measured: %s", size.name, label, error)
                failures.append({"model": size.name, "engine": label, "error": f"{type(error).__name__}: {error}"})
                continue
            for setting in settings:
                figure = measure(engine, inputs, setting, new_tokens, repeats)
                logger.info("%-6s %-12s %-22s %9.1f tok/s", size.name, setting.name, label, figure["tokens_per_s"])
                results.append({"model": size.name, "setting": setting.name, "engine": label, **figure})
            del engine
    add_agreement(results)
    return {
        "command": report_command("bench.engine"),
        "machine": machine(
            cpu_capability=torch.backends.cpu.get_cpu_capability(),
            threads=args.threads,
            device=args.device if args.device == "cpu" else torch.cuda.get_device_name(0),
        ),
        "versions": versions(),
        "new_tokens": new_tokens,
        "repeats": repeats,
        "sizes": {name: SIZES[name].__dict__ for name in sizes},
        "settings": [s.__dict__ for s in settings],
        "results": [{k: v for k, v in r.items() if k != "outputs"} for r in results],
        "ratios": ratios(results),
        "failures": failures,
    }


def versions() -> dict:
    import transformers

    found = {"torch": torch.__version__, "torch_cuda": torch.version.cuda, "transformers": transformers.__version__}
    try:
        import ctranslate2

        found["ctranslate2"] = ctranslate2.__version__
    except ImportError:
        found["ctranslate2"] = None
    return found


def is_fp32_transformers(label: str) -> bool:
    return label.startswith("transformers") and not label.endswith(("fp16", "bf16"))


def add_agreement(results: list[dict]) -> None:
    """Each result's share of sequences identical to transformers' (same model and setting)."""
    reference = {(r["model"], r["setting"]): r["outputs"] for r in results if is_fp32_transformers(r["engine"])}
    for r in results:
        if (r["model"], r["setting"]) in reference:
            r["same_as_transformers"] = agreement(r["outputs"], reference[(r["model"], r["setting"])])


def ratios(results: list[dict]) -> dict:
    """Ratios of tokens/s between engines of the same run, the form the speed targets are stated in.

    "transformers" stands for the faster of its fp32 attention implementations measured.
    """
    speed: dict[tuple[str, str], dict[str, float]] = {}
    for r in results:
        row = speed.setdefault((r["model"], r["setting"]), {})
        row[r["engine"]] = r["tokens_per_s"]
        if is_fp32_transformers(r["engine"]):
            row["transformers"] = max(row.get("transformers", 0.0), r["tokens_per_s"])
    pairs = [
        ("ours fp32", "transformers"), ("ours fp32", "ct2 fp32"), ("ours int8", "ct2 int8"),
        ("ours eager fp32", "transformers"), ("ours fp32", "ours eager fp32"),
        ("ours fp32", "ct2 int8"), ("ours bf16", "transformers"),
        ("ours bf16", "ct2 int8"), ("ours fp32 +attn", "ours fp32"), ("ours bf16 +attn", "ours bf16"),
        ("ours fp16", "ct2 float16"), ("ours fp16", "transformers fp16"), ("ours bf16", "transformers bf16"),
        ("ours fp16 +attn", "ours fp16"), ("ours fp16", "transformers"),
    ]
    out: dict[str, dict[str, float]] = {}
    for (model, setting), row in speed.items():
        for numerator, denominator in pairs:
            if row.get(numerator) and row.get(denominator):
                out.setdefault(f"{model} {setting}", {})[f"{numerator} / {denominator}"] = round(
                    row[numerator] / row[denominator], 3
                )
    return out


def print_table(report: dict) -> None:
    results = report["results"]
    engines = list(dict.fromkeys(r["engine"] for r in results))
    rows = list(dict.fromkeys((r["model"], r["setting"]) for r in results))
    speed = {(r["model"], r["setting"], r["engine"]): r["tokens_per_s"] for r in results}
    header = ["model", "setting", *engines]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for model, setting in rows:
        cells = [f"{speed[(model, setting, e)]:,.0f}" if (model, setting, e) in speed else "" for e in engines]
        lines.append("| " + " | ".join([model, setting, *cells]) + " |")
    print("tokens/s, " + f"{report['machine']['threads']} threads, {report['new_tokens']} new tokens per sequence")
    print("\n".join(lines))
    print()
    names = list(dict.fromkeys(name for values in report["ratios"].values() for name in values))
    lines = ["| model setting | " + " | ".join(names) + " |", "|" + "---|" * (len(names) + 1)]
    for key, values in report["ratios"].items():
        lines.append("| " + key + " | " + " | ".join(f"{values[n]:.2f}" if n in values else "" for n in names) + " |")
    print("\n".join(lines))
    agreements = [(r["model"], r["setting"], r["engine"], r["same_as_transformers"]) for r in results
                  if "same_as_transformers" in r and not is_fp32_transformers(r["engine"])]
    print()
    print("sequences identical to transformers':")
    for model, setting, engine, share in agreements:
        print(f"  {model:6s} {setting:12s} {engine:18s} {share:6.1%}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model and inputs: a smoke test of a few seconds")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sizes", nargs="+", default=["small", "base"], choices=["small", "base"])
    parser.add_argument("--engines", nargs="*", help="only engines whose label starts with one of these")
    parser.add_argument("--hf-attention", nargs="+", default=["sdpa"], choices=["sdpa", "eager"])
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens generated per sequence")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="TSV of English/Chinese sentences for inputs")
    parser.add_argument("--cache", help="keep the built models and conversions here between runs")
    parser.add_argument("--output", help="JSON path (default bench/results/engine-<device>.json; none with --quick)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    report = run(args)
    print_table(report)
    default = REPOSITORY / "bench" / "results" / f"engine-{args.device}.json"
    output = args.output or (None if args.quick else str(default))
    if output:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        Path(output).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {output}")


if __name__ == "__main__":
    main()
