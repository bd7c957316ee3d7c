"""The decoding steps: the compiled step with its kernels chosen on this machine (its own decode loop), the eager
step it falls back to and, on a GPU, the eager step's CUDA graphs (both under StepLoop's `decode_rows`)."""

from __future__ import annotations

import logging
import os
import time
import warnings
from dataclasses import dataclass, field

import torch
from torch import Tensor

from model import cpu_isa, weight_spec
from model.runtime import eager, graphs
from model.runtime.extension import ACTIVATIONS, KERNELS, compiled_extension, cpu_model, failure
from model.runtime.quantize import quantize_per_channel
from model.runtime.rows import StaticRows

logger = logging.getLogger("model.runtime")

RUNTIME_ENV = "TRANSLATE_RUNTIME"  # auto (default): compiled if it builds, else eager; eager; compiled (required)
SMALL_ROWS, LARGE_ROWS = 4, 64  # rows the kernels are timed at: one text's beam of 4, sixteen texts' beams
CHOICE_REPEATS = 3  # the fastest of this many interleaved runs of each candidate

@dataclass
class RuntimeInfo:
    """What decodes and why, as /v1/models and the startup log report it."""

    runtime: str  # "compiled" or "eager"
    precision: str  # of the decoding step's matmuls: "float32" or "int8" (or the eager model's dtype)
    reason: str
    cpu: str = field(default_factory=cpu_model)
    threads: int = field(default_factory=torch.get_num_threads)
    kernels: dict[str, str] = field(default_factory=dict)  # matmul -> "small/large" kernel chosen
    choice_ms: float = 0.0
    # the instruction set the step runs at (model.cpu_isa): the compiled loops' level, or ATen's capability
    cpu_isa: str = field(default_factory=lambda: torch.backends.cpu.get_cpu_capability().lower())
    int8_tiles: str = ""  # the compiled step's own int8 tiles on this CPU: "vnni", "avx2" or "" (fbgemm only)

    def as_dict(self) -> dict:
        return {
            "runtime": self.runtime, "precision": self.precision, "reason": self.reason, "cpu": self.cpu,
            "threads": self.threads, "kernels": dict(self.kernels), "choice_ms": round(self.choice_ms, 1),
            "cpu_isa": self.cpu_isa, "int8_tiles": self.int8_tiles,
        }


class EagerStep:
    """The lecture model's own step: the reference, and the fallback. Its rows lie in fixed buffers (rows.StaticRows);
    each step reads them cut to the rows in use, the positions written and the longest source."""

    new_loop = None  # no compiled decode loop: StepLoop drives decode_rows

    def __init__(self, model, reason: str = "eager requested", precision: str | None = None) -> None:
        self.model = model
        self.info = RuntimeInfo("eager", precision or weights_precision(model), reason)

    def encode(self, source_ids: Tensor, source_mask: Tensor) -> Tensor:
        return eager.encode(self.model, source_ids, source_mask)

    def cross_key_values(self, hidden: Tensor, beams: int | Tensor = 1) -> tuple[list[Tensor], list[Tensor]]:
        return eager.cross_key_values(self.model, hidden, beams)

    def rows_cache(self) -> StaticRows:
        return StaticRows(self.model)

    @torch.inference_mode()
    def decode_rows(self, last_ids: Tensor, cache: StaticRows, need_weights: bool = False):
        """One step for every row of `cache` at its own position: logits (N, V) and, when asked, each layer's
        cross-attention (N, h, S)."""
        count = cache.rows
        cache.ids[:count].copy_(last_ids)
        variant = graphs.Variant(cache.pending, need_weights)
        cache.pending = "none"
        return graphs.rows_step(self.model, cache, count, variant, trimmed=True)


class GraphStep(EagerStep):
    """The eager step at static shapes (whole row buckets and buffers), so that on a GPU each shape's step is one
    CUDA graph replay (`capture`, by default where the model lies on a GPU); uncaptured, the same static step runs
    eagerly. The ids equal EagerStep's."""

    def __init__(self, model, capture: bool | None = None, reason: str = "", precision: str | None = None) -> None:
        capture = model.final_logits_bias.device.type == "cuda" if capture is None else capture
        super().__init__(model, reason or (
            "the lecture model's step at bucketed static shapes, each shape's step replayed as a CUDA graph"
            if capture else "the lecture model's step at bucketed static shapes, run eagerly"
        ), precision)
        self.graphs = graphs.GraphSteps(model, capture)

    @torch.inference_mode()
    def decode_rows(self, last_ids: Tensor, cache: StaticRows, need_weights: bool = False):
        """`EagerStep.decode_rows` at static shapes; the outputs are valid until the next step."""
        count = cache.rows
        cache.ids[:count].copy_(last_ids)
        self.graphs.run_rows(cache, need_weights)
        cross = [cache.weights[layer, :count] for layer in range(cache.layers)] if need_weights else None
        return cache.logits[:count], cross


