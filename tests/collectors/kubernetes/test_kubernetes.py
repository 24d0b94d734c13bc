"""The kubernetes collector against a real gRPC server implementing the kubelet's
PodResourcesLister on a unix socket, started by the tests; plus the generated code's freshness."""

from __future__ import annotations

import dataclasses
import logging
import os
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterable, Iterator
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from lockstep.agent.collector import CollectorContext, NothingHere, Paths
from lockstep.agent.gpus import GpuInventory, PublishedGpu
from lockstep.collectors.kubernetes import KubernetesCollector, KubernetesOptions, PodResourcesError
from lockstep.collectors.kubernetes.podresources import api_pb2 as pb
from lockstep.collectors.kubernetes.podresources import api_pb2_grpc
from lockstep.collectors.kubernetes.podresources.generate import GENERATED, generate
from tests.support import FIXTURES, LOCKSTEP, REPO, context, lockstep, samples

INFO = "lockstep_k8s_pod_gpu_info"
UUID = [f"GPU-0a1b2c3d-0000-4000-8000-0000000000{i:02d}" for i in range(4)]
MIG = "MIG-5f2e1d0c-1111-5222-9333-444455556666"


def pod(namespace: str, name: str, *containers: pb.ContainerResources) -> pb.PodResources:
    return pb.PodResources(namespace=namespace, name=name, containers=containers)


def container(name: str, *devices: tuple[str, list[str]]) -> pb.ContainerResources:
    return pb.ContainerResources(
        name=name, devices=[pb.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in devices]
    )


NODE = pb.ListPodResourcesResponse(
    pod_resources=[
        pod("ml", "train-0", container("trainer", ("nvidia.com/gpu", UUID[0:2])), container("logger")),
        pod("ml", "infer-0", container("server", ("nvidia.com/mig-1g.10gb", [MIG]), ("rdma/ib", ["mlx5_0"]))),
        # Time-slicing: two replicas of one GPU in one container are one GPU; another pod shares it.
        pod("dev", "nb-a", container("jupyter", ("nvidia.com/gpu.shared", [f"{UUID[3]}::0", f"{UUID[3]}::1"]))),
        pod("dev", "nb-b", container("jupyter", ("nvidia.com/gpu.shared", [f"{UUID[3]}::2", ""]))),
        pod("kube-system", "coredns-abc", container("coredns")),
    ]
)


class Kubelet(api_pb2_grpc.PodResourcesListerServicer):
    """What the kubelet serves: List answers ``response``, after ``delay`` seconds if set."""

    def __init__(self, response: pb.ListPodResourcesResponse, delay: float = 0.0) -> None:
        self.response = response
        self.delay = delay
        self.calls = 0
        self.released = threading.Event()  # ends a delayed answer early when the test is over

    def List(self, request: pb.ListPodResourcesRequest, context: grpc.ServicerContext) -> pb.ListPodResourcesResponse:
        self.calls += 1
        if self.delay:
            self.released.wait(self.delay)
        return self.response


@contextmanager
def kubelet_socket(servicer: Kubelet | None, directory: Path) -> Iterator[Path]:
    """A gRPC server on ``directory``/kubelet.sock; without a servicer it implements nothing."""
    socket = directory / "kubelet.sock"
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    if servicer is not None:
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix:{socket}")
    server.start()
    try:
        yield socket
    finally:
        if servicer is not None:
            servicer.released.set()
        server.stop(grace=None).wait()


def collector(socket: Path, gpu_inventory: GpuInventory | None = None, **options: Any) -> KubernetesCollector:
    """The collector on the kubelet socket, reading ``gpu_inventory`` (else an empty one of its own)."""
    made = context(options=KubernetesOptions(socket=socket, **options))
    if gpu_inventory is not None:
        made = dataclasses.replace(made, gpu_inventory=gpu_inventory)
    return KubernetesCollector(made)


def inventory_of(published: Iterable[PublishedGpu]) -> GpuInventory:
    """An inventory as the GPU collector would have published it."""
    inventory = GpuInventory()
    inventory.publish(tuple(published))
    return inventory


def series(c: KubernetesCollector) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for family in c.collect():
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def key(namespace: str, pod: str, container: str, resource: str, uuid: str, gpu: str = "") -> tuple:
    labels = {"k8s_namespace": namespace, "k8s_pod": pod, "k8s_container": container, "resource": resource}
    return (INFO, frozenset({**labels, "gpu": gpu, "uuid": uuid}.items()))


