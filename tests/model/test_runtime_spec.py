"""The runtime's weight spec (model/weight_spec.py): every tensor the compiled step reads, by state-dict name and
shape, checked by the checkpoint loader and the runtime alike."""

from __future__ import annotations

import pytest
import torch

from model import weight_spec as spec
from model.checkpoint import load_model
from model.config import ModelConfig
from model.errors import CheckpointError
from model.loading import resolve_model_path
from model.transformer import Transformer


@pytest.mark.parametrize("name", ["en-zh", "zh-en"])
def test_the_spec_names_every_weight_of_the_shipped_models_at_its_shape(name):
    model = load_model(resolve_model_path(name))
    named = spec.check(model).tensors()
    tensors = spec.model_tensors(model)
    assert set(tensors) - set(named) <= {"shared.weight"}  # the tied table, read under its per-side names
    for tensor_name, shape in named.items():
        assert tuple(tensors[tensor_name].shape) == shape


def test_a_module_tree_the_runtime_cannot_read_fails_naming_the_tensor():
    config = ModelConfig(vocab_size=40, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                         decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
                         max_position_embeddings=32, pad_token_id=39, eos_token_id=0, decoder_start_token_id=39)
    model = Transformer(config)
    spec.check(model)
    model.decoder_layers[0].feed_forward.fc1 = torch.nn.Linear(16, 33)
    with pytest.raises(CheckpointError, match=r"decoder_layers\.0\.feed_forward\.fc1\.weight"):
        spec.check(model)


def test_fused_matmuls_stack_their_layers_in_the_runtimes_order():
    model = load_model(resolve_model_path("en-zh"))
    layer = spec.model_spec(model).decoder[0]
    assert [m.name.split(".")[1] for m in layer.matmuls] == list(spec.DECODER_MATMULS)
    weight, bias = spec.read_matmul(spec.model_tensors(model), layer.matmuls[0])  # q, k, v
    attention = model.decoder_layers[0].self_attn
    torch.testing.assert_close(weight, torch.cat([attention.q_proj.weight, attention.k_proj.weight,
                                                  attention.v_proj.weight]).detach(), rtol=0, atol=0)
    torch.testing.assert_close(bias, torch.cat([attention.q_proj.bias, attention.k_proj.bias,
                                                attention.v_proj.bias]).detach(), rtol=0, atol=0)
