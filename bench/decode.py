"""What decoding a streamed answer costs per chunk, against a minimal loop.

Usage::

    python bench/decode.py [--quick] [--repeats N] [--chunks N] [--out DIR]

One trio process serves every stream of a fleet, so the CPU time spent on
each streamed chunk decides how many streams it carries. This measures it
for both wire formats and three kinds of delta (text, reasoning, tool-call
arguments), over in-memory ``httpx2.MockTransport`` bodies of ``--chunks``
chunks each (no socket, no server), for:

* the minimal loop: httpx2, its ``EventSource`` and ``json.loads``, reading the one
  field that carries the delta (``choices[0].delta.content`` and its
  reasoning and tool-call neighbours; ``delta.text``, ``delta.thinking``
  or ``delta.partial_json`` of each ``content_block_delta``);
* ``OpenAIProvider.stream`` / ``AnthropicProvider.stream``, typed events;
* the same provider through a slot (``wrap_provider`` on an open
  dispatcher);
* the official SDK (``openai``, ``anthropic``, on httpx2) when it can be
  imported, streaming with ``stream=True``; skipped when it cannot.

Method. Each case (format, kind) runs its clients in rounds, one stream
each per round, in an order that rotates from round to round, after one
untimed warm-up round, after which what is alive is frozen out of the
collector's way (``gc.freeze()``); ``gc.collect()`` runs before each
stream and the collector stays on while it is timed, because allocation is
part of the cost. Every client must see the same delta text, or the run stops. A
client's figure is the median of its per-chunk CPU times (the stream's
``time.thread_time``, which time spent waiting for the CPU on a shared
machine does not inflate, over ``--chunks``; everything runs in one
thread); its ratio is the median of its per-round ratios to the minimal
loop of the same round, so drift touches both sides of each ratio alike.
Wall-clock times are in the JSON report too, and the load average before
and after: a busy machine means a run to repeat.

Prints the markdown table on stdout (progress on stderr) and writes it,
and the JSON report with every sample, to ``DIR/decode.md`` and
``DIR/decode.json`` (``bench/reports`` by default).
"""

from __future__ import annotations

import gc
import importlib
import json
import statistics
import sys
import time
import warnings
from typing import TYPE_CHECKING, Any, Final, TypeAlias

import attrs
import httpx2
import trio

from trio_dispatch import open_dispatcher, wrap_provider
from trio_dispatch.messages import (
    ChatMessage,
    ChatRequest,
    ReasoningDelta,
    TextDelta,
    ToolCall,
)
from trio_dispatch.providers import AnthropicProvider, OpenAIProvider

from _common import command_line, environment, finish_in, load_average, show_progress

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from trio_dispatch import Provider

FORMATS: Final = ("openai", "anthropic")
KINDS: Final = ("text", "reasoning", "tool")
TARGET: Final = 1.3

_LABELS: Final = {
    ("openai", "minimal"): "minimal loop (httpx2 + its EventSource + json.loads)",
    ("openai", "provider"): "`OpenAIProvider.stream`",
    ("openai", "slot"): "`OpenAIProvider` through a slot",
    ("openai", "sdk"): "official `openai` SDK (`AsyncOpenAI`)",
    ("anthropic", "minimal"): "minimal loop (httpx2 + its EventSource + json.loads)",
    ("anthropic", "provider"): "`AnthropicProvider.stream`",
    ("anthropic", "slot"): "`AnthropicProvider` through a slot",
    ("anthropic", "sdk"): "official `anthropic` SDK (`AsyncAnthropic`)",
}
_FORMAT_LABELS: Final = {"openai": "OpenAI", "anthropic": "Anthropic"}
_KIND_LABELS: Final = {
    "text": "text",
    "reasoning": "reasoning",
    "tool": "tool-call arguments",
}
_REQUEST: Final = ChatRequest([ChatMessage("user", "Write a long answer.")])
_BASE_URL: Final = "http://decode.bench.invalid"
# A tool's arguments arrive as pieces of one JSON object.
_TOOL_OPEN: Final = '{"text": "'
_TOOL_CLOSE: Final = '"}'


def _piece(i: int) -> str:
    return f" word{i % 1000}"


# -- the bodies ------------------------------------------------------------


def _sse(data: object, event: str | None = None) -> str:
    line = f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"
    return line if event is None else f"event: {event}\n{line}"