def weights_precision(model) -> str:
    """The dtype the model's matrices are stored in, by name ("float32", "bfloat16", "float16")."""
    return str(model.output_weight.dtype).removeprefix("torch.")


class CompiledStep:
    """Every layer in one C++ call per step, on copies of the weights (fp32, plus per-channel int8), each matmul on
    the kernel measured fastest here for few rows and for many."""

    def __init__(self, model, extension, precision: str = "float32", choose: bool = True) -> None:
        if precision not in ("float32", "int8"):
            raise ValueError("the compiled step runs float32 or int8")
        self.model, self.extension, self.precision, self._choose = model, extension, precision, choose
        # listed once: walking the module tree per decode costs about a millisecond
        self._slots = [(module._parameters, name) for module in model.modules() for name in module._parameters]
        self._stamp = self._weights_stamp()
        config = model.config
        int8 = precision == "int8"
        reduce = reduce_range(extension)
        spec = weight_spec.check(model, "the compiled step")  # every tensor it reads, by name and shape
        tensors = weight_spec.model_tensors(model)
        self._runtime = extension.Runtime(
            weight_spec.fp32(tensors[spec.decoder_embedding[0]]), weight_spec.fp32(model.positions),
            float(model.embed_scale),
            config.decoder_attention_heads, ACTIVATIONS[config.activation_function],
            float(model.decoder_layers[0].final_layer_norm.eps),
        )
        self.names: list[str] = []
        self._runtime.set_encoder_embedding(weight_spec.fp32(tensors[spec.encoder_embedding[0]]))
        for layer in spec.encoder:
            weights, biases = zip(*(weight_spec.read_matmul(tensors, m) for m in layer.matmuls), strict=True)
            weights, biases = list(weights), list(biases)
            # int8 for the encoder's feed-forward only, fc1 only with 8-bit activations: fidelity (decisions.md)
            fc1 = _prepack(extension, weights[2]) if int8 and not reduce else None
            packed = [None, None, fc1, _prepack(extension, weights[3])] if int8 else []
            self._runtime.add_encoder_layer(weights, biases, weight_spec.read_norms(tensors, layer), packed, reduce)
            self.names += [m.name for m in layer.matmuls]
        for layer in spec.decoder:  # matmuls in model.weight_spec.DECODER_MATMULS' order
            weights, biases = zip(*(weight_spec.read_matmul(tensors, m) for m in layer.matmuls), strict=True)
            weights, biases = list(weights), list(biases)
            packed = [_prepack(extension, w) for w in weights] if int8 else []
            self._runtime.add_layer(weights, biases, weight_spec.read_norms(tensors, layer), packed, reduce)
            self.names += [m.name for m in layer.matmuls]
        output = weight_spec.fp32(tensors[spec.output[0]])
        self._runtime.set_output(
            output, weight_spec.fp32(tensors[spec.output_bias[0]]), [_prepack(extension, output)] if int8 else [],
            reduce, eager.RESCORED_CANDIDATES,
        )
        self.names.append("output")
        self.info = RuntimeInfo(
            "compiled", precision, "", cpu_isa=cpu_isa.NAMES[extension.cpu_isa()],
            int8_tiles=extension.int8_tiles() if int8 else "",
        )
        if choose:
            self.choose(precision)
        else:
            self.force("linear")

    def choose(self, precision: str, without: tuple[str, ...] = ()) -> None:
        """Time each matmul's candidate kernels on the real weights and keep the fastest; `without`: kernels left
        out (benchmarks)."""
        codes = {name: code for code, name in KERNELS.items()}
        names = ["linear", "transposed", "onednn"]
        if precision == "int8":
            names += ["int8", "tiles"]  # tiles: only where the CPU has some (the runtime checks)
        allowed = [codes[name] for name in names if name not in without]
        started = time.perf_counter()
        report = self._runtime.choose(allowed, SMALL_ROWS, LARGE_ROWS, CHOICE_REPEATS)
        self.info.choice_ms = (time.perf_counter() - started) * 1e3
        self.info.kernels = dict(zip(self.names, self._runtime.kernels(), strict=True))
        self.timings = {name: _timings(row) for name, row in zip(self.names, report, strict=True)}
        chosen = sorted(set(self.info.kernels.values()))
        self.info.reason = (
            f"kernels timed at {SMALL_ROWS} and {LARGE_ROWS} rows on this CPU in {self.info.choice_ms:.0f} ms; "
            f"chosen (few rows/many rows): {', '.join(chosen)}"
        )

    def force(self, kernel: str) -> None:
        """Every matmul on one kernel (a name of KERNELS), where it has one."""
        code = {name: code for code, name in KERNELS.items()}[kernel]
        self._runtime.force(code)
        self.info.kernels = dict(zip(self.names, self._runtime.kernels(), strict=True))
        self.info.reason = f"every matmul on {kernel} (forced)"

    def _weights_stamp(self) -> int:
        """One number that changes when a parameter is replaced, moved or updated in place."""
        return self.extension.weights_stamp([parameters.get(name) for parameters, name in self._slots])

    def refresh(self) -> None:
        """Copy the weights again if the model's changed since (an optimizer step, load_state_dict in place)."""
        if self._weights_stamp() != self._stamp:
            logger.info("decoding runtime: the model's weights changed; copying them again")
            self.__init__(self.model, self.extension, self.precision, self._choose)

    def encode(self, source_ids: Tensor, source_mask: Tensor) -> Tensor:
        """The encoder's hidden states (B, S, d_model); every decode starts here, so weights are refreshed here."""
        self.refresh()
        return self._runtime.encode(source_ids, source_mask)

    def cross_key_values(self, hidden: Tensor, beams: int | Tensor = 1) -> tuple[list[Tensor], list[Tensor]]:
        if isinstance(beams, int):
            beams = torch.full((hidden.size(0),), beams, dtype=torch.long, device=hidden.device)
        return self._runtime.cross_key_values(hidden.contiguous(), beams)

    def logits(self, hidden: Tensor) -> Tensor:
        """The step's output projection (int8 with rescoring, or fp32) of decoder states (N, d_model)."""
        return self._runtime.logits(hidden.detach().float().contiguous())

    def new_loop(self, alignment_head: tuple[int, int | None] | None = None):
        """The compiled decode loop; alignment_head: (layer, head or None for the average) a capture keeps."""
        self.refresh()
        config = self.model.config
        layer, head = alignment_head if alignment_head is not None else (0, 0)
        return self.extension.CompiledLoop(
            self._runtime, config.eos_token_id, config.pad_token_id, config.decoder_start_token_id, layer,
            -1 if head is None else head,
        )


