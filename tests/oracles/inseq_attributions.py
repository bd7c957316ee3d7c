"""inseq's attributions for (source, target) text pairs, as JSON: the oracle for model/explanations/attribution.py.
Runs in its own environment (inseq 0.7.1 on transformers 4.57, made by tests/oracles/install.sh) and imports
nothing from this repository.
"""

import json
import sys

import inseq
import torch
from transformers import MarianMTModel, MarianTokenizer


def rows(matrix: torch.Tensor, width: int) -> list[list[float]]:
    """inseq's (attributed positions, generated steps) → (steps, positions), NaN (not attributable) as 0."""
    return matrix.T.nan_to_num(0.0)[:, :width].tolist()


def check_probabilities(model: MarianMTModel, sequence) -> None:
    """inseq's p(y_t) must be the model's own: the same model, not one with re-scaled embeddings."""
    source = torch.tensor([[token.id for token in sequence.source]])
    decoder_input = torch.tensor([[token.id for token in sequence.target[:-1]]])
    targets = torch.tensor([token.id for token in sequence.target[1:]])
    scale = model.model.decoder.embed_scale
    model.model.decoder.embed_scale = model.model.encoder.embed_scale  # ids in: the model as it is
    with torch.no_grad():
        logits = model(input_ids=source, decoder_input_ids=decoder_input).logits[0]
    model.model.decoder.embed_scale = scale
    expected = logits.softmax(-1).gather(1, targets[:, None])[:, 0]
    probability = sequence.step_scores["probability"]
    if not torch.allclose(probability, expected, rtol=1e-4, atol=1e-6):
        raise SystemExit(f"inseq's probabilities {probability.tolist()} are not the model's {expected.tolist()}")


def main() -> None:
    """Read a request on stdin and write, per model, pair and method, the ids inseq attributed and its default
    aggregation.

    In: {"models": [{"model": dir, "pairs": [{"source": text, "target": text}]}], "methods": [...], "steps": n}
    Out: {"source_ids", "target_ids", "source": [T][S], "target": [T][T]} (row t: the t-th generated token;
    target column j: the decoder input j, 0 being the start token).
    """
    request = json.load(sys.stdin)
    json.dump([attribute_pairs(job["model"], job["pairs"], request) for job in request["models"]], sys.stdout)


def attribute_pairs(directory: str, pairs: list[dict], request: dict) -> list[dict]:
    """inseq's attributions of each pair by each method, with one correction: inseq hands Marian token
    embeddings already multiplied by embed_scale, and transformers' MarianDecoder multiplies `inputs_embeds`
    by it once more (modeling_marian.py, MarianDecoder.forward, in 4.57), so inseq would attribute a decoder
    whose inputs are scaled by d_model instead of √d_model. The decoder's embed_scale is set to 1 once inseq
    has loaded the model, and `check_probabilities` checks that inseq's per-step probabilities then equal
    the model's own teacher-forced probabilities."""
    model = MarianMTModel.from_pretrained(directory, attn_implementation="eager").eval()
    tokenizer = MarianTokenizer.from_pretrained(directory)
    results = []
    for pair in pairs:
        per_method = {}
        for method in request["methods"]:
            model.model.decoder.embed_scale = model.model.encoder.embed_scale  # what inseq checks at load
            attribution_model = inseq.load_model(model, method, tokenizer=tokenizer)
            model.model.decoder.embed_scale = 1.0  # inseq's embeddings are scaled already (see above)
            final_step = method == "value_zeroing"
            arguments = {"n_steps": request["steps"]} if method == "integrated_gradients" else {}
            output = attribution_model.attribute(
                pair["source"],
                generated_texts=pair["target"],
                attribute_target=True,
                show_progress=False,
                step_scores=[] if final_step else ["probability"],
                **arguments,
            )
            sequence = output.sequence_attributions[0]
            if not final_step:  # inseq computes no step scores for value zeroing (one pass over the sequence)
                check_probabilities(model, sequence)
            sequence = sequence.aggregate()
            steps = len(sequence.target) - 1  # target[0] is the decoder start token
            per_method[method] = {
                "source_ids": [token.id for token in sequence.source],
                "target_ids": [token.id for token in sequence.target[1:]],
                "source": rows(sequence.source_attributions, len(sequence.source)),
                "target": rows(sequence.target_attributions, steps),
            }
        results.append(per_method)
    return results


if __name__ == "__main__":
    main()
