"""What torch.compile (Inductor, C++ kernels on the CPU) would save on one decoding step: measured, not assumed.

    python -m bench.compile_step                   # shipped en-zh, float32, one thread
    python -m bench.compile_step --rows 4 64 --positions 8 24

Issue #16 asks for "less Python per decoding step (torch.compile or AOTInductor of the step, or a C++ step)".
Three ways of running one fp32 CPU decoding step of the shipped model, side by side in one process:

- per-matmul `linear`: `Transformer.decode_step` with every matmul through model.kernels.linear, which checks
  the mode (int8, dtype, device, gradients) and its weight copy's staleness on each call (the engine before
  StepWeights);
- StepWeights (shipped): `decode_step` with the copies checked once per decode and each matmul one torch.addmm;
- torch.compile: Inductor (C++ kernels on the CPU) with dynamic shapes, of
  (a) `decode_step` as it is: its KV cache is a Python object and its weight copies are checked by data_ptr, so
      Dynamo breaks the graph and recompiles;
  (b) a functional step: the same arithmetic as one pure function of tensors (weights prepared once, the cache's
      buffers and position passed in), one graph with symbolic rows, positions and source length; its eager run
      is the floor for Python overhead in eager PyTorch.

1. functional: best µs per step at --rows rows over caches of --positions positions for both decode_steps, the
   functional step eager and compiled (compile time reported), and the largest logit difference from decode_step.
2. engine: --texts dev sentences at beam 4 with alignments, one at a time and in batches of 16, with the two
   decode_steps and compiled (a), taking turns over --rounds rounds: median CPU ms per text, same token ids?

Writes bench/results/compile-step-cpu.json.
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

from bench.service import RESULTS, engine_arguments, engine_variants, read_sentences, translate_cpu_ms  # noqa: E402
from model.transformer import Transformer  # noqa: E402
from model.translator import Translator  # noqa: E402

SOURCE_LENGTH = 14  # tokens per source in the step measurements (a typical dev sentence)


def functional_step(model: Transformer):
    """`model.decode_step`'s arithmetic (fp32 inference, no attention returned) as a pure function:
    step(last_ids (N,), position (int), self_keys, self_values: per layer (N, h, capacity, d_k), written at
    `position`; cross_keys, cross_values: per layer (N, h, S, d_k); source_mask (N, 1, 1, S) additive) → logits."""
    config = model.config
    heads, d_k = config.decoder_attention_heads, config.d_model // config.decoder_attention_heads

    def transposed(linear: torch.nn.Linear) -> tuple[torch.Tensor, torch.Tensor]:
        return linear.weight.detach().t().contiguous(), linear.bias.detach().clone()

    layers = []
    for layer in model.decoder_layers:
        own, cross = layer.self_attn, layer.encoder_attn
        qkv = torch.cat([own.q_proj.weight, own.k_proj.weight, own.v_proj.weight]).detach().t().contiguous()
        qkv_bias = torch.cat([own.q_proj.bias, own.k_proj.bias, own.v_proj.bias]).detach()
        norms = (layer.self_attn_layer_norm, layer.encoder_attn_layer_norm, layer.final_layer_norm)
        layers.append({
            "qkv": (qkv, qkv_bias), "self_out": transposed(own.out_proj), "cross_q": transposed(cross.q_proj),
            "cross_out": transposed(cross.out_proj), "fc1": transposed(layer.feed_forward.fc1),
            "fc2": transposed(layer.feed_forward.fc2), "activation": layer.feed_forward.activation,
            "norms": [(n.weight.detach(), n.bias.detach(), n.eps) for n in norms],
        })
    output, output_bias = model.output_weight.detach().t().contiguous(), model.final_logits_bias.detach().reshape(-1)
    embedding, scale, positions = model.decoder_embed_tokens.weight.detach(), model.embed_scale, model.positions

    def attend(query, key, value, mask):
        rows, _, length, _ = key.shape
        scores = torch.bmm(query.reshape(rows * heads, 1, d_k), key.reshape(rows * heads, length, d_k).transpose(1, 2))
        scores = scores * d_k**-0.5
        if mask is not None:
            scores = (scores.view(rows, heads, 1, length) + mask).view(rows * heads, 1, length)
        context = torch.bmm(scores.softmax(dim=-1), value.reshape(rows * heads, length, d_k))
        return context.view(rows, heads * d_k)

    def norm(x, parameters):
        weight, bias, eps = parameters
        return F.layer_norm(x, (x.size(-1),), weight, bias, eps)

    def step(last_ids, position, self_keys, self_values, cross_keys, cross_values, source_mask):
        x = embedding[last_ids] * scale + positions[position]  # (N, d)
        rows = x.size(0)
        for i, p in enumerate(layers):
            qkv = torch.addmm(p["qkv"][1], x, p["qkv"][0]).view(rows, 3, heads, 1, d_k)
            self_keys[i][:rows, :, position : position + 1] = qkv[:, 1]
            self_values[i][:rows, :, position : position + 1] = qkv[:, 2]
            key, value = self_keys[i][:rows, :, : position + 1], self_values[i][:rows, :, : position + 1]
            attended = torch.addmm(p["self_out"][1], attend(qkv[:, 0], key, value, None), p["self_out"][0])
            x = norm(x + attended, p["norms"][0])
            query = torch.addmm(p["cross_q"][1], x, p["cross_q"][0])
            context = attend(query, cross_keys[i], cross_values[i], source_mask)
            x = norm(x + torch.addmm(p["cross_out"][1], context, p["cross_out"][0]), p["norms"][1])
            hidden = p["activation"](torch.addmm(p["fc1"][1], x, p["fc1"][0]))
            x = norm(x + torch.addmm(p["fc2"][1], hidden, p["fc2"][0]), p["norms"][2])
        return torch.addmm(output_bias, x, output)

    return step


def step_inputs(translator: Translator, rows: int, positions: int):
    """A cache of `rows` rows (sources of SOURCE_LENGTH real tokens) filled up to `positions` positions."""
    model = translator.model
    generator = torch.Generator().manual_seed(rows * 1000 + positions)
    source = torch.randint(10, translator.config.vocab_size, (rows, SOURCE_LENGTH), generator=generator)
    with torch.inference_mode():
        encoder = model.encode(source, torch.ones_like(source, dtype=torch.bool))
        cache = model.start_cache(encoder, capacity=positions + 1)
        for buffer in cache.self_key + cache.self_value:
            buffer.normal_(generator=generator)
    last = torch.randint(10, translator.config.vocab_size, (rows,), generator=generator)
    mask = torch.zeros(rows, 1, 1, SOURCE_LENGTH)
    return cache, last, mask


@contextlib.contextmanager
def per_matmul_dispatch():
    """decode_step as it was before StepWeights: every matmul through model.kernels.linear's dispatch."""
    original = Transformer.step_weights
    Transformer.step_weights = lambda self: None
    try:
        yield
    finally:
        Transformer.step_weights = original


