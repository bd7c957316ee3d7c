"""int8 weights for the compiled step: symmetric per-output-channel quantization of the fp32 weights read from
safetensors (nothing quantized is ever read from disk). Whether activations may use all 8 bits is the compiled
step's one CPU probe (`step.reduce_range`)."""

from __future__ import annotations

import torch
from torch import Tensor


def quantize_per_channel(weight: Tensor) -> tuple[Tensor, Tensor]:
    """W (out, in) → int8 W_q and per-row scales s with W ≈ s[:, None] · W_q (symmetric, zero point 0)."""
    scales = (weight.abs().amax(dim=1) / 127.0).clamp_min(torch.finfo(torch.float32).tiny)
    return torch.round(weight / scales[:, None]).clamp_(-127, 127).to(torch.int8), scales
