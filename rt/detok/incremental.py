"""Incremental, UTF-8-safe detokenization of many requests at once.

Each request keeps its ids with two offsets into them (the method of vLLM's
and SGLang's detokenizers): text is the difference between
``decode(ids[prefix:])`` and ``decode(ids[prefix:read])``, so a token is
decoded with a little context before it (a leading space survives), and a
delta that ends in an incomplete UTF-8 character (U+FFFD) is held until the
next token completes it. The first context is the tail of the prompt.

Every update carries the offset of its first token in the request's output,
so a token seen twice (a redelivered frame, a resubmitted request) is
recognised and skipped: feeding the same update twice emits nothing new.
A detokenizer that restarts rebuilds a request by opening it with the ids
the frontend already holds; the frontend skips text it already has by
``text_offset``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rt.detok.stops import StopMatcher

CONTEXT_TOKENS = 5  # prompt tokens decoded before the first output token
REPLACEMENT = "\ufffd"


@dataclass(frozen=True)
class DetokParams:
    skip_special_tokens: bool = True
    stop: tuple[str, ...] = ()
    # a stop string, or stop token (EOS, a stop_token_ids), that ends the text stays in it
    no_stop_trim: bool = False
    # stop strings count from this many output tokens on (the request's min_new_tokens,
    # as vLLM's min_tokens: the text before is emitted as it is, never matched)
    min_new_tokens: int = 0


@dataclass(frozen=True)
class TokenUpdate:
    """New output tokens of one request, from one scheduler step."""

    rid: str
    token_offset: int  # position of ids[0] in the request's output
    ids: Sequence[int]
    finished: bool = False  # the scheduler finished it (EOS, length, abort)
    stop_token: bool = False  # its last token is a stop token that ended it (EOS, stop_token_ids)


@dataclass(frozen=True)
class TextDelta:
    rid: str
    token_offset: int  # position of ids[0] in the output (ids new to this detokenizer)
    ids: tuple[int, ...]
    text_offset: int  # position of text[0] in the output text
    text: str
    stop_matched: str | None = None  # set once a stop string ended the request
    finished: bool = False  # no more text will come for this request


class DecodeState:
    """One request's ids, offsets and stop-string matcher."""

    def __init__(self, context: Sequence[int], params: DetokParams) -> None:
        self.params = params
        self.ids = list(context[-CONTEXT_TOKENS:]) if CONTEXT_TOKENS else []
        self.n_context = len(self.ids)
        self.prefix = 0
        self.read = self.n_context
        self.stops = StopMatcher(params.stop, keep=params.no_stop_trim)
        self.text_len = 0
        self.finished = False

    @property
    def n_output(self) -> int:
        return len(self.ids) - self.n_context


