"""The README's quickstart runs as written and shows the tool loop."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", README.read_text(), re.S | re.M)


def test_readme_quickstart_calls_the_tool_and_answers() -> None:
    quickstart = _python_blocks()[0]
    done = subprocess.run(
        [sys.executable, "-c", quickstart],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "It is 21 °C and sunny in Lyon."
    # Two LLM calls (the tool call, then the answer) and one tool call: the
    # example shows the loop it is built around.
    assert lines[1] == "2 1"
    assert lines[2].startswith("ProviderStatistics(provider='openai', limit=8,")
