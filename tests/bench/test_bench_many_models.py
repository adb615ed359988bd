"""Smoke test of ``bench/many_models.py``: a small run, its report's shape.

Against a redis-server of the test's own: which budgets are kept after
the grants, and that every row is there; never how fast anything ran.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from .._bench import load_bench_script
from .._redis import needs_redis

if TYPE_CHECKING:
    import pathlib

    from .._redis import RedisServer

pytestmark = needs_redis


def test_models_seen_once_are_forgotten_locally_and_kept_a_while_on_redis(
    tmp_path: pathlib.Path, shared_server: RedisServer
) -> None:
    bench = load_bench_script("many_models")
    path = tmp_path / "many_models.json"
    argv = ["--models", "30", "--grants", "20", "--redis-grants", "5"]
    assert (
        bench.main([*argv, "--redis-url", shared_server.url, "--json", str(path)]) == 0
    )
    report: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    rows = [
        (run["backend"], run["models"], run["grants"], run["models_kept"])
        for run in report["runs"]
    ]
    # Two idle virtual hours forget every learned budget of one process;
    # on Redis, in real time, they are still there a moment later.
    assert rows == [
        ("local", 0, 20, 0),
        ("local", 30, 20, 0),
        ("redis", 0, 5, 0),
        ("redis", 30, 5, 30),
    ]
