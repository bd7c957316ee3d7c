"""The Translator API and CLI as a user meets them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from model import InputTooLongError, InvalidInputError, Translator, UnknownModelError
from model.agreeing import word_links
from model.decoding.search import forced_pass
from model.explanations.alignment import alignment_matrix, attention_links
from model.explanations.explain import forced_decode
from model.tokenizer import is_special_piece, word_groups
from tests.harness.tiny import DEVICE, make_model_dir, synthetic_corpus

ALIGNMENT_SENTENCES = [english for english, _ in synthetic_corpus(count=8, seed=11)]


def test_translation_carries_tokens_scores_alignment(translator):
    result = translator.translate(["The cat sat on the mat."], beam_size=2)[0]
    assert isinstance(result.text, str)
    assert result.source_tokens[-1] == "</s>"
    assert len(result.token_logprobs) == len(result.target_tokens) == len(result.target_ids)
    assert [t for _, t in result.alignment] == list(range(len(result.target_tokens)))
    assert all(0 <= s < len(result.source_tokens) for s, _ in result.alignment)
    assert result.cross_attention is None  # only when asked for


def oracle_cross_attention(directory, translations) -> list[torch.Tensor]:
    """transformers' MarianMTModel on the same directory, teacher-forced on each translation's output:
    its cross-attention maps, (decoder_layers, heads, T, S) per translation."""
    transformers = pytest.importorskip("transformers")
    reference = transformers.MarianMTModel.from_pretrained(directory, attn_implementation="eager").eval()
    maps = []
    for translation in translations:
        decoder_input = [reference.config.decoder_start_token_id, *translation.target_ids[:-1]]
        with torch.no_grad():
            output = reference(
                input_ids=torch.tensor([translation.source_ids]),
                decoder_input_ids=torch.tensor([decoder_input]),
                output_attentions=True,
            )
        maps.append(torch.stack([layer[0] for layer in output.cross_attentions]))
    return maps


def most_attended(attention: torch.Tensor) -> list[tuple[int, int]]:
    """(source, target) links: for each target token (row of a (T, S) map), the source token it weighs
    most among all but the source's final </s>."""
    return [(source, target) for target, source in enumerate(attention[:, :-1].argmax(dim=-1).tolist())]


def test_without_a_declaration_the_alignment_is_marians_guided_alignment_head(model_dir, translator):
    """No declaration, no model card: the last decoder layer's head 0 at the predicting step, the head Marian's
    guided alignment trains (transformers' maps as the oracle)."""
    assert translator.alignment.reason == "marian default"
    translations = translator.translate(ALIGNMENT_SENTENCES, beam_size=1)
    maps = oracle_cross_attention(model_dir, translations)
    last = translator.config.decoder_layers - 1
    assert translator.alignment_head == (last, 0) and not translator.alignment_shift
    for translation, attention in zip(translations, maps, strict=True):
        assert translation.alignment == most_attended(attention[last, 0])
        assert all(source < len(translation.source_ids) - 1 for source, _ in translation.alignment)
    # the sentences tell the readings apart: the penultimate layer's head average, another head
    assert any(most_attended(a[last, 0]) != most_attended(a[last - 1].mean(0)) for a in maps)
    assert any(most_attended(a[last, 0]) != most_attended(a[last, 1]) for a in maps)


@pytest.mark.parametrize(
    ("card", "reason"),
    [
        ("# opus-mt\n\n* model: transformer-align\n", "marian guided alignment (model card)"),
        ("* dataset: opus\n* model: transformer\n", "fallback"),
    ],
)
def test_a_model_card_says_whether_marians_head_was_trained(tmp_path, card, reason):
    """OPUS-MT's model cards name the recipe: `-align` trained head 0 of the last layer; plain `transformer`
    trained no head to align, so the penultimate layer's head average is the documented fallback."""
    directory = make_model_dir(tmp_path / "card", shared=False, seed=6, model_card=card)
    translator = Translator.from_pretrained(directory, device=DEVICE)
    assert translator.alignment.reason == reason
    translations = translator.translate(ALIGNMENT_SENTENCES, beam_size=1)
    maps = oracle_cross_attention(directory, translations)
    last = translator.config.decoder_layers - 1
    for translation, attention in zip(translations, maps, strict=True):
        row = attention[last, 0] if reason != "fallback" else attention[last - 1].mean(0)
        assert translation.alignment == most_attended(row)
        assert attention_links(alignment_matrix(attention, *translator.alignment_head)) == translation.alignment


