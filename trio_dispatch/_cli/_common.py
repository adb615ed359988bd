"""What every command shares: exit reasons, the trio run, files, consoles, PNGs."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from .._util import needs_extra

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable, Sequence

    import trio
    from rich.console import Console

_T = TypeVar("_T")


class UsageError(Exception):
    """Options that parse but cannot work: nothing has run yet (status 2)."""


class Failure(Exception):
    """A run that could not finish its job, such as writing its files (status 1)."""


class MissingExtra(Exception):
    """A package the command needs is not installed (status 1)."""


def run_trio(
    async_fn: Callable[[], Awaitable[_T]], *, clock: trio.abc.Clock | None = None
) -> _T:
    """``trio.run(async_fn)``, where Ctrl+C cancels the run.

    trio's own Ctrl+C raises KeyboardInterrupt in whatever code happens to
    be running, and code we do not own may take it for something else:
    hypercorn takes one in its tasks as its cue to stop, and swallows it,
    so ``serve-fake`` slept on with no server left, and the demo lost one
    in a request's handler and went on. Here SIGINT arrives as a message
    instead and cancels the run, which every task knows how to end; once
    everything has unwound, KeyboardInterrupt is raised from here. Pressing
    Ctrl+C again while the run unwinds changes nothing.

    If SIGINT is not Python's default handler (ignored, as in a background
    job, or taken by whoever called us), it is left alone, as trio does.

    Raises:
        KeyboardInterrupt: Ctrl+C came while ``async_fn`` ran.
    """
    import trio  # noqa: PLC0415

    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return trio.run(async_fn, clock=clock)
    interrupted = False

    async def cancelled_by_ctrl_c() -> _T:
        # The receiver is open before anything else starts, so that no
        # task of the run ever sees a KeyboardInterrupt of its own.
        with trio.open_signal_receiver(signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:

                async def cancel_on_ctrl_c() -> None:
                    nonlocal interrupted
                    async for _ in signals:
                        interrupted = True
                        nursery.cancel_scope.cancel()

                nursery.start_soon(cancel_on_ctrl_c)
                result = await async_fn()
                nursery.cancel_scope.cancel()
        # Even if async_fn finished in the same moment: the user asked to
        # stop, and must not see the command go on to write its files.
        if interrupted:
            raise KeyboardInterrupt
        return result

    return trio.run(cancelled_by_ctrl_c, clock=clock)


# Which extra brings each optional package; ``demo`` includes ``testing``.
_EXTRAS = {"hypercorn": "testing", "matplotlib": "demo", "rich": "demo"}


def require(what: str, modules: Sequence[str]) -> None:
    """Refuse to start ``what`` unless ``modules`` import; name the extra to install."""
    if not all(map(_importable, modules)):
        extra = "demo" if any(_EXTRAS[m] == "demo" for m in modules) else "testing"
        raise MissingExtra(needs_extra(f"trio-dispatch {what}", extra))


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


# ------------------------------------------------------------------ files


def check_outputs(files: Iterable[Path] = (), folders: Iterable[Path] = ()) -> None:
    """Refuse, before any work, outputs that could not be written.

    A file must not be a folder, nor named twice; its folder (and each
    output folder) must be a writable directory, or else missing with its
    nearest existing ancestor a writable directory, so it can be made.
    Nothing is created here.
    """
    seen: set[Path] = set()
    for path in files:
        if path.is_dir():
            raise UsageError(f"cannot write {path}: it is a directory")
        if (resolved := path.resolve()) in seen:
            raise UsageError(f"cannot write {path} twice")
        seen.add(resolved)
        _check_folder(path.parent, path)
    for folder in folders:
        _check_folder(folder, folder)


def _check_folder(folder: Path, target: Path) -> None:
    existing = folder
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"cannot write {target}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write {target}: {existing} is not writable")


def write_files(files: dict[Path, bytes]) -> None:
    """Write every file whole: each beside its target, then renamed in place.

    If one cannot be written, the run fails with one line, and what was
    staged and the folders made for it are removed again.
    """
    # mkstemp makes files private (0600); give them the usual permissions.
    umask = os.umask(0)
    os.umask(umask)
    made: list[Path] = []
    staged: list[tuple[str, Path]] = []
    path = Path()
    try:
        for path in files:
            _make_folders(path.parent, made)
        for path, data in files.items():
            fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            staged.append((temporary, path))
            os.chmod(temporary, 0o666 & ~umask)
        for temporary, path in staged:
            os.replace(temporary, path)
        staged.clear()
        made.clear()
    except OSError as exc:
        raise Failure(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        for temporary, _ in staged:
            Path(temporary).unlink(missing_ok=True)
        for folder in reversed(made):
            # Only if still empty: a file renamed into it before the failure stays.
            with contextlib.suppress(OSError):
                folder.rmdir()


def _make_folders(folder: Path, made: list[Path]) -> None:
    """Make ``folder`` and its missing parents, adding each one made to ``made``."""
    missing: list[Path] = []
    while not os.path.lexists(folder) and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    for each in reversed(missing):
        each.mkdir()
        made.append(each)


def json_bytes(data: object) -> bytes:
    return (json.dumps(data, indent=1, sort_keys=True) + "\n").encode()


def rich_console() -> Console:
    from rich.console import Console  # noqa: PLC0415 (the demo extra, loaded when used)

    console = Console(highlight=False, soft_wrap=True)
    if not console.is_terminal:
        # Piped or captured: tables as wide as they need, not 80 columns.
        console.width = 160
    return console


def maybe_console() -> Console | None:
    """rich's console if rich is installed, else ``None``: plain output."""
    return rich_console() if _importable("rich") else None