def reduce_range(extension) -> bool:
    """Whether int8 activations keep 7 bits: without VNNI, fbgemm's int16 pair sums could saturate with 8."""
    return not extension.has_vnni()


def _timings(row: list[float]) -> dict:
    """One matmul's line of Runtime.choose's report as {"small": {kernel: µs}, "large": {...}}."""
    pairs = row[2:]
    half = len(pairs) // 2
    out = {}
    for label, part in (("small", pairs[:half]), ("large", pairs[half:])):
        out[label] = {KERNELS[int(part[i])]: round(part[i + 1], 1) for i in range(0, len(part), 2)}
    return out


def _prepack(extension, weight: Tensor):
    """W (out, in) quantized per output channel (symmetric int8) and prepacked for fbgemm's dynamic linear."""
    integers, scales = quantize_per_channel(weight)
    zero_points = torch.zeros(weight.size(0), dtype=torch.long)
    previous = torch.backends.quantized.engine
    torch.backends.quantized.engine = "fbgemm"  # prepacking reads the global engine
    try:
        with warnings.catch_warnings():  # torch 2.13 announces the quantized tensor type's deprecation
            warnings.simplefilter("ignore")
            quantized = torch._make_per_channel_quantized_tensor(integers, scales.double(), zero_points, 0)
        return extension.prepack(quantized)
    finally:
        torch.backends.quantized.engine = previous


def load_step(model, precision: str = "float32"):
    """The compiled step where it builds and suits, else the eager one (RuntimeInfo says why). TRANSLATE_RUNTIME=eager
    forces eager, =compiled makes a failed build an error."""
    wanted = os.environ.get(RUNTIME_ENV, "auto").strip().lower() or "auto"
    if wanted not in ("auto", "eager", "compiled"):
        raise ValueError(f"{RUNTIME_ENV} must be auto, eager or compiled, not {wanted!r}")
    int8_note = "" if precision != "int8" else "; int8 needs the compiled step, so float32 decodes"
    if wanted == "eager":
        return EagerStep(model, f"{RUNTIME_ENV}=eager{int8_note}")
    device = model.final_logits_bias.device
    if device.type == "cuda":  # the lecture model's step at static shapes, one CUDA graph replay per step
        return GraphStep(model, capture=True)
    if device.type != "cpu":
        return EagerStep(model, f"the compiled step is measured on CPUs only; {device.type} decodes eagerly")
    if precision not in ("float32", "int8"):
        return EagerStep(model, f"the compiled step runs float32 or int8; {precision} decodes eagerly")
    extension = compiled_extension()
    if extension is None:
        if wanted == "compiled":
            raise RuntimeError(f"{RUNTIME_ENV}=compiled but the compiled step could not be built: {failure()}")
        return EagerStep(model, f"the compiled step could not be built ({failure()}){int8_note}")
    step = CompiledStep(model, extension, precision)
    logger.info("decoding runtime: compiled %s step on %s, %s", precision, step.info.cpu, step.info.reason)
    return step