def _pieces(kind: str, chunks: int) -> list[str]:
    pieces = [_piece(i) for i in range(chunks)]
    if kind == "tool":
        pieces[0] = _TOOL_OPEN + pieces[0]
        pieces[-1] += _TOOL_CLOSE
    return pieces


def openai_body(kind: str, chunks: int) -> bytes:
    """A chat completion stream of ``chunks`` deltas, as OpenAI sends it.

    Text chunks carry OpenAI's envelope (``usage: null`` with
    ``include_usage``); reasoning chunks are DeepSeek's
    (``reasoning_content``, ``content: null``).
    """
    envelope: dict[str, Any] = {
        "id": "chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT",
        "object": "chat.completion.chunk",
        "created": 1741569952,
        "model": "gpt-4.1-2025-04-14",
        "service_tier": "default",
        "system_fingerprint": "fp_b8bc95a0ac",
    }

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {**envelope, "choices": [choice], "usage": None}

    events = [_sse(chunk({"role": "assistant", "content": "", "refusal": None}))]
    finish = "stop"
    if kind == "tool":
        finish = "tool_calls"
        start = {
            "index": 0,
            "id": "call_DdmO9pD3xa9XTPNJ32zg2hcA",
            "type": "function",
            "function": {"name": "write", "arguments": ""},
        }
        events.append(_sse(chunk({"tool_calls": [start]})))
    for piece in _pieces(kind, chunks):
        if kind == "text":
            delta: dict[str, Any] = {"content": piece}
        elif kind == "reasoning":
            delta = {"content": None, "reasoning_content": piece}
        else:
            delta = {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}
        events.append(_sse(chunk(delta)))
    events.append(_sse(chunk({}, finish)))
    usage = {
        "prompt_tokens": 19,
        "completion_tokens": chunks,
        "total_tokens": 19 + chunks,
    }
    events.append(_sse({**envelope, "choices": [], "usage": usage}))
    events.append(_sse("[DONE]"))
    return "".join(events).encode()


def anthropic_body(kind: str, chunks: int) -> bytes:
    """A Messages stream of ``chunks`` deltas in one block, as Anthropic sends it."""
    message: dict[str, Any] = {
        "id": "msg_01XFDUDYJgAACzvnptvVoYEL",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-6",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 19, "output_tokens": 1},
    }
    block: dict[str, Any]
    if kind == "text":
        block, delta_type, field = {"type": "text", "text": ""}, "text_delta", "text"
    elif kind == "reasoning":
        block = {"type": "thinking", "thinking": ""}
        delta_type, field = "thinking_delta", "thinking"
    else:
        block = {"type": "tool_use", "id": "toolu_01T1x1", "name": "write", "input": {}}
        delta_type, field = "input_json_delta", "partial_json"
    events = [
        _sse({"type": "message_start", "message": message}, "message_start"),
        _sse(
            {"type": "content_block_start", "index": 0, "content_block": block},
            "content_block_start",
        ),
        _sse({"type": "ping"}, "ping"),
    ]
    events.extend(
        _sse(
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": delta_type, field: piece},
            },
            "content_block_delta",
        )
        for piece in _pieces(kind, chunks)
    )
    stop_reason = "tool_use" if kind == "tool" else "end_turn"
    events += [
        _sse({"type": "content_block_stop", "index": 0}, "content_block_stop"),
        _sse(
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                "usage": {"output_tokens": chunks},
            },
            "message_delta",
        ),
        _sse({"type": "message_stop"}, "message_stop"),
    ]
    return "".join(events).encode()


def _mock_client(module: Any, body: bytes) -> Any:  # noqa: ANN401 (httpx2's types)
    """An ``AsyncClient`` of ``module`` whose every request gets ``body``."""

    def answer(request: Any) -> Any:  # noqa: ANN401 (either module's types)
        return module.Response(
            200,
            headers={"content-type": "text/event-stream; charset=utf-8"},
            content=body,
        )

    return module.AsyncClient(transport=module.MockTransport(answer))


# -- the clients -------------------------------------------------------------
# Each consumes one whole stream and returns the delta text it saw, so the
# run can check that every client did the same work.

_Consume: TypeAlias = "Callable[[], Awaitable[str]]"
_Consumer: TypeAlias = "tuple[_Consume, Callable[[], Awaitable[None]]]"
_Samples: TypeAlias = dict[str, list[float]]


