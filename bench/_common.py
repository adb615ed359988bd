"""What the benchmark scripts share: argument checks, paired samples, reports.

The scripts in ``bench/`` import this as ``_common``: run as
``python bench/NAME.py``, their own folder is the first entry of
``sys.path``. They use only the public API of trio_dispatch, as a user's
code would.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pathlib
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import TYPE_CHECKING, Any, Final, Protocol, final

import attrs
import trio

import trio_dispatch
from trio_dispatch.testing import percentile

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence


class Report(Protocol):
    """What a benchmark's report renders to."""

    def to_json(self) -> str:
        """The report as a JSON document."""
        ...

    def to_markdown(self) -> str:
        """The report as markdown."""
        ...


REPORTS: Final = pathlib.Path(__file__).resolve().parent / "reports"
"""Where the reports of ``bench/reports`` are written by default."""


def command_line(
    doc: str | None, *, quick: str | None = None, out: str | None = None
) -> argparse.ArgumentParser:
    """The command line every benchmark starts from; the script adds its own options.

    Args:
        doc: The script's docstring: its first paragraph describes the command.
        quick: The help of ``--quick`` (smaller runs), or ``None`` for none.
        out: The name of the reports that ``--out DIR`` writes in ``DIR``
            (``bench/reports`` by default), or ``None`` for ``--json PATH``,
            the JSON report written only when asked.
    """
    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    if quick is not None:
        parser.add_argument("--quick", action="store_true", help=quick)
    if out is None:
        parser.add_argument(
            "--json", type=pathlib.Path, default=None, help="write the JSON report here"
        )
    else:
        parser.add_argument(
            "--out", type=pathlib.Path, default=REPORTS, help=f"where {out}.md/json go"
        )
    return parser


def count(value: object, name: str, *, zero: bool = False) -> int:
    """``value`` if it is a positive ``int`` (or zero, with ``zero``), else ValueError.

    A ``bool`` is not a count.
    """
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < (0 if zero else 1)
    ):
        rule = "a non-negative" if zero else "a positive"
        raise ValueError(f"{name} must be {rule} integer, got {value!r}")
    return value


def count_option(*, zero: bool = False) -> Callable[[str], int]:
    """An argparse type: a positive integer (or zero, with ``zero``).

    A bad value is a usage error (status 2) before anything runs.
    """
    rule = "a non-negative" if zero else "a positive"

    def parse(text: str) -> int:
        try:
            return count(int(text), "value", zero=zero)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {rule} integer, got {text!r}"
            ) from None

    return parse


