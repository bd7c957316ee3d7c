"""The public engine API: load a Marian directory, translate, and say which source words produced which output.

tr = Translator.from_pretrained("en-zh")          # a shipped model by name, or a directory
out = tr.translate(["The cat sat."], beam_size=4, return_attention=True)
out[0].text, out[0].alignment, out[0].cross_attention
"""

from __future__ import annotations

import copy
import functools
import hashlib
import logging
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from model.agreeing import Aligner
from model.assessment import Assessor, calibration_fit, calibration_info
from model.checkpoint import WEIGHTS_NAME, load_model, read_model_card
from model.decoding.scheduler import Batch, DecodeLoop, DecodeRequest, Policy, TokenCallback
from model.decoding.search import Hypothesis, beam_search
from model.errors import InputTooLongError, InvalidInputError, UnknownModelError
from model.explanations.agreement import (
    AlignmentItem,
    AlignmentMethod,
    AlignmentRows,
)
from model.explanations.alignment import alignment_matrix
from model.explanations.attribution import Attributions, attribute
from model.explanations.explain import (
    AttentionSteps,
    attention_steps,
    check_ids,
    encoder_self_attention,
    forced_decode,
)
from model.host import matrices_to_lists
from model.options import DecodingOptions
from model.runtime import cast_weights, forced_pass, load_step
from model.runtime.step import weights_precision
from model.tokenizer import MarianTokenizer
from model.transformer import Transformer
from model.trust import Calibration, Trust

logger = logging.getLogger(__name__)

PRETRAINED_DIR = Path(__file__).resolve().parent / "pretrained"
DTYPE_NAMES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "int8": torch.int8}


def pretrained_names() -> list[str]:
    """Names of the models shipped in model/pretrained/."""
    if not PRETRAINED_DIR.is_dir():
        return []
    return sorted(p.name for p in PRETRAINED_DIR.iterdir() if (p / "config.json").is_file())


def resolve_model_path(name_or_path: str | Path) -> Path:
    """A shipped model's name ("en-zh") or a directory path → the directory."""
    candidate = Path(name_or_path)
    if candidate.is_dir():
        return candidate
    if isinstance(name_or_path, str) and "/" not in name_or_path and (PRETRAINED_DIR / name_or_path).is_dir():
        return PRETRAINED_DIR / name_or_path
    raise UnknownModelError(
        f"no model directory at {str(name_or_path)!r}; shipped models: {', '.join(pretrained_names()) or 'none'}"
    )


def resolved_dtype(dtype, device: torch.device):
    """`dtype` with "auto" made the fast mode measured for `device`: int8 on a CPU (the compiled runtime's; where
    it cannot be built int8 decodes in float32, and runtime_info says so), float32 on a GPU (there the shipped
    models are launch-bound, and half precision was no faster: docs/decisions.md)."""
    if dtype == "auto":
        return "int8" if device.type == "cpu" else "float32"
    return dtype


def pick_device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


@dataclass
class Translation:
    """One translated text, its tokens, scores and the attention that produced it."""

    text: str
    source_tokens: list[str]
    target_tokens: list[str]
    source_ids: list[int]
    target_ids: list[int]
    score: float
    token_logprobs: list[float]
    alignment: list[tuple[int, int]]  # (source token index, target token index), one per target token
    word_alignment: list[tuple[int, int]]  # (source word index, target word index)
    source_words: list[str]
    target_words: list[str]
    cross_attention: Tensor | None = None  # (layers, heads, T, S)
    alternatives: list[Translation] = field(default_factory=list)
    # HEAD: one link per target token; AGREEMENT: model.explanations.agreement
    alignment_method: AlignmentMethod = AlignmentMethod.HEAD
    alignment_note: str | None = None  # why "agreement" was asked for and "head" given
    # the alignment head's rows (T, S) as decoded, unread: what an agreement after decoding starts from
    alignment_rows: Tensor | None = field(default=None, repr=False, compare=False)
    trust: Trust | None = None  # how far to believe it (Translator.assess; model.trust)


@dataclass
class StreamedToken:
    """One token as greedy decoding produced it (Translator.submit's on_token)."""

    index: int  # position in the output, from 0; the last streamed token is </s>
    token_id: int
    piece: str
    logprob: float
    attention: list[float] | None  # the alignment head's weights over the source tokens (</s> last) at this step


