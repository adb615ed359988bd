"""One metering path: what a provider tells by itself is its call's, once."""

from __future__ import annotations

import trio
import trio.testing

from trio_dispatch import Quota, RateLimitInfo, open_dispatcher

FIGURES = RateLimitInfo(requests=Quota(limit=600, remaining=100, reset=50.0))


async def test_a_callback_from_the_calling_task_is_its_calls() -> None:
    async with (
        open_dispatcher({"p": 2, "q": 2}) as dispatcher,
        dispatcher.slot("p") as slot,
    ):
        with dispatcher.calling(slot) as call:
            dispatcher.observe_rate_limits("q", FIGURES)  # another provider
            assert (call.observed, call.reported) == (False, False)
            dispatcher.observe_rate_limits("p", FIGURES)
            assert (call.observed, call.reported) == (True, False)
            dispatcher.report_rate_limit("p", 1.0)
            assert (call.observed, call.reported) == (True, True)
        assert call.slot is slot


async def test_a_callback_from_another_task_is_not_the_calls() -> None:
    async with (
        open_dispatcher({"p": 2}) as dispatcher,
        dispatcher.slot("p") as slot,
    ):

        async def callbacks() -> None:
            dispatcher.observe_rate_limits("p", FIGURES)
            dispatcher.report_rate_limit("p", None)
            await trio.lowlevel.checkpoint()

        with dispatcher.calling(slot) as call:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(callbacks)
            assert (call.observed, call.reported) == (False, False)


async def test_calls_nest_and_the_outer_one_comes_back() -> None:
    async with (
        open_dispatcher({"p": 2}) as dispatcher,
        dispatcher.slot("p") as outer_slot,
        dispatcher.slot("p") as slot,
    ):
        with dispatcher.calling(outer_slot) as outer:
            with dispatcher.calling(slot) as inner:
                dispatcher.observe_rate_limits("p", FIGURES)
            assert inner.observed
            assert not outer.observed
            dispatcher.observe_rate_limits("p", FIGURES)
            assert outer.observed