def _minimal(client: httpx2.AsyncClient, fmt: str, kind: str) -> _Consume:
    url = (
        f"{_BASE_URL}/v1/chat/completions"
        if fmt == "openai"
        else f"{_BASE_URL}/v1/messages"
    )
    loads = json.loads

    async def openai() -> str:
        pieces: list[str] = []
        async with client.stream("POST", url, json={}) as response:
            async for sse in httpx2.EventSource(response):
                if sse.data == "[DONE]":
                    continue  # read on to the end, as a client must
                choices = loads(sse.data)["choices"]
                if not choices:
                    continue
                delta = choices[0]["delta"]
                if kind == "text":
                    value = delta.get("content")
                elif kind == "reasoning":
                    value = delta.get("reasoning_content")
                else:
                    calls = delta.get("tool_calls")
                    value = calls[0]["function"].get("arguments") if calls else None
                if value:
                    pieces.append(value)
        return "".join(pieces)

    field = {"text": "text", "reasoning": "thinking", "tool": "partial_json"}[kind]

    async def anthropic() -> str:
        pieces: list[str] = []
        async with client.stream("POST", url, json={}) as response:
            async for sse in httpx2.EventSource(response):
                event = loads(sse.data)
                if event["type"] == "content_block_delta":
                    pieces.append(event["delta"][field])
        return "".join(pieces)

    return openai if fmt == "openai" else anthropic


_DELTAS: Final = (TextDelta, ReasoningDelta)


def _ours(provider: Provider) -> _Consume:
    async def consume() -> str:
        pieces: list[str] = []
        async with provider.stream(_REQUEST) as events:
            async for event in events:
                if isinstance(event, _DELTAS):
                    pieces.append(event.text)
                elif isinstance(event, ToolCall):
                    pieces.append(event.raw_arguments)
        return "".join(pieces)

    return consume


def _sdk(fmt: str, kind: str, body: bytes) -> _Consumer | None:
    """The official SDK's client and its closer, or ``None`` if not installed."""
    try:
        sdk = importlib.import_module(fmt)
    except ImportError:
        return None
    http_client = _mock_client(httpx2, body)
    messages = [{"role": "user", "content": "Write a long answer."}]
    if fmt == "openai":
        openai = sdk.AsyncOpenAI(
            api_key="bench",
            base_url=f"{_BASE_URL}/v1",
            http_client=http_client,
            max_retries=0,
        )

        async def consume_openai() -> str:
            pieces: list[str] = []
            stream = await openai.chat.completions.create(
                model="gpt-4.1", messages=messages, stream=True
            )
            async with stream:
                async for chunk in stream:
                    if not chunk.choices:
                        continue
                    delta = chunk.choices[0].delta
                    if kind == "text":
                        value = delta.content
                    elif kind == "reasoning":
                        # Not in the SDK's model: kept as an extra field.
                        value = getattr(delta, "reasoning_content", None)
                    else:
                        calls = delta.tool_calls
                        value = calls[0].function.arguments if calls else None
                    if value:
                        pieces.append(value)
            return "".join(pieces)

        return consume_openai, openai.close
    anthropic = sdk.AsyncAnthropic(
        api_key="bench", base_url=_BASE_URL, http_client=http_client, max_retries=0
    )
    field = {"text": "text", "reasoning": "thinking", "tool": "partial_json"}[kind]

    async def consume_anthropic() -> str:
        pieces: list[str] = []
        stream = await anthropic.messages.create(
            model="claude-sonnet-4-6", max_tokens=4096, messages=messages, stream=True
        )
        async with stream:
            async for event in stream:
                if event.type == "content_block_delta":
                    pieces.append(getattr(event.delta, field))
        return "".join(pieces)

    return consume_anthropic, anthropic.close


# -- the report ----------------------------------------------------------------


@attrs.frozen
class ClientResult:
    """One client's figures in one case.

    Attributes:
        client: ``minimal``, ``provider``, ``slot`` or ``sdk``.
        label: What it is, for the table.
        per_chunk_us: Median of ``samples_us``.
        ratio: Median of ``ratios``.
        samples_us: CPU microseconds per chunk, one per round.
        ratios: Each round's CPU time over the minimal loop's in that round.
        wall_us: Wall-clock microseconds per chunk, one per round.
    """

    client: str
    label: str
    per_chunk_us: float
    ratio: float
    samples_us: tuple[float, ...]
    ratios: tuple[float, ...]
    wall_us: tuple[float, ...]


