"""A pool's member killed mid-run: no turn fails, its calls go to the other, it comes back.

Usage::

    python bench/pool_failover.py [--quick] [--seconds S] [--seed S] [--json PATH]

Real time, real sockets: two fake LLM servers on loopback (keys
``secret-a`` and ``secret-b``) are the members ``key-a`` and ``key-b`` of
a pool ``gpt`` (4 slots each, ``failure_threshold`` 3, ``failure_cooldown``
5 s). Conversations over the pool (``PoolProvider`` of two
``OpenAIProvider``s, through ``start_conversation``) arrive at random (a
Poisson process, seeded), each asking 1 to 3 questions in a row, each
question one turn and one streamed call of about 1.2 s (0.2 s to its
first token, then 20 tokens at 20 per second). They offer 60% of the
pool's capacity: while key-b is down, key-a alone gets 120% of its own,
and a queue grows, which key-b's return drains.

At a quarter of the run key-b's server is killed: its listening socket
closes and the calls it is streaming are cut. At 60% of the run it comes
back on the same port. The run then goes on to its end, and every
conversation started is awaited.

The report: the turns asked, answered and failed; the calls each server
answered; the calls sent to key-b while its server was down (each one
refused, then sent again on key-a at once, in its place) and the calls
cut mid-stream by the kill (the conversation's own retry sends them
again); key-b's moves out of service, half-open and back in, from the
dispatcher's ``ServiceChanged`` events, with the seconds from its
server's return to its probe and to its return to service.

Issue 29's bars, checked: no turn fails; while key-b's server is down, no
call is answered by it and every call is answered by key-a; key-b is back
in service within one cooldown of its server's return (its probe granted
within ``failure_cooldown``, and back in once that one call is answered).
The exit status is 1 if a bar is missed. Uses only the public API.
"""

from __future__ import annotations

import json
import random
import sys
import time
from typing import TYPE_CHECKING

import attrs
import trio
import trio.testing

import trio_dispatch
from trio_dispatch.events import ServiceChanged
from trio_dispatch.providers import OpenAIProvider
from trio_dispatch.testing import FakeReply, FakeScript, open_fake_llm_server

