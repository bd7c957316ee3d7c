"""The REST API v1, as pydantic models: requests, responses and errors. FastAPI turns this file into /docs.

Limits live here as constants so that /openapi.json states them and validation enforces them.
"""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

from model import (
    ALIGNMENT_METHODS,
    ATTRIBUTION_DEFAULT_STEPS,
    ATTRIBUTION_MAX_STEPS,
    ATTRIBUTION_METHODS,
    DEFAULT_ALIGNMENT,
    DEFAULT_TRUST_MODE,
    FLAG_KINDS,
    TRUST_MODES,
    DecodingOptions,
)
from service.explanations import MAX_ID_CHARS
from service.glossaries import MAX_INLINE_ENTRIES

# /v1's limits (the compatibility routes have their own: service/compat/translation.py).
V1_MAX_TEXTS = 64  # texts per request
V1_MAX_TEXT_CHARS = 2000  # characters per text
MAX_BEAM_SIZE = 8
DEFAULT_BEAM_SIZE = 4
MAX_LENGTH = 512

AttentionLevel = Literal["none", "summary", "full"]
AttentionKind = Literal["cross", "encoder_self"]
ExplainMethod = Literal[
    "attention", "saliency", "input_x_gradient", "integrated_gradients", "value_zeroing", "alti_plus"
]
assert get_args(ExplainMethod)[1:] == ATTRIBUTION_METHODS, "the API's methods are the engine's"
DEFAULT_STEPS, MAX_ATTRIBUTION_STEPS = ATTRIBUTION_DEFAULT_STEPS, ATTRIBUTION_MAX_STEPS
AlignmentMethod = Literal["agreement", "head"]
TrustMode = Literal["off", "fast", "full"]
assert get_args(TrustMode) == TRUST_MODES, "the API's trust modes are the engine's"
FlagKind = Literal["omission", "addition", "repetition", "untranslated", "truncated"]
assert get_args(FlagKind) == FLAG_KINDS, "the API's flag kinds are the engine's"
assert get_args(AlignmentMethod) == ALIGNMENT_METHODS, "the API's alignment methods are the engine's"
ALIGNMENT_METHOD_HELP = (
    "\"agreement\": the links the model's alignment head and the reverse model's (the served model translating "
    "target_lang→source_lang, forced to write the source back from the translation) agree on: a word may have no "
    'link or several (in domain AER 21–23 against the head\'s 24–31, docs/explanations.md). "head": per target token '
    "the source token the alignment head weighs most. Where no reverse model is served, or it cannot read the pair, "
    '"agreement" falls back to "head"; `alignment_method` and `alignment_note` in the answer say which was given.'
)
Text = Annotated[
    str,
    Field(
        max_length=V1_MAX_TEXT_CHARS,
        description=f"At most {V1_MAX_TEXT_CHARS} characters and at most the model's max_source_tokens "
        "sentencepiece tokens (GET /v1/models; 256 for the shipped models, which English text reaches at about "
        "800–950 characters and Chinese at about 280–340): answered 413 input_too_long beyond either. With "
        "split_sentences (the default) the token limit applies to each sentence of the text.",
    ),
]
ModelId = Annotated[str, Field(min_length=1, max_length=64, description="A model id from GET /v1/models.")]
Language = Annotated[str, Field(min_length=2, max_length=16, pattern=r"^[A-Za-z-]+$")]
AlignmentPair = Annotated[list[int], Field(min_length=2, max_length=2, description="[source_index, target_index]")]
CharSpan = Annotated[list[int], Field(min_length=2, max_length=2, description="[start, end) character offsets")]