@attrs.frozen
class Case:
    """One wire format and kind of delta, every client measured on it."""

    format: str
    kind: str
    clients: tuple[ClientResult, ...]

    def result(self, client: str) -> ClientResult:
        """The result of ``client``; ``KeyError`` if it did not run."""
        for result in self.clients:
            if result.client == client:
                return result
        raise KeyError(client)


@attrs.frozen
class DecodeReport:
    """Everything one run measured, and the machine it ran on.

    Attributes:
        chunks: Deltas per stream.
        repeats: Timed rounds per case.
        quick: Whether ``--quick`` sizes were used.
        target: The highest ratio to the minimal loop our providers may have.
        worst_ratio: Our providers' highest ratio, direct or through a slot.
        cases: One per (format, kind).
        skipped: The official SDKs that could not be imported.
        environment: Interpreter, library versions, machine and load.
    """

    chunks: int
    repeats: int
    quick: bool
    target: float
    worst_ratio: float
    cases: tuple[Case, ...]
    skipped: tuple[str, ...]
    environment: dict[str, str]

    @property
    def met(self) -> bool:
        """Whether every ratio of our providers is within the target."""
        return self.worst_ratio <= self.target

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        return {**attrs.asdict(self, recurse=True), "met": self.met}

    def to_json(self) -> str:
        """The report as a JSON document."""
        return json.dumps(self.to_dict(), indent=2)

    def to_markdown(self) -> str:
        """The report as a markdown table."""
        env = self.environment
        sdks = [f"{name} {env[name]}" for name in FORMATS if name not in self.skipped]
        lines = [
            f"Per-chunk decode cost: trio-dispatch {env['trio_dispatch']}, trio"
            f" {env['trio']}, httpx2 {env['httpx2']},"
            f" {env['python']} on {env['platform']}, {env['cpus']} CPUs"
            + (f"; {' and '.join(sdks)}" if sdks else "")
            + ".",
            f"{self.chunks:,} chunks per stream from an in-memory"
            f" `httpx2.MockTransport` body; {self.repeats} interleaved rounds after"
            " a warm-up; the median CPU µs per chunk (`time.thread_time`), and the"
            " median of the per-round ratios to the minimal loop. Load average"
            f" {env['load_before']} before, {env['load_after']} after.",
            "",
            "| Format | Deltas | Client | CPU µs per chunk | vs minimal loop |",
            "|---|---|---|--:|--:|",
        ]
        for case in self.cases:
            for result in case.clients:
                lines.append(
                    f"| {_FORMAT_LABELS[case.format]} | {_KIND_LABELS[case.kind]}"
                    f" | {result.label}"
                    f" | {result.per_chunk_us:,.2f} | {result.ratio:.2f}x |"
                )
        lines += [
            "",
            f"Highest ratio of our providers: **{self.worst_ratio:.2f}x** (target"
            f" <= {self.target:.1f}x): {'met' if self.met else 'missed'}.",
        ]
        if self.skipped:
            lines.append(f"Not installed, skipped: {', '.join(self.skipped)}.")
        return "\n".join(lines) + "\n"


# -- the run -----------------------------------------------------------------


def _provider(
    fmt: str, client: httpx2.AsyncClient
) -> OpenAIProvider | AnthropicProvider:
    if fmt == "openai":
        return OpenAIProvider(
            "bench",
            base_url=f"{_BASE_URL}/v1",
            api_key="bench",
            model="m",
            client=client,
        )
    return AnthropicProvider(
        "bench", base_url=_BASE_URL, api_key="bench", model="m", client=client
    )