from _common import (
    bars_and_machine,
    command_line,
    environment,
    finish,
    free_port,
    load_average,
    show_progress,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

MEMBER = 4
LOAD = 0.6  # of the pool's capacity
THRESHOLD = 3
COOLDOWN = 5.0
QUESTIONS = (1, 3)
KILL_AT = 0.25
BACK_AT = 0.6
# One call: 0.2 s to the first token, then 20 tokens at 20 per second.
REPLY = FakeReply(
    text=" ".join(["word"] * 20), time_to_first_token=0.2, tokens_per_second=20.0
)
CALL = 0.2 + 19 / 20.0


@attrs.frozen
class Change:
    """One of key-b's ``ServiceChanged`` events, seconds from the run's start."""

    at: float
    state: str


@attrs.frozen
class FailoverReport:
    """What happened, the bars, and where it was measured."""

    seconds: float
    seed: int
    killed_at: float
    back_at: float
    turns: int
    answered: int
    failed: int
    answered_by_a: int
    answered_by_a_while_down: int
    answered_by_b: int
    sent_to_b_while_down: int
    probes_while_down: int
    calls_sent: int
    retries: int
    changes: list[Change]
    probe_after: float | None
    back_in_service_after: float | None
    bars: dict[str, bool]
    environment: dict[str, str] = attrs.field(factory=environment)
    load: str = attrs.field(factory=load_average)

    def to_json(self) -> str:
        return json.dumps(attrs.asdict(self), indent=2)

    def to_markdown(self) -> str:
        def seconds(value: float | None) -> str:
            return "never" if value is None else f"{value:.2f} s"

        changes = ", ".join(f"{c.state} at {c.at:.2f} s" for c in self.changes)
        lines = [
            f"Two members of {MEMBER} slots, failure_threshold {THRESHOLD},"
            f" failure_cooldown {COOLDOWN:g} s; conversations of"
            f" {QUESTIONS[0]}-{QUESTIONS[1]} turns of one ~{CALL:.1f} s call,"
            f" offering {LOAD:.0%} of the pool's capacity; {self.seconds:g} s"
            f" of real time, seed {self.seed}. key-b's server killed at"
            f" {self.killed_at:.2f} s, back at {self.back_at:.2f} s.",
            "",
            "| Turns asked | answered | failed | Calls sent | Retries |"
            " Requests to A | to A while B down | to B's servers |"
            " Granted on key-b while down | Its probes then |",
            "|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
            f"| {self.turns} | {self.answered} | {self.failed} | {self.calls_sent}"
            f" | {self.retries} | {self.answered_by_a}"
            f" | {self.answered_by_a_while_down} | {self.answered_by_b}"
            f" | {self.sent_to_b_while_down} | {self.probes_while_down} |",
            "",
            f"key-b: {changes}. From its server's return: probe"
            f" {seconds(self.probe_after)}, back in service"
            f" {seconds(self.back_in_service_after)}.",
            "",
            *bars_and_machine(self.bars, self.environment, self.load),
        ]
        return "\n".join(lines) + "\n"


@attrs.define
class _Tally:
    """The turns and calls of the run, and what the timeline saw."""

    turns: int = 0
    answered: int = 0
    failed: int = 0
    calls: int = 0
    retries: int = 0
    b_answered: int = 0  # by key-b's servers, before the kill and after the return
    a_at_kill: int = 0
    a_at_back: int = 0
    b_granted_at_kill: int = 0
    b_granted_at_back: int = 0


async def _run(seconds: float, seed: int) -> FailoverReport:  # noqa: PLR0915  # one timeline, its parts beside it
    rng = random.Random(seed)
    script = FakeScript(default=REPLY)
    port_b = free_port()
    tally = _Tally()
    changes: list[Change] = []
    start = trio.current_time()
    killed_at = KILL_AT * seconds
    back_at = BACK_AT * seconds
    async with (
        open_fake_llm_server(script, api_key="secret-a") as a,
        trio_dispatch.open_dispatcher(
            {"key-a": MEMBER, "key-b": MEMBER},
            pools={"gpt": ("key-a", "key-b")},
            failure_threshold=THRESHOLD,
            failure_cooldown=COOLDOWN,
        ) as dispatcher,
        dispatcher.events() as events,
        OpenAIProvider(
            "key-a", base_url=a.openai_base_url, api_key="secret-a", model="fake"
        ) as key_a,
        OpenAIProvider(
            "key-b",
            base_url=f"http://127.0.0.1:{port_b}/v1",
            api_key="secret-b",
            model="fake",
        ) as key_b,
        trio.open_nursery() as nursery,
    ):
        pool = trio_dispatch.PoolProvider("gpt", {"key-a": key_a, "key-b": key_b})

        async def watch() -> None:
            async for event in events:
                if isinstance(event, ServiceChanged) and event.provider == "key-b":
                    changes.append(Change(event.at - start, event.state))

        async def serve_b(
            scope: trio.CancelScope, *, task_status: trio.TaskStatus[None]
        ) -> None:
            """key-b's server on its port until ``scope`` is cancelled (killed)."""
            with scope:
                async with open_fake_llm_server(
                    script, api_key="secret-b", port=port_b
                ) as b:
                    task_status.started()
                    try:
                        await trio.sleep_forever()
                    finally:
                        tally.b_answered += b.statistics().requests_total

        def key_b_granted() -> int:
            return dispatcher.statistics().providers["key-b"].granted_total

        async def timeline() -> None:
            await trio.sleep_until(start + killed_at)
            show_progress(f"key-b's server killed at {killed_at:.1f} s")
            first.cancel()
            tally.a_at_kill = a.statistics().requests_total
            tally.b_granted_at_kill = key_b_granted()
            await trio.sleep_until(start + back_at)
            tally.a_at_back = a.statistics().requests_total
            tally.b_granted_at_back = key_b_granted()
            show_progress(f"key-b's server back at {back_at:.1f} s")
            await nursery.start(serve_b, second)

        async def session(questions: int) -> None:
            conversation = dispatcher.start_conversation(pool)
            for index in range(questions):
                tally.turns += 1
                try:
                    result = await conversation.ask(f"question {index}")
                except Exception:  # a failed turn is what is counted
                    tally.failed += 1
                    continue
                tally.answered += 1
                tally.calls += result.llm_calls
                tally.retries += result.retries

        first, second = trio.CancelScope(), trio.CancelScope()
        nursery.start_soon(watch)
        await nursery.start(serve_b, first)
        nursery.start_soon(timeline)
        async with trio.open_nursery() as sessions:
            at = 0.0
            while True:
                # Sessions per second: calls per second over the mean questions.
                at += rng.expovariate(LOAD * 2 * MEMBER / CALL / 2.0)
                if at >= seconds:
                    break
                await trio.sleep_until(start + at)
                sessions.start_soon(session, rng.randint(*QUESTIONS))
        answered_by_a = a.statistics().requests_total
        second.cancel()
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    return _report(seconds, seed, tally, changes, answered_by_a)


def _report(
    seconds: float,
    seed: int,
    tally: _Tally,
    changes: list[Change],
    answered_by_a: int,
) -> FailoverReport:
    """The run's report: its figures and bars."""
    killed_at = KILL_AT * seconds
    back_at = BACK_AT * seconds
    probe = next(
        (c.at - back_at for c in changes if c.state == "half_open" and c.at >= back_at),
        None,
    )
    came_back = next(
        (c.at - back_at for c in changes if c.state == "in" and c.at >= back_at), None
    )
    sent_down = tally.b_granted_at_back - tally.b_granted_at_kill
    probes_down = sum(
        1 for c in changes if c.state == "half_open" and killed_at <= c.at < back_at
    )
    bars = {
        "no turn fails": tally.failed == 0 and tally.answered == tally.turns,
        "while key-b is down, only the calls that take it out and its probes"
        " go to it (each then to key-a)": sent_down <= THRESHOLD + probes_down,
        f"key-b's probe within one cooldown ({COOLDOWN:g} s) of its return": (
            probe is not None and probe <= COOLDOWN
        ),
        "key-b back in service once its probe is answered": (
            came_back is not None
            and probe is not None
            and came_back <= probe + 2 * CALL
        ),
    }
    return FailoverReport(
        seconds=seconds,
        seed=seed,
        killed_at=killed_at,
        back_at=back_at,
        turns=tally.turns,
        answered=tally.answered,
        failed=tally.failed,
        answered_by_a=answered_by_a,
        answered_by_a_while_down=tally.a_at_back - tally.a_at_kill,
        answered_by_b=tally.b_answered,
        sent_to_b_while_down=sent_down,
        probes_while_down=probes_down,
        calls_sent=tally.calls,
        retries=tally.retries,
        changes=changes,
        probe_after=probe,
        back_in_service_after=came_back,
        bars=bars,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = command_line(__doc__, quick="16 s of real time instead of 40")
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--seed", type=int, default=1)
    options = parser.parse_args(argv)
    started = time.perf_counter()
    seconds = options.seconds or (16.0 if options.quick else 40.0)
    report = trio.run(_run, seconds, options.seed)
    finish(report, json_path=options.json, started=started)
    return 0 if all(report.bars.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