def test_each_gpu_of_each_container_from_a_real_kubelet_api(tmp_path: Path) -> None:
    with kubelet_socket(Kubelet(NODE), tmp_path) as socket:
        got = series(collector(socket))
    assert got == {
        key("ml", "train-0", "trainer", "nvidia.com/gpu", UUID[0]): 1,
        key("ml", "train-0", "trainer", "nvidia.com/gpu", UUID[1]): 1,
        key("ml", "infer-0", "server", "nvidia.com/mig-1g.10gb", MIG): 1,
        key("dev", "nb-a", "jupyter", "nvidia.com/gpu.shared", UUID[3]): 1,
        key("dev", "nb-b", "jupyter", "nvidia.com/gpu.shared", UUID[3]): 1,
    }


def test_gpu_label_is_the_nvml_index_once_published(tmp_path: Path) -> None:
    inventory = inventory_of(PublishedGpu(i, UUID[n], "", None, "", True, (), ()) for n, i in ((0, 0), (1, 5)))
    with kubelet_socket(Kubelet(NODE), tmp_path) as socket:
        got = series(collector(socket, inventory, resources=("nvidia.com/gpu",)))
    assert got == {
        key("ml", "train-0", "trainer", "nvidia.com/gpu", UUID[0], gpu="0"): 1,
        key("ml", "train-0", "trainer", "nvidia.com/gpu", UUID[1], gpu="5"): 1,
    }


def test_device_file_ids_are_mapped_to_uuids_through_the_driver(tmp_path: Path) -> None:
    """GKE's device plugin names GPUs by device file (nvidia0); the driver's procfs maps minors to UUIDs."""
    node = pb.ListPodResourcesResponse(pod_resources=[pod("ml", "p", container("c", ("nvidia.com/gpu", ["nvidia1"])))])
    ctx = context(proc=FIXTURES / "kubernetes" / "proc", options=KubernetesOptions(socket=tmp_path / "kubelet.sock"))
    with kubelet_socket(Kubelet(node), tmp_path):
        got = series(KubernetesCollector(ctx))
    assert got == {key("ml", "p", "c", "nvidia.com/gpu", "GPU-a94c07e1-0b6e-4a51-9d2f-7e3c5b8d0f1f"): 1}


def test_kubelet_is_asked_at_most_every_refresh(tmp_path: Path) -> None:
    kubelet = Kubelet(NODE)
    with kubelet_socket(kubelet, tmp_path) as socket:
        cached = collector(socket, refresh=3600.0)
        first, second = series(cached), series(cached)
        uncached = collector(socket, refresh=1e-9)
        series(uncached), series(uncached)
    assert first == second
    assert kubelet.calls == 1 + 2


def test_pods_that_leave_leave_no_series(tmp_path: Path) -> None:
    kubelet = Kubelet(NODE)
    with kubelet_socket(kubelet, tmp_path) as socket:
        c = collector(socket, refresh=1e-9, resources=("nvidia.com/mig-*",))
        before = series(c)
        kubelet.response = pb.ListPodResourcesResponse()
        after = series(c)
    assert list(before) == [key("ml", "infer-0", "server", "nvidia.com/mig-1g.10gb", MIG)]
    assert after == {}


def test_a_slow_kubelet_fails_the_run_at_the_timeout(tmp_path: Path) -> None:
    outcome: list[BaseException] = []
    with kubelet_socket(Kubelet(NODE, delay=60), tmp_path) as socket:
        c = collector(socket, timeout=0.3)

        def run() -> None:
            try:
                series(c)
            except BaseException as exc:
                outcome.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        thread.join(30)  # a guard against a hang, far above the 0.3 s deadline: not a timing assert
        assert not thread.is_alive(), "the List call was not bounded by its timeout"
    assert [str(e) for e in outcome] == [f"the kubelet's pod-resources API at {socket} did not answer within 0.3s"]
    assert isinstance(outcome[0], PodResourcesError)


def test_no_pod_resources_directory_is_nothing_here(tmp_path: Path) -> None:
    """The default socket is looked up under --path.rootfs: a node without a kubelet has no directory."""
    c = KubernetesCollector(
        CollectorContext(paths=Paths(rootfs=tmp_path), options=KubernetesOptions(), log=logging.getLogger("test"))
    )
    with pytest.raises(NothingHere) as raised:
        series(c)
    expected_dir = tmp_path / "var/lib/kubelet/pod-resources"
    assert str(raised.value) == (
        f"no {expected_dir} (not a Kubernetes node, or the kubelet's pod-resources directory is not mounted "
        "into the agent's container)"
    )


