"""Priority classes under load: each class's waits, with and without aging.

Usage::

    python bench/priority_classes.py [--quick] [--jobs N] [--out DIR]

Plays one seeded workload per load (10,000 agent turns by default, a fifth
of them of class 1, the rest of class 0) through the real dispatcher in
virtual time (``run_priority_classes``), once per ``priority_aging``, and
reports each class's p95 and longest wait: a turn's total wait for slots,
and the longest wait of a single call. An aging of 1e9 s stands for strict
classes (no aging over runs this long), which starve the lower class under
overload; the figures show how far an aging bounds that.

Prints the markdown table on stdout and writes it, and the JSON report, to
``DIR/priority_classes.md`` and ``DIR/priority_classes.json``
(``bench/reports`` by default). The figures are virtual time: the same on
any machine.
"""

from __future__ import annotations

import time

from trio_dispatch.testing import PriorityClassesConfig, run_priority_classes

from _common import command_line, finish_in


def main() -> None:
    """Run the sweep and write its report."""
    parser = command_line(
        __doc__, quick="1,000 turns per run, not 10,000", out="priority_classes"
    )
    parser.add_argument("--jobs", type=int, default=1, help="processes to use")
    args = parser.parse_args()
    started = time.perf_counter()
    config = PriorityClassesConfig(agents=1_000 if args.quick else 10_000)
    report = run_priority_classes(config, jobs=args.jobs)
    finish_in(report, args.out, "priority_classes", started=started)


if __name__ == "__main__":
    main()
