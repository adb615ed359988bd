"""The one exception-group walker."""

from __future__ import annotations

import trio

from trio_dispatch._groups import first, leaves, only


def nested() -> tuple[BaseExceptionGroup[BaseException], list[BaseException]]:
    a, b, c, d = ValueError("a"), KeyError("b"), OSError("c"), ValueError("d")
    group = BaseExceptionGroup(
        "outer", [a, BaseExceptionGroup("inner", [b, ExceptionGroup("deep", [c])]), d]
    )
    return group, [a, b, c, d]


def test_leaves_are_every_non_group_in_order() -> None:
    group, expected = nested()
    assert list(leaves(group)) == expected
    plain = ValueError("x")
    assert list(leaves(plain)) == [plain]


def test_only_is_true_when_every_leaf_is_of_the_kind() -> None:
    group, _ = nested()
    assert only(group, Exception)
    assert not only(group, ValueError)
    assert only(BaseExceptionGroup("g", [KeyboardInterrupt()]), KeyboardInterrupt)
    assert only(KeyboardInterrupt(), KeyboardInterrupt)
    assert not only(
        BaseExceptionGroup("g", [KeyboardInterrupt(), ValueError()]), KeyboardInterrupt
    )


def test_first_finds_the_first_leaf_of_a_kind() -> None:
    group, (a, _, c, _) = nested()
    assert first(group, ValueError) is a
    assert first(group, OSError) is c
    assert first(group, trio.Cancelled) is None
