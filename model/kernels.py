"""How a linear layer multiplies in CPU inference: x Wᵀ + b on the kernel and weight layout that runs fastest
for its dtype, and int8 weights for the int8 fast mode.

`linear` is every matmul of model/transformer.py: fp32 multiplies by an (in, out) copy of the weight with
torch.addmm, bf16 weights go through oneDNN's prepacked copy, int8 (Transformer.quantize_int8) through torch's
dynamic quantized linear; GPUs and anything run with gradients take F.linear on the weight itself. Each copy
lives in a `PackedWeight` beside its layer and is rebuilt whenever the weight changes. The module globals below
are switches the benchmarks flip (bench/linear_kernels.py): read them as `kernels.NAME`, not copied by import.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

ONEDNN = torch.backends.mkldnn.is_available()
# fp32 inference on the CPU multiplies by a copy of each weight laid out (in, out), x @ Wᵀ as one plain
# GEMM (torch.addmm), rather than by W (out, in) through F.linear's transposed GEMM or by oneDNN's prepacked
# copy: the decoding steps read every weight once per step, and this layout streams it fastest.
# `python -m bench.linear_kernels --rounds 5` (2-core Intel Xeon; the en-zh decoder step's 19 weights, 19.2 MiB,
# one thread): 1,054 against 1,351 µs through oneDNN at 4 rows, 4,618 against 5,829 at 64, 1.03× at 240 (an
# encoder batch); the engine at beam 4: 30.7 against 40.0 CPU ms per text alone, 9.0 against 9.1 in batches of 16.
TRANSPOSED_FP32 = True
# bf16 weights go through oneDNN (its bf16 kernels); below this many multiply-adds (rows × in × out) oneDNN's
# fixed cost per call outweighs its faster kernel in fp32 and plain F.linear wins (used when TRANSPOSED_FP32
# is off). Measured on a 2-core AMD EPYC (fp32, 1 thread): 256→1024 at 1 row 29 µs vs 36 µs, at 2 rows 48 vs 37.
SMALL_MATMUL = 300_000
# int8 weights (Transformer.quantize_int8) only from this many multiply-adds: below it the quantization's own
# steps cost more than the int8 kernel saves, and fp32 is exact. Measured here (1 thread): at 4 rows (beam 4, one
# text) 256→768 runs 22 µs in int8 vs 22 µs in fp32, 256→256 20 vs 10, while the 256→8935 output projection
# runs 310 vs 570 µs; at 64 rows every layer runs about twice as fast in int8.
INT8_MIN_MACS = 2_000_000


INT8_ENGINES = ("fbgemm", "onednn", "x86")  # torch's quantized backends that prepack int8 weights


def _has_vnni() -> bool:
    """Whether the CPU multiplies u8·s8 pairs into int32 directly (AVX-512 VNNI), so 8-bit activations cannot
    saturate fbgemm's int16 intermediate sums as they can on plain AVX2/AVX-512."""
    try:
        flags = Path("/proc/cpuinfo").read_text(encoding="ascii", errors="ignore")
    except OSError:
        return False
    return " avx512_vnni" in flags


# 7-bit activations (torch's default for fbgemm) where 8 bits could saturate; 8 bits on VNNI. Measured on the
# shipped en-zh model, 200 dev sentences: 90.5% of translations identical to fp32 with 8 bits, 87% with 7.
REDUCE_RANGE = not _has_vnni()


class PackedWeight:
    """Copies of a weight (out, in) laid out for CPU inference, each rebuilt whenever the weight changes.

    fp32: the weight transposed to (in, out), contiguous (`get_transposed`, see TRANSPOSED_FP32).
    bf16: oneDNN's prepacked copy (`get`): oneDNN picks a blocked memory layout for the weight once
    instead of on every call. Results agree with F.linear to float rounding (~1e-6 in fp32).

    `int8` (an engine of INT8_ENGINES, set by Transformer.quantize_int8) switches CPU inference to
    int8 weights: see `int8_linear`.
    """

    def __init__(self) -> None:
        self.stamp: tuple | None = None
        self.packed: Tensor | None = None
        self.int8: str | None = None
        self.int8_rows = False  # activations quantized per row instead of per call
        self.int8_stamp: tuple | None = None
        self.int8_packed = None  # torch.classes.quantized.LinearPackedParamsBase
        self.transposed_stamp: tuple | None = None
        self.transposed: Tensor | None = None

    def get(self, weight: Tensor) -> Tensor:
        stamp = _stamp(weight)
        if stamp != self.stamp:
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
            self.stamp = stamp
        return self.packed

    def get_transposed(self, weight: Tensor) -> Tensor:
        """Wᵀ (in, out), contiguous: what `linear` multiplies fp32 rows by (see TRANSPOSED_FP32)."""
        stamp = _stamp(weight)
        if stamp != self.transposed_stamp:
            self.transposed = weight.detach().t().contiguous()
            self.transposed_stamp = stamp
        return self.transposed

    def get_int8(self, weight: Tensor, bias: Tensor | None):
        """The weight quantized per output channel (symmetric int8) and prepacked with its fp32 bias."""
        stamp = (_stamp(weight), None if bias is None else _stamp(bias))
        if stamp != self.int8_stamp:
            bias = None if bias is None or self.int8_rows else bias.detach().float()  # per row: added after
            self.int8_packed = prepack_int8(weight.detach().float(), bias, self.int8)
            self.int8_stamp = stamp
        return self.int8_packed