class ModelChoice(BaseModel):
    """Pick a model by id, or by language pair."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model: ModelId | None = Field(None, description="Model id; alternative to source_lang + target_lang.")
    source_lang: Language | None = Field(None, examples=["en"])
    target_lang: Language | None = Field(None, examples=["zh"])


class TranslateRequest(ModelChoice):
    """POST /v1/translate."""

    texts: list[Text] = Field(min_length=1, max_length=V1_MAX_TEXTS, examples=[["The cat sat on the mat."]])
    beam_size: int = Field(DEFAULT_BEAM_SIZE, ge=1, le=MAX_BEAM_SIZE, description="1 is greedy decoding.")
    n_best: int = Field(1, ge=1, le=MAX_BEAM_SIZE, description="Hypotheses per text (best first); at most beam_size.")
    max_length: int | None = Field(
        None, ge=1, le=MAX_LENGTH, description="Most target tokens to generate; default 2 × source + 10."
    )
    min_length: int = Field(
        0,
        ge=0,
        le=MAX_LENGTH,
        description="Fewest target tokens before </s> may end a translation (transformers' min_new_tokens); "
        "at most max_length.",
    )
    attention: AttentionLevel = Field(
        "none",
        description='"summary": the cross-attention of the alignment head (the map `alignment` is read from); '
        '"full": also every layer and head. The explanation_id gives the same maps later.',
    )
    source_share: bool = Field(
        False,
        description="true: each translation also carries `token_source_shares` and `source_share`: how much of "
        "each target token came from the source rather than from the target prefix (ALTI+, Ferrando et al. "
        "2022): how a token was made, not whether it is right (`trust` is that); costs one more pass.",
    )
    alignment_method: AlignmentMethod = Field(
        DEFAULT_ALIGNMENT["translate"].value,
        description=ALIGNMENT_METHOD_HELP + ' Default "head" here: "agreement" costs a forced decode of the reverse '
        "model per hypothesis (the texts of a batch share it: +34–39 % CPU per text under float32 decoding, +98–170 % "
        "under int8, for the shipped models; docs/rest-api.md). The explanation_id remembers the method given.",
    )
    trust: TrustMode = Field(
        DEFAULT_TRUST_MODE,
        description='How far to believe each translation (`trust` on every hypothesis): "fast" from the decode '
        'alone (under 10 % more CPU per sentence); "full" also forces the reverse model over each translation '
        "(its log-probability of the source among the signals, and omission flags it confirms; the same score, "
        "which no other signal improved on held-out sets; one forced decode per hypothesis, more CPU than the "
        'decode); "off": no `trust`. docs/explanations.md ("Trust") has the measurements.',
    )
    split_sentences: bool = Field(
        True,
        description="Cut each text into sentences (at sentence ends, line breaks kept) and decode them as separate "
        "texts of the same batch: a text of several sentences is answered with `sentences` (one translation object "
        "each, with its own explanation_id) and `text` joined from them. false: each text is decoded whole. "
        "beam_size, n_best and max_length apply per sentence; a single sentence longer than the model accepts is "
        "still answered 413.",
    )

    protect: bool = Field(
        True,
        description="Keep placeholders (%s, %1$s, %(name)s, {name}, {0}, {{name}}, ${var}, ICU {count, plural, …} "
        "blocks), URLs, e-mail addresses and numbers of three digits or more byte for byte: the model reads a "
        "stand-in for each, and the span is put back where the stand-in went in the translation; each translation "
        "lists them in `protected`. false: the text goes to the model as written.",
    )

    glossary: dict[str, str] | None = Field(
        None,
        max_length=MAX_INLINE_ENTRIES,
        description="Terms to use: {source term: target term}. A term applies where its source side occurs in a "
        "text (whole words, case-insensitively, for English; the characters, for Chinese); each translation lists "
        "those that applied in `terms`.",
    )
    glossary_id: str | None = Field(
        None, max_length=64, description="A stored glossary (POST /v2/glossaries) for this model's language pair."
    )

    @model_validator(mode="after")
    def _n_best_within_beam(self) -> TranslateRequest:
        if self.glossary is not None and self.glossary_id is not None:
            raise ValueError("give glossary or glossary_id, not both")
        if self.n_best > self.beam_size:
            raise ValueError("n_best must not exceed beam_size")
        if self.max_length is not None and self.min_length > self.max_length:
            raise ValueError("min_length must not exceed max_length")
        return self

    def decoding_options(self) -> DecodingOptions:
        """The engine's options for this request (the one options type, built here as vLLM builds its own)."""
        return DecodingOptions(
            beam_size=self.beam_size,
            n_best=self.n_best,
            max_new_tokens=self.max_length,
            min_new_tokens=self.min_length,
        )


