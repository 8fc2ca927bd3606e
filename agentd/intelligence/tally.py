"""What a model call had cost when it was cut: the tokens of a reply that never finished.

Why: a gateway bills a request once it starts answering, and a run cut mid-reply (its deadline, a drain's
end, an operator's or a parent's cancel) would otherwise count none of it, so a killed subtree looked
cheaper than it was and a budget could be outrun by cutting. The loop hands each call a :class:`CallTally`
(in a context variable, so no client signature changes: the gateway finds it with :func:`current_tally`);
the gateway notes the request's size, that the answer began and, while streaming, what it had streamed. When
the call is cut, :meth:`CallTally.cut` says what to count: the usage the gateway sent (some gateways send it
in every chunk), else an *estimate* (:data:`agentd.defaults.CHARS_PER_TOKEN` characters per token of the
request and of the streamed text), marked as such. A call cut before the gateway began to answer counts
nothing. No I/O here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Protocol

import attrs

from agentd import defaults
from agentd.intelligence.wire import Usage


class Streamed(Protocol):
    """What a stream has delivered so far (:class:`agentd.intelligence.wire.StreamAssembler`)."""

    @property
    def streamed_chars(self) -> int: ...

    @property
    def reported(self) -> Usage | None: ...


@attrs.frozen
class CutUsage:
    """The tokens to count for a cut call; ``estimated`` when they are an estimate, not the gateway's word."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    estimated: bool = False

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def usage(self) -> Usage:
        return Usage(self.prompt_tokens, self.completion_tokens, self.total if self.estimated else 0)


def _tokens(chars: int) -> int:
    return -(-max(0, chars) // defaults.CHARS_PER_TOKEN)


class CallTally:
    """One model call's progress, as the gateway saw it (its latest attempt). (A plain class: one per step.)"""

    __slots__ = ("answering", "request_chars", "stream")

    def __init__(self) -> None:
        self.request_chars = 0
        self.answering = False
        self.stream: Streamed | None = None

    def attempt(self, request_chars: int) -> None:
        """An attempt is sent (a retry starts afresh: a failed attempt's reply was never given)."""
        self.request_chars = request_chars
        self.answering = False
        self.stream = None

    def began(self, stream: Streamed | None = None) -> None:
        """The gateway began to answer (2xx); ``stream``: the reply is streamed into it."""
        self.answering = True
        self.stream = stream

    def cut(self) -> CutUsage:
        """What the call cost when it was cut."""
        if not self.answering:
            return CutUsage()
        if self.stream is not None and self.stream.reported is not None:
            reported = self.stream.reported
            return CutUsage(reported.prompt_tokens, reported.completion_tokens)
        streamed = self.stream.streamed_chars if self.stream is not None else 0
        return CutUsage(_tokens(self.request_chars), _tokens(streamed), estimated=True)


_CURRENT: ContextVar[CallTally | None] = ContextVar("agentd_call_tally", default=None)


def current_tally() -> CallTally | None:
    """The tally of the model call in progress in this task, if its caller keeps one."""
    return _CURRENT.get()


@contextlib.contextmanager
def tallying(tally: CallTally) -> Iterator[CallTally]:
    """Keep ``tally`` for the model calls made in this block (by this task and the tasks it starts)."""
    token = _CURRENT.set(tally)
    try:
        yield tally
    finally:
        _CURRENT.reset(token)


__all__ = ["CallTally", "CutUsage", "Streamed", "current_tally", "tallying"]