def _stamp(weight: Tensor) -> tuple:
    version = 0 if weight.is_inference() else weight._version  # inference tensors are never updated in place
    return (weight.data_ptr(), version, weight.dtype, weight.shape)


def quantize_per_channel(weight: Tensor) -> tuple[Tensor, Tensor]:
    """W (out, in) → int8 W_q and per-row scales s with W ≈ s[:, None] · W_q (symmetric, zero point 0)."""
    scales = (weight.abs().amax(dim=1) / 127.0).clamp_min(torch.finfo(torch.float32).tiny)
    return torch.round(weight / scales[:, None]).clamp_(-127, 127).to(torch.int8), scales


def prepack_int8(weight: Tensor, bias: Tensor | None, engine: str):
    """W quantized per channel and laid out for `engine`'s int8 GEMM (fbgemm, oneDNN or x86)."""
    integers, scales = quantize_per_channel(weight)
    zero_points = torch.zeros(weight.size(0), dtype=torch.long)
    previous = torch.backends.quantized.engine
    torch.backends.quantized.engine = engine  # prepacking reads the global engine; linear_dynamic does not
    try:
        with warnings.catch_warnings():  # torch 2.13 announces the quantized tensor type's deprecation
            warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")
            quantized = torch._make_per_channel_quantized_tensor(integers, scales.double(), zero_points, 0)
        return torch.ops.quantized.linear_prepack(quantized, bias)
    finally:
        torch.backends.quantized.engine = previous


def int8_linear(x: Tensor, weight: Tensor, bias: Tensor | None, packed: PackedWeight) -> Tensor:
    """x Wᵀ + b with int8 weights and dynamically quantized int8 activations, fp32 in and out.

    torch's dynamic quantized linear: x is quantized to uint8 with one scale and zero point for
    the whole call (its min and max), multiplied with the per-channel int8 weight on the CPU's
    integer dot-product units (VNNI), and the int32 sums scaled back to fp32 with the bias added.
    REDUCE_RANGE keeps activations to 7 bits on CPUs without VNNI (pairs of u8·s8 products
    summed in int16, which 8 bits could saturate).

    With `packed.int8_rows` (the default) each row is first divided by its largest magnitude and
    its scale and the bias applied to the result: a row's quantization step is then at most 2/255
    of its own largest magnitude whatever else shares the batch (one outlier row no longer coarsens
    every other row), though not bit-identical across batches (the call's min and max still pick
    the zero point). Measured on the shipped en-zh model: 88-90% of translations identical to fp32
    per row against 84-86% per call, at about the same speed.
    """
    if not packed.int8_rows:
        return torch.ops.quantized.linear_dynamic(x, packed.get_int8(weight, bias), REDUCE_RANGE)
    # abs().amax(): torch's inf-norm reduction runs 5-10× slower here (67 µs for 64 rows of 256)
    scale = x.abs().amax(dim=-1, keepdim=True).clamp_min_(torch.finfo(x.dtype).tiny)  # (..., 1)
    out = torch.ops.quantized.linear_dynamic(x / scale, packed.get_int8(weight, bias), REDUCE_RANGE)  # (..., out)
    return out.mul_(scale) if bias is None else torch.addcmul(bias, out, scale)


def runs_int8(x: Tensor, weight: Tensor, packed: PackedWeight) -> bool:
    """Whether `linear` multiplies x by this weight in int8: int8 mode, CPU inference in fp32, a large enough matmul."""
    return (
        packed.int8 is not None
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and not torch.is_grad_enabled()
        and x.numel() * weight.size(0) >= INT8_MIN_MACS
    )


def linear(x: Tensor, weight: Tensor, bias: Tensor | None, packed: PackedWeight) -> Tensor:
    """x Wᵀ + b; through the prepacked weight when running inference on CPU, else F.linear.

    Weights in a lower precision than x (a bf16 model, see Transformer.cast_weights) multiply
    in their own dtype; the result comes back in x's dtype, so activations stay fp32.
    """
    if runs_int8(x, weight, packed):
        return int8_linear(x, weight, bias, packed)
    if x.dtype != weight.dtype and x.dtype == torch.float32 and not torch.is_autocast_enabled(x.device.type):
        return linear(x.to(weight.dtype), weight, bias, packed).to(x.dtype)
    cpu_inference = x.device.type == "cpu" and not torch.is_grad_enabled()
    if TRANSPOSED_FP32 and cpu_inference and x.dtype == torch.float32 and weight.dtype == torch.float32:
        transposed = packed.get_transposed(weight)  # (in, out)
        rows = x.reshape(-1, x.size(-1))
        out = torch.mm(rows, transposed) if bias is None else torch.addmm(bias, rows, transposed)
        return out.view(*x.shape[:-1], out.size(-1))
    if ONEDNN and cpu_inference and x.dtype in (torch.float32, torch.bfloat16):
        if x.dtype == torch.bfloat16 or x.numel() * weight.size(0) >= SMALL_MATMUL:
            return torch.ops.mkldnn._linear_pointwise(x, packed.get(weight), bias, "none", [], "")
    return F.linear(x, weight, bias)
