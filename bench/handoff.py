"""Hand-off benchmarks: trio-dispatch slots against trio.CapacityLimiter.

Usage::

    python bench/handoff.py [--quick] [--repeats N] [--json PATH]

Prints the results as a markdown table on stdout (progress goes to stderr)
and, with ``--json``, writes the full report, every sample included, to
``PATH``. Exits with status 1 if a target was missed.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

from trio_dispatch.benchmarks import run_handoff_benchmarks


def _progress(message: str) -> None:
    print(f"  {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks; the exit status says whether every target was met."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="smaller sizes, fewer repeats"
    )
    parser.add_argument(
        "--repeats", type=int, default=None, help="pairs of samples per benchmark"
    )
    parser.add_argument(
        "--json", type=pathlib.Path, default=None, help="write the report here"
    )
    args = parser.parse_args(argv)
    start = time.perf_counter()
    report = run_handoff_benchmarks(
        repeats=args.repeats, quick=args.quick, progress=_progress
    )
    _progress(f"done in {time.perf_counter() - start:.1f} s")
    print(report.to_markdown(), end="")
    if args.json is not None:
        args.json.write_text(report.to_json() + "\n", encoding="utf-8")
    return 0 if report.all_met else 1


if __name__ == "__main__":
    sys.exit(main())
