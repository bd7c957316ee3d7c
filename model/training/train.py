"""Train a Marian-format translation model from tab-separated parallel text.

    python -m model.training.train --train train.tsv --dev dev.tsv --source-column 0 --target-column 1 \\
        --work runs/en-zh --output model/pretrained/en-zh
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import shutil
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from model.checkpoint import load_state, save_model
from model.config import ModelConfig
from model.tokenizer import EOS, PAD, MarianTokenizer
from model.training.data import collate, dev_references, read_pairs
from model.training.evaluate import evaluate
from model.training.guided_alignment import (
    AlignmentMonitor,
    guide_tensor,
    guided_alignment_loss,
    load_guides,
    resolve_alignment_head,
)
from model.training.options import TrainingOptions
from model.training.vocabulary import guess_language, prepare_tokenizer
from model.transformer import Transformer

logger = logging.getLogger("model.training.train")
SAVE_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": None}


# ---- data ---------------------------------------------------------------------------








def make_batches(examples: list[tuple[list[int], list[int]]], batch_tokens: int, rng: random.Random) -> list[list[int]]:
    """Token-based batches: sort by length (with noise), cut where padded size would exceed batch_tokens."""
    order = sorted(range(len(examples)), key=lambda i: (len(examples[i][1]) + rng.random(), len(examples[i][0])))
    batches, current, longest = [], [], 0
    for index in order:
        source, target = examples[index]
        size = max(longest, len(source), len(target) + 1)
        if current and size * (len(current) + 1) > batch_tokens:
            batches.append(current)
            current, size = [], max(len(source), len(target) + 1)
        current.append(index)
        longest = size
    if current:
        batches.append(current)
    rng.shuffle(batches)
    return batches


# ---- resumable state (safetensors + JSON, no pickle) ---------------------------------
def weights_of(model: Transformer) -> dict[str, torch.Tensor]:
    """Every trainable tensor once (tied embeddings share one name), plus final_logits_bias."""
    weights = {name: t.detach().contiguous() for name, t in model.named_parameters()}
    weights["final_logits_bias"] = model.final_logits_bias.detach().contiguous()
    return weights


def save_training_state(path: Path, model: Transformer, optimizer: torch.optim.Optimizer, state: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    save_file(weights_of(model), str(tmp / "model.safetensors"))
    optimizer_state = optimizer.state_dict()
    tensors = {}
    for index, values in optimizer_state["state"].items():
        for key, value in values.items():
            tensors[f"{index}.{key}"] = value if torch.is_tensor(value) else torch.tensor(value)
    save_file(tensors, str(tmp / "optimizer.safetensors"))
    (tmp / "state.json").write_text(
        json.dumps({**state, "param_groups": optimizer_state["param_groups"]}, indent=1), encoding="utf-8"
    )
    if path.exists():
        shutil.rmtree(path)
    tmp.rename(path)


def load_training_state(path: Path, model: Transformer, optimizer: torch.optim.Optimizer) -> dict:
    model.load_state_dict(load_file(str(path / "model.safetensors")), strict=False)
    state = json.loads((path / "state.json").read_text(encoding="utf-8"))
    tensors = load_file(str(path / "optimizer.safetensors"))
    grouped: dict[int, dict] = {}
    for name, value in tensors.items():
        index, key = name.split(".", 1)
        grouped.setdefault(int(index), {})[key] = value
    optimizer.load_state_dict({"state": grouped, "param_groups": state.pop("param_groups")})
    return state


def average_weights(paths: list[Path]) -> dict[str, torch.Tensor]:
    total: dict[str, torch.Tensor] = {}
    for path in paths:
        for name, tensor in load_file(str(path)).items():
            total[name] = total.get(name, 0) + tensor.double()
    return {name: (tensor / len(paths)).float() for name, tensor in total.items()}


def export(model: Transformer, tokenizer: MarianTokenizer, work: Path, output: Path, dtype: torch.dtype | None) -> None:
    """Write a Marian directory: config, weights, both sentencepiece models, vocabularies."""
    output.mkdir(parents=True, exist_ok=True)
    save_model(model, output, dtype=dtype)
    shutil.copy(work / "tokenizer" / "source.spm", output / "source.spm")
    shutil.copy(work / "tokenizer" / "target.spm", output / "target.spm")
    tokenizer.save_vocabularies(output)


# ---- training -----------------------------------------------------------------------
def build_config(options: TrainingOptions, tokenizer: MarianTokenizer) -> ModelConfig:
    return ModelConfig(
        vocab_size=len(tokenizer.source_vocab),
        decoder_vocab_size=len(tokenizer.target_vocab),
        share_encoder_decoder_embeddings=options.joint_vocab,
        tie_word_embeddings=True,
        d_model=options.d_model,
        encoder_layers=options.encoder_layers,
        decoder_layers=options.decoder_layers,
        encoder_attention_heads=options.heads,
        decoder_attention_heads=options.heads,
        encoder_ffn_dim=options.ffn_dim,
        decoder_ffn_dim=options.ffn_dim,
        activation_function=options.activation,
        scale_embedding=True,
        max_position_embeddings=256,
        pad_token_id=tokenizer.target_vocab[PAD],
        eos_token_id=tokenizer.target_vocab[EOS],
        decoder_start_token_id=tokenizer.target_vocab[PAD],
        dropout=options.dropout,
        attention_dropout=options.attention_dropout,
    )


VOCABULARY_TENSORS = (
    "model.shared.weight",
    "model.encoder.embed_tokens.weight",
    "model.decoder.embed_tokens.weight",
    "lm_head.weight",
)


def carry_vocabulary(
    tensors: dict[str, torch.Tensor], origin: Path, tokenizer: MarianTokenizer, model: Transformer
) -> dict[str, torch.Tensor]:
    """Re-index `origin`'s vocabulary-sized tensors onto the new vocabulary, piece by piece.

    A piece both vocabularies hold keeps its trained row; a new piece keeps `model`'s fresh initialisation
    (its logit bias 0). Joint vocabularies only (the layout this trainer writes and OPUS-MT ships).
    """
    if not model.config.share_encoder_decoder_embeddings:
        raise ValueError("--retokenize needs a joint vocabulary (--joint-vocab)")
    old_vocab = json.loads((origin / "vocab.json").read_text(encoding="utf-8"))
    new_vocab = tokenizer.target_vocab
    pairs = [(new_id, old_vocab[piece]) for piece, new_id in new_vocab.items() if piece in old_vocab]
    new_ids = torch.tensor([new for new, _ in pairs])
    old_ids = torch.tensor([old for _, old in pairs])
    fresh = model.decoder_embed_tokens.weight.detach()
    carried = dict(tensors)
    for name in VOCABULARY_TENSORS:
        if name in tensors:
            rows = fresh.clone().to(tensors[name].dtype)
            rows[new_ids] = tensors[name][old_ids]
            carried[name] = rows
    if "final_logits_bias" in tensors:
        bias = torch.zeros(1, len(new_vocab), dtype=tensors["final_logits_bias"].dtype)
        bias[0, new_ids] = tensors["final_logits_bias"].reshape(-1)[old_ids]
        carried["final_logits_bias"] = bias
    logger.info(
        "carried %d of %d pieces' rows from %s (%d new)",
        len(pairs),
        len(new_vocab),
        origin,
        len(new_vocab) - len(pairs),
    )
    return carried


def zero_start_embedding(model: Transformer) -> None:
    """Keep the <pad> row (the decoder's start token) at zero, as Marian and CTranslate2 assume."""
    with torch.no_grad():
        model.decoder_embed_tokens.weight[model.config.decoder_start_token_id].zero_()


def learning_rate(step: int, options: TrainingOptions) -> float:
    """Linear warmup to the peak, then decay with the inverse square root of the step."""
    step = max(step, 1)
    return options.learning_rate * min(step / options.warmup_steps, math.sqrt(options.warmup_steps / step))


@dataclass
class TrainingData:
    tokenizer: MarianTokenizer
    examples: list[tuple[list[int], list[int]]]  # (source ids, target ids), both ending in </s>
    guides: list[list[tuple[int, int]]]  # per example its guided-alignment links (empty without guides)
    dev_sources: list[str]
    dev_refs: list[list[str]]
    source_language: str  # "en", "zh", …: --source-language, else guessed from the sources' script


@contextmanager
def logging_to(path: Path):
    """Send model.* logs to `path` for the duration of one training run."""
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logging.getLogger("model").addHandler(handler)
    try:
        yield
    finally:
        logging.getLogger("model").removeHandler(handler)
        handler.close()


def load_data(options: TrainingOptions, work: Path) -> TrainingData:
    """Phase 1: read the pairs, prepare the tokenizers, encode, attach guides, read dev."""
    pairs = read_pairs(options.train, options.source_column, options.target_column)
    logger.info("read %d training pairs from %s", len(pairs), options.train)
    tokenizer = prepare_tokenizer(options, pairs, work)
    guides_by_pair = load_guides(options.guided_alignment, pairs, tokenizer) if options.guided_alignment else None
    examples, guides = [], []
    for number, (source, target) in enumerate(pairs):
        source_ids, target_ids = tokenizer.encode_source(source), tokenizer.encode_target(target)
        if len(source_ids) <= options.max_length and len(target_ids) <= options.max_length:
            examples.append((source_ids, target_ids))
            guides.append(guides_by_pair[number] if guides_by_pair else [])
    dev_sources, dev_refs = [], []
    if options.dev:
        dev_sources, dev_refs = dev_references(read_pairs(options.dev, options.source_column, options.target_column))
        if options.eval_limit:
            dev_sources, dev_refs = dev_sources[: options.eval_limit], dev_refs[: options.eval_limit]
    language = options.source_language or guess_language([source for source, _ in pairs[:50]])
    return TrainingData(tokenizer, examples, guides, dev_sources, dev_refs, language)


def build_model(options: TrainingOptions, tokenizer: MarianTokenizer) -> Transformer:
    """Phase 2: the network, freshly initialised or continued from --init-from."""
    config = build_config(options, tokenizer)
    if options.guided_alignment:
        config.alignment_layer, config.alignment_head = resolve_alignment_head(options, config)
        config.alignment_shift = options.alignment_shift
    model = Transformer(config)
    for name, parameter in model.named_parameters():
        if parameter.dim() > 1:
            torch.nn.init.xavier_uniform_(parameter) if "embed" not in name else torch.nn.init.normal_(
                parameter, 0, config.d_model**-0.5
            )
    if options.init_from:
        tensors = load_file(str(Path(options.init_from) / "model.safetensors"))
        if options.retokenize:
            tensors = carry_vocabulary(tensors, Path(options.init_from), tokenizer, model)
        load_state(model, tensors, source=options.init_from)
        logger.info("initialised weights from %s", options.init_from)
    zero_start_embedding(model)
    return model


def train(options: TrainingOptions) -> dict:
    """Train (or resume) as `options` say and export the chosen weights; returns the summary."""
    work = Path(options.work)
    work.mkdir(parents=True, exist_ok=True)
    with logging_to(work / "train.log"):
        if options.threads:
            torch.set_num_threads(options.threads)
        (work / "options.json").write_text(json.dumps(asdict(options), indent=1), encoding="utf-8")
        random.seed(options.seed)
        torch.manual_seed(options.seed)
        data = load_data(options, work)
        model = build_model(options, data.tokenizer)
        if options.export_only:
            # Export the best checkpoint so far (e.g. while the run goes on) without training or evaluating.
            model.load_state_dict(load_file(str(work / "best.safetensors")), strict=False)
            export(model, data.tokenizer, work, Path(options.output), SAVE_DTYPES[options.save_dtype])
            return {"exported": options.output}
        optimizer = torch.optim.Adam(model.parameters(), lr=options.learning_rate, betas=(0.9, 0.98), eps=1e-9)
        state = {"epoch": 0, "batch_in_epoch": 0, "step": 0, "best_bleu": -1.0, "history": [], "seconds": 0.0}
        if (work / "last" / "state.json").exists():
            state = load_training_state(work / "last", model, optimizer)
            logger.info("resumed from %s at epoch %d step %d", work / "last", state["epoch"], state["step"])
        logger.info(
            "model: %d parameters, %d training examples, %d dev sources",
            sum(p.numel() for p in model.parameters()),
            len(data.examples),
            len(data.dev_sources),
        )
        monitor = AlignmentMonitor(options, data.tokenizer, model.config, data.source_language)
        started = time.monotonic() - state["seconds"]
        stop = False
        while state["epoch"] < options.epochs and not stop:
            stop, running, batches = run_epoch(options, model, optimizer, data, state, work, started)
            end_epoch(options, model, optimizer, data, state, work, started, monitor, running, batches)
        return finish(options, model, data.tokenizer, work, state, data.dev_sources, data.dev_refs)


def run_epoch(options, model: Transformer, optimizer, data: TrainingData, state: dict, work: Path, started: float):
    """Phase 3: the updates of one epoch (from where a resumed run left off).

    Returns (out of time or steps, the epoch's running sums, the epoch's batch count).
    """
    try:
        from tqdm import tqdm
    except ImportError:  # progress bars are a convenience, not a requirement
        tqdm = None
    config = model.config
    epoch = state["epoch"]
    batches = make_batches(data.examples, options.batch_tokens, random.Random(options.seed + epoch))
    model.train()
    progress = (
        tqdm(total=len(batches), initial=state["batch_in_epoch"], desc=f"epoch {epoch + 1}", mininterval=10)
        if tqdm
        else None
    )
    running = {"loss": 0.0, "tokens": 0, "alignment": 0.0, "batches": 0}
    last_checkpoint = time.monotonic()
    for batch_index in range(state["batch_in_epoch"], len(batches)):
        source_ids, source_mask, decoder_input, labels = collate(data.examples, batches[batch_index], config)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(state["step"] + 1, options)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=options.bf16):
            if options.guided_alignment:
                encoded = model.encode(source_ids, source_mask)
                hidden, cross = model.decode(decoder_input, encoded, need_weights=True)
                logits = model.logits(hidden)
                layer, head = config.alignment_layer, config.alignment_head
                attention = cross[layer].mean(dim=1) if head is None else cross[layer][:, head]
                guide = guide_tensor(
                    [data.guides[i] for i in batches[batch_index]],
                    source_ids.size(1),
                    labels.size(1),
                    config.alignment_shift,
                )
                alignment_loss = guided_alignment_loss(attention, guide)
            else:
                logits = model(source_ids, source_mask, decoder_input)
        loss = F.cross_entropy(
            logits.float().view(-1, logits.size(-1)),
            labels.view(-1),
            ignore_index=-100,
            label_smoothing=options.label_smoothing,
            reduction="sum",
        )
        tokens = int((labels != -100).sum())
        optimizer.zero_grad(set_to_none=True)
        objective = loss / tokens
        if options.guided_alignment:
            objective = objective + options.guided_alignment_weight * alignment_loss
            running["alignment"] += alignment_loss.detach().item()
        objective.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), options.clip_norm)
        optimizer.step()
        zero_start_embedding(model)
        state["step"] += 1
        state["batch_in_epoch"] = batch_index + 1
        running["batches"] += 1
        running["loss"] += loss.detach().item()
        running["tokens"] += tokens
        if progress:
            progress.update(1)
            progress.set_postfix(loss=f"{running['loss'] / running['tokens']:.3f}", refresh=False)
        if state["step"] % 50 == 0:
            logger.info(
                "epoch %d step %d loss %.4f lr %.2e",
                epoch + 1,
                state["step"],
                running["loss"] / running["tokens"],
                optimizer.param_groups[0]["lr"],
            )
        elapsed = time.monotonic() - started
        out_of_time = options.max_minutes and elapsed > options.max_minutes * 60
        out_of_steps = options.max_steps and state["step"] >= options.max_steps
        if out_of_time or out_of_steps:
            if progress:
                progress.close()
            return True, running, len(batches)
        if time.monotonic() - last_checkpoint > options.checkpoint_minutes * 60:
            state["seconds"] = elapsed
            save_training_state(work / "last", model, optimizer, state)
            last_checkpoint = time.monotonic()
    if progress:
        progress.close()
    return False, running, len(batches)


