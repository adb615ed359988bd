"""The latency trio-dispatch adds to one LLM call, over loopback HTTP.

Usage::

    python bench/http_latency.py [--calls N] [--warmup N] [--json PATH]

Streams the same answer from the fake LLM server straight through an
``OpenAIProvider`` and through ``wrap_provider``, interleaved, and prints
p50/p99 of the time to first event and to stream end as a markdown table
on stdout (progress goes to stderr). With ``--json``, writes the report
to ``PATH``.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

from trio_dispatch.benchmarks import run_http_benchmark


def _progress(message: str) -> None:
    print(f"  {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2_000, help="timed calls per path")
    parser.add_argument(
        "--warmup", type=int, default=100, help="untimed calls per path first"
    )
    parser.add_argument(
        "--json", type=pathlib.Path, default=None, help="write the report here"
    )
    args = parser.parse_args(argv)
    start = time.perf_counter()
    report = run_http_benchmark(
        calls=args.calls, warmup=args.warmup, progress=_progress
    )
    _progress(f"done in {time.perf_counter() - start:.1f} s")
    print(report.to_markdown(), end="")
    if args.json is not None:
        args.json.write_text(report.to_json() + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
