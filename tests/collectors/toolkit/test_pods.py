"""The pod of a process from its cgroup (both cgroup drivers), and the pods' log directories."""

from __future__ import annotations

from pathlib import Path

import pytest

from lockstep.collectors.toolkit.pods import PodLogs, pod_log_directories, pod_log_pattern, pod_uid_of_process

UID = "8f2c1b7e-3d4a-4c5b-9e6f-0a1b2c3d4e5f"


@pytest.mark.parametrize(
    "cgroup",
    [
        # systemd driver: the UID with underscores, in a .slice
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice/"
        "cri-containerd-0123abcd.scope",
        # cgroupfs driver, cgroup v1 lines
        f"12:memory:/kubepods/besteffort/pod{UID}/0123abcd\n11:cpu:/kubepods/besteffort/pod{UID}/0123abcd",
        f"0::/kubepods/pod{UID}/0123abcd",
    ],
)
def test_a_process_in_a_pods_cgroup(tmp_path: Path, cgroup: str) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text(cgroup + "\n")
    assert pod_uid_of_process(tmp_path, 42) == UID


@pytest.mark.parametrize("cgroup", ["0::/system.slice/slurmstepd.scope/job_4242/step_0", "0::/user.slice/podman"])
def test_a_process_in_no_pod(tmp_path: Path, cgroup: str) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text(cgroup + "\n")
    assert pod_uid_of_process(tmp_path, 42) == ""
    assert pod_uid_of_process(tmp_path, 43) == ""  # gone


def test_log_directories_of_the_wanted_pods_only(tmp_path: Path) -> None:
    pods = tmp_path / "var" / "log" / "pods"
    for name in (f"team-a_llama-0_{UID}", "team-b_other_11111111-2222-3333-4444-555555555555", "garbage"):
        (pods / name).mkdir(parents=True)
    found = pod_log_directories(tmp_path, {UID, "99999999-2222-3333-4444-555555555555"})
    assert found == [PodLogs("team-a", "llama-0", UID, f"/var/log/pods/team-a_llama-0_{UID}")]
    assert pod_log_pattern(found[0]) == f"/var/log/pods/team-a_llama-0_{UID}/*/*.log"
    assert pod_log_directories(tmp_path, set()) == []
    assert pod_log_directories(tmp_path / "nowhere", {UID}) == []