def best_us(function, calls: int) -> float:
    for _ in range(5):
        function()
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(calls):
            function()
        best = min(best, (time.perf_counter() - started) / calls)
    return best * 1e6


@torch.inference_mode()
def functional(translator: Translator, rows_list: list[int], positions_list: list[int], calls: int) -> dict:
    step = functional_step(translator.model)
    compiled = torch.compile(step, dynamic=True)
    report: dict = {"compile_s": 0.0, "steps": []}
    started = time.perf_counter()
    for rows in rows_list:  # compile (and recompile, where it must) before timing
        cache, last, mask = step_inputs(translator, rows, positions_list[0])
        compiled(last, positions_list[0], cache.self_key, cache.self_value, cache.cross_key, cache.cross_value, mask)
    report["compile_s"] = round(time.perf_counter() - started, 1)
    for rows in rows_list:
        for positions in positions_list:
            cache, last, mask = step_inputs(translator, rows, positions)
            arguments = (last, positions, cache.self_key, cache.self_value, cache.cross_key, cache.cross_value, mask)
            cache.length = positions
            reference, _ = translator.model.decode_step(last, cache)  # writes the same K/V at `positions`
            eager_logits, compiled_logits = step(*arguments), compiled(*arguments)

            def engine(cache=cache, last=last, positions=positions):
                cache.length = positions
                return translator.model.decode_step(last, cache)

            cache.step_weights = None  # every matmul through `linear`
            dispatching_us = best_us(engine, calls)
            cache.step_weights = translator.model.step_weights()
            report["steps"].append({
                "rows": rows,
                "positions": positions,
                "per_matmul_linear_us": round(dispatching_us),
                "engine_us": round(best_us(engine, calls)),
                "eager_us": round(best_us(lambda a=arguments: step(*a), calls)),
                "compiled_us": round(best_us(lambda a=arguments: compiled(*a), calls)),
                "max_abs_diff_eager_vs_engine": float((eager_logits - reference).abs().max()),
                "max_abs_diff_compiled_vs_engine": float((compiled_logits - reference).abs().max()),
            })
    for entry in report["steps"]:
        entry["compiled_speedup_vs_eager"] = round(entry["eager_us"] / entry["compiled_us"], 2)
        entry["compiled_speedup_vs_engine"] = round(entry["engine_us"] / entry["compiled_us"], 2)
    return report


