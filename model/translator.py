"""The public engine API: load a Marian directory, translate, and say which source words produced which output.

tr = Translator.from_pretrained("en-zh")          # a shipped model by name, or a directory
out = tr.translate(["The cat sat."], beam_size=4, return_attention=True)
out[0].text, out[0].alignment, out[0].cross_attention

Translator is the façade: loading (model.loading), building Translations (model.translation), the decode loop
(model.decoding.scheduler), alignments and their agreement (model.agreeing), trust (model.assessment) and
explanations (model.explaining) each live in a module of their own, which it delegates to.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

import torch

from model.agreeing import Aligner, ReverseReading
from model.assessment import Assessor, calibration_fit, calibration_info
from model.calibration import Calibration
from model.decoding.scheduler import Batch, DecodeRequest, Policy, SchedulerThread, request_of
from model.decoding.search import Hypothesis, beam_search
from model.errors import InvalidInputError
from model.explaining import Explainer
from model.explanations.agreement import AlignmentRows
from model.explanations.attribution import Attributions
from model.explanations.explain import AttentionSteps
from model.loading import translator_parts
from model.options import DecodingOptions
from model.results import Explanation, StreamedToken, Translation, blank_translation
from model.runtime import load_step
from model.runtime.extension import compiled_extension
from model.runtime.step import weights_precision
from model.tokenizer import MarianTokenizer
from model.transformer import Transformer
from model.translation import Builder, check_source_ids, decoding_options, encode_texts

__all__ = ["Explanation", "StreamedToken", "Translation", "Translator"]

MAX_TERM_BEAM = 4  # the widest beam a glossary's terms raise a search to (the default beam)


class Translator:
    """A loaded model plus its tokenizer, ready to translate batches of text."""

    def __init__(
        self,
        model: Transformer,
        tokenizer: MarianTokenizer,
        name: str = "model",
        weights_digest: str = "",
        exact_model: Transformer | None = None,
        step=None,
        model_card: str | None = None,
        calibration: Calibration | None = None,
    ) -> None:
        self.model = model  # what decodes (translate, generate, submit)
        # how each step runs: the compiled runtime where it builds and suits, else the eager step (runtime_info)
        self.step = step if step is not None else load_step(model, weights_precision(model))
        # what the lecture's arithmetic explains with (attention_steps, attribute, encoder maps, forced rows): the
        # decoding model, or its float32 original where the step decodes on lower-precision weights (CPU bf16)
        self.exact_model = exact_model if exact_model is not None else model
        self.tokenizer, self.name, self.weights_digest, self.config = tokenizer, name, weights_digest, model.config
        # which head alignments are read from, and why (ModelConfig.alignment_source: config.json, else the card)
        self.alignment = self.config.alignment_source(model_card)
        self.calibration = calibration  # trust's fit (trust.json beside the weights), or None: uncalibrated
        self._loop: SchedulerThread | None = None
        self._aligner = Aligner(tokenizer, self.exact_model, self.alignment_head, self.alignment_shift, name)
        self._builder = Builder(tokenizer, self._aligner, self.alignment_head)
        self._assessor = Assessor(tokenizer, self._aligner, self.config.max_position_embeddings)
        self._explainer = Explainer(model, self.exact_model, self.step, tokenizer, self._aligner, self._builder)

    @classmethod
    def from_pretrained(
        cls, name_or_path: str | Path, device: str | torch.device | None = None, dtype: torch.dtype | str | None = None
    ) -> Translator:
        """Load a Marian directory (or a shipped model by name) onto `device` (None: cuda if available) in `dtype`:
        a torch dtype or its name ("float32", "bfloat16", "float16", "int8", "auto"), None the exact float32
        (model.loading.translator_parts says what each one decodes and explains with)."""
        return cls(**translator_parts(name_or_path, device, dtype))

    @property
    def device(self) -> torch.device:  # where the decoding model's weights lie
        return self.model.final_logits_bias.device

    @property
    def precision(self) -> str:
        """How decoding stores its matrices: "float32", "bfloat16", "float16" or "int8"."""
        return self.step.info.precision

    @property
    def runtime_info(self) -> dict:
        """What runs each decoding step (compiled or eager), why, on which CPU, and the kernels chosen there."""
        return self.step.info.as_dict()

    @property
    def explanation_precision(self) -> str:
        """How explanations' maps and scores are computed: through the decoding step, so `precision`."""
        return self.precision

    @property
    def steps_precision(self) -> str:
        """How `attention_steps`, attributions and encoder maps are computed: the exact model's weights, "float32"
        under int8 and the CPU's bfloat16."""
        return weights_precision(self.exact_model)

    @property
    def alignment_layer(self) -> int:
        """The decoder layer alignments are read from (see alignment_head)."""
        return self.alignment.layer

    @property
    def alignment_head(self) -> tuple[int, int | None]:
        """(layer, head) of the alignment head; head None means the layer's head average. A model may declare it in
        config.json; else Marian's (the last layer's head 0), unless its model card says it was trained without
        guided alignment (then the penultimate layer's head average). `alignment.reason` says which."""
        return self.alignment.layer, self.alignment.head

    @property
    def alignment_shift(self) -> bool:
        """True when target token t's alignment is read at the step where t is the decoder's input
        (the model declares `alignment_shift` in config.json), else at the step that predicts t."""
        return self.config.alignment_shift

    def encode_source(self, texts: list[str]) -> list[list[int]]:
        """Texts → vocabulary ids with the final </s> (the ids MarianTokenizer gives)."""
        return encode_texts(self.tokenizer, self.config.max_position_embeddings, texts)

    def generate(
        self,
        source_ids: list[list[int]],
        options: DecodingOptions | None = None,
        *,
        return_attention: bool = False,
        alignment_attention: bool = False,
        constraints: list[list[list[int]]] | None = None,
        **settings,
    ) -> list[list[Hypothesis]]:
        """Decode id sequences; per input its hypotheses, best first. `options`, or its fields by keyword
        (`generate(ids, beam_size=4)`; transformers' `num_return_sequences` is n_best). return_attention: each
        hypothesis carries every head's cross-attention; alignment_attention: only the alignment head's rows.
        constraints: per input, target id sequences every hypothesis contains (lexically constrained search)."""
        options = decoding_options(options, settings)
        check_source_ids(self.config, source_ids)
        if not source_ids:
            return []
        head = self.alignment_head if alignment_attention else None
        return beam_search(
            self.model, source_ids, options, return_attention=return_attention, alignment_head=head, step=self.step,
            constraints=constraints, word_continuations=self.word_continuations if constraints else None,
        )

    @functools.cached_property
    def word_continuations(self) -> list[int]:
        """Target tokens that go on the word before them (a Latin letter or digit without the ▁ that starts a
        word): a term must not be followed by one (a character script has none)."""
        pieces = self.tokenizer.target_pieces
        return [i for i, piece in pieces.items() if piece[:1].isascii() and piece[:1].isalnum()]

    @property
    def constrains(self) -> bool:
        """Whether terms can be enforced in the search (the compiled runtime's search is there to do it)."""
        return compiled_extension() is not None

    def term_ids(self, terms: list[str]) -> list[list[int]]:
        """Target ids of glossary terms as they decode inside a translation (no </s>)."""
        return [self.tokenizer.encode_target(term)[:-1] for term in terms if term.strip()]

    def _constrained(self, options: DecodingOptions, wanted: list[list[int]]) -> tuple[DecodingOptions, str | None]:
        """Options for a text whose search holds constraints (`wanted`): a beam with a place for each count of
        term tokens met (as dynamic beam allocation shares beams out), within 2 and MAX_TERM_BEAM, and why."""
        if not wanted:
            return options, None
        beam = max(options.beam_size, 2, min(sum(map(len, wanted)) + 1, MAX_TERM_BEAM))
        if beam == options.beam_size:
            return options, None
        return (dataclasses.replace(options, beam_size=beam),
                f"a glossary applied: searched with a beam of {beam} (asked: {options.beam_size}), a place for each "
                "count of term tokens met")

    def _inputs(
        self, texts: list[str], source_ids: list[list[int]] | None, terms: list[list[str]] | None
    ) -> tuple[list[list[int]], list[list[list[int]]]]:
        """`translate`'s and `submit_all`'s texts checked: their source ids (encoded here unless given) and each
        one's term ids."""
        if terms is not None and len(terms) != len(texts):
            raise InvalidInputError(f"{len(terms)} term lists for {len(texts)} texts")
        if terms is not None and any(terms) and not self.constrains:
            raise InvalidInputError("terms need the compiled runtime's search, which this machine could not build")
        if source_ids is None:
            source_ids = self.encode_source(texts)
        elif len(source_ids) != len(texts):
            raise InvalidInputError(f"{len(source_ids)} source id lists for {len(texts)} texts")
        return source_ids, [self.term_ids(t) if t else [] for t in terms or [[] for _ in texts]]

    def translate(
        self,
        texts: list[str],
        options: DecodingOptions | None = None,
        *,
        return_attention: bool = False,
        reverse: Translator | None = None,
        source_ids: list[list[int]] | None = None,
        terms: list[list[str]] | None = None,
        **settings,
    ) -> list[Translation]:
        """Translate texts with `options` (or its fields by keyword, as `generate`).

        Alignments are always computed (from the alignment head's captured rows); every layer's and head's attention
        is returned only when return_attention is true. A blank text translates to "" without running the model.
        With `reverse` (a model translating the other way) the alignments are its and this model's agreed ones,
        else the head's one-best. `source_ids`: the texts' `encode_source` ids where the caller already has them.
        `terms`: per text, target terms every translation of it contains (a glossary's, enforced in the search).
        """
        options = decoding_options(options, settings)
        source_ids, wanted = self._inputs(texts, source_ids, terms)
        blank = [not text.strip() for text in texts]
        nbest: list[list[Hypothesis]] = [[] for _ in texts]
        notes: list[str | None] = [None] * len(texts)
        for constrained in (False, True):  # texts with terms decode apart: their beam may differ
            chosen = [i for i in range(len(texts)) if not blank[i] and bool(wanted[i]) == constrained]
            if not chosen:
                continue
            groups: dict[tuple[DecodingOptions, str | None], list[int]] = {}  # a text's terms set its beam
            for i in chosen:
                groups.setdefault(self._constrained(options, wanted[i]), []).append(i)
            for (used, note), group in groups.items():  # equal beams decode together
                decoded = self.generate([source_ids[i] for i in group], used, return_attention=return_attention,
                                        alignment_attention=not return_attention,
                                        constraints=[wanted[i] for i in group] if constrained else None)
                for i, hypotheses in zip(group, decoded, strict=True):
                    nbest[i], notes[i] = hypotheses, note
        results = self._builder.translations(source_ids, nbest, [return_attention] * len(texts))
        for result, note in zip(results, notes, strict=True):
            result.search_note = note
        return results if reverse is None else self.with_agreements(results, reverse)

    def start_loop(
        self,
        policy: Policy = "continuous",
        max_rows: int = 64,
        max_texts: int | None = None,
        gather_s: float = 0.0,
        max_waiting: int = 1024,
        on_joined: Callable[[Batch, list[float]], None] | None = None,
        on_done: Callable[[Batch], None] | None = None,
    ) -> None:
        """Start the decode loop `submit` feeds, in its own thread (SchedulerThread says what `policy` and each limit
        mean); on_joined(batch, waits) and on_done(batch) are called from it as a batch joins and leaves (metrics)."""
        if self._loop is not None:
            return
        builder = self._builder

        def finished(requests: list[DecodeRequest]) -> list[Translation]:  # a step's finished texts, built together
            built = builder.translations([r.source_ids for r in requests], [r.hypotheses for r in requests],
                                         [r.return_attention for r in requests])
            for request, translation in zip(requests, built, strict=True):
                translation.search_note = request.note
            return built

        self._loop = SchedulerThread(
            self.model, max_rows=max_rows, max_waiting=max_waiting, alignment_head=self.alignment_head,
            step=self.step, policy=policy, max_texts=max_texts, gather_s=gather_s, finish=finished,
            on_joined=on_joined, on_done=on_done, word_continuations=self.word_continuations,
        )

    @property
    def decoder_rows(self) -> int:
        """Rows the decode loop is decoding now (0 without one)."""
        return self._loop.scheduler.rows if self._loop is not None else 0

    def submit(
        self,
        text: str,
        options: DecodingOptions | None = None,
        *,
        return_attention: bool = False,
        on_token: Callable[[StreamedToken], None] | None = None,
        source_ids: list[int] | None = None,
        terms: list[str] | None = None,
        **settings,
    ) -> Future:
        """`submit_all` of one text. `on_token(StreamedToken)` is called from the loop's thread as tokens settle:
        under beam search those every live beam shares, so they are always a prefix of the answer."""
        return self.submit_all([text], options, return_attention=return_attention, on_token=on_token,
                               source_ids=None if source_ids is None else [source_ids],
                               terms=None if terms is None else [terms], **settings)[0]

    def submit_all(
        self,
        texts: list[str],
        options: DecodingOptions | None = None,
        *,
        return_attention: bool = False,
        on_token: Callable[[StreamedToken], None] | None = None,
        source_ids: list[list[int]] | None = None,
        terms: list[list[str]] | None = None,
        **settings,
    ) -> list[Future]:
        """Translate texts through the decode loop (`start_loop` first), queued together so that they join it at
        one step: a Future each of its Translation, equal to `translate(texts, options)`'s. `source_ids`: the texts'
        `encode_source` ids, where known; `terms`: per text, target terms its translation contains; `on_token`: see
        `submit` (one text only). InvalidInputError / InputTooLongError at once, DecoderBusyError (none queued) when
        the queue is full."""
        if self._loop is None:
            raise RuntimeError("call start_loop() before submit()")
        if on_token is not None and len(texts) != 1:
            raise ValueError("on_token streams one text")
        options = decoding_options(options, settings)
        source_ids, wanted = self._inputs(texts, source_ids, terms)
        streamed = self._builder.streamed(on_token) if on_token is not None else None
        futures: list[Future | None] = [None] * len(texts)
        requests, queued = [], []
        for i, text in enumerate(texts):
            if not text.strip():
                futures[i] = Future()
                futures[i].set_result(blank_translation())
                continue
            used, note = self._constrained(options, wanted[i])
            requests.append(request_of(source_ids[i], used, return_attention, streamed, alignment_rows=True,
                                       constraints=wanted[i], note=note))
            queued.append(i)
        for i, future in zip(queued, self._loop.submit_all(requests), strict=True):
            futures[i] = future
        return futures

    def cancel(self, future: Future) -> None:
        """Stop decoding a text `submit` returned `future` for (its caller went away); frees its rows."""
        if self._loop is not None:
            self._loop.cancel(future)

    def with_agreement(self, translation: Translation, reverse: Translator) -> Translation:
        """`with_agreements` of one translation."""
        return self.with_agreements([translation], reverse)[0]

    def with_agreements(
        self, translations: list[Translation], reverse: Translator, reading: ReverseReading | None = None
    ) -> list[Translation]:
        """`translations` (made without `reverse`, and their alternatives) with the alignment agreed with `reverse`,
        as `translate(..., reverse=reverse)` gives it; `reading`: the reverse model's to share with `assess`."""
        return self._aligner.with_agreements(translations, reverse._aligner, reading)

    def reverse_reading(self, rows: bool = True, logprobs: bool = True) -> ReverseReading:
        """This model's reading, as the reverse model, of translations forced back: one to share between
        `with_agreements` (rows) and `assess` "full" (log-probabilities) of the other model over one batch."""
        return ReverseReading(self._aligner, rows, logprobs)

    def assess(
        self,
        translations: list[Translation],
        mode: str = "fast",
        reverse: Translator | None = None,
        options: DecodingOptions | None = None,
        reading: ReverseReading | None = None,
    ) -> None:
        """Set `trust` on every translation and alternative (model.trust): "fast" from the decode alone, "full" also
        from `reverse` forced back over each pair (else "fast"; `reading`: shared with `with_agreements`), "off" none;
        `options`: what they were decoded with."""
        aligner = reverse._aligner if reverse is not None else None
        self._assessor.assess(translations, mode, aligner, options, self.calibration, reading)

    def trust_fit(self, mode: str):
        """The calibration's fit of `mode` ("fast", "full") for these weights, or None: the uncalibrated default."""
        return calibration_fit(self.calibration, mode)

    @property
    def trust_info(self) -> dict:
        """What GET /v1/models says of this model's trust score."""
        return calibration_info(self.calibration)

    def alignment_rows(self, source: str, target: str) -> AlignmentRows:
        """The alignment head's rows (read as declared) with `target` forced after `source`: a reverse model's part
        of `agreed_alignment`. InputTooLongError past the positions."""
        return self._aligner.forced_rows([self._aligner.pair_ids(source, target)])[0]

    def force(self, source: str, target: str) -> Translation:
        """The Translation this model gives `source` had its search chosen `target` (forced through the exact
        model), without alternatives: for assessing a translation made elsewhere."""
        return self._explainer.force(source, target)

    def explain(
        self, source_ids: list[int], target_ids: list[int], encoder_attention: bool = False,
        reverse: Translator | None = None,
    ) -> Explanation:
        """Teacher-force `target_ids` (eos included) after `source_ids` through the step that decodes (its decode loop,
        kernels and precision): the maps, token scores and alignments `translate` gave for that output (with the same
        `reverse`: agreed with it), plus (encoder_attention) the exact model's encoder maps."""
        return self._explainer.explain(
            source_ids, target_ids, encoder_attention, reverse._aligner if reverse is not None else None
        )

    def attribute(
        self, source_ids: list[int], target_ids: list[int], method: str = "alti_plus", steps: int | None = None
    ) -> Attributions:
        """How much each source and earlier target token made each of `target_ids` (eos included), by `method`
        (model.explanations.attribution.METHODS; `steps` for integrated gradients)."""
        return self._explainer.attribute(source_ids, target_ids, method, steps)

    def attention_steps(
        self, source_ids: list[int], target_ids: list[int], kind: str, layer: int | None, head: int, position: int
    ) -> AttentionSteps:
        """One head's attention at one query position, step by step (layer None: the alignment layer for
        cross-attention, the last encoder layer for encoder self-attention)."""
        return self._explainer.attention_steps(source_ids, target_ids, kind, layer, head, position)