def say(console: Console | None, text: str) -> None:
    """Print ``text`` as it is (never as markup), with rich or without."""
    if console is None:
        print(text, flush=True)
    else:
        console.print(text, markup=False)


def print_table(
    console: Console | None,
    title: str,
    columns: Sequence[str],
    rows: Iterable[Sequence[str]],
) -> None:
    """A table, first column to the left and the rest to the right."""
    rows = list(rows)
    if console is not None:
        from rich.table import Table  # noqa: PLC0415 (the demo extra, loaded when used)

        table = Table(title=title)
        for index, column in enumerate(columns):
            table.add_column(column, justify="left" if index == 0 else "right")
        for row in rows:
            table.add_row(*row)
        console.print(table)
        return
    widths = [max(map(len, cells)) for cells in zip(columns, *rows, strict=True)]
    lines = [title]
    for first, *rest in (columns, *rows):
        cells = [first.ljust(widths[0])]
        cells += [
            cell.rjust(width) for cell, width in zip(rest, widths[1:], strict=True)
        ]
        lines.append("  ".join(cells))
    print("\n".join(lines), flush=True)


def spinner(
    console: Console | None, text: str
) -> contextlib.AbstractContextManager[object]:
    """rich's spinner with ``text`` while the block runs; nothing without rich."""
    return contextlib.nullcontext() if console is None else console.status(text)


def png(draw: Callable[[Any], None]) -> bytes:
    """Draw with matplotlib on fresh axes and return the PNG bytes."""

    def on_axes(figure: Any) -> None:  # noqa: ANN401 (a matplotlib Figure)
        draw(figure.subplots())
        figure.tight_layout()

    return figure_png(on_axes, (8, 4.5))


def figure_png(
    draw: Callable[[Any], None], size: tuple[float, float] = (12, 6.5)
) -> bytes:
    """Draw with matplotlib on a fresh, empty figure; return the PNG bytes."""
    import io  # noqa: PLC0415

    import matplotlib  # noqa: PLC0415 (the demo extra, loaded when used)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    figure = plt.figure(figsize=size)
    try:
        draw(figure)
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=100)
        return buffer.getvalue()
    finally:
        plt.close(figure)


# ------------------------------------------------------------------ demo
