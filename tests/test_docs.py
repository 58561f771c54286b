"""The documentation: the site builds in strict mode (a broken link, a missing page or a page
left out of the nav fails), every command shown in the README and on the get-started page runs
and prints what a reader is told to look for, the tables quoted there are what raydg prints for
those numbers, and every method's page lists its options with their defaults.

The commands run as a reader runs them after the set-up, with the environment active
(``source .venv/bin/activate``: the venv's ``bin`` first on ``PATH``), in a fresh folder whose
MLflow store and trial storage are that folder's. The two set-up commands are CI's to run
(``.ci/run`` builds the environment they build); a command that needs a GPU, a cluster, a
download or more than about a minute belongs on another page."""

from __future__ import annotations

import dataclasses
import math
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
EXECUTED = [ROOT / "README.md", DOCS / "get-started.md"]  # every command of these runs
SETUP = [  # run by CI, not here; byte-identical in both files
    "python3 -m venv .venv && .venv/bin/pip install -c constraints.txt -e '.[dev]' && "
    ".venv/bin/raydg run digits-style --method fedavg",
    ".venv/bin/python -m pytest -q",
]
ACTIVATE = "source .venv/bin/activate"
COMMAND_BLOCKS = {"", "bash", "console", "sh", "shell"}  # fenced blocks whose lines are commands
TITLE = "Accuracy (%) on the held-out domain, "


def fenced_blocks(path: Path) -> list[tuple[str, list[str]]]:
    """Every fenced code block of a Markdown file: (language, lines)."""
    blocks, lang, lines = [], None, []
    for line in path.read_text().splitlines():
        fence = re.match(r"^```\s*([\w-]*)", line)
        if fence and lang is None:
            lang, lines = fence.group(1), []
        elif line.startswith("```") and lang is not None:
            blocks.append((lang, lines))
            lang = None
        elif lang is not None:
            lines.append(line)
    assert lang is None, f"{path.name}: a code block is not closed"
    return blocks


def commands(path: Path) -> list[str]:
    """The command lines of a file's command blocks, one command per line."""
    out = []
    for lang, lines in fenced_blocks(path):
        if lang not in COMMAND_BLOCKS:
            continue
        for line in lines:
            assert not line.rstrip().endswith("\\"), f"{path.name}: one command per line: {line}"
            if line.strip() and not line.lstrip().startswith("#"):
                out.append(line.strip())
    return out


def test_the_site_builds_in_strict_mode(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(tmp_path / "site")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "WARNING" not in done.stderr, done.stderr[-3000:]
    reference = (tmp_path / "site" / "api" / "methods" / "index.html").read_text()
    assert "ClientContext" in reference and "client_phase" in reference  # from the docstrings
    assert (tmp_path / "site" / "fidelity" / "index.html").exists()  # the generated pages


def test_the_setup_commands_are_the_same_in_the_readme_and_get_started():
    for path in EXECUTED:
        shown = commands(path)
        assert shown[:2] == SETUP, (path.name, shown[:2])
        assert shown[2] == ACTIVATE, (path.name, shown[2])  # before any bare raydg


def test_the_readme_is_short_and_links_into_the_docs():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), target


def expectations(command: str) -> list[str]:
    """What a command's output must hold (regular expressions, multiline): the thing the page
    tells its reader to look at."""
    words = shlex.split(command)
    assert words[0] == "raydg", f"not a raydg command: {command}"
    if words[1:3] == ["list", "methods"]:
        return [r"^fedavg \[built-in\]: McMahan et al", r"^fedprox \[built-in\]: .*options\.mu="]
    if words[1:3] == ["list", "datasets"]:
        return [r"^digits-style \[built-in\]: .*domains: plain, colour-inverted, sketch, texture"]
    if words[1:3] == ["list", "configs"]:
        return [r"^csac-rotmnist: CSAC", r"^sweeps/fedprox-digits-style: "]
    if words[1] == "run":
        seeds = words.count("--seed")
        out = [re.escape(TITLE + "selected round (training-domain validation), "),
               r"^Method +plain +colour-inverted +sketch +texture +Avg +Steps/client$",
               r"^raydg: done in "]
        if seeds > 1:  # the mean ± std of the page's explanation, Avg's included
            out.append(rf"mean ± std over {seeds} seeds")
            out.append(r"^\S+ .*\d ± \d+\.\d\d +\d+$")
        return out
    if words[1] == "report":
        out = [re.escape(TITLE + "selected round (training-domain validation)")]
        if "--versus" in words:
            baseline = words[words.index("--versus") + 1]
            out += [rf"vs {baseline} \(95% CI\)$", r"^\S+ .* [+-]\d+\.\d\d ± \d+\.\d\d$"]
        return out
    raise AssertionError(f"no expectation for {command!r}: add one in tests/test_docs.py")