def test_directory_without_socket_is_a_failure(tmp_path: Path) -> None:
    with pytest.raises(PodResourcesError, match=r"^no kubelet socket at .*kubelet\.sock \(is the kubelet running\?\)$"):
        series(collector(tmp_path / "kubelet.sock"))
    (tmp_path / "kubelet.sock").write_text("")
    with pytest.raises(PodResourcesError, match=r"kubelet\.sock is not a socket$"):
        series(collector(tmp_path / "kubelet.sock"))


def test_a_kubelet_without_the_v1_api_is_named(tmp_path: Path) -> None:
    with kubelet_socket(None, tmp_path) as socket:
        with pytest.raises(PodResourcesError) as raised:
            series(collector(socket))
    assert str(raised.value) == f"the kubelet at {socket} does not serve the v1 pod-resources API (older than 1.20?)"


@pytest.mark.real
def test_permission_denied_says_who_may_connect() -> None:
    """The kubelet's socket is root's (srwxr-xr-x): a non-root agent gets EACCES on connect."""
    from tests.support import require_real

    require_real("running as root (to drop to an unprivileged user)", os.geteuid() == 0)
    directory = Path(tempfile.mkdtemp(prefix="lockstep-kubelet-"))
    directory.chmod(0o755)  # reachable by anyone; only the socket's own mode keeps others out
    script = (
        "import os, sys; from pathlib import Path; "
        "from lockstep.collectors.kubernetes import list_pod_resources, PodResourcesError\n"
        # Everything imported while still root: the interpreter's files need not be readable by nobody.
        "import grpc, lockstep.collectors.kubernetes.podresources.api_pb2_grpc\n"
        "os.setgid(65534); os.setuid(65534)\n"
        "try: list_pod_resources(Path(sys.argv[1]), 5)\n"
        "except PodResourcesError as e: print(e)\n"
    )
    try:
        with kubelet_socket(Kubelet(NODE), directory) as socket:
            os.chmod(socket, 0o755)
            assert stat.S_ISSOCK(socket.stat().st_mode)
            result = subprocess.run(
                [sys.executable, "-c", script, str(socket)], capture_output=True, text=True, timeout=60, cwd=REPO
            )
    finally:
        (directory / "kubelet.sock").unlink(missing_ok=True)
        directory.rmdir()
    assert result.stdout.startswith(f"cannot reach the kubelet's pod-resources API at {socket}: "), result
    assert "ermission denied" in result.stdout
    assert result.stdout.rstrip().endswith(
        "(only root may connect to the kubelet's socket: run the agent as uid 0, see docs/deploy.md)"
    )


@pytest.mark.real
def test_lockstep_once_with_a_real_kubelet(tmp_path: Path) -> None:
    with kubelet_socket(Kubelet(NODE), tmp_path) as socket:
        result = lockstep(
            "once",
            "--collector.disable-defaults",
            "--collector.kubernetes",
            f"--kubernetes.pod-resources-socket={socket}",
        )
    assert result.returncode == 0, result.stderr
    got = samples(result.stdout)
    assert got[("lockstep_collector_up", frozenset({("collector", "kubernetes")}))] == 1
    assert got[key("ml", "infer-0", "server", "nvidia.com/mig-1g.10gb", MIG)] == 1
    assert len([k for k in got if k[0] == INFO]) == 5


@pytest.mark.real
def test_a_hung_kubelet_does_not_hold_up_the_other_collectors(tmp_path: Path) -> None:
    config = tmp_path / "lockstep.yml"
    with kubelet_socket(Kubelet(NODE, delay=60), tmp_path) as socket:
        config.write_text(f"collectors:\n  kubernetes:\n    socket: {socket}\n    timeout: 500ms\n")
        result = lockstep("once", "--config", str(config))
    assert result.returncode == 1
    assert (
        f"collector kubernetes: failed: PodResourcesError: the kubelet's pod-resources API at {socket} "
        in result.stderr
    )
    got = samples(result.stdout)
    assert got[("lockstep_collector_up", frozenset({("collector", "kubernetes")}))] == 0
    assert got[("lockstep_collector_up", frozenset({("collector", "host")}))] == 1
    assert not [k for k in got if k[0] == INFO]


def test_checked_in_generated_code_matches_the_proto(tmp_path: Path) -> None:
    generated = generate(tmp_path)
    checked_in = REPO / "collectors" / "kubernetes" / "podresources"
    for path in generated:
        assert path.read_text() == (checked_in / path.name).read_text(), (
            f"collectors/kubernetes/podresources/{path.name} differs from what api.proto generates: "
            "python -m lockstep.collectors.kubernetes.podresources.generate"
        )
    assert sorted(p.name for p in generated) == sorted(GENERATED)


