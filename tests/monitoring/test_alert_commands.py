"""Every `oomguard ...` command the chart tells an operator to run exists: the command, each
flag and each flag's value, checked against the CLI's own argparse parser.

The texts: the PrometheusRule's annotations, NOTES.txt and the Grafana dashboard's strings,
rendered by the real Helm engine with the monitoring on (defaults, and every part on).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex

import pytest
from promlib import alerts_of, dashboard, merged, rule_groups

from chartlib import ALL_ON, render
from oomguard._cli.main import build_parser

#: A command in backquotes (annotations, dashboard texts), or on a line of its own (NOTES).
_QUOTED = re.compile(r"`(oomguard\s[^`]*)`")
_LINE = re.compile(r"^\s+(?:\$\s+)?(oomguard\s.*)$", re.MULTILINE)


def commands_in(text: str) -> list[str]:
    return _QUOTED.findall(text) + _LINE.findall(text)


def problems(command: str) -> list[str]:
    """What is wrong with `command` for the real `oomguard` CLI; [] when it parses."""
    argv = shlex.split(command)
    assert argv[0] == "oomguard"
    parser = build_parser()
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = parser.parse_args(argv[1:])
    except SystemExit:
        return [err.getvalue().strip().splitlines()[-1]]
    # argparse accepts a unique prefix of a flag (--pipe for --pipelines): a text must
    # spell each flag whole.
    known = set(_subcommand(parser, args.command)._option_string_actions)
    return [f"{a}: not a flag of `oomguard {args.command}` (spell it whole)" for a in argv
            if a.startswith("-") and a.split("=")[0] not in known]  # fmt: skip


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices


def _subcommand(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    return _subcommands(parser)[name]


def _strings(node) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [s for v in node.values() for s in _strings(v)]
    if isinstance(node, list):
        return [s for v in node for s in _strings(v)]
    return []


@pytest.fixture(scope="module", params=["defaults", "all-on"])
def texts(request) -> dict[str, str]:
    """Where -> text, of every text the chart renders for an operator."""
    values = merged(ALL_ON) if request.param == "all-on" else merged(None)
    rendered = render(values)
    out = {
        f"{alert} {field}": text
        for alert, rule in alerts_of(rule_groups(values)).items()
        for field, text in rule["annotations"].items()
    }
    out["NOTES.txt"] = rendered["oomguard/templates/NOTES.txt"]
    out["dashboard"] = "\n".join(_strings(dashboard(values)))
    return out


def test_every_command_the_chart_names_exists(texts):
    found = {(where, c) for where, text in texts.items() for c in commands_in(text)}
    bad = {f"{where}: `{c}`: {p}" for where, c in found for p in problems(c)}
    assert bad == set()
    # Each alert tells the operator what to run next.
    described = {where.split()[0] for where, _ in found if where.endswith("description")}
    assert described == {where.split()[0] for where in texts if where.endswith("description")}


def test_no_text_names_an_oomguard_subcommand_outside_backquotes(texts):
    # "run oomguard pipelines" would escape the check above: any `oomguard <word>` whose word
    # is a subcommand, or looks like one, must be a quoted command.
    sub = set(_subcommands(build_parser()))
    assert {"report", "doctor"} <= sub
    for where, text in texts.items():
        bare = _QUOTED.sub("", text)
        bare = _LINE.sub("", bare)
        named = {w for w in re.findall(r"\boomguard ([a-z]+)\b", bare)}
        assert not named & (sub | {"pipelines", "signatures", "events", "peaks"}), (where, text)


@pytest.mark.parametrize(
    "command, wrong",
    [
        ("oomguard pipelines", "invalid choice: 'pipelines'"),
        ("oomguard signatures", "invalid choice: 'signatures'"),
        ("oomguard report --pipeline-list", "unrecognized arguments: --pipeline-list"),
        ("oomguard report --killer earlyom", "'earlyom' is not a killer"),
        ("oomguard report --eve", "--eve: not a flag of `oomguard report`"),
    ],
)
def test_the_check_refuses_commands_that_do_not_exist(command, wrong):
    (said,) = problems(command)
    assert wrong in said


def test_the_check_accepts_the_commands_the_report_help_shows():
    epilog = _subcommand(build_parser(), "report").epilog
    examples = [
        line.strip() for line in epilog.splitlines() if line.strip().startswith("oomguard ")
    ]
    assert len(examples) >= 5
    assert {c: problems(c.split(" |")[0]) for c in examples} == {c: [] for c in examples}