async def _measure_case(
    fmt: str, kind: str, chunks: int, repeats: int
) -> tuple[_Samples, _Samples, bool]:
    """Per-chunk CPU and wall µs of every client, one per round; the SDK ran."""
    body = (
        openai_body(kind, chunks) if fmt == "openai" else anthropic_body(kind, chunks)
    )
    expected = "".join(_pieces(kind, chunks))
    sdk = _sdk(fmt, kind, body)
    try:
        async with (
            _mock_client(httpx2, body) as client,
            open_dispatcher({"bench": 8}) as dispatcher,
        ):
            provider = _provider(fmt, client)
            clients = {
                "minimal": _minimal(client, fmt, kind),
                "provider": _ours(provider),
                "slot": _ours(wrap_provider(provider, dispatcher)),
            }
            if sdk is not None:
                clients["sdk"] = sdk[0]
            names = list(clients)
            samples: _Samples = {name: [] for name in names}
            walls: _Samples = {name: [] for name in names}
            for round_ in range(-1, repeats):  # round -1 warms up
                if round_ == 0:
                    # What the warm-up loaded (the SDKs' modules and models)
                    # lives on: out of the collector's way, so that a
                    # collection costs what the streams allocate, not the
                    # size of the heap.
                    gc.collect()
                    gc.freeze()
                shift = round_ % len(names)
                for name in names[shift:] + names[:shift]:
                    gc.collect()
                    wall, cpu = time.perf_counter(), time.thread_time()
                    seen = await clients[name]()
                    cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
                    if seen != expected:
                        raise RuntimeError(
                            f"benchmark went wrong: {name} saw other deltas"
                        )
                    if round_ >= 0:
                        samples[name].append(1e6 * cpu / chunks)
                        walls[name].append(1e6 * wall / chunks)
    finally:
        if sdk is not None:
            with trio.CancelScope(shield=True):
                await sdk[1]()
        gc.unfreeze()
        gc.collect()  # what the last stream left is finalised in this run
    return samples, walls, sdk is not None


def _case(fmt: str, kind: str, samples: _Samples, walls: _Samples) -> Case:
    minimal = samples["minimal"]
    results = []
    for name, times in samples.items():
        ratios = tuple(t / m for t, m in zip(times, minimal, strict=True))
        results.append(
            ClientResult(
                client=name,
                label=_LABELS[fmt, name],
                per_chunk_us=statistics.median(times),
                ratio=statistics.median(ratios),
                samples_us=tuple(times),
                ratios=ratios,
                wall_us=tuple(walls[name]),
            )
        )
    return Case(format=fmt, kind=kind, clients=tuple(results))


def _version(module: str) -> str:
    try:
        return str(importlib.import_module(module).__version__)
    except ImportError:
        return "not installed"


def run(
    *,
    chunks: int,
    repeats: int,
    quick: bool = False,
    progress: Callable[[str], None] | None = None,
) -> DecodeReport:
    """Measure every case and client; see the module notes for the method.

    Args:
        chunks: Deltas per stream, at least 2.
        repeats: Timed rounds per case, at least 1.
        quick: Recorded in the report.
        progress: Called with a short line before each case.
    """
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 2:
        raise ValueError(f"chunks must be an integer of at least 2, got {chunks!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive integer, got {repeats!r}")
    load_before = load_average()
    cases: list[Case] = []
    skipped: set[str] = set()
    for fmt in FORMATS:
        for kind in KINDS:
            if progress is not None:
                progress(f"{fmt}, {_KIND_LABELS[kind]}: {repeats} rounds")
            with warnings.catch_warnings():
                # The openai SDK leaves its stream's async generators
                # unfinished; trio warns as the collector (run before every
                # stream) finalises them. That is the SDK's, not measured.
                warnings.filterwarnings(
                    "ignore",
                    message=r"Async generator '(openai|anthropic|httpx2)\.",
                    category=ResourceWarning,
                )
                samples, walls, ran_sdk = trio.run(
                    _measure_case, fmt, kind, chunks, repeats
                )
            if not ran_sdk:
                skipped.add(fmt)
            cases.append(_case(fmt, kind, samples, walls))
    worst = max(
        case.result(client).ratio for case in cases for client in ("provider", "slot")
    )
    versions = {"openai": _version("openai"), "anthropic": _version("anthropic")}
    loads = {"load_before": load_before, "load_after": load_average()}
    found = environment(httpx2=True) | versions | loads
    return DecodeReport(
        chunks=chunks,
        repeats=repeats,
        quick=quick,
        target=TARGET,
        worst_ratio=worst,
        cases=tuple(cases),
        skipped=tuple(name for name in FORMATS if name in skipped),
        environment=found,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark, print its table and write its reports."""
    parser = command_line(
        __doc__, quick="200 chunks, 3 rounds (for tests)", out="decode"
    )
    parser.add_argument("--chunks", type=int, default=None, help="deltas per stream")
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds")
    args = parser.parse_args(argv)
    chunks = args.chunks or (200 if args.quick else 2_000)
    repeats = args.repeats or (3 if args.quick else 7)
    start = time.perf_counter()
    report = run(
        chunks=chunks, repeats=repeats, quick=args.quick, progress=show_progress
    )
    finish_in(report, args.out, "decode", started=start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