class AttentionMaps(BaseModel):
    layer: int = Field(description="The decoder layer of `summary` (the alignment layer).")
    head: int | None = Field(
        description="The alignment head of that layer; null: the model declares none and `summary` is the "
        "layer's head average."
    )
    shift: bool = Field(
        False,
        description="true: row t of `summary` is the alignment head at the step where target token t is the "
        "decoder's input (the step after the one that predicted it; the last row repeats), the row "
        "`alignment` is read from.",
    )
    summary: list[list[float]] = Field(
        description="[target_token][source_token]: the alignment head's weights, row t the one target token t's "
        "alignment is read from; rows sum to 1."
    )
    cross_attention: list[list[list[list[float]]]] | None = Field(
        None, description='[layer][head][target_token][source_token]; only with attention: "full".'
    )


class TrustFlagOut(BaseModel):
    kind: FlagKind = Field(
        description="omission: source words the translation seems to leave out; addition: target words with "
        "little source support; repetition: a stretch repeated back to back that the source does not repeat; "
        "untranslated: source words copied through; truncated: the length budget ended it before </s>."
    )
    side: Literal["source", "target"] = Field(description="Which sentence `words` index.")
    words: list[int] = Field(description="Indices into source_words or target_words.")
    text: list[str] = Field(description="Those words.")


class HeldOutOut(BaseModel):
    low: float = Field(description="The lowest score of the bin.")
    high: float = Field(description="The highest score of the bin.")
    answers: int = Field(description="Held-out translations scored from low to high.")
    adequate: float = Field(description="The share of them labelled adequate (0 to 1).")


class TrustOut(BaseModel):
    score: float = Field(
        description="Estimated probability (0 to 1) that the translation is adequate: fitted for this model "
        "(`calibrated`) on the signals GET /v1/models names as its `score_signals` (the mean token log-probability, "
        "chosen by measurement), else exp(signals.forward_logprob)."
    )
    flags: list[TrustFlagOut]
    signals: dict[str, float] = Field(
        description="The raw numbers: forward_logprob (mean token log-probability), forward_min_logprob, "
        "source_coverage, target_support, repetition, length_ratio, untranslated, truncated, source_length, "
        'source_familiarity and, in "full", '
        "reverse_logprob (the reverse model's mean log-probability of the source given the translation). Empty "
        "for a text split into sentences (see each sentence's)."
    )
    mode: Literal["fast", "full"] = Field(
        description='Which signals were computed and read by the flags ("full": the reverse model\'s too).'
    )
    calibrated: bool = Field(description="false: no calibration fitted for these weights; the default score.")
    held_out: HeldOutOut | None = Field(
        None,
        description="What such a score meant on this model's translations of held-out sentences (ones its "
        "calibration never saw): of `answers` translations scored from `low` to `high`, the share `adequate` were "
        "labelled adequate. Null without a calibration.",
    )
    sentence: int | None = Field(
        None, description="For a text split into sentences: the sentence whose score this is (the least trusted)."
    )


class ProtectedOut(BaseModel):
    """A span of the source kept byte for byte in the translation."""

    text: str = Field(description="The span as the client wrote it.")
    kind: Literal["placeholder", "url", "email", "number"]
    source_span: CharSpan = Field(description="Character offsets [start, end) into the client's text.")
    target_span: CharSpan = Field(description="Character offsets [start, end) into this translation's `text`.")


class TermOut(BaseModel):
    """A glossary term that applied to the text."""

    source: str = Field(description="The source term as the text has it.")
    target: str = Field(description="The target term the glossary gives, as the translation has it.")
    source_span: CharSpan = Field(description="Character offsets [start, end) into the client's text.")
    target_span: CharSpan = Field(description="Character offsets [start, end) into this translation's `text`.")


