"""CTranslate2 as an optional decoding backend: our checkpoint converted with `ctranslate2.specs`, searched by CT2.

`convert` writes one of our models as a CTranslate2 model directory (no transformers involved): the same
weights, the same sinusoidal positions, the decoder started from the start token's own embedding (as our
engine does) and our vocabulary, id for id. CT2 returns the attention averaged over the first
`alignment_heads` heads of `alignment_layer`, so the alignment layer's cross-attention heads are
permuted (Q, K and V rows, output-projection columns: the layer computes exactly the same function)
to put our alignment head first, with alignment_heads=1; a model without a declared head gets the layer's
head average (alignment_heads = every head).

`CTranslate2Decoder.generate` decodes with CT2's beam search and returns our `Hypothesis` objects:
the alignment head's rows from CT2's `return_attention`, per-token log-probabilities from CT2's
`score_batch` over the chosen tokens (one forced pass of the same CT2 model: the numbers that model
gives those tokens, not a search by-product). Explanations never come from here (Translator.exact_model).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import uuid
from pathlib import Path

import torch

from model.errors import CheckpointError, InvalidInputError
from model.options import DecodingOptions
from model.search import Hypothesis, length_budget
from model.tokenizer import EOS, UNK, MarianTokenizer
from model.transformer import MultiHeadAttention, Transformer, sinusoidal_positions

logger = logging.getLogger(__name__)

# CT2's compute types on the CPU (int8_float16 and the like need a GPU; see its documentation)
COMPUTE_TYPES = ("int8", "int8_float32", "int8_bfloat16", "int16", "float32", "bfloat16", "float16", "int8_float16")
# the weights each compute type is stored in on disk (CT2 converts at load time when they differ)
_QUANTIZATION = {"int8_float32": "int8", "int8_bfloat16": "int8", "int8_float16": "int8"}
CONVERTER_VERSION = 1  # bump when `convert` writes something different, so cached conversions are remade


def ctranslate2_available() -> bool:
    """Whether the ctranslate2 package can be imported (the `fast` extra)."""
    import importlib.util

    return importlib.util.find_spec("ctranslate2") is not None


def import_ctranslate2():
    """The ctranslate2 module, or a clear error naming the extra to install."""
    try:
        import ctranslate2
    except ImportError:
        raise InvalidInputError(
            "engine ctranslate2 needs the ctranslate2 package: pip install 'attention-translate[fast]' "
            "(or pip install 'ctranslate2>=4.3')"
        ) from None
    return ctranslate2


def _activation(name: str):
    from ctranslate2.specs import common_spec

    activations = {
        "swish": common_spec.Activation.SWISH,
        "silu": common_spec.Activation.SWISH,
        "relu": common_spec.Activation.RELU,
        "gelu": common_spec.Activation.GELU,
        "gelu_new": common_spec.Activation.GELUTanh,
        "gelu_fast": common_spec.Activation.GELUTanh,
        "gelu_pytorch_tanh": common_spec.Activation.GELUTanh,
    }
    return activations[name]


def _array(tensor: torch.Tensor):
    return tensor.detach().float().cpu().numpy().copy()  # a copy: CT2 quantizes its arrays in place


def _set_linear(spec, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    spec.weight = _array(weight)
    if bias is not None:
        spec.bias = _array(bias)


def _set_norm(spec, norm: torch.nn.LayerNorm) -> None:
    spec.gamma = _array(norm.weight)
    spec.beta = _array(norm.bias)


def head_order(heads: int, first: int) -> list[int]:
    """Head indices with `first` moved to the front, the others in their order."""
    return [first] + [h for h in range(heads) if h != first]


def permuted_heads(attention: MultiHeadAttention, order: list[int]) -> dict[str, torch.Tensor]:
    """The attention's projections with its heads reordered: head order[i] becomes head i.

    Q, K and V rows of a head and the output projection's columns that read it move together, so
    the module computes the same output; only the position of each head's weights changes.
    """
    d_k = attention.d_k
    rows = torch.cat([torch.arange(h * d_k, (h + 1) * d_k) for h in order])  # (d_model,)
    out = {}
    for name in ("q_proj", "k_proj", "v_proj"):
        projection = getattr(attention, name)
        out[f"{name}.weight"] = projection.weight.detach()[rows]
        out[f"{name}.bias"] = projection.bias.detach()[rows]
    out["out_proj.weight"] = attention.out_proj.weight.detach()[:, rows]
    out["out_proj.bias"] = attention.out_proj.bias.detach()
    return out


def _set_attention(spec, attention: MultiHeadAttention, self_attention: bool, order: list[int] | None = None) -> None:
    weights = permuted_heads(attention, order or list(range(attention.heads)))
    q, k, v = (weights[f"{n}_proj.weight"] for n in "qkv")
    qb, kb, vb = (weights[f"{n}_proj.bias"] for n in "qkv")
    if self_attention:
        _set_linear(spec.linear[0], torch.cat([q, k, v]), torch.cat([qb, kb, vb]))
    else:
        _set_linear(spec.linear[0], q, qb)
        _set_linear(spec.linear[1], torch.cat([k, v]), torch.cat([kb, vb]))
    _set_linear(spec.linear[-1], weights["out_proj.weight"], weights["out_proj.bias"])


def _vocabulary(pieces: dict[int, str], size: int) -> list[str]:
    """Pieces in id order, `size` of them; ids vocab.json leaves out get a placeholder (never produced)."""
    return [pieces.get(i, f"<unused{i}>") for i in range(size)]


def model_spec(model: Transformer, tokenizer: MarianTokenizer, alignment: tuple[int, int | None]):
    """The TransformerSpec of our model: every weight mapped by name, the alignment head first in its layer."""
    from ctranslate2.specs import transformer_spec

    config = model.config
    layer, head = alignment
    activation = _activation(config.activation_function)
    encoder = transformer_spec.TransformerEncoderSpec(
        config.encoder_layers, config.encoder_attention_heads, pre_norm=False, activation=activation
    )
    decoder = transformer_spec.TransformerDecoderSpec(
        config.decoder_layers,
        config.decoder_attention_heads,
        pre_norm=False,
        activation=activation,
        alignment_layer=layer,
        alignment_heads=1 if head is not None else config.decoder_attention_heads,
    )
    positions = _array(sinusoidal_positions(config.max_position_embeddings, config.d_model))
    for side, spec, table in ((0, encoder, model.encoder_embed_tokens), (1, decoder, model.decoder_embed_tokens)):
        spec.scale_embeddings = model.embed_scale
        spec.position_encodings.encodings = positions
        (spec.embeddings[0] if side == 0 else spec.embeddings).weight = _array(table.weight)
    for spec, ours in zip(encoder.layer, model.encoder_layers, strict=True):
        _set_attention(spec.self_attention, ours.self_attn, self_attention=True)
        _set_norm(spec.self_attention.layer_norm, ours.self_attn_layer_norm)
        _set_linear(spec.ffn.linear_0, ours.feed_forward.fc1.weight, ours.feed_forward.fc1.bias)
        _set_linear(spec.ffn.linear_1, ours.feed_forward.fc2.weight, ours.feed_forward.fc2.bias)
        _set_norm(spec.ffn.layer_norm, ours.final_layer_norm)
    for index, (spec, ours) in enumerate(zip(decoder.layer, model.decoder_layers, strict=True)):
        order = head_order(ours.encoder_attn.heads, head) if index == layer and head is not None else None
        _set_attention(spec.self_attention, ours.self_attn, self_attention=True)
        _set_norm(spec.self_attention.layer_norm, ours.self_attn_layer_norm)
        _set_attention(spec.attention, ours.encoder_attn, self_attention=False, order=order)
        _set_norm(spec.attention.layer_norm, ours.encoder_attn_layer_norm)
        _set_linear(spec.ffn.linear_0, ours.feed_forward.fc1.weight, ours.feed_forward.fc1.bias)
        _set_linear(spec.ffn.linear_1, ours.feed_forward.fc2.weight, ours.feed_forward.fc2.bias)
        _set_norm(spec.ffn.layer_norm, ours.final_layer_norm)
    _set_linear(decoder.projection, model.output_weight, model.final_logits_bias)
    decoder.start_from_zero_embedding = False  # our decoder starts from decoder_start_token_id's embedding

    spec = transformer_spec.TransformerSpec(encoder, decoder)
    spec.register_source_vocabulary(_vocabulary(tokenizer.source_pieces, config.vocab_size))
    spec.register_target_vocabulary(_vocabulary(tokenizer.target_pieces, config.target_vocab_size))
    spec.config.unk_token = UNK
    spec.config.eos_token = EOS
    spec.config.bos_token = EOS  # never used: sources come with their </s>, no <s> is added
    spec.config.decoder_start_token = _vocabulary(tokenizer.target_pieces, config.target_vocab_size)[
        config.decoder_start_token_id
    ]
    spec.config.add_source_bos = False
    spec.config.add_source_eos = False  # our source ids already end in </s> (MarianTokenizer.encode_source)
    return spec


def conversion_key(
    weights_digest: str, model: Transformer, tokenizer: MarianTokenizer, alignment, quantization: str | None
) -> str:
    """What a conversion depends on: the weights, config.json, the vocabularies, the alignment head, the weight type."""
    text = json.dumps(
        [
            CONVERTER_VERSION,
            weights_digest,
            model.config.to_marian_dict(),
            tokenizer.source_vocab,
            tokenizer.target_vocab,
            list(alignment),
            quantization,
        ],
        sort_keys=True,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def convert(
    model: Transformer,
    tokenizer: MarianTokenizer,
    output: str | Path,
    alignment: tuple[int, int | None],
    quantization: str | None = None,
) -> Path:
    """Write `model` as a CTranslate2 model directory at `output` (weights stored in `quantization`, None: fp32)."""
    spec = model_spec(model, tokenizer, alignment)
    spec.validate()
    spec.optimize(quantization=quantization)
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    spec.save(str(output))
    return output


def cached_conversion(
    model: Transformer,
    tokenizer: MarianTokenizer,
    cache_dir: Path,
    weights_digest: str,
    alignment: tuple[int, int | None],
    compute_type: str,
) -> Path:
    """The conversion for these weights, alignment head and compute type under `cache_dir`, made once.

    Written to a temporary name and renamed, so replicas converting at once never read a half-written model.
    """
    quantization = _QUANTIZATION.get(compute_type, compute_type)
    key = conversion_key(weights_digest, model, tokenizer, alignment, quantization)
    target = cache_dir / f"{weights_digest}-{key}"
    private_directory(cache_dir)
    if (target / "model.bin").is_file():
        return target
    staging = cache_dir / f".{target.name}.{os.getpid()}.{uuid.uuid4().hex}.partial"
    convert(model, tokenizer, staging, alignment, quantization)
    try:
        staging.rename(target)
    except OSError:  # another process renamed its copy first
        shutil.rmtree(staging, ignore_errors=True)
    logger.info("converted the model for CTranslate2 (%s) into %s", compute_type, target)
    return target


def private_directory(path: Path) -> None:
    """Make `path` (mode 0700), or check that an existing one belongs to this user and that nobody else may
    write in it: a conversion found there is served as the model, so no other user may have put it there
    (the default cache lives under the shared temporary directory)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    status = path.stat()
    owner = os.getuid() if hasattr(os, "getuid") else status.st_uid
    if status.st_uid != owner or status.st_mode & 0o022:
        raise CheckpointError(
            f"{path}: the CTranslate2 cache directory must belong to this user and be writable by it alone "
            f"(owner uid {status.st_uid}, mode {status.st_mode & 0o777:o}); set cache_dir to a private directory"
        )


