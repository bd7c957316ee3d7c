"""A translator's texts through its decode loop (model.decoding.scheduler.SchedulerThread, in a thread of its own): one
Future of a Translation per text, tokens streamed as they settle, a step's finished texts built together.
Translator.start_loop, submit, cancel and decoder_rows delegate here.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future

from model.decoding.scheduler import Batch, DecodeRequest, Policy, SchedulerThread
from model.options import DecodingOptions
from model.results import StreamedToken, Translation, blank_translation
from model.transformer import Transformer
from model.translation import Builder


class TranslationQueue:
    """One model's decode loop and what feeds it: texts encoded by `encode_source`, finished ones built by
    `builder`."""

    def __init__(
        self,
        model: Transformer,
        step,
        alignment_head: tuple[int, int | None],
        encode_source: Callable[[list[str]], list[list[int]]],
        builder: Builder,
        policy: Policy,
        max_rows: int,
        max_texts: int | None,
        gather_s: float,
        max_waiting: int,
        on_joined: Callable[[Batch, list[float]], None] | None,
        on_done: Callable[[Batch], None] | None,
        word_continuations: list[int] | None = None,
    ) -> None:
        self.encode_source, self.builder = encode_source, builder
        self.loop = SchedulerThread(
            model,
            max_rows=max_rows,
            max_waiting=max_waiting,
            alignment_head=alignment_head,
            step=step,
            policy=policy,
            max_texts=max_texts,
            gather_s=gather_s,
            finish=self._finished,
            on_joined=on_joined,
            on_done=on_done,
            word_continuations=word_continuations,
        )

    @property
    def rows(self) -> int:
        return self.loop.scheduler.rows

    def submit(
        self,
        text: str,
        options: DecodingOptions,
        return_attention: bool,
        on_token: Callable[[StreamedToken], None] | None,
        source_ids: list[int] | None,
        constraints: list[list[int]] | None = None,
    ) -> Future:
        """Translator.submit."""
        if source_ids is None:
            (source_ids,) = self.encode_source([text])
        if not text.strip():
            result: Future = Future()
            result.set_result(blank_translation())
            return result
        streamed = self.builder.streamed(on_token) if on_token is not None else None
        return self.loop.submit(source_ids, options, return_attention, streamed, alignment_rows=True,
                                constraints=constraints)

    def cancel(self, future: Future) -> None:
        self.loop.cancel(future)

    def _finished(self, requests: list[DecodeRequest]) -> list[Translation]:
        """The loop's `finish`: the Translations of the requests one step finished, built together."""
        return self.builder.translations(
            [r.source_ids for r in requests], [r.hypotheses for r in requests], [r.return_attention for r in requests]
        )