class IncrementalDetokenizer:
    """Turns token updates of many requests into text deltas, one batch at a time."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        self._states: dict[str, DecodeState] = {}

    def open(
        self,
        rid: str,
        prompt_ids: Sequence[int],
        params: DetokParams,
        prior_ids: Sequence[int] = (),
    ) -> list[TextDelta]:
        """Start (or, after a restart, rebuild) a request. ``prior_ids`` are output
        tokens already generated: for a new request they are decoded now and their
        text counted as emitted (nothing is returned). Opening a request that is
        open already merges ``prior_ids`` as an update and returns what was new."""
        if rid in self._states:
            return self.step([TokenUpdate(rid, 0, prior_ids)]) if prior_ids else []
        self._states[rid] = DecodeState(prompt_ids, params)
        if prior_ids:
            self.step([TokenUpdate(rid, 0, prior_ids)])
        return []

    def close(self, rid: str) -> None:
        self._states.pop(rid, None)

    def __contains__(self, rid: str) -> bool:
        return rid in self._states

    def finished(self, rid: str) -> bool:
        """Whether open request ``rid`` has ended here (a stop string, or its last token)."""
        return self._states[rid].finished

    def output_len(self, rid: str) -> int:
        """How many output tokens of open request ``rid`` this detokenizer has."""
        return self._states[rid].n_output

    def step(self, updates: Sequence[TokenUpdate]) -> list[TextDelta]:
        """Apply one frame of updates; return a delta per request that changed (two
        for an update whose tokens straddle its ``min_new_tokens``: the text before
        is never matched against stop strings, and the text after is, also when
        the update is a rebuild's whole output at once)."""
        first: list[TokenUpdate] = []
        rest: list[TokenUpdate] = []
        split: set[str] = set()
        for update in updates:
            state = self._states.get(update.rid)
            # the first token whose text stop strings may match: the min_new_tokens-th
            armed = state.params.min_new_tokens - 1 if state is not None else 0
            cut = armed - update.token_offset
            if update.rid in split:  # (after its own first part)
                rest.append(update)
            elif 0 < cut < len(update.ids):
                split.add(update.rid)
                first.append(TokenUpdate(update.rid, update.token_offset, update.ids[:cut]))
                rest.append(
                    TokenUpdate(
                        update.rid, armed, update.ids[cut:], update.finished, update.stop_token
                    )
                )
            else:
                first.append(update)
        return self._step(first) + (self._step(rest) if rest else [])

    def _step(self, updates: Sequence[TokenUpdate]) -> list[TextDelta]:
        """A stop token that ends a request is in its ids but not in its text,
        unless it asks ``no_stop_trim`` (as vLLM and SGLang have it): it is kept
        out of the decode, and added to the ids after."""
        touched: list[tuple[TokenUpdate, DecodeState, tuple[int, ...], int]] = []
        trimmed: set[str] = set()
        for update in updates:
            state = self._states.get(update.rid)
            if state is None or state.finished:
                continue
            skip = state.n_output - update.token_offset
            if skip < 0:
                raise ValueError(
                    f"request {update.rid}: tokens from offset {update.token_offset} arrived "
                    f"but only {state.n_output} came before; a gap means a lost frame"
                )
            new = tuple(update.ids[skip:])
            if not new and not update.finished:
                continue
            first = state.n_output
            if new and update.finished and update.stop_token and not state.params.no_stop_trim:
                trimmed.add(update.rid)
                state.ids.extend(new[:-1])
            else:
                state.ids.extend(new)
            touched.append((update, state, new, first))
        try:
            texts = self._decode_pairs([s for _, s, _, _ in touched])
        except Exception:  # undo the batch, so that each update can be retried alone
            for update, state, new, _ in reversed(touched):
                del state.ids[len(state.ids) - len(new) + (update.rid in trimmed) :]
            raise
        for update, state, new, _ in touched:
            if update.rid in trimmed:
                state.ids.append(new[-1])
        deltas = []
        for (update, state, new, first), (prefix_text, full_text) in zip(
            touched, texts, strict=True
        ):
            text = ""
            complete = not full_text.endswith(REPLACEMENT)
            if len(full_text) > len(prefix_text) and (complete or update.finished):
                text = full_text[len(prefix_text) :]
                state.prefix, state.read = state.read, len(state.ids)
            if state.n_output >= state.params.min_new_tokens:
                text = state.stops.feed(text)
            if update.finished or state.stops.matched is not None:
                text += state.stops.flush()
                state.finished = True
            offset = state.text_len
            state.text_len += len(text)
            deltas.append(
                TextDelta(
                    update.rid,
                    first,
                    new,
                    offset,
                    text,
                    state.stops.matched,
                    state.finished,
                )
            )
        return deltas

    def _decode_pairs(self, states: Sequence[DecodeState]) -> list[tuple[str, str]]:
        """(decode(ids[prefix:read]), decode(ids[prefix:])) for each state, batched."""
        if not states:
            return []
        seqs: list[list[int]] = []
        for state in states:
            seqs.append(state.ids[state.prefix : state.read])
            seqs.append(state.ids[state.prefix :])
        texts = self._decode_many(seqs, states)
        return [(texts[2 * i], texts[2 * i + 1]) for i in range(len(states))]

    def _decode_many(self, seqs: list[list[int]], states: Sequence[DecodeState]) -> list[str]:
        # (a special token shown is set apart by no space: a fast tokenizer's decode, as
        # vLLM's and SGLang's; spaces_between_special_tokens was slow tokenizers' alone)
        out = [""] * len(seqs)
        groups: dict[bool, list[int]] = {True: [], False: []}
        for i in range(len(seqs)):
            groups[states[i // 2].params.skip_special_tokens].append(i)
        for skip, idx in groups.items():
            if idx:
                decoded = self._batch_decode([seqs[i] for i in idx], skip)
                for i, text in zip(idx, decoded, strict=True):
                    out[i] = text
        return out

    def _batch_decode(self, seqs: list[list[int]], skip: bool) -> list[str]:
        if self._backend is not None:  # the Rust tokenizer decodes the batch in one call
            return list(self._backend.decode_batch(seqs, skip_special_tokens=skip))
        return list(self._tokenizer.batch_decode(seqs, skip_special_tokens=skip))
