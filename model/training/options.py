"""What one training run is told: the command line of model.training.train as one dataclass."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TrainingOptions:
    train: str
    dev: str | None
    work: str
    output: str | None
    source_column: int = 0
    target_column: int = 1
    source_vocab_size: int = 8000
    target_vocab_size: int = 8000
    source_character_coverage: float = 1.0
    target_character_coverage: float = 0.9995
    # "unigram" (word-respecting pieces: never across a space) or "char" (one piece per character: for
    # Chinese, a piece then never spans two words of any segmentation).
    source_model_type: str = "unigram"
    target_model_type: str = "unigram"
    d_model: int = 256
    heads: int = 4
    ffn_dim: int = 1024
    encoder_layers: int = 6
    decoder_layers: int = 3
    activation: str = "swish"
    dropout: float = 0.1
    attention_dropout: float = 0.0
    label_smoothing: float = 0.1
    learning_rate: float = 1e-3
    warmup_steps: int = 500
    batch_tokens: int = 2000
    max_length: int = 96
    clip_norm: float = 1.0
    epochs: int = 30
    max_steps: int = 0
    max_minutes: float = 0.0
    average_last: int = 3
    bleu_tokenize: str = "13a"
    eval_limit: int = 0
    seed: int = 1234
    threads: int = 0
    bf16: bool = False
    checkpoint_minutes: float = 10.0
    save_dtype: str = "float16"
    joint_vocab: bool = True
    export_only: bool = False
    epoch_eval_limit: int = 0
    init_from: str = ""
    # With --init-from: train new tokenizers on this data instead of reusing the model's, and carry over
    # the embedding rows (and logit biases) of every piece both vocabularies share; new pieces start fresh.
    retokenize: bool = False
    # Guided alignment (Garg et al. 2019; Marian's --guided-alignment): pull one cross-attention head
    # toward word links of the training pairs (model.training.statistical_alignment's train.jsonl).
    guided_alignment: str = ""
    guided_alignment_weight: float = 0.1
    alignment_layer: int = -1  # -1: the penultimate decoder layer
    alignment_head: int = 0  # -1: the layer's head average
    alignment_shift: bool = False  # guide target token t at the step where t is the decoder's input
    alignment_dev: str = ""  # eflomal links of dev pairs (dev.jsonl): in-domain AER per epoch
    alignment_gold: str = ""  # human gold directory: gold AER per epoch
    source_language: str = ""  # "en", "zh", …; empty: guessed from the training sources' script