class HypothesisOut(BaseModel):
    text: str
    source_tokens: list[str]
    target_tokens: list[str]
    score: float = Field(description="Sum of the token log-probabilities.")
    token_scores: list[float] = Field(description="Log-probability of each target token.")
    alignment: list[AlignmentPair] = Field(
        description='[source_token_index, target_token_index]: with `alignment_method` "head", per target token '
        'the source token the alignment head weighs most; with "agreement", every pair of tokens whose words the '
        "two models agree on (none, one or several per token). Never the source's </s>."
    )
    word_alignment: list[AlignmentPair] = Field(description="[source_word_index, target_word_index] pairs.")
    source_words: list[str]
    target_words: list[str]
    alignment_method: AlignmentMethod = Field("head", description="Which alignment `alignment` is.")
    alignment_note: str | None = Field(
        None, description='Why "agreement" was asked for and "head" given (no reverse model served, pair too long).'
    )
    explanation_id: str | None = Field(
        description="Fetch the full explanation at GET /v1/explanations/{explanation_id}; null for a blank text "
        '(translated to "" without running the model) and for a text split into sentences (see `sentences`).'
    )
    attention: AttentionMaps | None = None
    trust: TrustOut | None = Field(None, description='How far to believe it; absent with trust: "off".')
    token_source_shares: list[float] | None = Field(
        None,
        description="Only with source_share: true. Per target token, the share (0 to 1) of its making that "
        "came from the source tokens rather than from the target prefix (ALTI+).",
    )
    source_share: float | None = Field(
        None, description="Only with source_share: true. The mean of token_source_shares (null for a blank text)."
    )
    protected: list[ProtectedOut] | None = Field(
        None,
        description="With protect (the default): every protected span of the source, once per occurrence, and "
        "where it stands in `text`. The token lists, scores and alignment are the model's: it read a stand-in "
        "(a name or a digit) in each span's place.",
    )
    terms: list[TermOut] | None = Field(
        None, description="With a glossary: each of its terms that applied, once per occurrence, and where it stands."
    )


class SentenceTranslationOut(HypothesisOut):
    alternatives: list[HypothesisOut] | None = Field(None, description="The next best hypotheses when n_best > 1.")


class TranslationOut(SentenceTranslationOut):
    """One text's translation. A text of several sentences (split_sentences) also carries `sentences`; then
    `text` is their translations joined with the text's own spacing, the token, word and alignment lists are
    the sentences' laid end to end (indices into the concatenated lists, each sentence ending in its own </s>),
    `score` is their sum, and explanation_id is null, attention and alternatives absent: those are per sentence.
    """

    sentences: list[SentenceTranslationOut] | None = Field(
        None,
        description="Only for a text split into two or more sentences: each sentence's translation, exactly as "
        "/v1/translate answers that sentence alone (explanation_id, attention and alternatives included).",
    )


class TranslateResponse(BaseModel):
    model: str
    translations: list[TranslationOut]


class ExplanationResponse(BaseModel):
    """GET /v1/explanations/{explanation_id}: the maps of one translation, recomputed by forced decoding."""

    model: str
    explanation_id: str
    source: str
    translation: str
    source_tokens: list[str]
    target_tokens: list[str]
    token_scores: list[float]
    alignment_layer: int
    alignment_head: int | None = Field(description="The alignment head of alignment_layer; null: the head average.")
    alignment_shift: bool = Field(
        description="true: target token t's alignment is read from the attention row of the next step, where t "
        "is the decoder's input (the row guided alignment trained); false: from the row that predicts t."
    )
    alignment: list[AlignmentPair]
    word_alignment: list[AlignmentPair] = Field(description="The same word alignment the translation carried.")
    source_words: list[str]
    target_words: list[str]
    alignment_method: AlignmentMethod = Field(
        description="Which alignment `alignment` is: an explanation id gives the method its translation was given."
    )
    alignment_note: str | None = Field(
        None, description='Why "agreement" was asked for and "head" given (no reverse model served, pair too long).'
    )
    cross_attention: list[list[list[list[float]]]] = Field(description="[layer][head][target_token][source_token]")


