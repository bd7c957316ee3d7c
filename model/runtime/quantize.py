"""int8 weights for the compiled step: symmetric per-output-channel quantization of the fp32 weights read from
safetensors (nothing quantized is ever read from disk), and whether activations may use all 8 bits here."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor


def has_vnni() -> bool:
    """Whether the CPU multiplies u8·s8 pairs into int32 directly (AVX-512 VNNI), so 8-bit activations cannot
    saturate fbgemm's int16 intermediate sums as they can on plain AVX2/AVX-512."""
    try:
        flags = Path("/proc/cpuinfo").read_text(encoding="ascii", errors="ignore")
    except OSError:
        return False
    return " avx512_vnni" in flags


# 7-bit activations (torch's default for fbgemm) where 8 bits could saturate; 8 bits on VNNI.
REDUCE_RANGE = not has_vnni()


def quantize_per_channel(weight: Tensor) -> tuple[Tensor, Tensor]:
    """W (out, in) → int8 W_q and per-row scales s with W ≈ s[:, None] · W_q (symmetric, zero point 0)."""
    scales = (weight.abs().amax(dim=1) / 127.0).clamp_min(torch.finfo(torch.float32).tiny)
    return torch.round(weight / scales[:, None]).clamp_(-127, 127).to(torch.int8), scales
