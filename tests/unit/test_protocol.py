"""The vocabulary in `oomguard._protocol` is the one the code speaks."""

import ast
import pathlib

import oomguard
from oomguard import _protocol
from oomguard._metrics import INTERNAL_ERROR_SITES, OomguardMetrics

SRC = pathlib.Path(oomguard.__file__).parent


def _guard_sites(paths):
    """Every constant site named in `guard("x")`, `guard.error("x")`, `internal_error("x")`."""
    sites = {}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and node.args):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            arg = node.args[0]
            if name in {"guard", "error", "internal_error"} and isinstance(arg, ast.Constant):
                if name == "error" and "guard" not in ast.unparse(func):
                    continue
                sites.setdefault(arg.value, []).append(path.relative_to(SRC).as_posix())
    return sites


def test_every_scheduler_guard_site_is_a_metric_label():
    # The scheduler's Guard counts into oomguard_internal_errors_total{where}; a site missing
    # from the label set was counted as "other" ("apply", "add_worker", "unguarded" were).
    # The worker side's guards only log (they have no metrics), so they are not scanned.
    paths = [p for p in SRC.rglob("*.py") if "worker_plugin" not in p.parts]
    used = _guard_sites(paths)
    assert {"apply", "add_worker", "unguarded", "transition"} <= set(used)
    missing = {site: where for site, where in used.items() if site not in INTERNAL_ERROR_SITES}
    assert not missing, f"guard sites not in _protocol.SCHEDULER_GUARD_SITES: {missing}"
    assert set(used) == INTERNAL_ERROR_SITES, "a label no code uses"


def test_metric_label_sets_come_from_the_protocol():
    m = OomguardMetrics()
    for site in _protocol.SCHEDULER_GUARD_SITES:
        m.internal_error(site)
    text = "".join(
        f"{s.name}{s.labels}{s.value}\n"
        for metric in m.collect()
        for s in metric.samples
        if s.name == "oomguard_internal_errors_total"
    )
    assert "'other'}0.0" in text.replace(" ", "")  # nothing folded into "other"
    for reason in _protocol.REJECT_REASONS:
        m.report_rejected(reason)
    rejected = {
        s.labels["reason"]: s.value
        for metric in m.collect()
        for s in metric.samples
        if s.name == "oomguard_reports_rejected_total"
    }
    assert rejected["other"] == 0 and all(rejected[r] == 1 for r in _protocol.REJECT_REASONS)


def test_no_rpc_or_topic_name_is_spelled_outside_the_protocol():
    names = {
        v
        for k, v in vars(_protocol).items()
        if k.endswith(("_HANDLER", "_TOPIC", "_PLUGIN", "_ANNOTATION")) and v != "oomguard"
    }
    for path in SRC.rglob("*.py"):
        if path.name == "_protocol.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in names:
                raise AssertionError(
                    f"{path.relative_to(SRC)}:{node.lineno} spells {node.value!r}"
                )