def engine(translator: Translator, sentences: list[str], rounds: int) -> dict:
    """bench.service.engine_variants three ways: the dispatching step, the shipped one, and torch.compile of
    decode_step (warmed up first, its warm-up time reported); and whether each gives the shipped step's ids."""
    model = translator.model
    compiled = torch.compile(model.decode_step, dynamic=True)
    torch._dynamo.config.recompile_limit = 64  # let it recompile as it needs: the point is its steady speed

    @contextlib.contextmanager
    def compiled_step():
        model.decode_step = compiled
        try:
            yield
        finally:
            del model.decode_step  # the instance attribute: back to the class's method

    variants = {
        "per-matmul linear": per_matmul_dispatch,
        "StepWeights (shipped)": contextlib.nullcontext,
        "torch.compile(decode_step)": compiled_step,
    }
    source_ids = translator.encode_source(sentences)
    started = time.perf_counter()
    with compiled_step():
        for batch in (1, 16):
            translate_cpu_ms(translator, source_ids, batch)
    warmup_s = time.perf_counter() - started
    cpu_ms, outputs = engine_variants(translator, sentences, rounds, variants)
    reference = outputs["StepWeights (shipped)"]
    return {
        "compile_warmup_s": round(warmup_s, 1),
        "cpu_ms_per_text": cpu_ms,
        "same_ids_as_shipped": {name: ids == reference for name, ids in outputs.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = engine_arguments(__doc__)
    parser.add_argument("--rows", type=int, nargs="+", default=[4, 16, 64])
    parser.add_argument("--positions", type=int, nargs="+", default=[8, 24])
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--output", type=Path, default=RESULTS / "compile-step-cpu.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    translator = Translator.from_pretrained(args.model, device="cpu")
    report = {
        "command": " ".join(["python -m bench.compile_step", *(argv if argv is not None else sys.argv[1:])]),
        "machine": {"platform": platform.platform(), "cpu_capability": torch.backends.cpu.get_cpu_capability()},
        "torch": torch.__version__,
        "model": args.model,
        "functional": functional(translator, args.rows, args.positions, args.calls),
        "engine": engine(translator, read_sentences(args.data, args.texts), args.rounds),
    }
    print(f"functional step (compiled in {report['functional']['compile_s']} s), best µs per step, one thread:")
    print(
        "| rows | positions | decode_step, per-matmul `linear` | decode_step (StepWeights) | functional eager | "
        "functional compiled | compiled / decode_step |"
    )
    print("|---|---|---|---|---|---|---|")
    for s in report["functional"]["steps"]:
        print(
            f"| {s['rows']} | {s['positions']} | {s['per_matmul_linear_us']} | {s['engine_us']} | {s['eager_us']} | "
            f"{s['compiled_us']} | {s['compiled_speedup_vs_engine']}× |"
        )
    worst = max(s["max_abs_diff_compiled_vs_engine"] for s in report["functional"]["steps"])
    print(f"largest |compiled − engine| logit difference: {worst:.2e}")
    result = report["engine"]
    print(
        f"engine, beam 4 with alignments, {args.texts} dev sentences, median CPU ms per text over {args.rounds} rounds "
        f"(torch.compile warmed up for {result['compile_warmup_s']} s first):"
    )
    print("| decoding step | B=1 | B=16 | same ids as shipped |")
    print("|---|---|---|---|")
    for name, ms in result["cpu_ms_per_text"].items():
        print(f"| {name} | {ms['B=1']} | {ms['B=16']} | {result['same_ids_as_shipped'][name]} |")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
