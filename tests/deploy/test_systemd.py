"""The systemd unit, its environment and sysusers files, and the dependency lock they install from.

systemd-analyze and systemd-sysusers work on files, without a running systemd: the unit is
verified and its exposure scored offline, the sysusers file applied to a scratch root.
"""

from __future__ import annotations

import re
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from lockstep.agent.cli import build_parser
from lockstep.agent.registry import discover
from tests.support import REPO, AgentProcess, require_real

SYSTEMD = REPO / "systemd"
UNIT = SYSTEMD / "lockstep.service"
INSTALL_DOC = REPO / "docs" / "install.md"
LOCK = REPO / "requirements.lock"
INSTALLED_EXEC = "/opt/lockstep/bin/lockstep"


def unit_settings(text: str) -> dict[str, list[str]]:
    """Key -> values (systemd allows a key more than once) of a unit file's [Service] section."""
    settings: dict[str, list[str]] = {}
    section = ""
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
        elif section == "Service":
            key, _, value = line.partition("=")
            settings.setdefault(key, []).append(value)
    return settings


def unit_for_this_checkout(tmp_path: Path) -> Path:
    """The unit with ExecStart at this checkout's lockstep: verify checks that the binary exists.

    Only the executable path is replaced; every other line is verified as shipped."""
    lockstep = Path(sys.executable).parent / "lockstep"
    assert lockstep.is_file(), f"{lockstep} missing: the project is not installed in this interpreter's venv"
    text = UNIT.read_text()
    assert text.count(INSTALLED_EXEC) == 1
    copy = tmp_path / "lockstep.service"
    copy.write_text(text.replace(INSTALLED_EXEC, str(lockstep)))
    return copy


def systemd_analyze() -> str:
    path = shutil.which("systemd-analyze")
    require_real("systemd-analyze (Debian package systemd)", path is not None)
    return path  # type: ignore[return-value]


@pytest.mark.real
def test_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    result = subprocess.run(
        [systemd_analyze(), "verify", str(unit_for_this_checkout(tmp_path))], capture_output=True, text=True, timeout=60
    )
    # verify exits 0 on unknown keys and bad values too, only warning about them: demand silence.
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


@pytest.mark.real
def test_unit_exposure_score_is_the_documented_one(tmp_path: Path) -> None:
    result = subprocess.run(
        [systemd_analyze(), "security", "--offline=yes", "--no-pager", str(unit_for_this_checkout(tmp_path))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    score = re.search(r"Overall exposure level for lockstep\.service: (\d+\.\d) (\w+)", result.stdout)
    assert score, result.stdout
    documented = re.search(r"exposure level of (\d+\.\d) \((\w+)\)", INSTALL_DOC.read_text())
    assert documented, "docs/install.md does not state the exposure level"
    assert (score.group(1), score.group(2)) == (documented.group(1), documented.group(2))


@pytest.mark.real
def test_sysusers_file_creates_a_locked_system_user(tmp_path: Path) -> None:
    sysusers = shutil.which("systemd-sysusers")
    require_real("systemd-sysusers (Debian package systemd)", sysusers is not None)
    (tmp_path / "etc").mkdir()
    config = (SYSTEMD / "lockstep.sysusers").read_text()
    result = subprocess.run(
        [sysusers, f"--root={tmp_path}", "-"], input=config, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    (user,) = [line.split(":") for line in (tmp_path / "etc/passwd").read_text().splitlines()]
    name, _, uid, gid, gecos, home, shell = user
    assert (name, gecos, home, shell) == ("lockstep", "Lockstep GPU node agent", "/", "/usr/sbin/nologin")
    assert int(uid) < 1000 and uid == gid  # a system user with its own group
    assert (tmp_path / "etc/group").read_text() == f"lockstep:x:{gid}:\n"
    settings = unit_settings(UNIT.read_text())
    assert (settings["User"], settings["Group"]) == (["lockstep"], ["lockstep"])


def test_environment_file_options_are_accepted_by_lockstep_run() -> None:
    settings = unit_settings(UNIT.read_text())
    assert settings["EnvironmentFile"] == ["-/etc/lockstep/lockstep.env"]
    assert settings["ExecStart"] == [f"{INSTALLED_EXEC} run $LOCKSTEP_OPTS"]
    (line,) = [ln for ln in (SYSTEMD / "lockstep.env").read_text().splitlines() if ln.startswith("LOCKSTEP_OPTS=")]
    options = shlex.split(line.partition("=")[2])[0].split()  # systemd: strip quotes, then $VAR splits at spaces
    args = build_parser(discover()).parse_args(["run", *options])
    assert str(args.config) == "/etc/lockstep/lockstep.yml"


@pytest.mark.real
def test_agent_pings_the_units_watchdog(tmp_path: Path, agent_process: type[AgentProcess]) -> None:
    """With the unit's WatchdogSec, the agent says READY=1 and then pings WATCHDOG=1."""
    settings = unit_settings(UNIT.read_text())
    assert (settings["Type"], settings["NotifyAccess"]) == (["notify"], ["main"])
    (watchdog,) = settings["WatchdogSec"]
    assert watchdog.endswith("s")
    notify = tmp_path / "notify.sock"
    received: list[str] = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(notify))
        sock.settimeout(10)
        env = {"NOTIFY_SOCKET": str(notify), "WATCHDOG_USEC": str(int(watchdog[:-1]) * 1_000_000)}
        with agent_process("run", "--collector.disable-defaults", env=env):
            while "WATCHDOG=1" not in received:
                received.append(sock.recv(256).decode())
    assert received[0] == "READY=1"


def test_lock_pins_every_runtime_dependency_with_hashes() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins: dict[str, str] = {}
    hashes: dict[str, int] = {}
    via: dict[str, list[str]] = {}
    current = ""
    for line in LOCK.read_text().splitlines():
        pinned = re.match(r"^([A-Za-z0-9._-]+)==([^ ;\\]+)", line)
        if pinned:
            current = canonicalize_name(pinned.group(1))
            pins[current] = pinned.group(2)
            hashes[current] = 0
        elif line.strip().startswith("--hash=sha256:"):
            hashes[current] += 1
        elif re.match(r"^\s+#\s+(via\s+)?\S", line) and current:
            via.setdefault(current, []).append(line.strip("# ").removeprefix("via ").strip())
    missing, unsatisfied = [], []
    for text in project["dependencies"]:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        if name not in pins:
            missing.append(text)
        elif not requirement.specifier.contains(pins[name], prereleases=True):
            unsatisfied.append(f"{text} (lock has {pins[name]})")
    assert (missing, unsatisfied) == ([], []), "requirements.lock is stale: ./dev/lock"
    assert [name for name, count in hashes.items() if count == 0] == []
    # Nothing in the lock that neither the project nor another locked package asks for.
    orphans = [
        n for n, why in via.items() if not any(w.startswith("lockstep") or canonicalize_name(w) in pins for w in why)
    ]
    assert orphans == []
    assert set(via) == set(pins)
