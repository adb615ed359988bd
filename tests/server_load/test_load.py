"""``ServerLoad``: a server's running and waiting requests, checked on its fields."""

from __future__ import annotations

import attrs
import pytest

from trio_dispatch import ServerLoad


def test_a_load_names_its_figures_and_its_server() -> None:
    load = ServerLoad(running=6, waiting=2, format="sglang")
    assert (load.running, load.waiting, load.format) == (6, 2, "sglang")
    assert ServerLoad(running=0, waiting=0).format is None
    assert repr(load) == "ServerLoad(running=6, waiting=2, format='sglang')"
    assert load == ServerLoad(running=6, waiting=2, format="sglang")


def test_a_load_is_frozen_and_its_figures_are_keywords() -> None:
    load = ServerLoad(running=1, waiting=0)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        load.running = 2  # type: ignore[misc]  # the assignment is the test
    # Two counts of requests side by side: never taken by position.
    with pytest.raises(TypeError):
        ServerLoad(1, 0)  # type: ignore[call-arg]  # the call is the test


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        (
            {"running": -1, "waiting": 0},
            ValueError,
            r"^running must be a non-negative integer, got -1$",
        ),
        (
            {"running": 0, "waiting": -3},
            ValueError,
            r"^waiting must be a non-negative integer, got -3$",
        ),
        (
            {"running": 3.0, "waiting": 0},
            TypeError,
            r"^running must be a non-negative integer, got 3\.0$",
        ),
        (
            {"running": True, "waiting": 0},
            TypeError,
            r"^running must be a non-negative integer, got True$",
        ),
        (
            {"running": 0, "waiting": "2"},
            TypeError,
            r"^waiting must be a non-negative integer, got '2'$",
        ),
        (
            {"running": 0, "waiting": None},
            TypeError,
            r"^waiting must be a non-negative integer, got None$",
        ),
        (
            {"running": 0, "waiting": 0, "format": "vLLM"},
            ValueError,
            r"^format must be one of vllm, llama\.cpp, sglang, tgi, got 'vLLM'$",
        ),
        (
            {"running": 0, "waiting": 0, "format": 1},
            TypeError,
            r"^format must be one of vllm, llama\.cpp, sglang, tgi, got 1$",
        ),
    ],
)
def test_a_load_refuses_what_is_no_count_of_requests(
    arguments: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        ServerLoad(**arguments)  # type: ignore[arg-type]  # the wrong types are the test
