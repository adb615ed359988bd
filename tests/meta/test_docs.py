"""The README's and the docs' code blocks run as written and show what they say.

Every ```python block of README.md and of docs/*.md is one of two kinds,
and the test finds out which, so that none is skipped:

* a program (it calls ``trio.run``, or runs under ``if __name__ ==
  "__main__":``): it runs verbatim in a fresh interpreter, and must exit
  cleanly;
* a fragment, marked on the line before its fence by an HTML comment
  (``<!-- fragment: NAME -->``, not shown on GitHub or PyPI) that names the
  harness running it: the fragment, verbatim, becomes the body of an
  ``async def`` that the harness calls with what the fragment takes from
  the text around it (``dispatcher``, ``provider``, ``run_tool``), and the
  harness checks that it did something. Beside ``trio`` and
  ``trio_dispatch``, a fragment must import whatever else it uses.

A program with a fixed port or a secret (the admin API's) is marked
``<!-- program: NAME -->`` and run by its harness with a free port and a
token. The only changes ever made to a block's text are those addresses.

Every other fence is a ``console`` or ``text`` block, shown and not run.
Every relative link of these files, and the heading it points at, exists;
the README stays short, its two commands and its quickstarts first.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import itertools
import json
import os
import pathlib
import re
import socket
import subprocess
import symtable
import sys
import textwrap
import time
import tomllib
import typing
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, NamedTuple

import pytest

if TYPE_CHECKING:
    from .._redis import RedisServer

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
README = ROOT / "README.md"
# Every page run here: the README, then the docs, in a stable order.
PAGES = (README, *sorted((ROOT / "docs").glob("*.md")))

BLOCK = re.compile(
    r"(?:^<!-- (?P<kind>fragment|program): (?P<harness>[\w-]+) -->\n)?"
    r"^```python\n(?P<code>.*?)^```$",
    re.S | re.M,
)


class Block(NamedTuple):
    """One ```python block of a page."""

    page: str  # the path from the repository's root, as in a link
    line: int
    kind: str  # "program" or "fragment"
    harness: str | None
    code: str


def page_blocks(page: pathlib.Path) -> list[Block]:
    """Every ```python block of a page, with its kind and its harness."""
    text = page.read_text(encoding="utf-8")
    name = page.relative_to(ROOT).as_posix()
    blocks = []
    for match in BLOCK.finditer(text):
        line = text.count("\n", 0, match.start("code"))
        code = match["code"]
        kind = match["kind"] or ("program" if _is_program(code) else "unmarked")
        blocks.append(Block(name, line, kind, match["harness"], code))
    return blocks


def doc_blocks() -> list[Block]:
    """Every ```python block of every page, the README's first."""
    return [block for page in PAGES for block in page_blocks(page)]


def _where(block: Block) -> str:
    return f"{block.page}:{block.line}"


def _is_program(code: str) -> bool:
    return (
        re.search(r"^(trio\.run\(|if __name__ == \"__main__\":$)", code, re.M)
        is not None
    )


def _python_blocks() -> list[str]:
    """The README's own blocks (the quickstarts must stay in it)."""
    return [block.code for block in page_blocks(README)]


def _run(block: str, *, env: dict[str, str] | None = None) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-W", "error::DeprecationWarning", "-c", block],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


# -- what a fragment may take from the text around it, and how it is run ------

# Every fragment gets these three, whether it uses them or not.
PARAMETERS = ("dispatcher", "provider", "run_tool")
# The module names a fragment may use without importing them: the
# quickstarts import them.
GIVEN = frozenset({"trio", "trio_dispatch"})

PRELUDE = """\
import trio
import trio.testing
import trio_dispatch
"""

HARNESSES = {
    # Inside an open dispatcher with an OpenAI provider on the fake server:
    # the fragment must have taken slots.
    "in-dispatcher": """
async def main() -> None:
    from trio_dispatch.providers import OpenAIProvider
    from trio_dispatch.testing import FakeReply, FakeScript, open_fake_llm_server

    async def run_tool() -> None:
        await trio.sleep(0)

    async with (
        open_fake_llm_server(FakeScript(default=FakeReply(text="ok"))) as server,
        OpenAIProvider(
            id="openai", base_url=server.openai_base_url, api_key="sk-test", model="m"
        ) as provider,
        trio_dispatch.open_dispatcher({"openai": 8}) as dispatcher,
    ):
        with trio.fail_after(30):
            await fragment(dispatcher, provider, run_tool)
        print("granted", dispatcher.statistics().providers["openai"].granted_total)


trio.run(main)
""",
    # On its own: it opens what it needs.
    "standalone": """
async def main() -> None:
    with trio.fail_after(30):
        await fragment(None, None, None)
    print("done")


trio.run(main)
""",
    # The manual's events loop, subscribed, while a turn takes a slot.
    "events": """
async def main() -> None:
    async with (
        trio_dispatch.open_dispatcher({"openai": 8}) as dispatcher,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(fragment, dispatcher, None, None)
        await trio.testing.wait_all_tasks_blocked()
        with dispatcher.turn(conversation_id="agent-7"):
            async with dispatcher.slot("openai"):
                pass
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()


trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
""",
    # The collector registered, served, and scraped after a grant.
    "prometheus": """
def serve_on_a_free_port() -> list[int]:
    # The manual's port (9100) may be taken here: the server gets a free one.
    import prometheus_client

    start = prometheus_client.start_http_server
    ports: list[int] = []

    def start_on_a_free_port(port, addr="0.0.0.0", registry=None, **options):
        server, thread = start(0, addr="127.0.0.1", registry=registry, **options)
        ports.append(server.server_port)
        return server, thread

    prometheus_client.start_http_server = start_on_a_free_port
    return ports


async def main() -> None:
    import urllib.request

    ports = serve_on_a_free_port()
    async with trio_dispatch.open_dispatcher({"openai": 8}) as dispatcher:
        await fragment(dispatcher, None, None)
        async with dispatcher.slot("openai"):
            pass
        url = f"http://127.0.0.1:{ports[0]}/metrics"
        text = await trio.to_thread.run_sync(
            lambda: urllib.request.urlopen(url, timeout=10).read().decode()
        )
    for line in text.splitlines():
        if line.startswith("trio_dispatch_grants_total"):
            print(line)


trio.run(main)
""",
}
# The fleet's fragment runs on its own too, against the test's Redis.
HARNESSES["fleet"] = HARNESSES["standalone"]


def fragment_program(block: Block) -> str:
    """The fragment as the body of ``fragment``, followed by its harness."""
    assert block.harness is not None
    body = textwrap.indent(block.code, "    ")
    return (
        f"{PRELUDE}\n\n"
        f"async def fragment({', '.join(PARAMETERS)}) -> None:\n{body}\n"
        f"{HARNESSES[block.harness]}"
    )


def free_names(code: str) -> set[str]:
    """The global names the body of ``fragment`` (nested scopes too) reads."""
    (table,) = (
        child
        for child in symtable.symtable(code, "<readme>", "exec").get_children()
        if child.get_name() == "fragment"
    )
    found: set[str] = set()
    stack = [table]
    while stack:
        scope = stack.pop()
        found |= {
            symbol.get_name()
            for symbol in scope.get_symbols()
            if symbol.is_global() and symbol.is_referenced()
        }
        stack.extend(scope.get_children())
    return found


def fragment_of(harness: str) -> list[Block]:
    return [b for b in doc_blocks() if b.harness == harness]


# -- every block is run -------------------------------------------------------


def test_every_block_is_a_program_or_a_marked_fragment() -> None:
    blocks = doc_blocks()
    assert len(blocks) >= 9
    unmarked = [_where(b) for b in blocks if b.kind == "unmarked"]
    assert unmarked == [], "blocks neither a program nor a marked fragment"
    for block in blocks:
        compile(
            block.code if block.kind == "program" else fragment_program(block),
            _where(block),
            "exec",
        )
        if block.kind == "fragment":
            assert not _is_program(block.code), _where(block)
            assert block.harness in HARNESSES, _where(block)
        elif block.harness is not None:
            assert block.harness in PROGRAM_HARNESSES, _where(block)
    # Each harness is used (a renamed one would leave a block unrun).
    used = {b.harness for b in blocks} - {None}
    assert used == set(HARNESSES) | set(PROGRAM_HARNESSES)


def test_a_fragment_imports_what_it_uses() -> None:
    for block in doc_blocks():
        if block.kind == "fragment":
            missing = free_names(fragment_program(block)) - GIVEN - set(dir(builtins))
            assert missing == set(), f"{_where(block)} uses {missing}"


def test_the_name_checker_finds_a_missing_import() -> None:
    block = Block(
        "-", 1, "fragment", "standalone", "registry = prometheus_client.R()\n"
    )
    assert free_names(fragment_program(block)) == {"prometheus_client"}
    block = Block(
        "-", 1, "fragment", "standalone", "import json\nprint(json.dumps(1))\n"
    )
    assert free_names(fragment_program(block)) == {"print"}


@pytest.mark.parametrize(
    "block",
    [b for b in doc_blocks() if b.kind == "program" and b.harness is None],
    ids=_where,
)
def test_every_program_runs(block: Block) -> None:
    _run(block.code)


@pytest.mark.parametrize("block", fragment_of("in-dispatcher"), ids=_where)
def test_a_fragment_inside_a_dispatcher_runs_and_takes_slots(block: Block) -> None:
    last = _run(fragment_program(block))[-1]
    assert re.fullmatch(r"granted [1-9]\d*", last), last


def test_the_budgets_fragment_runs() -> None:
    (block,) = fragment_of("standalone")
    assert _run(fragment_program(block)) == ["done"]


def test_the_fleet_fragment_runs_against_redis(server: RedisServer) -> None:
    (block,) = fragment_of("fleet")
    address = "redis://127.0.0.1:6379/0"
    assert block.code.count(address) == 1
    moved = block._replace(code=block.code.replace(address, server.url))
    assert _run(fragment_program(moved)) == ["done"]


def test_the_events_fragment_prints_a_grant() -> None:
    (block,) = fragment_of("events")
    assert _run(fragment_program(block)) == ["openai agent-7 waited 0.00 s"]


def test_the_prometheus_fragment_serves_the_collector() -> None:
    (block,) = fragment_of("prometheus")
    lines = _run(fragment_program(block))
    assert lines == ['trio_dispatch_grants_total{provider="openai"} 1.0']


# -- the pages: fences, links, the README's shape -----------------------------

FENCE = re.compile(r"^```(?P<info>.*)$")
# What a fence may hold: Python (run above), or what is shown and not run.
LANGUAGES = frozenset({"python", "console", "text"})
LINK = re.compile(r"!?\[[^\]]*\]\((?P<target>[^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} +(?P<title>.+?) *$")