class ExplainRequest(ModelChoice):
    """POST /v1/explain: explain a translation step by step.

    Name the translation by its explanation_id (the exact tokens the model decoded; the id
    also names the model), or give a source with an optional target text (re-tokenized;
    default: the model's own translation).
    """

    explanation_id: str | None = Field(
        None,
        max_length=MAX_ID_CHARS,
        description="An explanation_id from /v1/translate: explain exactly those tokens. Excludes source, "
        "target and the model choice.",
    )
    source: Text | None = Field(None, examples=["The cat sat on the mat."])
    target: Text | None = Field(None, description="A translation to force-decode; default: the model's own.")
    kind: AttentionKind = Field(
        "cross", description="Which attention to open: decoder cross-attention or encoder self-attention."
    )
    layer: int | None = Field(
        None, ge=0, description="Layer index; default: the alignment layer (cross) or the last layer."
    )
    head: int = Field(0, ge=0)
    position: int = Field(
        0, ge=0, description="Query position: a target token (cross) or a source token (encoder_self)."
    )
    beam_size: int = Field(
        DEFAULT_BEAM_SIZE, ge=1, le=MAX_BEAM_SIZE, description="Beam size for the model's own translation."
    )
    alignment_method: AlignmentMethod | None = Field(
        None,
        description=ALIGNMENT_METHOD_HELP + ' Default: the method an explanation_id was made with, else "agreement" '
        "(the better one measured).",
    )
    method: ExplainMethod = Field(
        "attention",
        description='"attention": the maps and one head step by step (always there). Any other method adds '
        "`attributions`: per target token, how much each source token and each earlier target token made it. "
        "Costs per method in docs/explanations.md (integrated_gradients is the dearest).",
    )
    steps: int | None = Field(
        None,
        ge=1,
        le=MAX_ATTRIBUTION_STEPS,
        description=f"integrated_gradients only: points on the path from the baseline (default {DEFAULT_STEPS}).",
    )

    @model_validator(mode="after")
    def _steps_only_for_integrated_gradients(self) -> ExplainRequest:
        if self.steps is not None and self.method != "integrated_gradients":
            raise ValueError("steps applies to method integrated_gradients only")
        return self

    @model_validator(mode="after")
    def _one_way_to_name_the_translation(self) -> ExplainRequest:
        if self.explanation_id is None and self.source is None:
            raise ValueError("give either explanation_id or source")
        if self.explanation_id is not None:
            extra = [
                name
                for name in ("source", "target", "model", "source_lang", "target_lang")
                if getattr(self, name) is not None
            ]
            if extra:
                raise ValueError(f"explanation_id names the model and the tokens; do not also give {', '.join(extra)}")
        return self


class AttentionStepsOut(BaseModel):
    """One head's attention for one query: X → Q, K, V → Q·Kᵀ → ÷√d_k → softmax → Σ weights·V."""

    kind: AttentionKind
    layer: int
    head: int
    position: int
    d_k: int
    x_query: list[float] = Field(description="The input vector the query is projected from (d_model).")
    x: list[list[float]] = Field(
        description="Input vectors keys and values are projected from [source_token][d_model]."
    )
    q: list[float] = Field(description="Query vector (d_k).")
    k: list[list[float]] = Field(description="One key per attended position [source_token][d_k].")
    v: list[list[float]] = Field(description="One value per attended position [source_token][d_k].")
    scores: list[float] = Field(description="q · kᵀ per position.")
    scaled_scores: list[float] = Field(description="scores / √d_k.")
    weights: list[float] = Field(description="softmax(scaled_scores).")
    output: list[float] = Field(description="Σ weights · v (d_k).")


class AttributionsOut(BaseModel):
    """Per target token t, where it came from: each source token and each decoder input up to t."""

    method: ExplainMethod
    source: list[list[float]] = Field(description="[target_token][source_token]")
    target: list[list[float]] = Field(
        description="[target_token][decoder_input]: column 0 the decoder's start token, column j the target token "
        "j - 1; zero after the token's own step. Row t of source and of target together sum to 1."
    )
    source_share: list[float] = Field(description="Per target token, the sum of its source row.")


class ExplainResponse(ExplanationResponse):
    token_scores: list[float]
    encoder_self_attention: list[list[list[list[float]]]] = Field(
        description="[layer][head][source_token][source_token]"
    )
    steps: AttentionStepsOut
    attributions: AttributionsOut | None = Field(None, description="Only when a method other than attention is asked.")


