"""A fake server that queues like a real one: continuous batching, FIFO beyond.

``FakeBatching`` describes the server; ``BatchQueue`` keeps its slots and its
waiting line on trio's clock; ``exposition`` writes its running and waiting
counts as the chosen server's ``/metrics`` would.

The model, and its invariants (which the tests hold exactly, in virtual time):

* ``running <= slots`` at every instant, and ``waiting > 0`` only while
  ``running == slots``: a freed slot passes at once to the first in line,
  so nobody who comes later takes it first.
* A request in a slot first spends ``prefill_per_token`` per prompt token;
  its first token goes out when that is done, and each later one a *step*
  after the one before, ``decode_per_token * (1 + decode_growth *
  (running - 1))``, with ``running`` counted as the step starts (a step is
  not timed again if the batch changes during it).
* A request that leaves (its client disconnects, it is cancelled) leaves the
  line, or frees its slot, at once: release is synchronous, and runs in a
  ``finally``.
"""

from __future__ import annotations

from collections import deque
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Final, final

import attrs
import trio

from .._server_load._formats import metrics_text
from .._server_load._load import SERVER_FORMATS, ServerFormat, ServerLoad
from .._validation import (
    check_fraction,
    non_negative_seconds,
    one_of,
    positive_int,
    positive_seconds,
    text,
    validator,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable


@final
@attrs.frozen
class FakeBatching:
    """A self-hosted server's continuous batching, for the fake server to play.

    vLLM, llama.cpp's ``llama-server``, SGLang and TGI never answer 429 when
    full: they run up to ``slots`` sequences at once and queue every other
    request, first come first served. With a ``FakeBatching`` the fake server
    does the same. Each request takes a free slot or waits in line; in its
    slot it spends ``prefill_per_token`` per prompt token (the server's
    estimate of the body: a token per four characters of its messages), then
    streams the tokens its ``FakeReply`` scripts, each a *step* after the one
    before::

        step = decode_per_token * (1 + decode_growth * (running - 1))

    where ``running`` is how many requests hold a slot as the step starts.
    With ``decode_growth`` below 1 the total rate, ``running / step`` tokens
    per second, grows with the batch up to ``slots`` and no further (beyond
    ``slots``, requests wait); at 1 it never grows. The script still decides
    the text, the tool calls, the faults and the status codes (a status
    fault answers at once, without a slot); the reply's
    ``time_to_first_token`` and ``tokens_per_second`` are not used, the batch
    sets the pace (its ``latency`` still comes before the headers, which go
    out before the request takes its place in line, as on the real servers:
    the wait shows as time to first token). Every prompt token is prefilled,
    cached or not.

    ``GET /metrics`` then answers the running and waiting counts in the
    exposition format of the server named by ``metrics``, with its metric
    names (no API key needed, and not counted as an LLM request); the fake
    server's ``statistics()`` has them too, with their peaks and time
    integrals.

    The defaults are a small model on one GPU; size your own from your
    server, measured with one request alone, then with ``slots`` at once:

    Attributes:
        slots: How many requests run at once: vLLM's ``--max-num-seqs``,
            ``llama-server``'s ``--parallel``, SGLang's
            ``--max-running-requests``, TGI's ``--max-batch-size`` (or what
            the KV cache holds, if that comes first).
        prefill_per_token: Seconds per prompt token before the first token.
            Send one request alone with a long prompt and ``max_tokens=1``:
            its time to first token over its prompt tokens (or 1 over
            ``llamacpp:prompt_tokens_seconds``).
        decode_per_token: Seconds between two tokens of a request running
            alone: one request's inter-token time (``llama-server``'s
            ``timings.predicted_per_token_ms``, vLLM's
            ``vllm:inter_token_latency_seconds`` at a concurrency of 1).
        decode_growth: How much each other running request slows every
            request's step, from 0 (a batch is free) to 1 (a batch gains
            nothing). Run ``n`` requests at once (``n = slots``), measure
            their inter-token time ``t_n`` beside the lone ``t_1``:
            ``decode_growth = (t_n / t_1 - 1) / (n - 1)``.
        metrics: The server whose ``/metrics`` it speaks (names, labels,
            numbers): ``"vllm"``, ``"llama.cpp"``, ``"sglang"`` or
            ``"tgi"``, as ``ServerLoad.format`` names them.
        model_name: The ``model_name`` label of vLLM's and SGLang's metrics
            (their served model name).
    """

    slots: int = attrs.field(default=4, validator=positive_int)
    prefill_per_token: float = attrs.field(
        default=0.0005, validator=non_negative_seconds
    )
    decode_per_token: float = attrs.field(default=0.02, validator=positive_seconds)
    decode_growth: float = attrs.field(
        default=0.25, validator=validator(check_fraction)
    )
    metrics: ServerFormat = attrs.field(
        default="vllm", validator=one_of(*SERVER_FORMATS)
    )
    model_name: str = attrs.field(default="fake-model", validator=text)

    def step(self, running: int) -> float:
        """Seconds between two tokens of each request while ``running`` run."""
        return self.decode_per_token * (1 + self.decode_growth * (running - 1))

    def prefill(self, prompt_tokens: int) -> float:
        """Seconds a prompt of ``prompt_tokens`` takes before its first token."""
        return self.prefill_per_token * prompt_tokens


@attrs.define(eq=False)
class BatchQueue:
    """A ``FakeBatching``'s slots and waiting line, in play.

    ``on_change(running, waiting)`` is called at once after every change.
    """

    batching: FakeBatching
    on_change: Callable[[int, int], None]
    running: int = 0
    _line: deque[trio.Event] = attrs.field(factory=deque, init=False)

    @property
    def waiting(self) -> int:
        """How many requests wait for a slot."""
        return len(self._line)

    @asynccontextmanager
    async def sequence(self, prompt_tokens: int) -> AsyncIterator[Callable[[], float]]:
        """Hold a slot, with the prompt prefilled: yield the next step's length."""
        await self._acquire()
        try:
            await trio.sleep(self.batching.prefill(prompt_tokens))
            yield self._step
        finally:
            self._release()

    def _step(self) -> float:
        return self.batching.step(self.running)

    async def _acquire(self) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        if self.running < self.batching.slots:
            self.running += 1
            self._changed()
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        granted = trio.Event()
        self._line.append(granted)
        self._changed()
        try:
            await granted.wait()
        except BaseException:
            if granted.is_set():
                # Handed the slot as it was cancelled: pass it on.
                self._release()
            else:
                self._line.remove(granted)
                self._changed()
            raise

    def _release(self) -> None:
        if self._line:
            # The slot goes to the first in line, never back to the pool.
            self._line.popleft().set()
        else:
            self.running -= 1
        self._changed()

    def _changed(self) -> None:
        self.on_change(self.running, len(self._line))


# -- /metrics ------------------------------------------------------------------

#: The content type of the Prometheus text exposition format.
EXPOSITION_TYPE: Final = b"text/plain; version=0.0.4; charset=utf-8"


def exposition(batching: FakeBatching, running: int, waiting: int) -> str:
    """``/metrics``'s text: ``running`` and ``waiting`` as ``batching.metrics`` says them."""
    load = ServerLoad(running=running, waiting=waiting, format=batching.metrics)
    return metrics_text(load, batching.model_name)
