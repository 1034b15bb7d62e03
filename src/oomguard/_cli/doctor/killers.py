"""`oomguard doctor`'s killer section: the userspace killers on this host (with earlyoom's
thresholds) and whether oomguard can read the evidence that names them here (PSI, the
xattrs systemd-oomd counts in, other users' processes in /proc)."""

from __future__ import annotations

import os

from ..._host.cgroup.files import join_root, read_text
from ..._host.cgroup.info import unescape_mount
from ..._host.oom_killers import find_killers
from ..._host.readings import host_reading
from ..._units import format_bytes
from .check import Check
from .text import FIX, KILLERS


def _thresholds(k: dict) -> str:
    """' (pid 812), SIGTERM at MemAvailable <= 10 % (2.4 GiB), SIGKILL <= 5 % (1.2 GiB)'."""
    if k.get("term_percent") is None:
        return ""
    out = f", SIGTERM at MemAvailable <= {round(k['term_percent'], 2):g} %"
    if k.get("term_bytes") is not None:
        out += f" ({format_bytes(k['term_bytes'])})"
    out += f", SIGKILL <= {round(k['kill_percent'], 2):g} %"
    if k.get("kill_bytes") is not None:
        out += f" ({format_bytes(k['kill_bytes'])})"
    return out + (", dry run" if k.get("dryrun") else "")


def check_oom_killers(root: str = "/") -> list[Check]:
    """One `warn` per userspace killer running (by /proc/*/comm), else one `ok`."""
    found: dict[str, list[dict]] = {}
    for k in find_killers(host_reading(root)["total"], root=root):
        found.setdefault(k["name"], []).append(k)
    if not found:
        return [Check("oom-killer", "ok", f"none running ({', '.join(KILLERS)})")]
    checks = []
    for name, ks in found.items():
        pids = ", ".join(str(k["pid"]) for k in ks)
        detail = f"{name} is running (pid {pids}){_thresholds(ks[0])}: {KILLERS[name][0]}"
        checks.append(Check(f"oom-killer.{name}", "warn", detail, KILLERS[name][1]))
    return checks


def _proc_options(root: str) -> list[str]:
    text, _ = read_text(join_root(root, "proc/self/mountinfo"))
    for line in (text or "").splitlines():
        left, _, right = line.partition(" - ")
        lf, rf = left.split(), right.split()
        if len(lf) >= 5 and unescape_mount(lf[4]) == "/proc" and rf[:1] == ["proc"]:
            return rf[2].split(",") if len(rf) >= 3 else []
    return []


def check_killer_evidence(root: str = "/", cgroup_path: str | None = None) -> list[Check]:
    """Can oomguard read what names a killer here: PSI, xattrs on the worker's cgroup, the
    /proc entries of other users' processes (a signal's sender, a killer run by root)?"""
    checks = []
    reading = host_reading(root)
    if reading["psi_some10"] is not None:
        some, full = reading["psi_some10"], reading["psi_full10"]
        detail = f"/proc/pressure/memory is readable (some avg10 {some:g}, full {full:g})"
        checks.append(Check("killer-evidence.psi", "ok", detail))
    else:
        detail = "/proc/pressure/memory is missing: reports carry MemAvailable without pressure"
        checks.append(Check("killer-evidence.psi", "warn", detail, FIX["psi"]))
    if cgroup_path is not None:
        try:
            os.listxattr(cgroup_path)
            detail = f"xattrs of {cgroup_path} are readable: systemd-oomd's kills are counted"
            checks.append(Check("killer-evidence.xattrs", "ok", detail))
        except OSError as e:
            detail = f"xattrs of {cgroup_path} unreadable ({e.strerror or e}): oomd kills unseen"
            checks.append(Check("killer-evidence.xattrs", "warn", detail, FIX["xattrs"]))
    hidden = [o for o in _proc_options(root) if o.startswith("hidepid=")]
    if hidden and hidden[0] not in ("hidepid=0", "hidepid=off"):
        detail = (
            f"/proc is mounted with {hidden[0]}: another user's processes (a killer run by "
            "root, a signal's sender) are invisible to the nanny"
        )
        checks.append(Check("killer-evidence.proc", "warn", detail, FIX["hidepid"]))
    else:
        detail = "/proc shows every user's processes: killers and signal senders are named"
        checks.append(Check("killer-evidence.proc", "ok", detail))
    checks.append(check_signal_recorder())
    return checks


def check_signal_recorder() -> Check:
    """Is oomguard's native signal recorder installed (the sender of a worker's SIGTERM)?"""
    from ..._host import sigrec

    ok, why = sigrec.available()
    if ok:
        detail = "the native signal recorder is installed: a signal's sender is named"
        return Check("killer-evidence.signal-senders", "ok", detail)
    detail = f"{why}: a signal's sender is not recorded, its killer only inferred"
    return Check("killer-evidence.signal-senders", "no", detail, FIX["sigrec"])
