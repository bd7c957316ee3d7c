"""Where one decoding step's time goes: torch.profiler over the shipped model's `decode_step`, one thread.

    python -m bench.profile_step                       # en-zh, float32, 4 and 64 rows (beam 4 × 1 and 16 texts)
    python -m bench.profile_step --dtype bfloat16 --rows 64

For each row count: the step's wall time in a loop (its KV cache at a fixed length of 8 positions), the share
of the matmuls (linear layers and the output projection) in the profiler's self CPU time, and each matmul
shape's time per call inside the step beside the same shapes through the step's own matmul
(model.kernels.linear) alone in a tight loop (one weight, which then stays in the core's caches). A step
reads every decoder weight once; when the step's weights outgrow the caches, each matmul waits on memory and
runs slower inside the step than alone.
Writes bench/results/profile-step-cpu.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

REPOSITORY = Path(__file__).resolve().parents[1]
if str(REPOSITORY) not in sys.path:
    sys.path.insert(0, str(REPOSITORY))

from model.kernels import PackedWeight, linear  # noqa: E402
from model.translator import Translator  # noqa: E402

MATMULS = ("mkldnn::_linear_pointwise", "aten::addmm", "aten::mm", "quantized::linear_dynamic")
POSITIONS = 8  # cache length the measured step attends over


def step_runner(translator: Translator, rows: int):
    """A function running one decoding step of `rows` rows over a fixed-length cache (same work every call)."""
    model = translator.model
    source = translator.tokenizer.encode_source("An angle of 90 degrees is called a right angle.")
    with torch.inference_mode():
        ids = torch.tensor([source] * rows)
        encoder = model.encode(ids, torch.ones_like(ids, dtype=torch.bool))
        cache = model.start_cache(encoder, capacity=POSITIONS + 1)
        for buffer in cache.self_key + cache.self_value:
            buffer.zero_()
    last = torch.full((rows,), translator.config.eos_token_id + 5)

    @torch.inference_mode()
    def step():
        cache.length = POSITIONS
        return model.decode_step(last, cache)

    return step


def wall_ms(function, calls: int) -> float:
    """Milliseconds per call of `function` over `calls` calls, after ten untimed ones."""
    for _ in range(10):
        function()
    start = time.perf_counter()
    for _ in range(calls):
        function()
    return (time.perf_counter() - start) / calls * 1e3


def alone_us(shapes: list, calls: int) -> float:
    """Microseconds per call of the step's own fp32 matmul (model.kernels.linear, with its prepared copy of
    the weight) on random inputs of the recorded shapes, in a tight loop."""
    x_shape, w_shape = shapes[0], shapes[1]
    x, weight, prepared = torch.randn(x_shape), torch.randn(w_shape), PackedWeight()
    with torch.inference_mode():
        return wall_ms(lambda: linear(x, weight, None, prepared), calls) * 1e3


def profile_rows(translator: Translator, rows: int, calls: int) -> dict:
    step = step_runner(translator, rows)
    step_ms = wall_ms(step, calls)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as profiler:
        for _ in range(calls):
            step()
    events = profiler.key_averages(group_by_input_shape=True)
    total_us = sum(event.self_cpu_time_total for event in events)
    by_shape: dict[str, dict] = defaultdict(lambda: {"calls": 0, "self_us": 0.0})
    matmul_us = 0.0
    for event in events:
        if event.key not in MATMULS:
            continue
        matmul_us += event.self_cpu_time_total
        shapes = [shape for shape in event.input_shapes if shape]
        if event.key == "aten::addmm" and len(shapes) == 3:  # (bias, x, weightᵀ)
            shapes = [shapes[1], shapes[2][::-1]]
        shapes = shapes[:2]
        key = f"{tuple(shapes[0])} x {tuple(shapes[1])}" if len(shapes) == 2 and len(shapes[1]) == 2 else event.key
        entry = by_shape[key]
        entry["calls"] += event.count
        entry["self_us"] += event.self_cpu_time_total
        entry["shapes"] = shapes
    matmuls = []
    for key, entry in sorted(by_shape.items(), key=lambda item: -item[1]["self_us"]):
        in_step = entry["self_us"] / entry["calls"]
        shapes = entry.get("shapes", [])
        alone = alone_us(shapes, 200) if translator.model.output_weight.dtype == torch.float32 and len(shapes) == 2 \
            and len(shapes[1]) == 2 else None
        matmuls.append({
            "shape": key, "per_step": round(entry["calls"] / calls, 1), "in_step_us": round(in_step, 1),
            "alone_us": round(alone, 1) if alone is not None else None,
        })
    return {
        "rows": rows, "step_ms": round(step_ms, 3), "matmul_share": round(matmul_us / total_us, 3),
        "matmuls": matmuls,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="en-zh")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "int8"])
    parser.add_argument("--rows", type=int, nargs="+", default=[4, 64])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--output", default=str(REPOSITORY / "bench" / "results" / "profile-step-cpu.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    translator = Translator.from_pretrained(args.model, device="cpu", dtype=args.dtype)
    weights = sum(p.numel() * p.element_size() for p in translator.model.decoder_layers.parameters())
    weights += translator.model.output_weight.numel() * translator.model.output_weight.element_size()
    results = [profile_rows(translator, rows, args.calls) for rows in args.rows]
    print(f"{args.model} {args.dtype}: decoder layers + output projection hold {weights / 2**20:.1f} MiB of weights")
    for result in results:
        print(f"\n{result['rows']} rows: {result['step_ms']} ms per step, matmuls {100 * result['matmul_share']:.0f}%"
              " of the profiled CPU time")
        print("| matmul (input x weight) | per step | µs in the step | µs alone (same kernel) |")
        print("|---|---|---|---|")
        for matmul in result["matmuls"]:
            print(f"| {matmul['shape']} | {matmul['per_step']} | {matmul['in_step_us']} | {matmul['alone_us']} |")
    report = {
        "command": " ".join(["python -m bench.profile_step", *sys.argv[1:]]),
        "machine": {"platform": platform.platform(), "torch": torch.__version__, "threads": 1},
        "model": args.model, "dtype": args.dtype, "weights_mib": round(weights / 2**20, 2), "results": results,
    }
    Path(args.output).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {args.output}")


if __name__ == "__main__":
    main()
