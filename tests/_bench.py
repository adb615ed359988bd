"""Loading the benchmark scripts of ``bench/``, which are not a package; a stand-in server."""

from __future__ import annotations

import importlib.util
import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import types

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
STAND_IN = ROOT / "tests" / "fixtures" / "llama_server_stand_in.py"


def load_bench_script(name: str) -> types.ModuleType:
    """Import ``bench/<name>.py`` by its path, as ``python bench/<name>.py`` would.

    Run as a script, its own folder is the first entry of ``sys.path``, so
    ``import _common`` finds ``bench/_common.py``: the same here, while it
    loads.
    """
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(BENCH))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module


def llama_server_stand_in(tmp_path: Path) -> tuple[str, Path]:
    """A command line of ``STAND_IN``, with ``{port}``, and where it will write its pid."""
    pid_file = tmp_path / "stand_in.pid"
    command = shlex.join([sys.executable, str(STAND_IN), "{port}", str(pid_file)])
    return command, pid_file


def process_gone(pid: int) -> bool:
    """Whether no process has the id ``pid`` (any more)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False
