"""The training pipeline end to end on a few hundred pairs: it learns, resumes, and exports a Marian directory."""

from __future__ import annotations

import json

import pytest
import torch

from model import Translator
from model.training.train import main as train_main
from tests.harness.tiny import synthetic_corpus

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    directory = tmp_path_factory.mktemp("data")
    pairs = synthetic_corpus(count=300, seed=11)
    (directory / "train.tsv").write_text("".join(f"{en}\t{zh}\tCC-BY test\n" for en, zh in pairs), encoding="utf-8")
    (directory / "dev.tsv").write_text("".join(f"{en}\t{zh}\n" for en, zh in pairs[:20]), encoding="utf-8")
    return directory


def tiny_run(data, work, output, *options: str) -> None:
    """One training run of the tiny setting; later options override earlier ones (argparse keeps the last)."""
    train_main(
        ["--train", str(data / "train.tsv"), "--dev", str(data / "dev.tsv"), "--work", str(work), "--output",
         str(output), "--source-vocab-size", "100", "--target-vocab-size", "80", "--d-model", "32", "--heads", "2",
         "--ffn-dim", "64", "--encoder-layers", "1", "--decoder-layers", "1", "--batch-tokens", "400",
         "--warmup-steps", "10", "--learning-rate", "3e-3", "--epochs", "20", "--bleu-tokenize", "zh",
         "--average-last", "2", "--save-dtype", "float32", *options]
    )  # fmt: skip


def _train(data, work, output, max_steps):
    tiny_run(data, work, output, "--max-steps", str(max_steps))
    return json.loads((work / "summary.json").read_text())


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory):
    work, output = tmp_path_factory.mktemp("work"), tmp_path_factory.mktemp("out")
    first = _train(data, work, output, max_steps=20)
    second = _train(data, work, output, max_steps=45)  # the same command, continued
    return first, second, output


def test_loss_decreases(trained):
    _, second, _ = trained
    losses = [record["train_loss"] for record in second["history"]]
    assert losses[-1] < losses[0] - 0.5


def test_interrupted_run_resumes_from_its_checkpoint(trained):
    first, second, _ = trained
    assert first["steps"] == 20
    assert second["steps"] == 45  # continued from step 20, not restarted
    assert second["history"][: len(first["history"])] == first["history"]


def test_output_loads_in_our_translator_and_transformers_identically(trained, data):
    _, _, output = trained
    ours = Translator.from_pretrained(output, device="cpu")
    reference = transformers.MarianMTModel.from_pretrained(output).eval()
    tokenizer = transformers.MarianTokenizer.from_pretrained(output)
    sources = [line.split("\t")[0] for line in (data / "dev.tsv").read_text(encoding="utf-8").splitlines()[:8]]
    ids = ours.encode_source(sources)
    assert ids == [tokenizer(s)["input_ids"] for s in sources]
    for source, hypotheses in zip(ids, ours.generate(ids, beam_size=1, max_new_tokens=30)):
        expected = reference.generate(torch.tensor([source]), num_beams=1, do_sample=False, max_new_tokens=30)
        assert hypotheses[0].token_ids == expected[0, 1:].tolist()
        assert ours.tokenizer.decode(hypotheses[0].token_ids) == tokenizer.decode(
            expected[0], skip_special_tokens=True, use_source_tokenizer=False
        )


def test_output_converts_with_ctranslate2_and_decodes_identically(trained, data, tmp_path):
    ctranslate2 = pytest.importorskip("ctranslate2")
    from ctranslate2.converters import TransformersConverter

    _, _, output = trained
    converted = TransformersConverter(str(output)).convert(str(tmp_path / "ct2"), quantization="float32")
    reference = ctranslate2.Translator(converted, device="cpu")
    ours = Translator.from_pretrained(output, device="cpu")
    sources = [line.split("\t")[0] for line in (data / "dev.tsv").read_text(encoding="utf-8").splitlines()[:8]]
    ids = ours.encode_source(sources)
    # min_decoding_length=0: CTranslate2 otherwise bans </s> as the first token, which transformers and we allow
    expected = reference.translate_batch(
        [ours.tokenizer.source_tokens(row) for row in ids], beam_size=1, min_decoding_length=0
    )
    for hypotheses, result in zip(ours.generate(ids, beam_size=1), expected):
        assert ours.tokenizer.target_tokens(hypotheses[0].token_ids)[:-1] == result.hypotheses[0]


def test_each_run_removes_its_log_handler_again(trained):
    import logging

    assert not [h for h in logging.getLogger("model").handlers if isinstance(h, logging.FileHandler)]


def test_guided_alignment_training_records_the_alignment_head_and_attention_health(data, tmp_path):
    """A guided run on word links (here: every pair's words aligned in order) declares its head and reports
    the head's entropy and AER per epoch; the exported directory still loads in transformers."""
    from model.training.gold import split_words

    pairs = [line.split("\t")[:2] for line in (data / "train.tsv").read_text(encoding="utf-8").splitlines()]
    with open(tmp_path / "links.jsonl", "w", encoding="utf-8") as handle:
        for en, zh in pairs:
            en_words, zh_words = split_words(en, "en"), split_words(zh, "zh")
            links = [[i, min(i, len(zh_words) - 1)] for i in range(len(en_words))]
            record = {"en": en, "zh": zh, "en_words": en_words, "zh_words": zh_words, "links": links}
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    work, output = tmp_path / "work", tmp_path / "out"
    links = str(tmp_path / "links.jsonl")
    tiny_run(
        data, work, output, "--decoder-layers", "2", "--epochs", "1", "--guided-alignment", links,
        "--alignment-dev", links, "--alignment-layer", "1", "--alignment-head", "1",
    )  # fmt: skip
    summary = json.loads((work / "summary.json").read_text())
    epoch = summary["history"][0]
    assert {"alignment_loss", "dev_aer", "dev_entropy"} <= set(epoch) and 0 <= epoch["dev_entropy"] <= 1
    config = json.loads((output / "config.json").read_text())
    assert (config["alignment_layer"], config["alignment_head"]) == (1, 1)
    assert Translator.from_pretrained(output, device="cpu").alignment_head == (1, 1)
    transformers.MarianMTModel.from_pretrained(output)  # still a plain Marian checkpoint
