"""The simulated node run by Kubernetes: what the kubelet's pod-resources API would answer.

Only in the ``kubernetes`` scenario; every other scenario is a Slurm node without a kubelet,
where the kubernetes collector finds no socket and reports nothing here.  The answer is a
real ``ListPodResourcesResponse`` handed to the collector through ``node.seams`` (the
collector's gRPC client itself is tested against a real gRPC server in tests/collectors/kubernetes/test_kubernetes.py).

The pods' GPU processes (simulation/gpu.py puts them on the GPUs) are in their containers'
cgroups as containerd with the systemd cgroup driver makes them
(``/proc/<pid>/cgroup``), and the kubelet's log links name each container
(``/var/log/containers/<pod>_<namespace>_<container>-<id>.log`` under the rootfs):
the trainer (pid 2200) on GPUs 0-3, vLLM (3100, its engine core 3101 on GPUs 4-5), and the
notebooks of alice (4100, 55 % of GPU 7's SM time) and bob (4200, 20 %).  GPU 6 is allocated
through Dynamic Resource Allocation (a ResourceClaim of NVIDIA's DRA driver) to an embeddings pod
that runs nothing on it yet.
"""

from __future__ import annotations

import hashlib
import os
import uuid as uuidlib
from typing import TYPE_CHECKING

from lockstep.collectors.kubernetes import KUBELET_POD_RESOURCES
from lockstep.simulation import Scenario
from lockstep.simulation.gpu import GPU_UUIDS  # the fake NVML's GPUs, by NVML index

if TYPE_CHECKING:
    from lockstep.simulation import SimulatedNode

DRA_CLAIM_UID = "0c9a3e52-7d41-4b8e-a6f0-2d5b1c8e9f37"

SCENARIOS = (
    Scenario(
        "kubernetes",
        "The node as a Kubernetes GPU node: a training pod holds GPUs 0-3, an inference pod 4-5, "
        "two notebooks share GPU 7 by time-slicing; the kubelet's pod-resources API says which. The "
        "inference pod's vLLM server is calm (KV cache 42 %). An embeddings pod holds GPU 6 through a DRA "
        "ResourceClaim.",
    ),
)


def _response():  # type: ignore[no-untyped-def]
    from lockstep.collectors.kubernetes.podresources import api_pb2 as pb

    def pod(namespace: str, name: str, *containers: pb.ContainerResources) -> pb.PodResources:
        return pb.PodResources(namespace=namespace, name=name, containers=containers)

    def container(name: str, resource: str = "", device_ids: tuple[str, ...] = ()) -> pb.ContainerResources:
        devices = [pb.ContainerDevices(resource_name=resource, device_ids=device_ids)] if resource else []
        return pb.ContainerResources(name=name, devices=devices, cpu_ids=[0, 1])

    def dra_container(name: str, claim: str, gpu: int) -> pb.ContainerResources:
        device = f"gpu-{gpu}"  # NVIDIA's DRA driver names a whole GPU by its NVML index
        cdi = (f"k8s.gpu.nvidia.com/device={device}", f"k8s.gpu.nvidia.com/claim={DRA_CLAIM_UID}-{device}")
        resource = pb.ClaimResource(
            cdi_devices=[pb.CDIDevice(name=n) for n in cdi],
            driver_name="gpu.nvidia.com",
            pool_name="node001",
            device_name=device,
        )
        dynamic = pb.DynamicResource(claim_name=claim, claim_namespace="inference", claim_resources=[resource])
        return pb.ContainerResources(name=name, dynamic_resources=[dynamic], cpu_ids=[2, 3])

    return pb.ListPodResourcesResponse(
        pod_resources=[
            pod("kube-system", "nvidia-device-plugin-daemonset-x7k2p", container("nvidia-device-plugin")),
            pod(
                "training",
                "llama-70b-worker-0",
                container("trainer", "nvidia.com/gpu", GPU_UUIDS[0:4]),
                container("rdma", "rdma/hca_shared_devices_a", ("hca0",)),  # not a GPU: left out
            ),
            pod("inference", "vllm-llama-8b-7d9f6c-x2kqz", container("vllm", "nvidia.com/gpu", GPU_UUIDS[4:6])),
            pod("research", "notebook-alice", container("jupyter", "nvidia.com/gpu.shared", (f"{GPU_UUIDS[7]}::0",))),
            pod("research", "notebook-bob", container("jupyter", "nvidia.com/gpu.shared", (f"{GPU_UUIDS[7]}::1",))),
            # GPU 6 through Dynamic Resource Allocation (NVIDIA's DRA driver, Kubernetes 1.31+): a
            # ResourceClaim's device, with the CDI devices the driver gives the container.
            pod("inference", "embeddings-6b7c9-w4kxd", dra_container("tei", "embeddings-gpu", 6)),
        ]
    )


# (namespace, pod, container) -> the host PIDs of its processes.
CONTAINER_PIDS = {
    ("training", "llama-70b-worker-0", "trainer"): (2200,),
    ("inference", "vllm-llama-8b-7d9f6c-x2kqz", "vllm"): (3100, 3101),
    ("research", "notebook-alice", "jupyter"): (4100,),
    ("research", "notebook-bob", "jupyter"): (4200,),
}
NOTEBOOK_PIDS = (4100, 4200)


def pod_uid(namespace: str, pod: str) -> str:
    return str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"lockstep-simulation/pod/{namespace}/{pod}"))


def container_id(namespace: str, pod: str, container: str) -> str:
    return hashlib.sha256(f"{namespace}/{pod}/{container}".encode()).hexdigest()


def cgroup(namespace: str, pod: str, container: str) -> str:
    """/proc/<pid>/cgroup of a process in the container: cgroup v2, systemd driver, containerd."""
    uid = pod_uid(namespace, pod).replace("-", "_")
    return (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice/"
        f"cri-containerd-{container_id(namespace, pod, container)}.scope\n"
    )


def pid_cgroup(pid: int) -> str | None:
    """The cgroup of a pod's process in the kubernetes scenario (None: not a pod's)."""
    for (namespace, pod, container), pids in CONTAINER_PIDS.items():
        if pid in pids:
            return cgroup(namespace, pod, container)
    return None


def build(node: SimulatedNode, t: float) -> None:
    if node.scenario != "kubernetes":
        return
    node.seams.replace(KUBELET_POD_RESOURCES.replaced_by(lambda timeout: _response()))
    proc = node.paths.procfs
    for pid in NOTEBOOK_PIDS:  # the other pods' processes are written by their areas (gpu, workloads)
        stat = f"{pid} (python) S 1 {pid} {pid} 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 100\n"
        node.write(proc / str(pid) / "stat", stat)
        node.write(proc / str(pid) / "cmdline", "python\0-m\0ipykernel_launcher\0")
    for (namespace, pod, container), pids in CONTAINER_PIDS.items():
        for pid in pids:
            node.write(proc / str(pid) / "cgroup", cgroup(namespace, pod, container))
        cid = container_id(namespace, pod, container)
        link = node.paths.rootfs / "var/log/containers" / f"{pod}_{namespace}_{container}-{cid}.log"
        if not link.is_symlink():
            link.parent.mkdir(parents=True, exist_ok=True)
            target = f"/var/log/pods/{namespace}_{pod}_{pod_uid(namespace, pod)}/{container}/0.log"
            os.symlink(target, link)
