"""A GPU shared by several pods or jobs: each one's share of it, from the per-process samples the
GPU collector publishes, each PID attributed through its cgroup (Kubernetes: the container's
ID and the kubelet's log links; Slurm: the job's cgroup).  Never a series per PID."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from lockstep.agent.collector import CollectorContext, Paths
from lockstep.agent.gpus import GpuInventory, GpuProcess, PublishedGpu
from lockstep.agent.seams import Seams
from lockstep.collectors.kubernetes import KUBELET_POD_RESOURCES, KubernetesCollector, KubernetesOptions
from lockstep.collectors.kubernetes.containers import Container, container_id, containers_by_id
from lockstep.collectors.kubernetes.podresources import api_pb2 as pb
from lockstep.collectors.slurm import SlurmCollector, SlurmOptions
from lockstep.collectors.slurm.scontrol import SCONTROL
from tests.support import collected, context
from tests.support.scontrol import SLURM, captured_scontrol

ID_A, ID_B, ID_C, ID_D = (f"{n}" * 64 for n in "abcd")
UUID = "GPU-0a1b2c3d-0000-4000-8000-000000000007"
UUID_MIG_GPU = "GPU-0a1b2c3d-0000-4000-8000-000000000006"
SM = "lockstep_k8s_container_gpu_sm_utilization_ratio"
MEMORY = "lockstep_k8s_container_gpu_memory_utilization_ratio"

# cgroup v2, systemd driver (containerd, CRI-O, cri-dockerd), and v1 with the cgroupfs driver.
CONTAINERD = (
    f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod9e1c_2f.slice/cri-containerd-{ID_A}.scope\n"
)
CRIO = f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod77_aa.slice/crio-{ID_B}.scope\n"
CGROUPFS_V1 = (
    f"12:pids:/kubepods/burstable/pod5d0a7e2c-1b2f-4c3d-9e8f-0a1b2c3d4e5f/{ID_C}\n"
    f"11:memory:/kubepods/burstable/pod5d0a7e2c-1b2f-4c3d-9e8f-0a1b2c3d4e5f/{ID_C}\n"
    "1:name=systemd:/system.slice/containerd.service\n"
)
DOCKER = f"0::/kubepods.slice/kubepods-pod11_22.slice/docker-{ID_D}.scope\n"


@pytest.mark.parametrize(
    ("cgroup", "expected"),
    [
        (CONTAINERD, ID_A),
        (CRIO, ID_B),
        (CGROUPFS_V1, ID_C),
        (DOCKER, ID_D),
        # Not in a pod: the host's, a Slurm job's, the pod's own slice (no container).
        ("0::/system.slice/vllm.service\n", None),
        (f"0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0/{ID_A}\n", None),
        ("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod9e1c_2f.slice\n", None),
        ("", None),
    ],
)
def test_container_id_from_the_cgroup(cgroup: str, expected: str | None) -> None:
    assert container_id(cgroup) == expected


def test_containers_are_named_by_the_kubelets_log_links(tmp_path: Path) -> None:
    links = tmp_path / "containers"
    links.mkdir()
    for name in (
        f"notebook-alice_research_jupyter-{ID_A}.log",
        f"vllm-7d9f6c-x2kqz_inference_vllm-server-{ID_B}.log",  # a container name with a dash
        "README",  # not a link of the kubelet's
        f"too_many_underscores_x-{ID_C}.log",
    ):
        os.symlink(f"/var/log/pods/{name}", links / name)  # dangling: never followed
    assert containers_by_id(links) == {
        ID_A: Container("research", "notebook-alice", "jupyter"),
        ID_B: Container("inference", "vllm-7d9f6c-x2kqz", "vllm-server"),
    }
    assert containers_by_id(tmp_path / "absent") == {}


def process(pid: int, sm: float | None, memory: float | None) -> GpuProcess:
    return GpuProcess(pid, 1 << 30, None, None, sm_utilization=sm, memory_utilization=memory)


def inventory_of(*published: PublishedGpu) -> GpuInventory:
    """An inventory as the GPU collector would have published it."""
    inventory = GpuInventory()
    inventory.publish(published)
    return inventory


@pytest.fixture
def shared_gpu() -> GpuInventory:
    """GPU 7 shared by two pods (one with two processes), a host process and a process whose
    container is gone; GPU 6 in MIG mode (no per-process utilisation)."""
    return inventory_of(
        PublishedGpu(6, UUID_MIG_GPU, "", 6, "", True, (process(4400, None, None),), ()),
        PublishedGpu(
            7,
            UUID,
            "",
            7,
            "",
            True,
            (
                process(4100, 0.5, 0.25),  # alice's notebook
                process(4101, 0.125, 0.0625),  # alice's notebook, a second process
                process(4200, 0.25, 0.125),  # bob's notebook
                process(900, 0.0625, 0.0),  # the host's (nvidia-smi, a benchmark)
                process(4300, 0.0625, 0.0),  # its container's log link is gone
            ),
            (),
        ),
    )


def node(tmp_path: Path) -> Paths:
    proc, rootfs = tmp_path / "proc", tmp_path / "root"
    cgroups = {4100: CONTAINERD, 4101: CONTAINERD, 4200: CRIO, 900: "0::/system.slice/sshd.service\n", 4300: DOCKER}
    cgroups[4400] = CGROUPFS_V1
    for pid, text in cgroups.items():
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cgroup").write_text(text)
    links = rootfs / "var/log/containers"
    links.mkdir(parents=True)
    for name in (
        f"notebook-alice_research_jupyter-{ID_A}.log",
        f"notebook-bob_research_jupyter-{ID_B}.log",
        f"mig-pod_ml_server-{ID_C}.log",
    ):
        os.symlink("/nowhere", links / name)
    return Paths(procfs=proc, rootfs=rootfs)


def kubernetes(paths: Paths, gpu_inventory: GpuInventory) -> KubernetesCollector:
    import logging

    seams = Seams(KUBELET_POD_RESOURCES.replaced_by(lambda timeout: pb.ListPodResourcesResponse()))
    context = CollectorContext(
        paths=paths,
        options=KubernetesOptions(),
        log=logging.getLogger("test"),
        seams=seams,
        gpu_inventory=gpu_inventory,
    )
    return KubernetesCollector(context)


def share(name: str, pod: str, gpu: str = "7", uuid: str = UUID) -> tuple[str, frozenset[tuple[str, str]]]:
    labels = {"k8s_namespace": "research", "k8s_pod": pod, "k8s_container": "jupyter", "gpu": gpu, "uuid": uuid}
    return (name, frozenset(labels.items()))


def test_each_pod_sharing_a_gpu_gets_its_own_share(tmp_path: Path, shared_gpu: GpuInventory) -> None:
    values = collected(kubernetes(node(tmp_path), shared_gpu))
    assert {k: v for k, v in values.items() if k[0] in (SM, MEMORY)} == {
        share(SM, "notebook-alice"): 0.625,  # 0.5 + 0.125: its two processes
        share(MEMORY, "notebook-alice"): 0.3125,
        share(SM, "notebook-bob"): 0.25,
        share(MEMORY, "notebook-bob"): 0.125,
    }
    assert [k for k in values if "pid" in dict(k[1])] == []


def test_no_per_process_utilisation_no_series_and_no_lookup(tmp_path: Path) -> None:
    inventory = inventory_of(PublishedGpu(7, UUID, "", 7, "", True, (process(4100, None, None),), ()))
    values = collected(kubernetes(Paths(procfs=tmp_path / "no-proc", rootfs=tmp_path / "no-root"), inventory))
    assert [k for k in values if k[0] in (SM, MEMORY)] == []


def job_share(name: str, job_id: str, gpu: str = "7", uuid: str = UUID) -> tuple[str, frozenset[tuple[str, str]]]:
    return (name, frozenset({"job_id": job_id, "gpu": gpu, "uuid": uuid}.items()))


def test_each_slurm_job_sharing_a_gpu_gets_its_own_share(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The v2 fixture: job 101 runs pids 5001-5003, job 102 pid 6001 (their cgroups)."""
    inventory = inventory_of(
        PublishedGpu(
            0,
            UUID,
            "",
            0,
            "",
            True,
            (
                process(5002, 0.5, 0.125),
                process(5003, 0.25, 0.0625),
                process(6001, 0.125, 0.25),
                process(7, 0.5, 0),
            ),
            (),
        ),
        PublishedGpu(1, UUID_MIG_GPU, "", 1, "", True, (process(5001, None, None),), ()),
    )
    slurm_context = context(
        proc=SLURM / "v2" / "proc",
        sys_=SLURM / "v2" / "sys",
        options=SlurmOptions(node_name="node07"),
        seams=Seams(SCONTROL.replaced_by(captured_scontrol())),
    )
    collector = SlurmCollector(dataclasses.replace(slurm_context, gpu_inventory=inventory))
    values = collected(collector)
    sm, memory = "lockstep_slurm_job_gpu_sm_utilization_ratio", "lockstep_slurm_job_gpu_memory_utilization_ratio"
    assert {k: v for k, v in values.items() if k[0] in (sm, memory)} == {
        job_share(sm, "101", "0"): 0.75,
        job_share(memory, "101", "0"): 0.1875,
        job_share(sm, "102", "0"): 0.125,
        job_share(memory, "102", "0"): 0.25,
    }
