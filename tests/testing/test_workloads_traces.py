"""Traces: agent turns as JSON Lines, one turn a line, read and written."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

import pytest

from trio_dispatch.testing import (
    CallsPerTurn,
    PoissonArrivals,
    Scenario,
    SimProvider,
    Trace,
    TurnSpec,
    Workload,
    run_simulation,
)

if TYPE_CHECKING:
    from pathlib import Path

THE_ISSUES_LINE = (
    '{"started_at": 12.5, "calls": [{"duration": 1.8, "tool_after": 0.4,'
    ' "tokens": 900}, {"duration": 0.6, "tokens": 300}], "tenant": "acme",'
    ' "priority": 0, "model": "gpt-4o"}'
)


def write(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_a_trace_line_becomes_a_turn(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        THE_ISSUES_LINE,
        "",
        '{"started_at": 0, "calls": [{"duration": 2}], "priority": 1}',
    )
    workload = Workload.from_trace(path)
    assert isinstance(workload.arrivals, Trace)
    assert workload.agents == 2
    late, early = workload.arrivals.turns
    assert late == TurnSpec(
        arrival=12.5,
        provider="provider",
        calls=(1.8, 0.6),
        tools=(0.4,),
        priority=0,
        tenant="acme",
        model="gpt-4o",
        tokens=(900, 300),
    )
    assert early == TurnSpec(0.0, "provider", (2.0,), priority=1)
    # Played by arrival; 2 turns 12.5 s apart, 4.4 s of calls in all.
    assert [t.arrival for t in workload.scenario().turns] == [0.0, 12.5]
    assert workload.mean_demand == pytest.approx(2.2)
    assert workload.load == pytest.approx(1 / 12.5 * 2.2 / 8)


def test_a_turn_goes_to_the_provider_named_like_its_model(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '{"started_at": 0, "calls": [{"duration": 1}], "model": "small"}',
        '{"started_at": 1, "calls": [{"duration": 1}], "model": "other"}',
        '{"started_at": 2, "calls": [{"duration": 1}]}',
    )
    providers = (SimProvider("big", 4), SimProvider("small", 2))
    turns = Workload.from_trace(path, providers).scenario().turns
    assert [t.provider for t in turns] == ["small", "big", "big"]


def test_a_drawn_workload_written_as_a_trace_reads_back_the_same(
    tmp_path: Path,
) -> None:
    provider = SimProvider("provider", 4)
    drawn = Workload(
        agents=50,
        arrivals=PoissonArrivals(0.9),
        providers=(provider,),
        calls=CallsPerTurn.mixture(
            (0.8, CallsPerTurn(1, 2)), (0.2, CallsPerTurn(5, 9))
        ),
        tenants=(("acme", 1.0), ("globex", 1.0)),
        models=(("gpt-4o", 1.0),),
        classes=((1, 0.3), (0, 0.7)),
        tokens_per_second=50.0,
        seed=4,
    )
    path = tmp_path / "drawn.jsonl"
    drawn.write_trace(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 50
    assert set(json.loads(lines[0])) <= {
        "started_at",
        "calls",
        "tenant",
        "priority",
        "model",
    }
    back = Workload.from_trace(path, (provider,))
    assert back.scenario().turns == drawn.scenario().turns
    # And it plays the same, to the last figure.
    assert run_simulation(back, "oldest-first") == run_simulation(drawn, "oldest-first")


def test_a_trace_plays_faster_and_fewer(tmp_path: Path) -> None:
    turns = [TurnSpec(10.0 * i, "p", (1.0, 2.0), (0.5,)) for i in range(10)]
    path = tmp_path / "t.jsonl"
    Scenario((SimProvider("p", 1),), turns).write_trace(path)
    workload = Workload.from_trace(path, (SimProvider("p", 1),))
    assert workload.load == pytest.approx(3.0 / 10.0)
    faster = workload.at_load(0.6)
    assert isinstance(faster.arrivals, Trace)
    assert faster.arrivals.speed == pytest.approx(2.0)
    assert faster.load == pytest.approx(0.6)
    assert [t.arrival for t in faster.scenario().turns] == pytest.approx(
        [5.0 * i for i in range(10)]
    )
    first = Workload(3, workload.arrivals, workload.providers)
    assert [t.arrival for t in first.scenario().turns] == [0.0, 10.0, 20.0]
    with pytest.raises(
        ValueError, match=r"^a trace of 10 turns cannot play 11 agents$"
    ):
        Workload(11, workload.arrivals, workload.providers)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "not a JSON object (Expecting value)"),
        ("[1, 2]", "expected a JSON object, got list"),
        ('{"calls": [{"duration": 1}]}', "started_at is missing"),
        (
            '{"started_at": -1, "calls": [{"duration": 1}]}',
            "started_at must be a non-negative number of seconds, got -1",
        ),
        (
            '{"started_at": "soon", "calls": [{"duration": 1}]}',
            "started_at must be a non-negative number of seconds, got 'soon'",
        ),
        (
            '{"started_at": 0, "calls": []}',
            "calls must be a non-empty list of calls, got []",
        ),
        ('{"started_at": 0}', "calls must be a non-empty list of calls, got None"),
        ('{"started_at": 0, "calls": [3]}', "calls[0] must be an object, got 3"),
        ('{"started_at": 0, "calls": [{}]}', "calls[0].duration is missing"),
        (
            '{"started_at": 0, "calls": [{"duration": 1}, {"duration": NaN}]}',
            "calls[1].duration must be a non-negative number of seconds, got nan",
        ),
        (
            '{"started_at": 0, "calls": [{"duration": 1, "tool_after": true}]}',
            "calls[0].tool_after must be a non-negative number of seconds, got True",
        ),
        (
            '{"started_at": 0, "calls": [{"duration": 1, "tokens": 1.5}]}',
            "calls[0].tokens must be a non-negative integer, got 1.5",
        ),
        (
            '{"started_at": 0, "calls": [{"duration": 1, "tokens": 5}, {"duration": 1}]}',
            "tokens must be given on every call or on none",
        ),
        (
            '{"started_at": 0, "calls": [{"duration": 1, "tool_afer": 1}]}',
            "calls[0].tool_afer is not a field of the trace format (expected"
            " duration, tool_after, tokens)",
        ),
        (
            '{"started_at": 0, "calls": [{"duration": 1}], "user": "x"}',
            "user is not a field of the trace format (expected started_at, calls,"
            " tenant, priority, model)",
        ),
        (
            '{"started_at": 0, "calls": [{"duration": 1}], "priority": "high"}',
            "priority must be an integer from -1000000 to 1000000, got 'high'",
        ),
        (
            '{"started_at": 0, "calls": [{"duration": 1}], "tenant": ""}',
            "tenant must be a non-empty string, got ''",
        ),
        (
            '{"started_at": 0, "calls": [{"duration": 1}], "model": 4}',
            "model must be a non-empty string, got 4",
        ),
    ],
)
def test_a_bad_record_is_refused_naming_its_line_and_field(
    tmp_path: Path, line: str, message: str
) -> None:
    good = '{"started_at": 0, "calls": [{"duration": 1}]}'
    path = write(tmp_path, good, line, good)
    with pytest.raises(
        ValueError, match=rf"^{re.escape(f'{path}, line 2: {message}')}$"
    ):
        Workload.from_trace(path)


def test_an_empty_trace_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "", "  ")
    with pytest.raises(
        ValueError, match=rf"^{re.escape(str(path))}: the trace holds no turn$"
    ):
        Workload.from_trace(path)
    with pytest.raises(ValueError, match=r"^a workload needs at least one provider$"):
        Workload.from_trace(path, ())
    with pytest.raises(FileNotFoundError):
        Workload.from_trace(tmp_path / "missing.jsonl")
