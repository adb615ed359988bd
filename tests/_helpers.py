"""Shared test helpers."""

from __future__ import annotations

import trio
import trio.testing


async def settle() -> None:
    """Let every task run until all are blocked, schedulers included."""
    await trio.testing.wait_all_tasks_blocked()


def task_names() -> list[str]:
    """The names of every task in the run."""
    names: list[str] = []
    stack = [trio.lowlevel.current_root_task()]
    while stack:
        task = stack.pop()
        if task is None:
            continue
        names.append(task.name)
        for nursery in task.child_nurseries:
            stack.extend(nursery.child_tasks)
    return names


def chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and everything behind it, through causes and contexts."""
    seen: list[BaseException] = []
    stack = [exc]
    while stack:
        current = stack.pop()
        if any(current is known for known in seen):
            continue
        seen.append(current)
        stack.extend(
            e for e in (current.__cause__, current.__context__) if e is not None
        )
    return seen
