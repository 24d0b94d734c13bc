"""`--drain` against an `scontrol` on PATH that answers `show node` as told and logs each call
(the real scontrol's drain is tests/health/test_health_check_slurm.py's): drained with
Lockstep's reason only when no one drained or downed the node, never twice, and every way
scontrol can fail said in one line within the deadline."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from lockstep.health.drain import DrainError, drain, node_name
from lockstep.report.transport import Deadline

pytestmark = pytest.mark.real  # scontrol is a process

# `scontrol -o show node` as Slurm 22.05 prints it (tests/fixtures/slurm/scontrol-show-node-drain.txt), shortened.
SHOWN = "NodeName=n1 Arch=x86_64 CPUTot=8 State={state} ThreadsPerCore=1 Partitions=gpu {reason}"


def fake_scontrol(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shown: str, exit_code: int = 0, delay: float = 0
) -> Path:
    """An scontrol on PATH: `show node` prints `shown` (exits exit_code), every call is logged."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    script = bin_dir / "scontrol"
    script.write_text(
        "#!/bin/sh\n"
        f'printf "%s\\n" "$*" >> {log}\n'
        f"sleep {delay}\n"
        'case "$1 $2" in\n'
        f"  '-o show') printf '%s\\n' '{shown}'; exit {exit_code} ;;\n"
        "esac\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return log


def test_a_node_in_service_is_drained_with_lockstep_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = fake_scontrol(tmp_path, monkeypatch, SHOWN.format(state="IDLE", reason=""))
    said = drain("n1", "GPU 5 lost (fell off the bus)", Deadline(10))
    assert said == "node n1 drained: lockstep: GPU 5 lost (fell off the bus)"
    assert log.read_text().splitlines() == [
        "-o show node n1",
        "update NodeName=n1 State=DRAIN Reason=lockstep: GPU 5 lost (fell off the bus)",
    ]


AT = "[ops@2026-11-21T23:24:27]"  # who set the reason, and when


@pytest.mark.parametrize(
    ("state", "reason", "said"),
    [
        (
            "IDLE+DRAIN",
            f"Reason=maintenance: PSU swap {AT}",
            "left as it is: IDLE+DRAIN by someone else (Reason=maintenance: PSU swap)",
        ),
        ("DOWN", f"Reason=Not responding {AT}", "left as it is: DOWN by someone else (Reason=Not responding)"),
        ("MIXED+DRAIN", f"Reason=lockstep: GPU 5 lost {AT}", "already drained by lockstep (lockstep: GPU 5 lost)"),
    ],
)
def test_a_node_drained_or_down_already_is_left_as_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state: str, reason: str, said: str
) -> None:
    log = fake_scontrol(tmp_path, monkeypatch, SHOWN.format(state=state, reason=reason))
    assert drain("n1", "GPU 5 lost", Deadline(10)) == f"node n1 {said}"
    assert log.read_text().splitlines() == ["-o show node n1"]  # no update


def test_every_way_scontrol_fails_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_scontrol(tmp_path, monkeypatch, "slurm_load_node error: Invalid node name specified", exit_code=1)
    with pytest.raises(
        DrainError, match=r"^scontrol -o show node failed: slurm_load_node error: Invalid node name specified$"
    ):
        drain("n1", "x", Deadline(10))
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    with pytest.raises(DrainError, match=r"^scontrol is not on PATH \(is this a Slurm node\?\)$"):
        drain("n1", "x", Deadline(10))


def test_a_hung_scontrol_is_left_at_the_deadline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_scontrol(tmp_path, monkeypatch, SHOWN.format(state="IDLE", reason=""), delay=30)
    with pytest.raises(DrainError, match=r"^scontrol -o did not finish within the check's deadline$"):
        drain("n1", "x", Deadline(1))


def test_the_node_is_named_as_slurm_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURMD_NODENAME", "gpu-node-017")
    assert node_name(None) == "gpu-node-017"
    assert node_name("given") == "given"
    monkeypatch.delenv("SLURMD_NODENAME")
    assert node_name(None) == os.uname().nodename.split(".")[0]