@pytest.mark.slow
def test_every_command_of_the_readme_and_get_started_runs_and_prints_what_they_say(tmp_path):
    """In one folder, as a reader goes on from the README to the get-started page; a command
    shown on both runs once."""
    bin_dir = Path(sys.executable).parent  # what `source .venv/bin/activate` puts first
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
           "VIRTUAL_ENV": str(bin_dir.parent), "MLFLOW_TRACKING_URI":
           f"sqlite:///{tmp_path}/mlflow.db", "RAYDG_STORAGE": str(tmp_path / "raydg-results")}
    env.pop("RAY_ADDRESS", None)  # a local Ray, as on a reader's machine
    ran: set[str] = set()
    for path in EXECUTED:
        for command in commands(path):
            if command in SETUP or command in ran:
                continue
            ran.add(command)
            if command == ACTIVATE:
                assert (bin_dir / "raydg").exists(), bin_dir
                continue
            done = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env,
                                  capture_output=True, text=True, timeout=300)
            printed = done.stdout + done.stderr
            assert done.returncode == 0, f"{path.name}: {command}\n{printed[-3000:]}"
            for expected in expectations(command):
                assert re.search(expected, printed, re.MULTILINE), (
                    f"{path.name}: {command} printed no {expected!r}:\n{printed[-3000:]}")
    assert len(ran) >= 6


def quoted_tables(path: Path) -> list[str]:
    """The ``text`` blocks of a page that quote the tables of ``raydg run`` (``Steps/client``)."""
    return ["\n".join(lines) for lang, lines in fenced_blocks(path)
            if lang == "text" and lines and lines[0].startswith(TITLE)
            and lines[1].rstrip().endswith("Steps/client")]


def summary_of(block: str) -> tuple[list[dict], list[str]]:
    """The summary rows that a quoted block of tables shows (every selection it names)."""
    from raydg.results import SELECTIONS

    rows, targets = [], []
    for table in block.split("\n\n"):
        title, header, _, *body = table.splitlines()
        sels = [s for s, text in SELECTIONS.items() if title.startswith(f"{TITLE}{text}, ")]
        sels += [s for s, text in SELECTIONS.items()
                 if f"; the same at the {text.split(' (')[0]}" in title]
        names = re.split(r"\s{2,}", header.strip())
        targets = names[1:-2]
        for line in body:
            cells = re.split(r"\s{2,}", line.strip())
            row = {"method": cells[0], "setting": "", "mode": "", "steps": float(cells[-1])}
            for column, text in zip(names[1:-1], cells[1:-1], strict=True):
                mean, _, std = text.partition(" ± ")
                row[column] = float(mean) if mean != "—" else math.nan
                row[f"{column}_std"] = float(std) if std else 0.0
            rows += [{**row, "selection": s} for s in sels]
    return rows, targets


@pytest.mark.parametrize("page", ["README.md", "docs/get-started.md", "docs/concepts/tables.md"])
def test_the_quoted_tables_are_what_raydg_prints_for_their_numbers(page):
    """A table quoted from ``raydg run`` is the text that raydg's own formatting gives for the
    quoted numbers: titles, columns and alignment stay true when the format changes."""
    from raydg.results import format_summary

    blocks = quoted_tables(ROOT / page)
    assert blocks, f"{page} quotes no table of raydg run"
    for block in blocks:
        rows, targets = summary_of(block)
        printed = []
        for seeds in range(1, 11):  # the title says how many
            for r in rows:
                for column in [*targets, "Avg"]:
                    r[f"{column}_seeds"] = seeds
            printed.append(format_summary(rows, targets, seeds))
        assert block in printed, f"{page}: raydg prints these numbers as\n{printed[0]}"


METHOD_PAGES = {"perxan": "gperxan", "gfedavg": "gperxan"}  # variants documented together


def default_text(value: object) -> str:
    """An option's default as a method page writes it: YAML's spelling, in backquotes."""
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, list):
        return "`[" + ", ".join(map(str, value)) + "]`"
    if isinstance(value, str):
        return f"`{value}`" if value else "`''`"
    return f"`{value!r}`"


def test_every_method_has_a_page_with_its_options_and_their_defaults():
    from raydg.methods import METHODS

    for name, cls in METHODS:
        page = DOCS / "methods" / f"{METHOD_PAGES.get(name, name)}.md"
        assert page.exists(), f"{name}: no page {page.relative_to(ROOT)}"
        text = page.read_text()
        assert f"`{name}`" in (DOCS / "methods" / "index.md").read_text(), name
        fields = dataclasses.fields(cls.Options)
        if not fields:
            continue
        header = next(line for line in text.splitlines() if line.startswith("| option |"))
        columns = [c.strip() for c in header.strip("|").split("|")]
        column = columns.index(f"`{name}`" if f"`{name}`" in columns else "default")
        defaults = cls.Options()
        for f in fields:
            row = next((line for line in text.splitlines()
                        if line.startswith(f"| `{f.name}` |")), None)
            assert row, f"{page.name}: no row for option {f.name} of {name}"
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", row.strip())[1:-1]]
            assert cells[column] == default_text(getattr(defaults, f.name)), (name, f.name, row)


def test_no_table_is_broken_by_a_blank_line():
    """A row after a blank line starts a new paragraph, not a row of the table above."""
    for path in [ROOT / "README.md", *DOCS.rglob("*.md")]:
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines[1:], 1):
            if line.startswith("|") and not lines[i - 1].strip():
                follows = lines[i + 1] if i + 1 < len(lines) else ""
                assert re.match(r"^\|[-:| ]+\|$", follows), f"{path.name}:{i + 1}: {line[:60]}"


def test_the_config_keys_table_names_every_field_of_runconfig():
    from raydg.config import RunConfig

    section = (DOCS / "guides" / "command-line.md").read_text().split("## Config keys", 1)[1]
    rows = re.findall(r"^\| `(\w+)` \|", section.split("\n## ", 1)[0], re.MULTILINE)
    assert rows == [f.name for f in dataclasses.fields(RunConfig)]
