"""The README's quickstarts run as written and show what they say."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", README.read_text(), re.S | re.M)


def _run(block: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-W", "error::DeprecationWarning", "-c", block],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_the_sdk_quickstart_comes_first_and_holds_a_slot_per_call() -> None:
    first = _python_blocks()[0]
    # Three lines added to an application that already uses the SDK.
    assert 'dispatcher.transport("openai")' in first
    assert "http_client=http" in first
    lines = _run(first)
    assert lines == ["Hello from the fake LLM server.", "1"]


def test_readme_quickstart_calls_the_tool_and_answers() -> None:
    (quickstart,) = [block for block in _python_blocks() if "WEATHER" in block]
    lines = _run(quickstart)
    assert lines[0] == "It is 21 °C and sunny in Lyon."
    # Two LLM calls (the tool call, then the answer) and one tool call: the
    # example shows the loop it is built around.
    assert lines[1] == "2 1"
    assert lines[2].startswith("ProviderStatistics(provider='openai', limit=8,")