def end_epoch(
    options,
    model: Transformer,
    optimizer,
    data: TrainingData,
    state: dict,
    work: Path,
    started: float,
    monitor,
    running: dict,
    batches: int,
) -> None:
    """Phase 4: record the epoch; at its end also evaluate (BLEU, attention health) and keep checkpoints."""
    epoch = state["epoch"]
    record = {
        "epoch": epoch + 1,
        "step": state["step"],
        "train_loss": round(running["loss"] / max(running["tokens"], 1), 4),
        "minutes": round((time.monotonic() - started) / 60, 1),
    }
    if options.guided_alignment:
        record["alignment_loss"] = round(running["alignment"] / max(running["batches"], 1), 4)
    if state["batch_in_epoch"] >= batches:
        if data.dev_sources:
            limit = options.epoch_eval_limit or len(data.dev_sources)  # a fixed prefix of dev keeps epochs comparable
            record.update(
                evaluate(model, data.tokenizer, data.dev_sources[:limit], data.dev_refs[:limit], options.bleu_tokenize)
            )
            record.update(monitor.epoch_report(model))
            if record["bleu"] > state["best_bleu"]:
                state["best_bleu"] = record["bleu"]
                save_file(weights_of(model), str(work / "best.safetensors"))
        save_file(weights_of(model), str(work / f"epoch-{epoch + 1:03d}.safetensors"))
        for old in sorted(work.glob("epoch-*.safetensors"))[: -max(options.average_last, 1)]:
            old.unlink()
        state["epoch"] += 1
        state["batch_in_epoch"] = 0
    state["history"].append(record)
    logger.info("epoch summary %s", json.dumps(record))
    state["seconds"] = time.monotonic() - started
    save_training_state(work / "last", model, optimizer, state)