class CTranslate2Decoder:
    """Beam search by CTranslate2 over a converted model, answering in our `Hypothesis` terms."""

    def __init__(
        self,
        directory: Path,
        tokenizer: MarianTokenizer,
        model_config,
        compute_type: str,
        threads: int,
        first_row_used: bool = True,
    ) -> None:
        ctranslate2 = import_ctranslate2()
        if compute_type not in COMPUTE_TYPES:
            raise InvalidInputError(f"compute_type must be one of {', '.join(COMPUTE_TYPES)}")
        self.translator = ctranslate2.Translator(
            str(directory), device="cpu", compute_type=compute_type, intra_threads=threads, inter_threads=1
        )
        self.compute_type = compute_type
        self.tokenizer = tokenizer
        self.config = model_config
        self.target_ids = {piece: i for i, piece in tokenizer.target_pieces.items()}
        self.pad_piece = tokenizer.target_pieces.get(model_config.pad_token_id)
        # whether alignments read the first step's row (False when the model reads them shifted: row t + 1)
        self.first_row_used = first_row_used

    def generate(self, source_ids: list[list[int]], options: DecodingOptions) -> list[list[Hypothesis]]:
        """Each source's n_best hypotheses, best first, with the alignment head's rows and token log-probs.

        The length budget is ours (2 × source + 10 unless max_new_tokens): CT2 decodes up to the batch's
        largest budget less the closing </s>; an output that reaches its own budget is cut there and closed
        with </s> at log-probability 0, as our search forces it.
        """
        config = self.config
        sources = [self.tokenizer.source_tokens(ids) for ids in source_ids]
        budgets = [length_budget(len(ids), options, config.max_position_embeddings) for ids in source_ids]
        results = self.translator.translate_batch(
            sources,
            beam_size=options.beam_size,
            num_hypotheses=options.n_best,
            length_penalty=options.length_penalty,
            min_decoding_length=options.min_new_tokens,
            max_decoding_length=max(budgets),
            return_end_token=True,
            return_attention=True,
            return_scores=True,
            suppress_sequences=[[self.pad_piece]] if self.pad_piece else None,
            max_batch_size=len(sources),
        )
        attentions = [[list(rows) for rows in result.attention] for result in results]  # copies we may edit
        if options.beam_size > 1 and len(sources) > 1 and self.first_row_used:
            # CTranslate2 4.x's beam search returns, for every input of a batch, the first step's attention
            # row of the batch's longest input (later rows are right); one greedy step gives each its own. A model
            # whose alignments are read shifted never reads that row (first_row_used False): it is left as is.
            first = self.translator.translate_batch(
                sources, beam_size=1, max_decoding_length=1, return_attention=True, max_batch_size=len(sources)
            )
            for hypotheses, own in zip(attentions, first, strict=True):
                for rows in hypotheses:
                    if rows:
                        rows[0] = own.attention[0][0]
        chosen: list[tuple[int, list[int], list[list[float]], float, bool]] = []
        for index, (result, budget) in enumerate(zip(results, budgets, strict=True)):
            hypotheses = zip(result.hypotheses, attentions[index], result.scores, strict=True)
            for pieces, attention, normalized in hypotheses:
                ids = [self.target_ids.get(p, self.tokenizer.target_unk_id) for p in pieces]
                forced = not ids or ids[-1] != config.eos_token_id or len(ids) >= budget
                if forced:  # the step that predicts token budget - 1 is the one our search forces to </s>
                    ids, attention = ids[: budget - 1], attention[:budget]
                chosen.append((index, ids, attention, normalized, forced))
        scored = (
            self.translator.score_batch(
                [sources[index] for index, *_ in chosen],
                # without the final </s>: CT2 appends it and scores it
                [self.tokenizer.target_tokens(ids if forced else ids[:-1]) for _, ids, _, _, forced in chosen],
                max_batch_size=len(chosen),
            )
            if chosen
            else []
        )
        out: list[list[Hypothesis]] = [[] for _ in source_ids]
        for (index, ids, attention, normalized, forced), score in zip(chosen, scored, strict=True):
            logprobs = list(score.log_probs)
            if forced:  # the budget's closing </s>: our search gives it log-probability 0
                ids, logprobs = [*ids, config.eos_token_id], [*logprobs[:-1], 0.0]
                if len(attention) < len(ids):  # CT2 stopped at the batch's budget: no row for the closing step
                    attention = [*attention, attention[-1] if attention else [0.0] * len(source_ids[index])]
            rows = torch.tensor(attention, dtype=torch.float32).reshape(len(ids), -1)[:, : len(source_ids[index])]
            out[index].append(
                Hypothesis(
                    token_ids=ids,
                    score=float(sum(logprobs)),
                    token_logprobs=logprobs,
                    cross_attention=None,
                    normalized_score=float(normalized),
                    alignment_attention=rows,
                )
            )
        return out
