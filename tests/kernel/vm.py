"""Boot a real cgroup v2 kernel in a VM and run `scenarios.py` inside it, once.

virtme-ng (`vng`, from PyPI) boots the kernel Debian's `linux-image-amd64` installs under
QEMU with this machine's filesystem shared read-only, so the project's virtualenv and code
are there as they are; /tmp is writable. KVM is not usable here (nested), so it runs under
software emulation: ~20 s to boot, ~40 s to import Dask. `./dev test-kernel` installs what
it needs; `python tests/kernel/vm.py [scenario ...]` runs it by hand and prints the results.
"""

from __future__ import annotations

import glob
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
MARK = "OOMGUARD-KERNEL "


def kernel() -> str | None:
    images = sorted(glob.glob("/boot/vmlinuz-*"))
    return images[-1] if images else None


def vng() -> str | None:
    local = pathlib.Path(sys.executable).parent / "vng"
    return str(local) if local.exists() else shutil.which("vng")


def missing() -> str:
    """Why the VM cannot start here, or "" when it can."""
    if os.geteuid() != 0:
        return "the VM scenarios need root (cgroup set-up inside the VM)"
    if shutil.which("qemu-system-x86_64") is None:
        return "qemu-system-x86_64 not found (Debian package qemu-system-x86)"
    if kernel() is None:
        return "no kernel image in /boot (Debian package linux-image-amd64)"
    if not os.path.exists("/bin/busybox"):
        return "no /bin/busybox for the VM's initramfs (Debian package busybox-static)"
    if vng() is None:
        return "vng not found (PyPI package virtme-ng)"
    return ""


def run(
    scenarios: list[str] | None = None,
    *,
    pythonpath: str | None = None,
    timeout: float = 2700,
    log_path: pathlib.Path | None = None,
) -> tuple[dict[str, dict], float]:
    """Boot once, run the scenarios; ({name: result}, seconds). Raises when the VM fails."""
    inner = [sys.executable, str(HERE / "scenarios.py"), *(scenarios or [])]
    command = " ".join(inner)
    if pythonpath:  # e.g. an older checkout's src/, to show a bug before its fix
        command = f"env PYTHONPATH={pythonpath} {command}"
    argv = [
        vng(),
        "--disable-kvm",
        "--run",
        kernel(),
        "--memory",
        "3G",
        "--cpus",
        "2",
        "--exec",
        command,
    ]
    env = {**os.environ, "PATH": f"{pathlib.Path(sys.executable).parent}:{os.environ['PATH']}"}
    started = time.monotonic()
    proc = subprocess.run(
        argv,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        errors="replace",
        timeout=timeout,
        env=env,
        cwd="/",
    )
    seconds = time.monotonic() - started
    console = proc.stdout + "\n--- stderr ---\n" + proc.stderr
    if log_path is not None:
        log_path.write_text(console)
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith(MARK):
            result = json.loads(line[len(MARK) :])
            results[result["scenario"]] = result
    if not results:
        raise RuntimeError(f"the VM ran no scenario (exit {proc.returncode}):\n{console[-3000:]}")
    return results, seconds


if __name__ == "__main__":
    args = sys.argv[1:]
    pp = None
    if args[:1] == ["--pythonpath"]:
        pp, args = args[1], args[2:]
    why = missing()
    if why:
        sys.exit(why)
    out, secs = run(args, pythonpath=pp, log_path=pathlib.Path("/tmp/oomguard-kernel-vm.log"))
    print(json.dumps(out, indent=1, default=str))
    print(f"VM run: {secs:.0f} s", file=sys.stderr)
