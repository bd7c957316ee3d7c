"""Which fp32 matmul kernel the CPU decoding step should use: the weights' layout, measured side by side.

    python -m bench.linear_kernels                 # shipped en-zh, one thread
    python -m bench.linear_kernels --rounds 5

1. stream: every weight one decoding step reads (the en-zh decoder's 18 linear layers and the output
   projection, 19.2 MiB in fp32), multiplied in turn by rows of activations, as a step does, with
   - "F.linear": W (out, in) as stored, a transposed GEMM;
   - "oneDNN prepacked": oneDNN's blocked copy of W (what fp32 decoding used before TRANSPOSED_FP32);
   - "addmm (in, out)": a contiguous copy of Wᵀ, a plain GEMM (model.kernels.linear with TRANSPOSED_FP32);
   and, for comparison, kernels that read fewer bytes per weight (not exact): bf16 weights through oneDNN, torch's
   dynamic int8 linear (fbgemm, what the int8 mode uses) and int8 weights with bf16 activations
   (torch._weight_int8pack_mm); µs per pass over the 19 weights, best of --calls, at 1, 4, 16, 64 rows (beam 4 ×
   1 and 16 texts) and 240 (an encoder batch).
2. engine: the shipped model translating --texts dev sentences at beam 4, one at a time and in batches of 16,
   with TRANSPOSED_FP32 on and off in the same process, taking turns over --rounds rounds: median CPU ms per text,
   and whether both give the same token ids.
Writes bench/results/linear-kernels-cpu.json.
"""

from __future__ import annotations

import contextlib
import json
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPOSITORY = Path(__file__).resolve().parents[1]
if str(REPOSITORY) not in sys.path:
    sys.path.insert(0, str(REPOSITORY))

import model.kernels as kernels  # noqa: E402
import model.transformer as transformer  # noqa: E402
from bench.service import RESULTS, engine_arguments, engine_variants, read_sentences  # noqa: E402
from model.translator import Translator  # noqa: E402

ROWS = (1, 4, 16, 64, 240)


def step_weights(model: transformer.Transformer) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """(weight, bias) of every matmul one decoding step runs, in the step's order."""
    weights = []
    for layer in model.decoder_layers:
        weights.append(layer.self_attn.fused_query_key_value_projection())
        for linear in (layer.self_attn.out_proj, layer.encoder_attn.q_proj, layer.encoder_attn.out_proj):
            weights.append((linear.weight.detach(), linear.bias.detach()))
        feed_forward = layer.feed_forward
        for linear in (feed_forward.fc1, feed_forward.fc2):
            weights.append((linear.weight.detach(), linear.bias.detach()))
    weights.append((model.output_weight.detach(), model.final_logits_bias))
    return weights


def best_us(function, calls: int) -> float:
    """The fastest of `calls` timed calls, in µs (after three untimed ones): the least disturbed by neighbours."""
    for _ in range(3):
        function()
    best = float("inf")
    for _ in range(calls):
        started = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - started)
    return round(best * 1e6, 1)


