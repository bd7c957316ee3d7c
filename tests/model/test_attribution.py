"""Attributions are right, not only consistent: the gradient and value-zeroing methods equal inseq's on the
same weights (the oracle runs in its own environment, tests/oracles/), and ALTI+ equals a second, slow,
explicit implementation of the paper's equations over transformers' own forward pass."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest
import torch

from model import ATTRIBUTION_METHODS, InputTooLongError, InvalidInputError, Translator
from model.explanations.attribution import MAX_TOKENS
from tests.harness.tiny import CHINESE_CHARACTERS, DEVICE, make_model_dir

transformers = pytest.importorskip("transformers")

REPOSITORY = Path(__file__).resolve().parents[2]
ORACLE_PYTHON = REPOSITORY / ".oracle" / "venv" / "bin" / "python"
ORACLE_SCRIPT = REPOSITORY / "tests" / "oracles" / "inseq_attributions.py"
INSEQ_METHODS = ["saliency", "input_x_gradient", "integrated_gradients", "value_zeroing"]
ORACLE_STEPS = 8  # integrated gradients' steps on both sides
TOLERANCE = 1e-3  # the bar; the two agree to about 1e-6 here


def run_inseq(jobs: list[tuple[Path, list[dict]]]) -> list[list[dict]]:
    """inseq's results per (model directory, text pairs), from one run of the oracle."""
    if not ORACLE_PYTHON.exists():
        pytest.fail("the inseq oracle is not installed: run `bash tests/oracles/install.sh` (.ci/run does)")
    models = [{"model": str(directory), "pairs": pairs} for directory, pairs in jobs]
    request = {"models": models, "methods": INSEQ_METHODS, "steps": ORACLE_STEPS}
    finished = subprocess.run(
        [str(ORACLE_PYTHON), str(ORACLE_SCRIPT)],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    return json.loads(finished.stdout)


def shipped_pairs(name: str, sources: list[str]) -> tuple[Path, list[dict]]:
    """The shipped model's own translations of `sources`, as text pairs for the oracle."""
    translator = Translator.from_pretrained(name, device="cpu")
    texts = [t.text for t in translator.translate(sources, beam_size=4)]
    return REPOSITORY / "model" / "pretrained" / name, [{"source": s, "target": t} for s, t in zip(sources, texts)]


SHIPPED = {"en-zh": ["I would like a cup of tea, please."], "zh-en": ["我喜欢喝茶。"]}


@pytest.fixture(scope="module")
def inseq_results(shared_model_dir):
    """inseq's results for a random tiny model and both shipped ones, by name, beside their directories."""
    jobs = {
        "tiny": (
            shared_model_dir,
            [
                {"source": "the cat sat on the mat.", "target": CHINESE_CHARACTERS[:6] + "。"},
                {"source": "we like green tea today!", "target": CHINESE_CHARACTERS[20:31] + "！"},
            ],
        ),
        **{name: shipped_pairs(name, sources) for name, sources in SHIPPED.items()},
    }
    results = run_inseq(list(jobs.values()))
    return {name: (jobs[name][0], result) for name, result in zip(jobs, results)}


@pytest.fixture(scope="module", params=["tiny", *SHIPPED])
def inseq_case(request, inseq_results):
    """(our translator, inseq's results) for one model."""
    directory, results = inseq_results[request.param]
    return Translator.from_pretrained(directory, device=DEVICE), results


@pytest.mark.parametrize("method", INSEQ_METHODS)
def test_attributions_equal_inseq(inseq_case, method):
    translator, results = inseq_case
    for per_method in results:
        expected = per_method[method]
        ours = translator.attribute(
            expected["source_ids"],
            expected["target_ids"],
            method,
            steps=ORACLE_STEPS if method == "integrated_gradients" else None,
        )
        source, target = torch.tensor(expected["source"]), torch.tensor(expected["target"])
        assert ours.source.shape == source.shape and ours.target.shape == target.shape
        assert (ours.source - source).abs().max() < TOLERANCE
        assert (ours.target - target).abs().max() < TOLERANCE


# ---- ALTI+: a slow, explicit second implementation over transformers' forward ------------------------------


def _vector_l1(v: list[float]) -> float:
    return sum(abs(x) for x in v)


def _slow_block(weights, values_from, residual, attention, norm, self_attention):
    """ALTI contributions of one attention block, one output i and one input j at a time (float64 lists).

    weights[h][i][j]; values_from[j] and residual[i] vectors; attention a transformers MarianAttention;
    norm its LayerNorm. Follows Ferrando et al. (2022), eqs. for post-norm blocks.
    """
    heads = len(weights)
    d = len(residual[0])
    d_k = d // heads
    w_v, b_v = attention.v_proj.weight.double(), attention.v_proj.bias.double()
    w_o, b_o = attention.out_proj.weight.double(), attention.out_proj.bias.double()
    gamma, beta, eps = norm.weight.double(), norm.bias.double(), norm.eps
    contributions = []
    for i in range(len(residual)):
        parts = []  # T_i(x_j), then the residual
        for j in range(len(values_from)):
            part = torch.zeros(d, dtype=torch.float64)
            x_j = torch.tensor(values_from[j], dtype=torch.float64)
            for h in range(heads):
                rows = slice(h * d_k, (h + 1) * d_k)
                value = w_v[rows] @ x_j + b_v[rows]  # this head's value vector of token j
                part += weights[h][i][j] * (w_o[:, rows] @ value)
            if self_attention and j == i:
                part += torch.tensor(residual[i], dtype=torch.float64)
            parts.append(part)
        if not self_attention:
            parts.append(torch.tensor(residual[i], dtype=torch.float64))
        y = sum(parts) + b_o
        sigma = math.sqrt(float(((y - y.mean()) ** 2).mean()) + eps)
        transformed = [gamma * (p - p.mean()) / sigma for p in parts]
        output = sum(transformed) + gamma * (b_o - b_o.mean()) / sigma + beta
        direct = torch.nn.functional.layer_norm(y, (d,), gamma, beta, eps)
        assert torch.allclose(output, direct, atol=1e-9)  # the decomposition adds up to the block's output
        norm_1 = _vector_l1(output.tolist())
        closeness = [max(0.0, norm_1 - _vector_l1((output - t).tolist())) for t in transformed]
        total = sum(closeness)
        contributions.append([c / total for c in closeness])
    return contributions


def _matmul(a, b):
    return [[sum(a[i][k] * b[k][j] for k in range(len(b))) for j in range(len(b[0]))] for i in range(len(a))]


def _slow_alti_plus(reference, source_ids, target_ids):
    """ALTI+ over transformers' MarianMTModel: encoder rollout, then the decoder's layers (float64)."""
    reference = reference.double()
    decoder_input = [reference.config.decoder_start_token_id, *target_ids[:-1]]
    out = reference(
        input_ids=torch.tensor([source_ids]),
        decoder_input_ids=torch.tensor([decoder_input]),
        output_attentions=True,
        output_hidden_states=True,
        use_cache=False,
    )
    to_list = lambda t: t[0].tolist()  # noqa: E731
    rollout = None
    for layer, module in enumerate(reference.model.encoder.layers):
        x = to_list(out.encoder_hidden_states[layer])
        c = _slow_block(
            to_list(out.encoder_attentions[layer]), x, x, module.self_attn, module.self_attn_layer_norm, True
        )
        rollout = c if rollout is None else _matmul(c, rollout)
    encoder_out = to_list(out.encoder_last_hidden_state)
    source_length, length = len(source_ids), len(decoder_input)
    total = None
    for layer, module in enumerate(reference.model.decoder.layers):
        y = out.decoder_hidden_states[layer][0]
        self_weights = to_list(out.decoder_attentions[layer])
        self_c = _slow_block(self_weights, y.tolist(), y.tolist(), module.self_attn, module.self_attn_layer_norm, True)
        attended, _ = module.self_attn(hidden_states=y[None], attention_mask=_causal_mask(length))[:2]
        mixed = module.self_attn_layer_norm(y + attended[0])  # the cross-attention's queries and residual
        cross_c = _slow_block(
            to_list(out.cross_attentions[layer]),
            encoder_out,
            mixed.tolist(),
            module.encoder_attn,
            module.encoder_attn_layer_norm,
            False,
        )
        rows = []
        for i in range(length):
            from_source = [
                sum(cross_c[i][j] * rollout[j][k] for j in range(source_length)) for k in range(source_length)
            ]
            from_prefix = [cross_c[i][source_length] * self_c[i][j] for j in range(length)]
            if total is not None:
                from_source = [
                    from_source[k] + sum(from_prefix[j] * total[j][k] for j in range(length))
                    for k in range(source_length)
                ]
                from_prefix = [
                    sum(from_prefix[j] * total[j][source_length + k] for j in range(length)) for k in range(length)
                ]
            row = from_source + from_prefix
            norm = sum(row)
            rows.append([v / norm for v in row])
        total = rows
    return torch.tensor(total)[:, :source_length], torch.tensor(total)[:, source_length:]


def _causal_mask(length):
    mask = torch.full((length, length), torch.finfo(torch.float64).min, dtype=torch.float64).triu(1)
    return mask[None, None]


@pytest.mark.parametrize("seed,shared", [(5, True), (6, False)])
def test_alti_plus_equals_an_explicit_implementation_of_the_paper(tmp_path, seed, shared):
    directory = make_model_dir(tmp_path / "model", shared=shared, seed=seed)
    translator = Translator.from_pretrained(directory, device=DEVICE)
    reference = transformers.MarianMTModel.from_pretrained(directory, attn_implementation="eager").eval()
    source_ids = translator.encode_source(["the quick brown fox sat on the mat."])[0]
    target_ids = translator.generate([source_ids], beam_size=2, max_new_tokens=9)[0][0].token_ids
    ours = translator.attribute(source_ids, target_ids, "alti_plus")
    with torch.no_grad():
        source, target = _slow_alti_plus(reference, source_ids, target_ids)
    assert (ours.source - source).abs().max() < 1e-4
    assert (ours.target - target).abs().max() < 1e-4


# ---- properties every method keeps ---------------------------------------------------------------------------


@pytest.mark.parametrize("method", ATTRIBUTION_METHODS)
def test_rows_are_distributions_over_the_source_and_the_prefix(translator, method):
    source_ids = translator.encode_source(["we like green tea today!"])[0]
    target_ids = translator.generate([source_ids], beam_size=1, max_new_tokens=7)[0][0].token_ids
    result = translator.attribute(source_ids, target_ids, method)
    length = len(target_ids)
    assert result.source.shape == (length, len(source_ids)) and result.target.shape == (length, length)
    assert (result.source >= 0).all() and (result.target >= 0).all()
    torch.testing.assert_close(result.source.sum(-1) + result.target.sum(-1), torch.ones(length))
    assert (result.target.triu(1) == 0).all()  # nothing comes from a position after the token's own step
    torch.testing.assert_close(result.source_share, result.source.sum(-1))


def test_bad_requests_are_refused(translator):
    source_ids = translator.encode_source(["the cat."])[0]
    with pytest.raises(InvalidInputError, match="method must be one of"):
        translator.attribute(source_ids, [5, 0], "gradcam")
    with pytest.raises(InvalidInputError, match="steps"):
        translator.attribute(source_ids, [5, 0], "saliency", steps=8)
    with pytest.raises(InvalidInputError, match="steps"):
        translator.attribute(source_ids, [5, 0], "integrated_gradients", steps=10_000)
    with pytest.raises(InputTooLongError, match="at most"):
        translator.attribute([14] * (MAX_TOKENS // 2) + [0], [5] * (MAX_TOKENS // 2) + [0], "alti_plus")
    long_target = [5] * 40 + [0]  # 41 target tokens × 50 steps × 45 tokens: more work than one request may ask
    with pytest.raises(InputTooLongError, match="ask at most 21 steps"):
        translator.attribute(source_ids, long_target, "integrated_gradients")
    assert translator.attribute(source_ids, long_target, "integrated_gradients", steps=21).source.shape == (41, 4)