def test_a_declaration_in_config_json_wins_over_the_model_card(tmp_path):
    card = "* model: transformer\n"
    directory = make_model_dir(tmp_path, shared=True, seed=7, alignment_layer=1, alignment_head=2, model_card=card)
    translator = Translator.from_pretrained(directory, device=DEVICE)
    assert translator.alignment_head == (1, 2) and translator.alignment.reason == "declared"


def test_a_declared_alignment_head_is_read_alone(tmp_path_factory):
    directory = make_model_dir(
        tmp_path_factory.mktemp("alignment-head"), shared=True, seed=7, alignment_layer=1, alignment_head=2
    )
    translator = Translator.from_pretrained(directory, device=DEVICE)
    translations = translator.translate(ALIGNMENT_SENTENCES, beam_size=1)
    maps = oracle_cross_attention(directory, translations)
    for translation, attention in zip(translations, maps, strict=True):
        assert translation.alignment == most_attended(attention[1, 2])
        assert attention_links(alignment_matrix(attention, 1, 2)) == translation.alignment
    # the sentences tell the wrong readings apart: the layer's head average, another layer's head
    assert any(most_attended(a[1, 2]) != most_attended(a[1].mean(0)) for a in maps)
    assert any(most_attended(a[1, 2]) != most_attended(a[0, 2]) for a in maps)


def test_word_alignment_covers_every_target_word(translator):
    result = translator.translate(["The quick brown fox jumps over the lazy dog."], beam_size=1)[0]
    assert [t for _, t in result.word_alignment] == list(range(len(result.target_words)))
    assert all(0 <= s < len(result.source_words) for s, _ in result.word_alignment)
    assert "quick" in result.source_words


def test_word_links_are_the_per_word_arithmetic_they_name():
    """Each target word goes to the source word (never </s>) with most mass of the word's mean attention row:
    word by word, as the definition reads, on random maps over real pieces."""
    rng = torch.Generator().manual_seed(3)
    source = ["▁The", "▁qu", "ick", "▁brown", "▁fox", ".", "</s>"]
    target = ["▁我", "喜欢", "猫", "▁a", "b", "。", "</s>"]
    for _ in range(200):
        matrix = torch.rand(len(target), len(source), generator=rng).softmax(dim=-1)
        groups = word_groups(source)
        candidates = [w for w, pieces in enumerate(groups) if not is_special_piece(source[pieces[0]])]
        expected = []
        for target_word, pieces in enumerate(word_groups(target)):
            row = matrix[pieces].mean(dim=0)
            masses = [float(row[groups[w]].sum()) for w in candidates]
            expected.append((candidates[masses.index(max(masses))], target_word))
        assert word_links(matrix, source, target)[0] == expected


def test_word_groups_merge_pieces_and_split_chinese():
    assert word_groups(["▁The", "▁qu", "ick", "▁fox", ".", "</s>"]) == [[0], [1, 2], [3, 4], [5]]
    assert word_groups(["▁我", "喜欢", "猫", "。", "</s>"]) == [[0], [1], [2], [3], [4]]


# Pieces as the shipped en-zh writes them (a lone "▁", sentencepiece's dummy prefix, before a piece without one),
# and the words they make.
LONE_SPACE_CASES = [
    (["▁", "我", "喜欢", "猫", "。", "</s>"], [[0, 1], [2], [3], [4], [5]]),
    (["▁The", "▁", "5", "▁cats", "</s>"], [[0], [1, 2], [3], [4]]),
    (["▁我", "喜欢", "▁", "</s>"], [[0], [1, 2], [3]]),
    (["▁", "▁", "ab", "c", "</s>"], [[0, 1, 2, 3], [4]]),
    (["▁", "</s>"], [[0], [1]]),
]


@pytest.mark.parametrize(("pieces", "groups"), LONE_SPACE_CASES)
def test_a_lone_word_boundary_belongs_to_the_word_that_follows(pieces, groups):
    assert word_groups(pieces) == groups


def test_a_lone_word_boundary_adds_nothing_to_its_words_attention():
    """The "▁" row of "▁ 我" says nothing of what 我 attends to: the word's row is 我's alone."""
    source = ["▁I", "▁like", "▁cats", ".", "</s>"]
    target = ["▁", "我", "喜欢", "猫", "。", "</s>"]
    matrix = torch.full((len(target), len(source)), 0.01)
    matrix[0, 2] = 0.96  # the lone ▁ looks at "cats" ...
    matrix[1, 0] = 0.6  # ... 我 at "I"
    pairs, _, target_words = word_links(matrix, source, target)
    assert target_words[0] == "我" and pairs[0] == (0, 0)


def test_n_best_alternatives_are_returned(translator):
    result = translator.translate(["I love my family."], beam_size=4, num_return_sequences=3)[0]
    assert len(result.alternatives) == 2