@pytest.mark.real
def test_lockstep_help_does_not_import_grpc() -> None:
    code = "import sys; from lockstep.agent.registry import discover; discover(); print('grpc' in sys.modules)"
    result = subprocess.run([*LOCKSTEP[:1], "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert result.stdout.strip() == "False", result.stderr


# --- Dynamic Resource Allocation: dynamic_resources in the same List answer ---

CLAIM_UID = "5e6f7a8b-1c2d-4e3f-9a0b-c1d2e3f4a5b6"


def claimed(driver: str, device: str, *cdi: str, pool: str = "node-7") -> pb.ClaimResource:
    return pb.ClaimResource(
        cdi_devices=[pb.CDIDevice(name=n) for n in cdi], driver_name=driver, pool_name=pool, device_name=device
    )


def with_claims(name: str, *resources: pb.ClaimResource, claim: str = "gpus") -> pb.ContainerResources:
    dynamic = pb.DynamicResource(claim_name=claim, claim_namespace="ml", claim_resources=resources)
    return pb.ContainerResources(name=name, dynamic_resources=[dynamic])


DRA_NODE = pb.ListPodResourcesResponse(
    pod_resources=[
        # Kubernetes 1.31+: driver, pool and device name, and NVIDIA's two CDI devices for each GPU.
        pod(
            "ml",
            "dra-train-0",
            with_claims(
                "trainer",
                claimed(
                    "gpu.nvidia.com",
                    "gpu-0",
                    "k8s.gpu.nvidia.com/device=gpu-0",
                    f"k8s.gpu.nvidia.com/claim={CLAIM_UID}-gpu-0",
                ),
                claimed("gpu.nvidia.com", "gpu-1", "k8s.gpu.nvidia.com/device=gpu-1"),
            ),
        ),
        # 1.27-1.30 (no driver or device name): the claim-specific CDI device only.
        pod("ml", "dra-old", with_claims("c", claimed("", "", f"k8s.gpu.nvidia.com/claim={CLAIM_UID}-gpu-2"))),
        # A CDI spec made by nvidia-ctk names the GPU by UUID.
        pod("ml", "dra-uuid", with_claims("c", claimed("gpu.nvidia.com", "", f"nvidia.com/gpu={UUID[3]}"))),
        # Left out: a MIG placement (no MIG UUID in it), a NIC of another driver, a GPU index the
        # GPU collector has not published.
        pod("ml", "dra-mig", with_claims("c", claimed("gpu.nvidia.com", "gpu-3-mig-9-0-1"))),
        pod("net", "dra-nic", with_claims("c", claimed("dra.net", "eth1", "dra.net/nic=eth1"))),
        pod("ml", "dra-unknown", with_claims("c", claimed("gpu.nvidia.com", "gpu-9"))),
        # Device-plugin GPUs beside them, in the same answer.
        pod("ml", "plugin", container("c", ("nvidia.com/gpu", [UUID[2]]))),
    ]
)


def test_gpus_allocated_through_dra_from_a_real_kubelet_api(tmp_path: Path) -> None:
    inventory = inventory_of(PublishedGpu(i, UUID[i], "", i, "", True, (), ()) for i in range(4))
    with kubelet_socket(Kubelet(DRA_NODE), tmp_path) as socket:
        got = series(collector(socket, inventory))
    assert got == {
        key("ml", "dra-train-0", "trainer", "gpu.nvidia.com", UUID[0], gpu="0"): 1,
        key("ml", "dra-train-0", "trainer", "gpu.nvidia.com", UUID[1], gpu="1"): 1,
        key("ml", "dra-old", "c", "gpu.nvidia.com", UUID[2], gpu="2"): 1,
        key("ml", "dra-uuid", "c", "gpu.nvidia.com", UUID[3], gpu="3"): 1,
        key("ml", "plugin", "c", "nvidia.com/gpu", UUID[2], gpu="2"): 1,
    }


def test_dra_drivers_are_an_option(tmp_path: Path) -> None:
    inventory = inventory_of(PublishedGpu(i, UUID[i], "", i, "", True, (), ()) for i in range(4))
    with kubelet_socket(Kubelet(DRA_NODE), tmp_path) as socket:
        got = series(collector(socket, inventory, dra_drivers=("other.example.com",), resources=()))
    assert got == {}


def test_dra_devices_wait_for_the_gpu_inventory(tmp_path: Path) -> None:
    """An index means nothing before the GPU collector has published: no series rather than a wrong one;
    a UUID needs no inventory."""
    with kubelet_socket(Kubelet(DRA_NODE), tmp_path) as socket:
        got = series(collector(socket, resources=()))
    assert got == {key("ml", "dra-uuid", "c", "gpu.nvidia.com", UUID[3]): 1}
