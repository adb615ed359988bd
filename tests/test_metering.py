"""One metering path: who tells the dispatcher what an answer said, once."""

from __future__ import annotations

import trio

from trio_dispatch import open_dispatcher
from trio_dispatch._metering import tells_itself
from trio_dispatch.testing import FakeScript, ScriptedProvider


def test_providers_show_the_callbacks_they_were_given() -> None:
    def figures(provider: str, info: object) -> None: ...

    def pauses(provider: str, retry_after: float | None) -> None: ...

    scripted = ScriptedProvider(
        FakeScript(replies=()), id="p", on_rate_limit=pauses, on_rate_limits=figures
    )
    assert scripted.on_rate_limits is figures
    assert scripted.on_rate_limit is pauses
    assert ScriptedProvider(FakeScript(replies=()), id="p").on_rate_limits is None


async def test_only_the_dispatchers_own_callbacks_tell_it_by_themselves() -> None:
    async with (
        open_dispatcher({"p": 1}) as dispatcher,
        open_dispatcher({"p": 1}) as other,
    ):
        own = ScriptedProvider(
            FakeScript(replies=()),
            id="p",
            on_rate_limit=dispatcher.report_rate_limit,
            on_rate_limits=dispatcher.observe_rate_limits,
        )
        figures_only = ScriptedProvider(
            FakeScript(replies=()),
            id="p",
            on_rate_limits=dispatcher.observe_rate_limits,
        )
        others = ScriptedProvider(
            FakeScript(replies=()),
            id="p",
            on_rate_limit=other.report_rate_limit,
            on_rate_limits=other.observe_rate_limits,
        )
        wrapped = ScriptedProvider(
            FakeScript(replies=()),
            id="p",
            on_rate_limits=lambda provider, info: dispatcher.observe_rate_limits(  # noqa: PLW0108  # a callback of its own, which calls the dispatcher
                provider, info
            ),
        )
        assert tells_itself(own, dispatcher) == (True, True)
        assert tells_itself(figures_only, dispatcher) == (True, False)
        assert tells_itself(others, dispatcher) == (False, False)
        assert tells_itself(wrapped, dispatcher) == (False, False)
        assert tells_itself(object(), dispatcher) == (False, False)
        await trio.lowlevel.checkpoint()