def test_bad_input_is_refused_clearly(translator):
    with pytest.raises(InvalidInputError):
        translator.translate("not a list")
    with pytest.raises(InvalidInputError):
        translator.translate([3])
    with pytest.raises(InvalidInputError, match="num_return_sequences"):
        translator.translate(["Hi"], beam_size=2, num_return_sequences=3)
    with pytest.raises(InputTooLongError):
        translator.translate(["word " * 400])


def test_unknown_model_lists_what_is_available():
    with pytest.raises(UnknownModelError, match="shipped models"):
        Translator.from_pretrained("xx-yy")


def test_dtype_and_device_are_honoured(model_dir, translator):
    fast = Translator.from_pretrained(model_dir, device="cpu", dtype=torch.bfloat16)
    matrices = [p for p in fast.model.parameters() if p.dim() == 2]  # linear layers and embeddings
    assert matrices and all(p.dtype == torch.bfloat16 for p in matrices)
    assert all(p.dtype == torch.float32 for p in translator.model.parameters())
    tensors = [*fast.model.parameters(), *fast.model.buffers()]
    assert all(t.device.type == "cpu" for t in tensors)
    # the same model, computed in bf16: the float32 translation's log-probabilities, rounded but close
    translation = translator.translate(["The cat sat on the mat."], beam_size=1)[0]
    exact = forced_decode(translator.model, translation.source_ids, translation.target_ids).token_logprobs
    rounded = forced_pass(fast.step, translation.source_ids, translation.target_ids).token_logprobs
    assert rounded != exact
    assert rounded == pytest.approx(exact, abs=0.05)
    assert fast.translate(["The cat."], beam_size=1)[0].target_tokens
    # the lecture's arithmetic (steps, attributions) runs on the float32 original, as under int8
    assert fast.precision == "bfloat16" and fast.steps_precision == "float32"
    assert all(p.dtype == torch.float32 for p in fast.exact_model.parameters())


def test_cli_prints_json_with_attention(model_dir):
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "model",
            "translate",
            "--model",
            str(model_dir),
            "--json",
            "--beam-size",
            "2",
            "The cat sat.",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    [result] = json.loads(completed.stdout)
    assert set(result) >= {
        "text",
        "source_tokens",
        "target_tokens",
        "score",
        "token_scores",
        "alignment",
        "cross_attention",
    }


def test_cli_reports_a_missing_model_without_a_traceback(tmp_path):
    completed = subprocess.run(
        [sys.executable, "-m", "model", "translate", "--model", str(tmp_path / "missing"), "Hello"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 2
    assert "error:" in completed.stderr and "Traceback" not in completed.stderr


def test_submit_takes_the_ids_a_caller_already_tokenized_and_does_not_tokenize_again(monkeypatch):
    """The service tokenizes each text once (to refuse one too long at once) and hands the ids on."""
    translator = Translator.from_pretrained("en-zh", device=DEVICE)
    text = "The cat sat on the mat."
    expected = translator.translate([text], beam_size=4)[0]
    (ids,) = translator.encode_source([text])
    translator.start_loop()

    def tokenized_again(*_):
        raise AssertionError("tokenized a second time")

    monkeypatch.setattr(translator, "encode_source", tokenized_again)
    monkeypatch.setattr(translator.tokenizer, "encode_source", tokenized_again)
    translation = translator.submit(text, beam_size=4, source_ids=ids).result(timeout=60)
    assert (translation.target_ids, translation.alignment) == (expected.target_ids, expected.alignment)
    assert translation.token_logprobs == pytest.approx(expected.token_logprobs, abs=1e-5)


def test_texts_submitted_together_join_the_loop_at_one_step_and_decode_as_translate_does():
    """A request's texts reach the loop's admission together: one batch, one encoder pass, whatever the thread
    timing; a blank one never enters the loop."""
    translator = Translator.from_pretrained("en-zh", device=DEVICE)
    texts = ["The cat sat on the mat.", " ", "Where is the station?", "I like tea.", "Thank you very much."]
    expected = translator.translate(texts, beam_size=4)
    joined = []
    translator.start_loop(on_joined=lambda batch, waits: joined.append(batch.size))
    for _ in range(3):
        futures = translator.submit_all(texts, beam_size=4)
        results = [future.result(timeout=60) for future in futures]
        assert [r.target_ids for r in results] == [e.target_ids for e in expected]
        for result, oracle in zip(results, expected, strict=True):
            assert result.token_logprobs == pytest.approx(oracle.token_logprobs, abs=1e-5)
    assert joined == [4, 4, 4]
