"""The simulated node run by Kubernetes: what the kubelet's pod-resources API would answer.

Only in the ``kubernetes`` scenario; every other scenario is a Slurm node without a kubelet,
where the kubernetes collector finds no socket and reports nothing here.  The answer is a
real ``ListPodResourcesResponse`` handed to the collector through ``node.seams`` (the
collector's gRPC client itself is tested against a real gRPC server in tests/test_kubernetes.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lockstep.simulation import Scenario
from lockstep.simulation.gpu import GPU_UUIDS  # the fake NVML's GPUs, by NVML index

if TYPE_CHECKING:
    from lockstep.simulation import SimulatedNode

SCENARIOS = (
    Scenario(
        "kubernetes",
        "The node as a Kubernetes GPU node: a training pod holds GPUs 0-3, an inference pod 4-5, "
        "two notebooks share GPU 7 by time-slicing; the kubelet's pod-resources API says which. The "
        "inference pod's vLLM server is calm (KV cache 42 %).",
    ),
)


def _response():  # type: ignore[no-untyped-def]
    from lockstep.collectors.podresources import api_pb2 as pb

    def pod(namespace: str, name: str, *containers: pb.ContainerResources) -> pb.PodResources:
        return pb.PodResources(namespace=namespace, name=name, containers=containers)

    def container(name: str, resource: str = "", device_ids: tuple[str, ...] = ()) -> pb.ContainerResources:
        devices = [pb.ContainerDevices(resource_name=resource, device_ids=device_ids)] if resource else []
        return pb.ContainerResources(name=name, devices=devices, cpu_ids=[0, 1])

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
        ]
    )


def build(node: SimulatedNode, t: float) -> None:
    if node.scenario != "kubernetes":
        return
    node.seams.kubelet_pod_resources = lambda timeout: _response()
