"""Loading refuses what it cannot serve faithfully, and names the problem."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from model import CheckpointError, Translator
from model.checkpoint import load_model, save_model


@pytest.fixture
def model_copy(model_dir, tmp_path):
    """A copy of the shared tiny model that a test may break."""
    return Path(shutil.copytree(model_dir, tmp_path / "tiny"))


def _edit_weights(directory, edit):
    tensors = load_file(str(directory / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(directory / "model.safetensors"))


def _edit_config(directory, **changes):
    config = json.loads((directory / "config.json").read_text())
    config.update(changes)
    (directory / "config.json").write_text(json.dumps(config))


def test_round_trip_preserves_every_tensor(model_copy, tmp_path):
    model = load_model(model_copy)
    save_model(model, tmp_path / "copy")
    again = load_model(tmp_path / "copy")
    for (name, a), (name_again, b) in zip(model.state_dict().items(), again.state_dict().items(), strict=True):
        assert name == name_again
        assert a.dtype == b.dtype and torch.equal(a, b), name


def test_half_precision_file_loads_in_the_requested_dtype(model_copy, tmp_path):
    save_model(load_model(model_copy), tmp_path / "half", dtype=torch.float16)
    assert all(t.dtype == torch.float16 for t in load_file(str(tmp_path / "half" / "model.safetensors")).values())
    assert load_model(tmp_path / "half").final_logits_bias.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in load_model(tmp_path / "half").parameters())


def test_missing_weights_file_is_named(model_copy):
    (model_copy / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model.safetensors is missing"):
        load_model(model_copy)


def test_pickle_checkpoint_is_refused_with_conversion_advice(model_copy):
    (model_copy / "model.safetensors").rename(model_copy / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="pickle.*save_pretrained"):
        load_model(model_copy)


def test_corrupt_weights_file_is_an_error(model_copy):
    (model_copy / "model.safetensors").write_bytes(b"\x00\x01not a safetensors file")
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        load_model(model_copy)


def test_missing_tensor_is_named(model_copy):
    _edit_weights(model_copy, lambda t: t.pop("model.decoder.layers.1.fc2.weight"))
    with pytest.raises(CheckpointError, match=r"model\.decoder\.layers\.1\.fc2\.weight is missing"):
        load_model(model_copy)


def test_unexpected_tensor_is_named(model_copy):
    _edit_weights(model_copy, lambda t: t.__setitem__("model.encoder.layers.9.extra", torch.zeros(2)))
    with pytest.raises(CheckpointError, match=r"unexpected tensors model\.encoder\.layers\.9\.extra"):
        load_model(model_copy)


def test_misshapen_tensor_is_named(model_copy):
    _edit_weights(model_copy, lambda t: t.__setitem__("model.encoder.layers.0.fc1.weight", torch.zeros(3, 3)))
    with pytest.raises(CheckpointError, match=r"model\.encoder\.layers\.0\.fc1\.weight has shape \(3, 3\)"):
        load_model(model_copy)


def test_config_that_disagrees_with_the_weights_is_an_error(model_copy):
    _edit_config(model_copy, encoder_ffn_dim=128)
    with pytest.raises(CheckpointError, match="fc1.weight has shape"):
        load_model(model_copy)


@pytest.mark.parametrize(
    "field, value",
    [
        ("normalize_before", True),
        ("layernorm_embedding", True),
        ("activation_function", "tanh"),
        ("model_type", "bart"),
    ],
)
def test_unsupported_architecture_is_refused_by_field_name(model_copy, field, value):
    _edit_config(model_copy, **{field: value})
    with pytest.raises(CheckpointError, match=field):
        load_model(model_copy)


def test_missing_tokenizer_file_is_named(model_copy):
    (model_copy / "target.spm").unlink()
    with pytest.raises(CheckpointError, match="target.spm is missing"):
        Translator.from_pretrained(model_copy, device="cpu")


def test_missing_directory_is_an_error(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_model(tmp_path / "nowhere")
