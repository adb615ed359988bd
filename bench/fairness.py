"""Run the fairness benchmark: turn latency under load, policy against policy.

Usage::

    python bench/fairness.py [--quick] [--out DIR] [--agents N] [--jobs N]

Writes ``fairness.json``, ``fairness.md`` and two PNG plots into ``DIR``
(default ``bench/results/fairness``) and prints the markdown. Everything runs
in virtual time, so the numbers are the same on any machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import attrs

from trio_dispatch.benchmarks import FairnessConfig, run_fairness_sweep


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, run the sweep, write and print the report."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="a smaller sweep, for a first look"
    )
    parser.add_argument(
        "--out", default="bench/results/fairness", help="where to write the report"
    )
    parser.add_argument("--agents", type=int, help="turns per run (overrides)")
    parser.add_argument("--seed", type=int, help="workload seed (overrides)")
    parser.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        help="processes to run sweep points in (default: one per CPU)",
    )
    args = parser.parse_args(argv)
    config = FairnessConfig.quick() if args.quick else FairnessConfig()
    if args.agents is not None:
        config = attrs.evolve(config, agents=args.agents)
    if args.seed is not None:
        config = attrs.evolve(config, seed=args.seed)
    started = time.perf_counter()
    report = run_fairness_sweep(config, jobs=args.jobs)
    elapsed = time.perf_counter() - started
    paths = report.write(args.out)
    print(report.to_markdown())
    print(f"Ran {len(report.rows)} simulations in {elapsed:.1f} s (wall clock).")
    for path in paths:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
