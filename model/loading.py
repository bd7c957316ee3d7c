"""Where a Translator comes from: a shipped model's name or a Marian directory, a device and a dtype made into the
parts Translator is built of (the decoding model, its step, the exact model explanations compute with, the tokenizer,
the model card and the trust calibration). Translator.from_pretrained delegates here.
"""

from __future__ import annotations

import copy
import hashlib
import logging
from pathlib import Path
from typing import Any

import torch

from model.calibration import Calibration
from model.checkpoint import WEIGHTS_NAME, load_model, read_model_card
from model.errors import InvalidInputError, UnknownModelError
from model.runtime import cast_weights, load_step
from model.tokenizer import MarianTokenizer

logger = logging.getLogger(__name__)

PRETRAINED_DIR = Path(__file__).resolve().parent / "pretrained"
DTYPE_NAMES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "int8": torch.int8}


def pretrained_names() -> list[str]:
    """Names of the models shipped in model/pretrained/."""
    if not PRETRAINED_DIR.is_dir():
        return []
    return sorted(p.name for p in PRETRAINED_DIR.iterdir() if (p / "config.json").is_file())


def resolve_model_path(name_or_path: str | Path) -> Path:
    """A shipped model's name ("en-zh") or a directory path → the directory."""
    candidate = Path(name_or_path)
    if candidate.is_dir():
        return candidate
    if isinstance(name_or_path, str) and "/" not in name_or_path and (PRETRAINED_DIR / name_or_path).is_dir():
        return PRETRAINED_DIR / name_or_path
    raise UnknownModelError(
        f"no model directory at {str(name_or_path)!r}; shipped models: {', '.join(pretrained_names()) or 'none'}"
    )


def resolved_dtype(dtype, device: torch.device):
    """`dtype` with "auto" made the fast mode measured for `device`: int8 on a CPU (the compiled runtime's; where
    it cannot be built int8 decodes in float32, and runtime_info says so), float32 on a GPU (there the shipped
    models are launch-bound, and half precision was no faster: docs/decisions.md)."""
    if dtype == "auto":
        return "int8" if device.type == "cpu" else "float32"
    return dtype


def pick_device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def translator_parts(
    name_or_path: str | Path, device: str | torch.device | None, dtype: torch.dtype | str | None
) -> dict[str, Any]:
    """Translator's constructor arguments for a model directory (or shipped name) on `device` in `dtype`
    (Translator.from_pretrained says what each dtype means)."""
    directory = resolve_model_path(name_or_path)
    target = pick_device(device)
    dtype = resolved_dtype(dtype, target)
    if isinstance(dtype, str):
        if dtype not in DTYPE_NAMES:
            raise InvalidInputError(f"dtype must be one of {', '.join(DTYPE_NAMES)} or auto")
        dtype = DTYPE_NAMES[dtype]
    dtype = dtype or torch.float32
    step = exact_model = None
    if dtype == torch.int8:
        if target.type != "cpu":
            raise InvalidInputError("dtype int8 runs on the CPU only; use bfloat16 or float16 on a GPU")
        model = load_model(directory)
        step = load_step(model, "int8")
    elif target.type == "cuda" and dtype != torch.float32:
        # A GPU runs half precision natively (weights, activations and cache in dtype; log-softmax in
        # fp32): the CPU's mode (bf16 matrices around fp32 activations, model.runtime.cast_weights)
        # would add a cast around every matmul there.
        model = load_model(directory).to(target).to(dtype)
    else:
        model = load_model(directory).to(target)
        if dtype != torch.float32:  # the CPU's mode: the eager step decodes on a copy with matrices in dtype,
            exact_model = model  # explanations' arithmetic (steps, attributions) stays in float32, as under int8
            model = cast_weights(copy.deepcopy(model), dtype)
    tokenizer = MarianTokenizer.from_directory(directory)
    if tokenizer.eos_id != model.config.eos_token_id:
        logger.warning(
            "vocab.json's </s> id %d differs from config eos_token_id %d", tokenizer.eos_id, model.config.eos_token_id
        )
    digest = hashlib.sha256((directory / WEIGHTS_NAME).read_bytes()).hexdigest()[:16]
    return {
        "model": model,
        "tokenizer": tokenizer,
        "name": directory.name,
        "weights_digest": digest,
        "exact_model": exact_model,
        "step": step,
        "model_card": read_model_card(directory),
        "calibration": Calibration.load(directory, digest),
    }