def positive_int(
    _instance: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    """An attrs validator: a positive ``int``, not a ``bool``; else ValueError."""
    count(value, attribute.name)


def paired(
    first: Sequence[float], second: Sequence[float]
) -> list[tuple[float, float]]:
    """Samples taken in turns, as pairs; ValueError unless there is one at least.

    The benchmarks alternate their two sides, so a sample's neighbour on the
    other side ran under the same machine load: comparisons are made pair
    by pair, and summed up by their median.
    """
    if not first or len(first) != len(second):
        raise ValueError("samples must come in pairs, at least one")
    return list(zip(first, second, strict=True))


@final
@attrs.frozen
class AddedLatency:
    """Latency of one measure, direct and through trio-dispatch, in microseconds.

    Attributes:
        direct_p50: Median of the direct calls.
        direct_p99: 99th percentile of the direct calls.
        through_p50: Median of the calls through trio-dispatch.
        through_p99: 99th percentile of the calls through it.
        added_p50: ``through_p50 - direct_p50``.
        added_p99: ``through_p99 - direct_p99``.
        added_paired_median: Median of the per-pair differences.
    """

    direct_p50: float
    direct_p99: float
    through_p50: float
    through_p99: float
    added_p50: float
    added_p99: float
    added_paired_median: float

    @classmethod
    def from_samples(
        cls, direct: Sequence[float], through: Sequence[float]
    ) -> AddedLatency:
        """Summarise paired samples, in seconds, as microseconds."""
        pairs = paired(direct, through)
        d50, d99 = percentile(direct, 50), percentile(direct, 99)
        t50, t99 = percentile(through, 50), percentile(through, 99)
        added = statistics.median(t - d for d, t in pairs)
        return cls(
            direct_p50=1e6 * d50,
            direct_p99=1e6 * d99,
            through_p50=1e6 * t50,
            through_p99=1e6 * t99,
            added_p50=1e6 * (t50 - d50),
            added_p99=1e6 * (t99 - d99),
            added_paired_median=1e6 * added,
        )


def latency_table(through: str, rows: Sequence[tuple[str, AddedLatency]]) -> list[str]:
    """A markdown table of ``rows`` (label, latency), in µs; ``through`` names the path."""
    lines = [
        f"| Measure | Direct p50 | {through} p50 | Added p50 | Direct p99"
        f" | {through} p99 | Added p99 | Added, paired median |",
        "|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for label, m in rows:
        lines.append(
            f"| {label} | {m.direct_p50:,.0f} | {m.through_p50:,.0f}"
            f" | {m.added_p50:+,.0f} | {m.direct_p99:,.0f}"
            f" | {m.through_p99:,.0f} | {m.added_p99:+,.0f}"
            f" | {m.added_paired_median:+,.0f} |"
        )
    return lines


def plain(value: attrs.AttrsInstance) -> dict[str, Any]:
    """An attrs value as JSON's own types: fields as keys, tuples as lists."""
    return attrs.asdict(value, value_serializer=_listed)


def _listed(_instance: object, _field: object, value: object) -> object:
    return list(value) if isinstance(value, tuple) else value


def load_average() -> str:
    """The machine's load average over the last minute, for a report's header."""
    return f"{os.getloadavg()[0]:.2f}"


def bars_and_machine(
    bars: dict[str, bool], environment: dict[str, str], load: str
) -> list[str]:
    """A report's closing lines: each bar met or missed, then where it ran."""
    return [
        *(f"- {'met' if ok else 'MISSED'}: {name}" for name, ok in bars.items()),
        "",
        ", ".join(f"{key} {value}" for key, value in environment.items())
        + f"; load average {load}",
    ]


def environment(*, httpx2: bool = False) -> dict[str, str]:
    """Interpreter, library versions and machine, for a report's header.

    Args:
        httpx2: Include httpx2's version (the HTTP benchmark's client).
    """
    found = {
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "trio": trio.__version__,
    }
    if httpx2:
        import httpx2 as client  # noqa: PLC0415 (only for its version)

        found["httpx2"] = client.__version__
    found |= {
        "trio_dispatch": trio_dispatch.__version__,
        "platform": f"{sys.platform} {platform.machine()}",
        "cpus": str(os.cpu_count()),
    }
    return found


def show_progress(message: str) -> None:
    """Show how a run is going, on stderr: stdout is for the report."""
    print(f"  {message}", file=sys.stderr, flush=True)


def finish(
    report: Report,
    *,
    json_path: pathlib.Path | None,
    started: float,
    markdown_path: pathlib.Path | None = None,
) -> None:
    """Print the report's markdown, and write it where asked.

    Args:
        report: The finished run's report.
        json_path: Where to write the JSON report, or ``None``.
        started: ``time.perf_counter()`` when the run started.
        markdown_path: Where to write the markdown report too, or ``None``.
    """
    show_progress(f"done in {time.perf_counter() - started:.1f} s")
    markdown = report.to_markdown()
    print(markdown, end="" if markdown.endswith("\n") else "\n")
    if markdown_path is not None:
        markdown_path.write_text(markdown, encoding="utf-8")
    if json_path is not None:
        json_path.write_text(report.to_json() + "\n", encoding="utf-8")


def finish_in(report: Report, out: pathlib.Path, name: str, *, started: float) -> None:
    """``finish``, writing ``<name>.md`` and ``<name>.json`` in the folder ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    finish(
        report,
        json_path=out / f"{name}.json",
        markdown_path=out / f"{name}.md",
        started=started,
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on, as of now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def redis_server() -> Iterator[str]:
    """Run a throwaway redis-server; yields its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit("redis-server is not installed (apt-get install redis-server)")
    port = free_port()
    with tempfile.TemporaryDirectory() as directory:
        process = subprocess.Popen(
            [
                *(binary, "--port", str(port), "--bind", "127.0.0.1"),
                *("--save", "", "--appendonly", "no", "--dir", directory),
            ],
            stdout=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    with socket.create_connection(("127.0.0.1", port), 0.2):
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.02)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            process.kill()
            process.wait()