def finish(options, model, tokenizer, work: Path, state: dict, dev_sources, dev_refs) -> dict:
    """Pick the best of (best epoch, average of the last epochs, last weights) on dev and export it."""
    candidates = {"last": {n: t.clone() for n, t in weights_of(model).items()}}
    if (work / "best.safetensors").exists():
        candidates["best"] = load_file(str(work / "best.safetensors"))
    epochs = sorted(work.glob("epoch-*.safetensors"))[-options.average_last :]
    if options.average_last > 1 and len(epochs) > 1:
        candidates["average"] = average_weights(epochs)
    scores = {}
    for name, weights in candidates.items():
        model.load_state_dict(weights, strict=False)
        scores[name] = (
            evaluate(model, tokenizer, dev_sources, dev_refs, options.bleu_tokenize) if dev_sources else {"bleu": 0.0}
        )
        logger.info("candidate %s: %s", name, scores[name])
    chosen = max(scores, key=lambda n: scores[n]["bleu"])
    model.load_state_dict(candidates[chosen], strict=False)
    summary = {
        "chosen": chosen,
        "greedy": scores[chosen],
        "candidates": scores,
        "steps": state["step"],
        "epochs": state["epoch"],
        "minutes": round(state["seconds"] / 60, 1),
    }
    if dev_sources:
        summary["beam4"] = evaluate(model, tokenizer, dev_sources, dev_refs, options.bleu_tokenize, beam_size=4)
    if options.output:
        export(model, tokenizer, work, Path(options.output), SAVE_DTYPES[options.save_dtype])
    (work / "summary.json").write_text(json.dumps({**summary, "history": state["history"]}, indent=1), encoding="utf-8")
    logger.info("finished: %s", json.dumps(summary))
    return summary


def parse_args(argv: list[str] | None = None) -> TrainingOptions:
    parser = argparse.ArgumentParser(
        prog="python -m model.training.train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    defaults = TrainingOptions(train="", dev=None, work="", output=None)
    parser.add_argument("--train", required=True, help="TSV with source, target (and optional attribution) columns")
    parser.add_argument("--dev", help="TSV in the same layout, for model selection")
    parser.add_argument(
        "--work", required=True, help="directory for checkpoints, logs and tokenizers (resumes from it)"
    )
    parser.add_argument("--output", help="Marian-format directory to write the final model to")
    for field_name, value in asdict(defaults).items():
        if field_name in ("train", "dev", "work", "output"):
            continue
        flag = "--" + field_name.replace("_", "-")
        if isinstance(value, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=value)
        else:
            parser.add_argument(flag, type=type(value), default=value)
    return TrainingOptions(**vars(parser.parse_args(argv)))


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    summary = train(parse_args(argv))
    print(json.dumps({k: v for k, v in summary.items() if k != "history"}, indent=1))


if __name__ == "__main__":
    main()
