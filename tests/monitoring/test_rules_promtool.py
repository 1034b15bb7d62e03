"""The chart's alert rules through Prometheus's own promtool (Debian's prometheus, 2.42):
`promtool check rules` on the rendered rules, and `promtool test rules` with
rules_test.yaml, where every alert both fires and stays quiet."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from promlib import alerts_of, merged, promtool, rule_groups, write_rules

from chartlib import ALL_ON

UNIT_TESTS = Path(__file__).with_name("rules_test.yaml")


@pytest.mark.parametrize("values", [None, ALL_ON], ids=["defaults", "all-on"])
def test_rendered_rules_pass_promtool_check(tmp_path, values):
    rules = write_rules(tmp_path / "rules.yaml", merged(values))
    done = promtool("check", "rules", str(rules))
    assert done.returncode == 0, done.stdout + done.stderr
    n = len(alerts_of(rule_groups(merged(values))))
    assert f"SUCCESS: {n} rules found" in done.stdout, done.stdout


def _unit_tests_in(directory: Path, values: dict | None = None):
    write_rules(directory / "rules.yaml", merged(values))
    shutil.copy(UNIT_TESTS, directory / UNIT_TESTS.name)
    return promtool("test", "rules", UNIT_TESTS.name, cwd=directory)


def test_every_alert_fires_and_stays_quiet_in_promtool_unit_tests(tmp_path):
    done = _unit_tests_in(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout
    # Every alert of the chart has a case where it fires and one where it does not.
    cases = [
        (case["alertname"], bool(case["exp_alerts"]))
        for test in yaml.safe_load(UNIT_TESTS.read_text())["tests"]
        for case in test["alert_rule_test"]
    ]
    alerts = set(alerts_of(rule_groups()))
    assert {name for name, fires in cases if fires} == alerts
    assert {name for name, fires in cases if not fires} == alerts


@pytest.mark.parametrize(
    "values, alert",
    [
        ({"abortWindow": "30m"}, "OomguardPipelineAborted"),
        ({"oomKillCauses": ["oom_kill", "memory_terminate"]}, "OomguardOomKillsHigh"),
        ({"signatureHosts": 2}, "OomguardSignatureSpread"),
        ({"regressionWindow": "5m"}, "OomguardSignatureRegressed"),
        ({"userspaceOomKillsPerHour": 1}, "OomguardUserspaceOomKills"),
        ({"kubeletKillsPerHour": 1}, "OomguardKubeletKills"),
    ],
)
def test_the_unit_tests_fail_when_an_alert_changes(tmp_path, values, alert):
    # The same unit tests against rules rendered with other values: promtool must notice.
    done = _unit_tests_in(tmp_path, {"metrics": {"prometheusRule": values}})
    assert done.returncode != 0, done.stdout
    assert f"alertname: {alert}" in done.stdout + done.stderr, done.stdout + done.stderr
