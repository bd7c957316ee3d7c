"""Device → host copies of many tensors at once, for the search and the explanations alike."""

from __future__ import annotations

import torch
from torch import Tensor


def copy_to_host(tensors: list[Tensor | None]) -> tuple[list[Tensor | None], int]:
    """The CPU copies of `tensors` (None stays None), one transfer per dtype (one wait instead of one per tensor),
    and how many transfers that took."""
    out: list[Tensor | None] = list(tensors)
    by_dtype: dict[torch.dtype, list[int]] = {}
    for index, tensor in enumerate(tensors):
        if tensor is not None and tensor.device.type != "cpu":
            by_dtype.setdefault(tensor.dtype, []).append(index)
    for indices in by_dtype.values():
        flat = torch.cat([tensors[i].reshape(-1) for i in indices]).cpu()
        for i, part in zip(indices, flat.split([tensors[i].numel() for i in indices]), strict=True):
            out[i] = part.view(tensors[i].shape)
    return out, len(by_dtype)


def packed_to_host(tensors: list[Tensor | None], every: bool = False) -> tuple[list[Tensor | None], int]:
    """The CPU copies of `tensors` (None stays None) in one transfer whatever their dtypes, and how many transfers
    that took (0 or 1): every device tensor travels as float32 in one packed vector and is cast back on the host.
    Exact for floating values of at most float32's precision and for integers and flags below 2**24 (token ids,
    beam indices, back-references): what a decode loop's step brings back. every: pack tensors already on the CPU
    too (how the tests take this path without a device)."""
    out: list[Tensor | None] = list(tensors)
    moving = [i for i, tensor in enumerate(tensors) if tensor is not None and (every or tensor.device.type != "cpu")]
    if not moving:
        return out, 0
    flat = torch.cat([tensors[i].reshape(-1).to(torch.float32) for i in moving]).cpu()
    for i, part in zip(moving, flat.split([tensors[i].numel() for i in moving]), strict=True):
        out[i] = part.view(tensors[i].shape).to(tensors[i].dtype)
    return out, 1


def to_host(tensors: list[Tensor | None]) -> list[Tensor | None]:
    """`copy_to_host` without the count."""
    return copy_to_host(tensors)[0]


def matrices_to_lists(matrices: list[Tensor]) -> list[list[list[float]]]:
    """2-d tensors as nested Python lists of floats (float32 values), all in one read: packed into one padded
    tensor, one `.tolist()`, each cut back to its own shape. The work after a decode (alignments, trust) runs on
    these host arrays rather than a torch call per sentence."""
    if not matrices:
        return []
    rows = max(m.size(0) for m in matrices)
    columns = max(m.size(1) for m in matrices)
    packed = torch.zeros(len(matrices), rows, columns, dtype=torch.float32, device=matrices[0].device)
    for index, matrix in enumerate(matrices):  # packed where they lie: only the `.tolist()` reads the device
        packed[index, : matrix.size(0), : matrix.size(1)] = matrix.detach()
    nested = packed.tolist()
    return [[row[: m.size(1)] for row in nested[i][: m.size(0)]] for i, m in enumerate(matrices)]
