"""Priority classes in the simulator: drawn workloads, exact runs, the sweep."""

from __future__ import annotations

import math

import attrs
import pytest

from trio_dispatch.testing import (
    PoissonArrivals,
    PriorityClassesConfig,
    Scenario,
    SimProvider,
    TurnSpec,
    Workload,
    run_priority_classes,
    run_simulation,
)


def _waits(aging: float) -> dict[str, float]:
    # Limit 1. A holds the slot from 0 to 10; B (class 0) asks at 1, C
    # (class 1) at 2. C's class is worth `aging` seconds of turn age.
    scenario = Scenario(
        providers=[SimProvider("p", 1)],
        turns=[
            TurnSpec(0.0, "p", (10.0,)),
            TurnSpec(1.0, "p", (1.0,)),
            TurnSpec(2.0, "p", (1.0,), priority=1),
        ],
    )
    result = run_simulation(scenario, "oldest-first", priority_aging=aging)
    return {
        name: record.slot_wait for name, record in zip("ABC", result.turns, strict=True)
    }


def test_a_higher_class_passes_a_younger_gap_than_its_aging() -> None:
    # C ranks 2 - 60 = -58, before B: granted at 10, then B at 11.
    assert _waits(60.0) == {"A": 0.0, "B": 10.0, "C": 8.0}


def test_a_lower_class_goes_first_when_its_turn_is_older_than_the_aging() -> None:
    # C ranks 2 - 0.5 = 1.5, after B (1): B at 10, C at 11.
    assert _waits(0.5) == {"A": 0.0, "B": 9.0, "C": 9.0}


def test_other_policies_ignore_classes() -> None:
    scenario = Scenario(
        providers=[SimProvider("p", 1)],
        turns=[
            TurnSpec(0.0, "p", (10.0,)),
            TurnSpec(1.0, "p", (1.0,)),
            TurnSpec(2.0, "p", (1.0,), priority=1),
        ],
    )
    result = run_simulation(scenario, "fifo")
    assert [t.slot_wait for t in result.turns] == [0.0, 9.0, 9.0]
    assert [t.priority for t in result.turns] == [0, 0, 1]


def test_classes_change_nothing_but_the_classes_of_the_turns() -> None:
    plain = Workload(
        agents=2_000,
        arrivals=PoissonArrivals(0.9),
        providers=[SimProvider("p", 4)],
        seed=7,
    )
    classed = attrs.evolve(plain, classes=[(2, 1.0), (0, 3.0)])
    turns = plain.scenario().turns
    drawn = classed.scenario().turns
    assert [attrs.evolve(t, priority=0) for t in drawn] == list(turns)
    assert {t.priority for t in turns} == {0}
    share = sum(t.priority == 2 for t in drawn) / len(drawn)
    assert 0.22 < share < 0.28
    assert {t.priority for t in drawn} == {0, 2}


@pytest.mark.parametrize(
    ("classes", "error", "message"),
    [
        (
            [(True, 1.0)],
            TypeError,
            r"^a class's priority must be an integer from -1000000 to 1000000,"
            r" got True$",
        ),
        (
            [(1, 0.0)],
            ValueError,
            r"^a class's weight must be a positive number, got 0\.0$",
        ),
        (
            [(1, 1.0), (1, 2.0)],
            ValueError,
            r"^classes must name each priority once, got \[1, 1\]$",
        ),
    ],
)
def test_bad_classes_are_refused(
    classes: list[tuple[object, float]], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        Workload(
            agents=1,
            arrivals=PoissonArrivals(0.5),
            providers=[SimProvider("p", 1)],
            classes=classes,  # type: ignore[arg-type]  # the point
        )


def test_a_bad_turn_priority_or_aging_is_refused() -> None:
    with pytest.raises(TypeError, match=r"^priority must be an integer"):
        TurnSpec(0.0, "p", (1.0,), priority=1.5)  # type: ignore[arg-type]  # the point
    scenario = Scenario(providers=[SimProvider("p", 1)], turns=[])
    with pytest.raises(
        ValueError,
        match=r"^priority_aging must be a positive number of seconds, got nan$",
    ):
        run_simulation(scenario, "oldest-first", priority_aging=math.nan)


def test_the_sweep_reports_every_class_and_strict_classes_favour_the_higher() -> None:
    config = PriorityClassesConfig(agents=400, loads=(1.1,), agings=(1e9, 5.0))
    report = run_priority_classes(config)
    assert [(r.aging, r.priority) for r in report.rows] == [
        (1e9, 1),
        (1e9, 0),
        (5.0, 1),
        (5.0, 0),
    ]
    assert sum(r.turns for r in report.rows) == 2 * 400
    strict_high, strict_low, aged_high, aged_low = report.rows
    # Overloaded: strict classes make the lower one wait for every higher
    # turn; with a short aging the classes' waits come close.
    assert strict_high.wait_max < strict_low.wait_max
    assert aged_high.wait_max > strict_high.wait_max
    assert (
        aged_low.call_wait_max - aged_high.call_wait_max
        < strict_low.call_wait_max - strict_high.call_wait_max
    )
    markdown = report.to_markdown()
    assert "| 110% | 5 s | 0 |" in markdown
    assert "| 110% | 1e9 s (strict) | 1 |" in markdown