class RuntimeInfo(BaseModel):
    runtime: str = Field(
        description="compiled: one C++ call per decode (model/runtime); eager: the lecture model's "
        "own step, where the compiled one could not be built or does not apply (a GPU, bfloat16)."
    )
    precision: str = Field(description="Of the decoding step's matmuls: float32 or int8 (compiled), else the model's.")
    reason: str = Field(
        description="Why: the kernels chosen on this CPU and how long choosing took, or the fallback's cause."
    )
    cpu: str = Field(description="The CPU model the kernels were measured on.")
    threads: int = Field(description="Threads each decode uses.")
    kernels: dict[str, str] = Field(
        description="Per matmul (layer.name, output): the kernel for few rows / many rows "
        "(linear, transposed, onednn, int8: fbgemm's, tiles: the runtime's own int8 tiles), measured fastest here "
        "when the model loaded."
    )
    choice_ms: float = Field(description="Milliseconds the kernel measurement took at load.")
    cpu_isa: str = Field(
        "",
        description="The instruction set the step runs at: avx512, avx2 or x86-64 (compiled; TRANSLATE_CPU_ISA may "
        "lower it below the CPU's), else ATen's CPU capability.",
    )
    int8_tiles: str = Field(
        "",
        description="The runtime's own int8 tiles an int8 step may choose here: vnni (AVX-512 VNNI, 8-bit rows), "
        "avx2 (7-bit rows) or empty (fbgemm's int8 alone, or not int8).",
    )


class ModelInfo(BaseModel):
    model_config = ConfigDict(protected_namespaces=())

    id: str
    source_lang: str
    target_lang: str
    weights_digest: str = Field(description="First 16 hex digits of the SHA-256 of model.safetensors.")
    device: str
    precision: str = Field(
        "float32",
        description="How translations are decoded: float32 (exact), bfloat16, float16 or int8 (the model's dtype).",
    )
    explanation_precision: str = Field(
        "float32",
        description="How explanations' maps and token scores (/v1/explain, /v1/explanations) are computed: a forced "
        "pass through the same decoding step and precision as /v1/translate, so they equal the answer's.",
    )
    steps_precision: str = Field(
        "float32",
        description="How /v1/explain's step-by-step arithmetic of one head, its attributions and the encoder's "
        "maps are computed: the model's own weights, float32 under int8 decoding (their maps differ from an int8 "
        "answer's by quantization error, within the bounds docs/explanations.md states).",
    )
    runtime: RuntimeInfo | None = Field(
        None,
        description="What runs the decoding steps on this replica, and why (the compiled runtime or the eager "
        "step it falls back to).",
    )
    encoder_layers: int
    decoder_layers: int
    encoder_attention_heads: int
    decoder_attention_heads: int
    d_model: int
    alignment_layer: int = Field(description="The decoder layer alignments are read from.")
    alignment_head: int | None = Field(
        description="The head of alignment_layer trained with guided alignment; null: the layer's head average."
    )
    alignment_shift: bool = Field(
        description="true: target token t's alignment is read from the alignment head's row at the step where t is "
        "the decoder's input (one row later than the step that predicted it); false: from the row that predicted t."
    )
    alignment_methods: list[AlignmentMethod] = Field(
        description='The alignments this model can give: ["agreement", "head"] where the model translating the other '
        'way is served too, else ["head"].'
    )
    alignment_source: str = Field(
        description="Why alignments are read from that head and step: `declared` (config.json's alignment_layer and "
        "alignment_head), `marian guided alignment (model card)` (its README.md names a -align recipe: Marian trained "
        "the last layer's head 0), `marian default` (no declaration, no recipe named: the head Marian's guided "
        "alignment trains, as most OPUS-MT models were), `fallback` (the card names a recipe without guided "
        "alignment: the penultimate layer's head average)."
    )
    trust: dict | None = Field(
        None,
        description="The trust score: `calibrated` (a trust.json fitted on these weights is loaded; else the "
        "uncalibrated default and a `note` why), `score_signals` (per mode, the signals the score is fitted on), "
        "`reliability` (per mode, what scores meant on held-out translations: bins of low, high, answers and the "
        'share adequate), `fitted_on` (what it was fitted on), `full_available` (the reverse model "full" needs '
        "is served).",
    )
    max_source_tokens: int = Field(description="The most sentencepiece tokens (with </s>) a text may have.")
    max_text_characters: int = Field(description="The most characters a text may have.")


class ModelsResponse(BaseModel):
    models: list[ModelInfo]


class HealthResponse(BaseModel):
    status: Literal["ok"]


class ReadyResponse(BaseModel):
    status: Literal["ready"]
    models: list[str]


class ErrorBody(BaseModel):
    code: str = Field(description="Stable machine-readable code, e.g. invalid_request, model_not_found, overloaded.")
    message: str = Field(description="What went wrong, for humans; never a stack trace.")


class ErrorResponse(BaseModel):
    error: ErrorBody