@torch.inference_mode()
def stream(weights, rows: int, calls: int) -> dict[str, float]:
    inputs = {weight.size(1): torch.randn(rows, weight.size(1)) for weight, _ in weights}
    prepacked = [kernels.PackedWeight().get(weight) for weight, _ in weights]  # the engine's own copies
    transposed = [kernels.PackedWeight().get_transposed(weight) for weight, _ in weights]

    def f_linear():
        for weight, bias in weights:
            F.linear(inputs[weight.size(1)], weight, bias)

    def onednn():
        for (weight, bias), packed in zip(weights, prepacked, strict=True):
            torch.ops.mkldnn._linear_pointwise(inputs[weight.size(1)], packed, bias, "none", [], "")

    def addmm():
        for (weight, bias), copy in zip(weights, transposed, strict=True):
            torch.addmm(bias, inputs[weight.size(1)], copy)

    # fewer bytes per weight, for comparison (not exact: bf16 weights, or int8 weights with per-channel scales)
    bf16_packed = [kernels.PackedWeight().get(weight.bfloat16()) for weight, _ in weights]
    int8_packed = [kernels.prepack_int8(weight.float(), bias, "fbgemm") for weight, bias in weights]
    int8_weights = []
    for weight, _ in weights:
        integers, scales = kernels.quantize_per_channel(weight.float())
        int8_weights.append((integers, scales.bfloat16()))

    def bf16():
        for (weight, bias), packed in zip(weights, bf16_packed, strict=True):
            x = inputs[weight.size(1)].bfloat16()
            torch.ops.mkldnn._linear_pointwise(x, packed, bias.bfloat16(), "none", [], "").float()

    def int8_dynamic():
        for (weight, _), packed in zip(weights, int8_packed, strict=True):
            torch.ops.quantized.linear_dynamic(inputs[weight.size(1)], packed, kernels.REDUCE_RANGE)

    def int8_weight_only():
        for (weight, _), (integers, scales) in zip(weights, int8_weights, strict=True):
            torch._weight_int8pack_mm(inputs[weight.size(1)].bfloat16(), integers, scales).float()

    passes = {
        "F.linear": f_linear,
        "oneDNN prepacked": onednn,
        "addmm (in, out)": addmm,
        "bf16 oneDNN": bf16,
        "int8 dynamic (fbgemm)": int8_dynamic,
        "int8 weights, bf16 activations": int8_weight_only,
    }
    timings: dict[str, list[float]] = {name: [] for name in passes}
    for _ in range(2):  # twice, taking turns
        for name, function in passes.items():
            timings[name].append(best_us(function, calls))
    return {name: min(values) for name, values in timings.items()}


@contextlib.contextmanager
def transposed_fp32(flag: bool):
    """model.kernels.TRANSPOSED_FP32 set to `flag` for the block, then back on."""
    kernels.TRANSPOSED_FP32 = flag
    try:
        yield
    finally:
        kernels.TRANSPOSED_FP32 = True


def engine(translator: Translator, sentences: list[str], rounds: int) -> dict:
    variants = {
        "transposed (in, out)": lambda: transposed_fp32(True),
        "before: oneDNN / F.linear": lambda: transposed_fp32(False),
    }
    cpu_ms, outputs = engine_variants(translator, sentences, rounds, variants)
    reference, *others = outputs.values()
    return {"cpu_ms_per_text": cpu_ms, "same_ids": all(other == reference for other in others)}


def main(argv: list[str] | None = None) -> int:
    parser = engine_arguments(__doc__)
    parser.add_argument("--calls", type=int, default=25)
    parser.add_argument("--output", type=Path, default=RESULTS / "linear-kernels-cpu.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    translator = Translator.from_pretrained(args.model, device="cpu")
    weights = step_weights(translator.model)
    mib = sum(weight.numel() for weight, _ in weights) * 4 / 2**20
    report = {
        "command": " ".join(["python -m bench.linear_kernels", *(argv if argv is not None else sys.argv[1:])]),
        "machine": {"platform": platform.platform(), "cpu_capability": torch.backends.cpu.get_cpu_capability()},
        "torch": torch.__version__,
        "model": args.model,
        "step_weights": len(weights),
        "step_weights_mib": round(mib, 1),
        "stream_us": {},
    }
    print(f"{args.model}: one decoding step's {len(weights)} weights ({mib:.1f} MiB fp32), one thread, best µs")
    for rows in ROWS:
        timing = stream(weights, rows, args.calls)
        report["stream_us"][str(rows)] = timing
        if rows == ROWS[0]:
            print("| rows | " + " | ".join(timing) + " | addmm / oneDNN |")
            print("|---" * (len(timing) + 2) + "|")
        ratio = timing["addmm (in, out)"] / timing["oneDNN prepacked"]
        print(f"| {rows} | " + " | ".join(str(value) for value in timing.values()) + f" | {ratio:.2f} |", flush=True)
    sentences = read_sentences(args.data, 1000)[: args.texts]
    report["engine"] = engine(translator, sentences, args.rounds)
    print(f"\nengine, beam 4, {len(sentences)} dev sentences, median CPU ms per text over {args.rounds} rounds:")
    for name, by_batch in report["engine"]["cpu_ms_per_text"].items():
        print(f"  {name}: " + ", ".join(f"{label} {value}" for label, value in by_batch.items()))
    print(f"  same token ids: {report['engine']['same_ids']}")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