@dataclass
class Explanation:
    """A given (source, target) pair run through the model by teacher forcing: the maps that produced it."""

    source_ids: list[int]
    target_ids: list[int]
    source_tokens: list[str]
    target_tokens: list[str]
    source_text: str
    text: str
    token_logprobs: list[float]
    alignment: list[tuple[int, int]]
    word_alignment: list[tuple[int, int]]
    source_words: list[str]
    target_words: list[str]
    alignment_head: tuple[int, int | None]
    cross_attention: Tensor  # (decoder_layers, heads, T, S)
    encoder_self_attention: Tensor | None = None  # (encoder_layers, heads, S, S)
    alignment_shift: bool = False  # alignments read at the step where each target token is the decoder's input
    alignment_method: AlignmentMethod = AlignmentMethod.HEAD  # as Translation's
    alignment_note: str | None = None


def blank_translation() -> Translation:
    """What a blank text translates to: nothing, with nothing to explain."""
    return Translation("", [], [], [], [], 0.0, [], [], [], [], [], None)


def decoding_options(options: DecodingOptions | None, settings: dict) -> DecodingOptions:
    """`options`, or one built from keyword settings (`num_return_sequences` is n_best's transformers name)."""
    settings = dict(settings)
    if "num_return_sequences" in settings:
        settings["n_best"] = settings.pop("num_return_sequences")
    unknown = set(settings) - set(DecodingOptions.__dataclass_fields__)
    if unknown:
        raise TypeError(f"unknown decoding settings: {', '.join(sorted(unknown))}")
    if options is not None and settings:
        raise TypeError("give DecodingOptions or keyword settings, not both")
    return options if options is not None else DecodingOptions(**settings)


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
        # How each decoding step runs: the compiled runtime where it builds and suits, else the model's eager step
        # (model.runtime.load_step; `runtime_info` says which and why).
        self.step = step if step is not None else load_step(model, weights_precision(model))
        # What the lecture's arithmetic explains with (attention_steps, attribute, encoder maps, forced rows): the
        # decoding model itself, except where the step decodes on weights in a lower precision (the CPU's bf16
        # mode), whose float32 original it is (see from_pretrained).
        self.exact_model = exact_model if exact_model is not None else model
        self.tokenizer = tokenizer
        self.name = name
        self.weights_digest = weights_digest
        self.config = model.config
        # Which head alignments are read from and why: config.json's declaration, else what the model card
        # (README.md) says of the training recipe (ModelConfig.alignment_source).
        self.alignment = self.config.alignment_source(model_card)
        # The trust score's fit (trust.json beside the weights), or None: the uncalibrated default (model.trust).
        self.calibration = calibration

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | Path,
        device: str | torch.device | None = None,
        dtype: torch.dtype | str | None = None,
    ) -> Translator:
        """Load a Marian directory (or a shipped model by name) onto `device` (None: cuda if available).

        dtype: a torch dtype or its name ("float32", "bfloat16", "float16", "int8", "auto"); None is float32,
        the exact reference. On a GPU a half dtype runs natively; on the CPU it stores the matrices in it around
        fp32 activations. "auto" (the service's default) is the fast mode measured for the device: int8 on a CPU
        (float32 where the compiled runtime cannot be built, as below), float32 on a GPU.

        "int8" (torch.int8; CPU only) decodes through the compiled runtime with int8 weights quantized at load
        time from the fp32 safetensors wherever int8 is faster here, and int8 activations quantized per row
        (model/runtime), the best candidates' logits recomputed in fp32. Explanations (`explain`,
        `attention_steps`, `attribute`) run the fp32 model over the tokens the int8 search chose: their maps
        and arithmetic are the exact model's, which may differ from the int8 numbers `translate` returned with
        its alignments by quantization error. Without the compiled runtime int8 decodes in float32 eagerly
        (`runtime_info` says so).
        """
        directory = resolve_model_path(name_or_path)
        target = pick_device(device)
        dtype = resolved_dtype(dtype, target)
        if isinstance(dtype, str):
            if dtype not in DTYPE_NAMES:
                raise InvalidInputError(f"dtype must be one of {', '.join(DTYPE_NAMES)} or auto")
            dtype = DTYPE_NAMES[dtype]
        dtype = dtype or torch.float32
        step = exact_model = None
        if dtype == torch.int8:
            if target.type != "cpu":
                raise InvalidInputError("dtype int8 runs on the CPU only; use bfloat16 or float16 on a GPU")
            model = load_model(directory)
            step = load_step(model, "int8")
        elif target.type == "cuda" and dtype != torch.float32:
            # A GPU runs half precision natively (weights, activations and cache in dtype; log-softmax in
            # fp32): the CPU's mode (bf16 matrices around fp32 activations, model.runtime.cast_weights)
            # would add a cast around every matmul there.
            model = load_model(directory).to(target).to(dtype)
        else:
            model = load_model(directory).to(target)
            if dtype != torch.float32:  # the CPU's mode: the eager step decodes on a copy with matrices in dtype,
                exact_model = model  # explanations' arithmetic (steps, attributions) stays in float32, as under int8
                model = cast_weights(copy.deepcopy(model), dtype)
        tokenizer = MarianTokenizer.from_directory(directory)
        if tokenizer.eos_id != model.config.eos_token_id:
            logger.warning(
                "vocab.json's </s> id %d differs from config eos_token_id %d",
                tokenizer.eos_id,
                model.config.eos_token_id,
            )
        digest = hashlib.sha256((directory / WEIGHTS_NAME).read_bytes()).hexdigest()[:16]
        return cls(
            model,
            tokenizer,
            name=directory.name,
            weights_digest=digest,
            exact_model=exact_model,
            step=step,
            model_card=read_model_card(directory),
            calibration=Calibration.load(directory, digest),
        )

    @property
    def device(self) -> torch.device:
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
        """How the step-by-step arithmetic of one head (`attention_steps`), attributions and encoder maps are
        computed: the exact model's weights, "float32" under int8 and the CPU's bfloat16."""
        return weights_precision(self.exact_model)

    @property
    def alignment_layer(self) -> int:
        """The decoder layer alignments are read from (see alignment_head)."""
        return self.alignment.layer

    @property
    def alignment_head(self) -> tuple[int, int | None]:
        """(layer, head) of the alignment head; head None means the layer's head average.

        A model trained with guided alignment may declare it in config.json (alignment_layer, alignment_head);
        without a declaration, Marian's: the last decoder layer's head 0, unless the model card says the model
        was trained without guided alignment (then the penultimate layer's head average). `alignment.reason`
        says which.
        """
        return self.alignment.layer, self.alignment.head

    @property
    def alignment_shift(self) -> bool:
        """True when target token t's alignment is read at the step where t is the decoder's input
        (the model declares `alignment_shift` in config.json), else at the step that predicts t."""
        return self.config.alignment_shift

    def encode_source(self, texts: list[str]) -> list[list[int]]:
        """Texts → vocabulary ids with the final </s> (the ids MarianTokenizer gives)."""
        if isinstance(texts, str) or not isinstance(texts, list):
            raise InvalidInputError("texts must be a list of strings")
        ids = []
        for index, text in enumerate(texts):
            if not isinstance(text, str):
                raise InvalidInputError(f"texts[{index}] is not a string")
            encoded = self.tokenizer.encode_source(text)
            if len(encoded) > self.config.max_position_embeddings:
                raise InputTooLongError(
                    f"texts[{index}] has {len(encoded)} tokens; "
                    f"this model accepts at most {self.config.max_position_embeddings}"
                )
            ids.append(encoded)
        return ids

    def generate(
        self,
        source_ids: list[list[int]],
        options: DecodingOptions | None = None,
        *,
        return_attention: bool = False,
        alignment_attention: bool = False,
        **settings,
    ) -> list[list[Hypothesis]]:
        """Decode id sequences; per input a list of hypotheses, best first.

        Give a `DecodingOptions`, or its fields by keyword (transformers' `num_return_sequences`
        is accepted for n_best): `generate(ids, beam_size=4, max_new_tokens=64)`.
        return_attention: each hypothesis carries every layer's and head's cross-attention;
        alignment_attention: only the alignment head's rows (Hypothesis.alignment_attention).
        """
        options = decoding_options(options, settings)
        if not source_ids:
            return []
        vocab = self.config.vocab_size
        for index, ids in enumerate(source_ids):
            if not ids or any((not isinstance(i, int)) or i < 0 or i >= vocab for i in ids):
                raise InvalidInputError(f"source_ids[{index}] must be a non-empty list of ids below {vocab}")
            if len(ids) > self.config.max_position_embeddings:
                raise InputTooLongError(f"source_ids[{index}] is longer than max_position_embeddings")
        head = self.alignment_head if alignment_attention else None
        return beam_search(
            self.model, source_ids, options, return_attention=return_attention, alignment_head=head, step=self.step
        )

    def translate(
        self,
        texts: list[str],
        options: DecodingOptions | None = None,
        *,
        return_attention: bool = False,
        reverse: Translator | None = None,
        source_ids: list[list[int]] | None = None,
        **settings,
    ) -> list[Translation]:
        """Translate texts with `options` (or its fields by keyword, as `generate`).

        Alignments are always computed (from the alignment head's captured rows); every layer's and
        head's attention is captured and returned only when return_attention is true. A blank text
        translates to "" without running the model. With `reverse` (a model translating the other way)
        the alignments are its and this model's agreed ones (`agreed_alignment`), else the head's one-best.
        `source_ids`: the texts' `encode_source` ids where the caller already has them (not encoded again).
        """
        options = decoding_options(options, settings)
        if source_ids is None:
            source_ids = self.encode_source(texts)
        elif len(source_ids) != len(texts):
            raise InvalidInputError(f"{len(source_ids)} source id lists for {len(texts)} texts")
        blank = [not text.strip() for text in texts]
        nbest_of_text = self.generate(
            [ids for ids, empty in zip(source_ids, blank, strict=True) if not empty],
            options,
            return_attention=return_attention,
            alignment_attention=not return_attention,
        )
        nbest_iter = iter(nbest_of_text)
        nbest = [[] if empty else next(nbest_iter) for empty in blank]
        results = self._translations(source_ids, nbest, [return_attention] * len(texts))
        return results if reverse is None else self.with_agreements(results, reverse)

    def _translations(
        self, source_ids: list[list[int]], nbest: list[list[Hypothesis]], keep_attention: list[bool]
    ) -> list[Translation]:
        """The Translations of decoded texts (their n-best, best first; [] for a blank text). Every hypothesis's
        alignment rows come to the host in one read; what follows is Python over those lists."""
        matrices = [self._alignment_matrix(h) for hs in nbest for h in hs]
        aligned = iter(zip(matrices, matrices_to_lists([self._aligner.read_rows(m) for m in matrices]), strict=True))
        results = []
        for ids, hypotheses, keep in zip(source_ids, nbest, keep_attention, strict=True):
            if not hypotheses:
                results.append(blank_translation())
                continue
            built = [self._build(ids, h, keep, *next(aligned)) for h in hypotheses]
            best = built[0]
            best.alternatives = built[1:]
            results.append(best)
        return results

    # ---- the decode loop -----------------------------------------------------------------------
    _loop: DecodeLoop | None = None

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
        """Start the decode loop `submit` feeds (model.decoding.scheduler.DecodeLoop), in its own thread: under
        policy "continuous" texts join and leave the running decode at every step, under "static" a batch of up to
        max_texts joins once the loop is empty (after waiting up to gather_s for company); either way each is
        decoded as if alone. max_rows: decoder rows in flight (a beam of k takes k). on_joined(batch, waits) and
        on_done(batch): called from the loop's thread as a batch joins and as its last text leaves (metrics)."""
        if self._loop is None:
            self._loop = DecodeLoop(
                self.model,
                max_rows=max_rows,
                max_waiting=max_waiting,
                alignment_head=self.alignment_head,
                step=self.step,
                policy=policy,
                max_texts=max_texts,
                gather_s=gather_s,
                finish=self._finished_requests,
                on_joined=on_joined,
                on_done=on_done,
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
        **settings,
    ) -> Future:
        """Translate one text through the decode loop (`start_loop` first): a Future of its Translation, equal to
        `translate([text], options)[0]`. `on_token(StreamedToken)` is called from the loop's thread as tokens
        are settled: under greedy decoding each as it is decoded, under beam search those every beam still in the
        running shares, so the tokens streamed are always a prefix of the answer.
        `source_ids`: the text's `encode_source` ids where the caller already has them (not encoded again).
        Raises InvalidInputError / InputTooLongError at once, DecoderBusyError when the queue is full."""
        if self._loop is None:
            raise RuntimeError("call start_loop() before submit()")
        options = decoding_options(options, settings)
        if source_ids is None:
            (source_ids,) = self.encode_source([text])
        if not text.strip():
            result: Future = Future()
            result.set_result(blank_translation())
            return result
        if on_token is not None:
            on_token = self._streamed(on_token)
        return self._loop.submit(source_ids, options, return_attention, on_token, alignment_rows=True)

    def _finished_requests(self, requests: list[DecodeRequest]) -> list[Translation]:
        """The loop's `finish`: the Translations of the requests one step finished, built together."""
        return self._translations(
            [r.source_ids for r in requests], [r.hypotheses for r in requests], [r.return_attention for r in requests]
        )

    def _streamed(self, on_token: Callable[[StreamedToken], None]) -> TokenCallback:
        def streamed(request, token_id: int, logprob: float, attention: Tensor | None) -> None:
            # attention: the alignment head's row (S,), or every head's (layers, heads, S) where the text keeps
            # its maps (return_attention), whose alignment head's row is read as for a whole output
            row = None
            if attention is not None:
                one_head = attention if attention.dim() == 1 else alignment_matrix(attention, *self.alignment_head)
                row = one_head.tolist()
            piece = self.tokenizer.target_tokens([token_id])[0]
            on_token(StreamedToken(request.step - 1, token_id, piece, logprob, row))

        return streamed

    def cancel(self, future: Future) -> None:
        """Stop decoding a text `submit` returned `future` for (its caller went away); frees its rows."""
        if self._loop is not None:
            self._loop.cancel(future)

    def _alignment_matrix(self, hypothesis: Hypothesis) -> Tensor:
        """The alignment head's (T, S) rows of a hypothesis, unread (from its maps where it kept them)."""
        attention = hypothesis.cross_attention
        if attention is not None:
            return alignment_matrix(attention, *self.alignment_head)
        return hypothesis.alignment_attention

    def _build(
        self, source_ids: list[int], hypothesis: Hypothesis, keep_attention: bool, matrix: Tensor | None = None,
        rows: list[list[float]] | None = None,
    ) -> Translation:
        """A Translation of one hypothesis; `matrix` and `rows`: its alignment rows (`_alignment_matrix`) and the
        same read, as host lists, where the caller made them for a whole batch, else made here."""
        source_tokens = self.tokenizer.source_tokens(source_ids)
        target_tokens = self.tokenizer.target_tokens(hypothesis.token_ids)
        attention = hypothesis.cross_attention
        if matrix is None:
            matrix = self._alignment_matrix(hypothesis)
        pairs, words = self._aligner.links(matrix, source_tokens, target_tokens, rows)
        return Translation(
            text=self.tokenizer.detokenize(hypothesis.token_ids),
            source_tokens=source_tokens,
            target_tokens=target_tokens,
            source_ids=list(source_ids),
            target_ids=list(hypothesis.token_ids),
            score=hypothesis.score,
            token_logprobs=hypothesis.token_logprobs,
            alignment=pairs,
            word_alignment=words[0],
            source_words=words[1],
            target_words=words[2],
            cross_attention=attention if keep_attention else None,
            alignment_rows=matrix,
        )

    def with_agreement(self, translation: Translation, reverse: Translator) -> Translation:
        """`with_agreements` of one translation."""
        return self.with_agreements([translation], reverse)[0]

    def with_agreements(self, translations: list[Translation], reverse: Translator) -> list[Translation]:
        """`translations` (made without `reverse`, and their alternatives) with the alignment agreed with `reverse`,
        as `translate(..., reverse=reverse)` gives it: for choosing the alignment after decoding. This model's rows
        are the decode's own (under int8 they differ from an explanation's float32 rows by quantization error, as
        the inline attention does); the reverse model's forced decodes for all of them share batches."""
        return self._aligner.with_agreements(translations, reverse)

    def assess(
        self,
        translations: list[Translation],
        mode: str = "fast",
        reverse: Translator | None = None,
        options: DecodingOptions | None = None,
    ) -> None:
        """Set `trust` on every translation and alternative (model.trust). mode "fast": from the decode alone;
        "full": also the reverse model's log-probabilities of the source forced after each translation (their
        forced decodes share batches; without `reverse` "full" is "fast"). "off": trust stays None. `options`: what
        the translations were decoded with (their length budget tells a truncated hypothesis; default: defaults)."""
        self._assessor.assess(translations, mode, reverse, options)

    @functools.cached_property
    def _assessor(self) -> Assessor:
        return Assessor(self)

    def trust_fit(self, mode: str):
        """The calibration's fit of `mode` ("fast", "full") for these weights, or None (no trust.json, or one fitted
        on other weights): the score is then the uncalibrated default."""
        return calibration_fit(self.calibration, mode)

    @property
    def trust_info(self) -> dict:
        """What GET /v1/models says of this model's trust score."""
        return calibration_info(self.calibration)

    @functools.cached_property
    def _aligner(self) -> Aligner:
        return Aligner(self)

    def alignment_rows(self, source: str, target: str) -> AlignmentRows:
        """The alignment head's rows (read as the model declares) when `target` is forced after `source`:
        what a reverse model contributes to `agreed_alignment`. Raises InputTooLongError past the positions."""
        return self._aligner.forced_rows([self._aligner.pair_ids(source, target)])[0]

    def force(self, source: str, target: str) -> Translation:
        """The Translation this model gives `source` had its search chosen `target` (teacher-forced by the exact
        model: its token log-probabilities and alignment head), without alternatives: for assessing a translation
        made elsewhere (`assess`). Raises InputTooLongError past the model's positions."""
        source_ids, target_ids = self._aligner.pair_ids(source, target)
        decoded = forced_decode(self.exact_model, source_ids, target_ids, encoder_attention=False)
        hypothesis = Hypothesis(
            token_ids=target_ids,
            score=sum(decoded.token_logprobs),
            token_logprobs=decoded.token_logprobs,
            cross_attention=None,
            normalized_score=0.0,
            alignment_attention=alignment_matrix(decoded.cross_attention, *self.alignment_head),
        )
        return self._build(source_ids, hypothesis, keep_attention=False)

    def explain(
        self,
        source_ids: list[int],
        target_ids: list[int],
        encoder_attention: bool = False,
        reverse: Translator | None = None,
    ) -> Explanation:
        """Teacher-force `target_ids` (eos included) after `source_ids` through the step that decodes (its kernels
        and precision: model.runtime.forced_pass): the maps, token scores and alignments `translate` gave for that
        output (with the same `reverse`: agreed with it, as `translate`), plus (encoder_attention) the encoder's
        self-attention, which the exact model computes (the step keeps no encoder maps)."""
        check_ids(self.model, list(source_ids), list(target_ids))
        decoded = forced_pass(self.step, list(source_ids), list(target_ids))
        encoder_maps = encoder_self_attention(self.exact_model, source_ids) if encoder_attention else None
        source_tokens = self.tokenizer.source_tokens(source_ids)
        target_tokens = self.tokenizer.target_tokens(target_ids)
        matrix = alignment_matrix(decoded.cross_attention, *self.alignment_head)
        pairs, words = self._aligner.links(matrix, source_tokens, target_tokens)
        (agreed,) = self._aligner.agreements(
            [AlignmentItem(list(source_ids), list(target_ids), pairs, words[0], matrix)], reverse
        )
        return Explanation(
            source_ids=list(source_ids),
            target_ids=list(target_ids),
            source_tokens=source_tokens,
            target_tokens=target_tokens,
            source_text=self.tokenizer.source_text(source_ids),
            text=self.tokenizer.detokenize(target_ids),
            token_logprobs=decoded.token_logprobs,
            alignment=agreed.token_links,
            word_alignment=agreed.word_links,
            source_words=words[1],
            target_words=words[2],
            alignment_head=self.alignment_head,
            alignment_shift=self.alignment_shift,
            cross_attention=decoded.cross_attention,
            encoder_self_attention=encoder_maps,
            alignment_method=agreed.method,
            alignment_note=agreed.note,
        )

    def attribute(
        self, source_ids: list[int], target_ids: list[int], method: str = "alti_plus", steps: int | None = None
    ) -> Attributions:
        """How much each source token and each earlier target token made each of `target_ids` (eos
        included): one of model.explanations.attribution.METHODS; `steps` for integrated gradients."""
        unknown_ids = (self.tokenizer.source_unk_id, self.tokenizer.target_unk_id)
        return attribute(self.exact_model, list(source_ids), list(target_ids), method, unknown_ids, steps)

    def attention_steps(
        self, source_ids: list[int], target_ids: list[int], kind: str, layer: int | None, head: int, position: int
    ) -> AttentionSteps:
        """One head's attention at one query position, step by step (layer None: the alignment layer
        for cross-attention, the last encoder layer for encoder self-attention)."""
        if layer is None:
            layer = self.alignment_layer if kind == "cross" else self.config.encoder_layers - 1
        return attention_steps(self.exact_model, list(source_ids), list(target_ids), kind, layer, head, position)