def fences(text: str) -> list[str]:
    """The info string of every fenced block, checking that each one closes."""
    found = []
    inside = False
    for line in text.splitlines():
        match = FENCE.match(line)
        if match is None:
            continue
        if inside:
            assert match["info"] == "", f"a fence opens inside another: {line!r}"
        else:
            found.append(match["info"])
        inside = not inside
    assert not inside, "a fence never closes"
    return found


def prose(text: str) -> str:
    """The text outside fenced blocks (a ``#`` in a block is no heading)."""
    lines = []
    inside = False
    for line in text.splitlines():
        if FENCE.match(line):
            inside = not inside
        elif not inside:
            lines.append(line)
    return "\n".join(lines)


def anchors(text: str) -> set[str]:
    """The anchors GitHub gives the headings of a page."""
    seen: dict[str, int] = {}
    for line in prose(text).splitlines():
        match = HEADING.match(line)
        if match is None:
            continue
        slug = re.sub(r"[^\w\- ]", "", match["title"].lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        if count:
            seen[f"{slug}-{count}"] = 1
    return set(seen)


def leads_somewhere(page: pathlib.Path, text: str, target: str) -> bool:
    """Whether a link of a page names a file of the repository, and its heading."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target):
        return True  # an absolute address: not this repository's to check
    path, _, anchor = target.partition("#")
    file = (page.parent / path).resolve() if path else page
    if path and (not file.is_relative_to(ROOT) or not file.exists()):
        return False
    if not anchor:
        return True
    heads = anchors(text if file == page else file.read_text(encoding="utf-8"))
    return file.suffix == ".md" and anchor in heads


def broken_links(page: pathlib.Path, text: str) -> list[str]:
    """The relative links of a page whose file or heading does not exist."""
    targets = [match["target"] for match in LINK.finditer(prose(text))]
    return [target for target in targets if not leads_somewhere(page, text, target)]


def test_the_docs_are_the_manual_the_fleet_the_design_and_the_benchmarks() -> None:
    assert PAGES[0] == README
    names = {page.name for page in PAGES[1:]}
    assert {"manual.md", "fleet.md", "design.md", "benchmarks.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_fence_is_run_or_only_shown(page: pathlib.Path) -> None:
    text = page.read_text(encoding="utf-8")
    infos = fences(text)
    assert set(infos) <= LANGUAGES, set(infos) - LANGUAGES
    # Every ```python fence is a block that the tests above run.
    assert infos.count("python") == len(page_blocks(page))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_leads_somewhere(page: pathlib.Path) -> None:
    text = page.read_text(encoding="utf-8")
    assert LINK.search(text) is not None
    assert broken_links(page, text) == []


def test_the_link_checker_finds_what_is_broken() -> None:
    page = ROOT / "docs" / "page.md"
    text = (
        "# A page\n\n## Hand-offs against `trio.CapacityLimiter`\n\n"
        "[ok](#hand-offs-against-triocapacitylimiter) [no](#hand-offs)\n"
        "[ok](../README.md#quickstart) [no](../README.md#quick-start)\n"
        "[ok](../bench/reports) [no](../bench/report) [no](../../outside)\n"
        "[ok](https://example.com/x) ![no](latency.png)\n"
        "```text\n[not a link](nowhere)\n```\n"
    )
    assert broken_links(page, text) == [
        "#hand-offs",
        "../README.md#quick-start",
        "../bench/report",
        "../../outside",
        "latency.png",
    ]


def test_the_readme_is_short_with_the_two_commands_and_the_quickstarts_first() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300
    # .ci/run and the demo point at these two lines, as they are.
    assert (
        "```console\n"
        "$ pip install -e '.[demo]' && trio-dispatch demo           # the main job\n"
        "$ pip install -e '.[test]' && python -m pytest -n auto     # the tests\n"
        "```\n"
    ) in text
    sections = re.findall(r"^## (.+)$", prose(text), re.M)
    assert sections[:2] == ["Two commands", "Quickstart"]
    assert "What is where" in sections


# -- what the manual says of the API, held to the code -------------------------

MANUAL = ROOT / "docs" / "manual.md"
EVENTS_HEADER = "| event | what happened | fields |"
NAME = re.compile(r"`([^`]+)`")


def event_table(text: str) -> dict[str, list[str]]:
    """The manual's table of events: each event's fields, in their order."""
    lines = text.splitlines()
    start = lines.index(EVENTS_HEADER) + 2  # past the header and its rule
    table: dict[str, list[str]] = {}
    for line in itertools.takewhile(lambda line: line.startswith("|"), lines[start:]):
        event, _, fields = (cell.strip() for cell in line.strip("|").split("|"))
        assert event not in table, f"{event} is listed twice"
        table[event.strip("`")] = NAME.findall(fields)
    return table


def test_the_manual_lists_every_event_and_each_field_in_order() -> None:
    import attrs  # noqa: PLC0415

    import trio_dispatch.events  # noqa: PLC0415

    module = trio_dispatch.events
    union = {cls.__name__ for cls in typing.get_args(module.DispatchEvent)}
    exported = {name for name in module.__all__ if attrs.has(getattr(module, name))}
    assert union == exported
    fields = {
        name: [field.name for field in attrs.fields(getattr(module, name))]
        for name in sorted(exported)
    }
    assert event_table(MANUAL.read_text(encoding="utf-8")) == fields


def test_the_event_table_reader_sees_a_missing_field() -> None:
    text = f"{EVENTS_HEADER}\n|---|---|---|\n| `Resumed` | ended | `provider`, `at` |\n"
    assert event_table(text) == {"Resumed": ["provider", "at"]}


SIGNATURE = re.compile(r"(?P<name>[\w.]+)(?P<parameters>\(.*\))")
# The calls whose every argument the manual must show: a conversation's, the
# simulator's and every hypothesis strategy's (with its operations).
SIGNED = (
    "trio_dispatch.Dispatcher.start_conversation",
    "trio_dispatch.testing.run_simulation",
    "trio_dispatch.testing.simulate",
    "trio_dispatch.testing.compare",
    "trio_dispatch.testing.run_comparison",
    "trio_dispatch.testing.DispatcherConfig",
    "trio_dispatch.testing.Workload.from_trace",
    "trio_dispatch.testing.run_fairness_sweep",
    "trio_dispatch.testing.run_priority_classes",
)


def listed_signatures(text: str) -> dict[str, str]:
    """The manual's signatures block: each name and its parameters."""
    _, marked, rest = text.partition("<!-- signatures -->\n```text\n")
    assert marked, "the manual has no signatures block"
    block, _, _ = rest.partition("```")
    listed: dict[str, str] = {}
    for line in block.splitlines():
        match = SIGNATURE.fullmatch(line)
        assert match is not None, line
        listed[match["name"]] = match["parameters"]
    return listed


def resolve(dotted: str) -> object:
    """The object a dotted public name names: a module's attribute, or a class's."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for part in parts[cut:]:
            found = getattr(found, part)
        return found
    raise LookupError(dotted)  # pragma: no cover (the first part is a module)


def shown_signature(function: object) -> str:
    """A callable's parameters as the manual shows them: no annotations, no self."""
    assert callable(function)
    signature = inspect.signature(function)
    parameters = [
        parameter.replace(annotation=inspect.Parameter.empty)
        for parameter in signature.parameters.values()
        if parameter.name != "self"
    ]
    bare = signature.replace(
        parameters=parameters, return_annotation=inspect.Signature.empty
    )
    return str(bare)


def test_the_signatures_the_manual_lists_are_the_code_s() -> None:
    from trio_dispatch.testing import strategies  # noqa: PLC0415

    listed = listed_signatures(MANUAL.read_text(encoding="utf-8"))
    strategies_ = {
        f"{strategies.__name__}.{name}"
        for name in strategies.__all__
        if callable(getattr(strategies, name))
    }
    assert set(SIGNED) | strategies_ <= set(listed)
    shown = {name: shown_signature(resolve(name)) for name in listed}
    assert shown == listed


def test_a_signature_shows_its_defaults_and_its_star_without_annotations() -> None:
    def call(self: object, a: int, *, b: tuple[str, ...] = ("x",)) -> None:
        """A method, as ``Dispatcher.start_conversation`` is read."""

    assert shown_signature(call) == "(a, *, b=('x',))"
    assert listed_signatures("<!-- signatures -->\n```text\nm.f(a, *, b=1)\n```\n") == {
        "m.f": "(a, *, b=1)"
    }


# -- what the README's commands install -----------------------------------------

REQUIREMENT = re.compile(r"(?P<name>[A-Za-z0-9_.-]+)(?:\[(?P<extras>[^\]]*)\])?")


def installed_by(extras: tuple[str, ...]) -> set[str]:
    """The distributions ``pip install '.[extras]'`` installs, by their names."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]
    optional = project["optional-dependencies"]
    names = {project["name"]}
    pending = [*project["dependencies"], *(f"{project['name']}[{e}]" for e in extras)]
    seen: set[str] = set()
    while pending:
        match = REQUIREMENT.match(pending.pop())
        assert match is not None
        names.add(match["name"])
        for extra in (match["extras"] or "").split(","):
            if extra and extra not in seen and match["name"] == project["name"]:
                seen.add(extra)
                pending.extend(optional[extra])
    return names


def top_level_imports(code: str) -> set[str]:
    """The top-level modules a block imports."""
    found = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            found |= {alias.name.partition(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.partition(".")[0])
    return found


def test_the_first_command_installs_what_every_quickstart_imports() -> None:
    demo = installed_by(("demo",))
    for block in page_blocks(README):
        # Each module here is the distribution of its name, dashes for _.
        wanted = {name.replace("_", "-") for name in top_level_imports(block.code)}
        assert wanted <= demo, f"{_where(block)} needs {wanted - demo}"


def test_the_sdks_are_for_the_quickstart_and_the_tests_never_the_library() -> None:
    sdks = {"openai", "anthropic"}
    assert sdks <= installed_by(("demo",))
    assert sdks <= installed_by(("test",))
    assert not sdks & installed_by(())
    assert not sdks & installed_by(("redis", "admin", "metrics", "otel", "testing"))


def test_a_readme_fragment_says_in_its_text_where_it_runs() -> None:
    # The marker is an HTML comment, which no reader sees: the paragraph
    # above it says it.
    text = README.read_text(encoding="utf-8")
    fragments = list(re.finditer(r"\n\n(?P<before>(?:.+\n)+)\n?<!-- fragment: ", text))
    assert len(fragments) == len(
        [b for b in page_blocks(README) if b.kind == "fragment"]
    )
    for fragment in fragments:
        assert "inside an open dispatcher" in " ".join(fragment["before"].split())


# -- programs with an address or a secret ------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _get(url: str, token: str | None = None) -> tuple[int, object]:
    request = urllib.request.Request(url)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_the_admin_program_serves_its_dispatcher() -> None:
    (block,) = fragment_of("served")
    address = "127.0.0.1:8081"
    assert block.code.count(address) == 1
    port = _free_port()
    token = "a-token-for-the-readme-test"
    env = {**os.environ, "TRIO_DISPATCH_ADMIN_TOKEN": token}
    code = block.code.replace(address, f"127.0.0.1:{port}")
    with subprocess.Popen(
        [sys.executable, "-W", "error::DeprecationWarning", "-c", code],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    health = _get(f"http://127.0.0.1:{port}/healthz")
                    break
                except OSError:
                    assert process.poll() is None, process.communicate()
                    assert time.monotonic() < deadline, "the admin API never answered"
                    time.sleep(0.05)
            limits = _get(f"http://127.0.0.1:{port}/limits", token)
            status = _get(f"http://127.0.0.1:{port}/status", token)
            refused = _get(f"http://127.0.0.1:{port}/limits")
        finally:
            # It would hold its slot for a minute: enough has been seen.
            process.kill()
    assert health == (200, {"status": "ok"})
    assert limits == (200, {"limits": {"anthropic": 4, "openai": 8}})
    assert status[0] == 200
    assert status[1]["providers"]["openai"]["in_flight"] == 1  # type: ignore[index]  # JSON
    assert refused[0] == 401


PROGRAM_HARNESSES = {"served": test_the_admin_program_serves_its_dispatcher}


# -- what the quickstarts show ----------------------------------------------


def test_the_sdk_quickstart_comes_first_and_holds_a_slot_per_call() -> None:
    first = _python_blocks()[0]
    # Four lines added to an application that already uses the SDK: the
    # turn among them, without which the order is first come, first served.
    assert 'dispatcher.transport("openai")' in first
    assert "http_client=http" in first
    assert re.search(r"^ +with dispatcher\.turn\(.*\):  # 4$", first, re.M)
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
