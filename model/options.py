"""How to decode: the one options type the engine, the CLI and the REST API share.

The service's request schema builds a `DecodingOptions` (as vLLM's protocol builds its sampling
parameters) and hands it, unchanged, through the deployment handles to `Translator.translate`;
texts decode together in one batch only when their options are equal (the type is frozen and hashable).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from model.errors import InvalidInputError

MAX_BEAM_SIZE = 64


@dataclass(frozen=True)
class DecodingOptions:
    """Beam search settings (greedy is beam_size=1), with transformers' `generate` meanings.

    beam_size        beams per input (num_beams)
    n_best           hypotheses returned per input, best first (num_return_sequences); at most beam_size
    max_new_tokens   the length budget: at most this many generated tokens, the last a forced </s>;
                     None: 2 × source length + 10, at least min_new_tokens, within the model's positions
    length_penalty   finished hypotheses rank by score / length ** length_penalty
    min_new_tokens   </s> is banned before this many tokens (as in transformers, max_new_tokens still ends
                     a translation; without it the default budget grows to min_new_tokens)
    """

    beam_size: int = 4
    n_best: int = 1
    max_new_tokens: int | None = None
    length_penalty: float = 1.0
    min_new_tokens: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.beam_size, int) or not 1 <= self.beam_size <= MAX_BEAM_SIZE:
            raise InvalidInputError(f"beam_size must be between 1 and {MAX_BEAM_SIZE}")
        if not isinstance(self.n_best, int) or not 1 <= self.n_best <= self.beam_size:
            raise InvalidInputError("n_best (num_return_sequences) must be between 1 and beam_size")
        if self.max_new_tokens is not None and (not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1):
            raise InvalidInputError("max_new_tokens must be at least 1")
        if not isinstance(self.min_new_tokens, int) or self.min_new_tokens < 0:
            raise InvalidInputError("min_new_tokens must be 0 or more")

    def as_dict(self) -> dict:
        return asdict(self)
