"""The Kubernetes collector: asks the kubelet which container holds which GPU (the call, its
deadline and its errors), attributes the GPU collector's per-process samples to containers
(containers.py) and DRA claims to GPUs (dra.py).  The package's __init__ describes the whole."""

from __future__ import annotations

import fnmatch
import re
import stat
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lockstep.agent.collector import Collector, CollectorContext, Families, MetricSpec, NothingHere
from lockstep.agent.families import Metric
from lockstep.agent.files import read_text
from lockstep.agent.options import option, parse_duration, parse_path, parse_string_list
from lockstep.agent.seams import Seam
from lockstep.collectors.kubernetes.containers import LOG_LINKS, Container, containers_by_id, process_container_id
from lockstep.collectors.kubernetes.dra import DEFAULT_DRA_DRIVERS, DraDevice, dra_devices, uuid_of_dra_device

if TYPE_CHECKING:
    from lockstep.collectors.kubernetes.podresources.api_pb2 import ListPodResourcesResponse

# The kubelet's pod-resources List call with a timeout in seconds (the simulated node's pods).
# The type is quoted: the generated gRPC code is loaded only when the collector runs.
KUBELET_POD_RESOURCES = Seam[Callable[[float], "ListPodResourcesResponse"]](
    "kubelet_pod_resources", "the kubelet's pod-resources List call with a timeout"
)

POD_GPU_INFO = MetricSpec(
    "lockstep_k8s_pod_gpu_info",
    "gauge",
    "A GPU assigned to a container by the kubelet (from its pod-resources API): 1 per GPU and "
    "container. resource is the device-plugin resource (nvidia.com/gpu, nvidia.com/mig-1g.10gb, ...) or, for a GPU "
    "allocated through DRA, the DRA driver (gpu.nvidia.com); "
    "uuid the GPU's or MIG device's UUID; gpu the NVML index where known. Join on uuid.",
    ("k8s_namespace", "k8s_pod", "k8s_container", "resource", "gpu", "uuid"),
)

_CONTAINER_GPU = ("k8s_namespace", "k8s_pod", "k8s_container", "gpu", "uuid")
CONTAINER_GPU_SM = MetricSpec(
    "lockstep_k8s_container_gpu_sm_utilization_ratio",
    "gauge",
    "Share of the GPU's SM time used by the container's processes in NVML's newest per-process sample of the "
    "last two rounds: on a GPU shared by several pods (time-slicing, MPS), each one's part. One series per "
    "container and GPU it runs a process on.",
    _CONTAINER_GPU,
    unit="ratio",
)
CONTAINER_GPU_MEMORY = MetricSpec(
    "lockstep_k8s_container_gpu_memory_utilization_ratio",
    "gauge",
    "Share of the GPU's memory bandwidth (time device memory was read or written) used by the container's "
    "processes in NVML's newest per-process sample of the last two rounds.",
    _CONTAINER_GPU,
    unit="ratio",
)

# Under --path.rootfs, so a containerised agent with the host's root mounted finds it there.
DEFAULT_SOCKET = Path("var/lib/kubelet/pod-resources/kubelet.sock")
DEFAULT_RESOURCES = ("nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-*")
# The kubelet answers with every pod on the node; 16 MiB (as NVIDIA's dcgm-exporter allows)
# instead of gRPC's 4 MiB default leaves room for big nodes.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
_DEVICE_FILE_ID = re.compile(r"^nvidia(\d+)$")


class PodResourcesError(Exception):
    """The kubelet's pod-resources API could not be asked, in words an operator can act on."""


@dataclass(frozen=True, order=True)
class Assignment:
    """One device of one resource assigned to one container, as the kubelet reported it."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_id: str


def list_pod_resources(socket: Path, timeout: float) -> ListPodResourcesResponse:
    """One List call to the kubelet on ``socket``, bounded by ``timeout`` seconds."""
    import grpc  # imported here: a tenth of a second that `lockstep --help` need not pay

    from lockstep.collectors.kubernetes.podresources import api_pb2, api_pb2_grpc

    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
    # A fresh channel per call: nothing keeps reconnecting in the background between calls.
    with grpc.insecure_channel(f"unix:{socket}", options=options) as channel:
        stub = api_pb2_grpc.PodResourcesListerStub(channel)
        try:
            return stub.List(api_pb2.ListPodResourcesRequest(), timeout=timeout)
        except grpc.RpcError as exc:
            raise _describe_rpc_error(exc, socket, timeout) from None


def _describe_rpc_error(exc: Any, socket: Path, timeout: float) -> PodResourcesError:
    import grpc

    code, details = exc.code(), exc.details() or ""
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return PodResourcesError(f"the kubelet's pod-resources API at {socket} did not answer within {timeout:g}s")
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return PodResourcesError(f"the kubelet at {socket} does not serve the v1 pod-resources API (older than 1.20?)")
    if code == grpc.StatusCode.UNAVAILABLE:
        hint = ""
        if "permission denied" in details.lower():
            hint = " (only root may connect to the kubelet's socket: run the agent as uid 0, see docs/deploy.md)"
        return PodResourcesError(f"cannot reach the kubelet's pod-resources API at {socket}: {details}{hint}")
    return PodResourcesError(f"pod-resources List at {socket} failed: {code.name}: {details}")


def assignments(response: ListPodResourcesResponse, resource_patterns: Sequence[str]) -> list[Assignment]:
    """The devices of the wanted resources, one entry per (container, resource, device), sorted."""
    found = set()
    for pod in response.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                if not any(fnmatch.fnmatchcase(devices.resource_name, p) for p in resource_patterns):
                    continue
                for device_id in devices.device_ids:
                    if device_id:
                        found.add(Assignment(pod.namespace, pod.name, container.name, devices.resource_name, device_id))
    return sorted(found)


def uuid_of(device_id: str, uuid_by_minor: dict[str, str]) -> str:
    """The GPU or MIG UUID a device-plugin ID stands for (the ID itself if it is no known form)."""
    uuid = device_id.split("::", 1)[0]  # time-slicing replica "GPU-...::3"
    match = _DEVICE_FILE_ID.match(uuid)
    if match:  # GKE's plugin: the device file /dev/nvidiaN
        return uuid_by_minor.get(match.group(1), uuid)
    return uuid


@dataclass(frozen=True)
class KubernetesOptions:
    socket: Path | None = option(
        None,
        parse_path,
        "the kubelet's pod-resources socket (default: var/lib/kubelet/pod-resources/kubelet.sock under --path.rootfs)",
        flag="--kubernetes.pod-resources-socket",
    )
    resources: tuple[str, ...] = option(
        DEFAULT_RESOURCES, parse_string_list, "device-plugin resource names (glob patterns) that are GPUs"
    )
    dra_drivers: tuple[str, ...] = option(
        DEFAULT_DRA_DRIVERS,
        parse_string_list,
        "DRA drivers (glob patterns) whose claimed devices are GPUs (Dynamic Resource Allocation)",
    )
    timeout: float = option(5.0, parse_duration, "deadline of one call to the kubelet")
    refresh: float = option(
        30.0, parse_duration, "ask the kubelet at most this often; rounds in between reuse the answer"
    )


class KubernetesCollector(Collector[KubernetesOptions]):
    name = "kubernetes"
    help = "Which pod and container hold which GPU, from the kubelet's pod-resources API."
    default_enabled = True
    default_interval = 15.0
    metrics = (POD_GPU_INFO, CONTAINER_GPU_SM, CONTAINER_GPU_MEMORY)
    needs = ("gpu",)  # the GPU inventory (context.gpu_inventory) gives each UUID its NVML index
    options_class = KubernetesOptions

    def __init__(self, context: CollectorContext) -> None:
        super().__init__(context)
        self.socket: Path = self.options.socket or context.paths.rootfs / DEFAULT_SOCKET
        # (monotonic time, device-plugin assignments, DRA devices) of the kubelet's last answer
        self._cached: tuple[float, list[Assignment], list[DraDevice]] | None = None

    def collect(self) -> Iterator[Metric]:
        now = time.monotonic()
        if self._cached is not None and now - self._cached[0] < self.options.refresh:
            found, claimed = self._cached[1], self._cached[2]
        else:
            response = self._list()
            found, claimed = (
                assignments(response, self.options.resources),
                dra_devices(response, self.options.dra_drivers),
            )
            self._cached = (now, found, claimed)
        uuid_by_minor = self._uuid_by_minor() if any(_DEVICE_FILE_ID.match(a.device_id) for a in found) else {}
        inventory = self.context.gpu_inventory  # the GPU collector's latest round
        families = Families(self.metrics)
        series = set()
        for a in found:
            uuid = uuid_of(a.device_id, uuid_by_minor)
            series.add((a.namespace, a.pod, a.container, a.resource, inventory.index_of(uuid) or "", uuid))
        uuid_by_index = {gpu.index: gpu.uuid for gpu in inventory.published() if gpu.uuid}
        for d in claimed:  # DRA (dra.py): resource is the DRA driver
            dra_uuid = uuid_of_dra_device(d.device, uuid_by_index)
            if dra_uuid is not None:  # an index the GPU collector has not published, a MIG placement
                series.add((d.namespace, d.pod, d.container, d.driver, inventory.index_of(dra_uuid) or "", dra_uuid))
        for labels in sorted(series):  # replicas of one time-sliced GPU are one series
            families[POD_GPU_INFO].add_metric(list(labels), 1)
        for (container, gpu, uuid), (sm, memory) in sorted(self._utilization_by_container().items()):
            of = [container.namespace, container.pod, container.name, gpu, uuid]
            families[CONTAINER_GPU_SM].add_metric(of, sm)
            families[CONTAINER_GPU_MEMORY].add_metric(of, memory)
        yield from families.all()

    def _utilization_by_container(self) -> dict[tuple[Container, str, str], tuple[float, float]]:
        """(container, gpu, uuid) -> the SM and memory-bandwidth shares of its processes on that
        GPU, summed: per-process samples from the GPU collector (agent/gpus.py), each PID mapped
        to its container through its cgroup (containers.py).  No PID is exported."""
        measured = [
            (gpu, p)
            for gpu in self.context.gpu_inventory.published()
            for p in gpu.processes
            if p.sm_utilization is not None
        ]
        if not measured:
            return {}
        names = containers_by_id(self.paths.rootfs / LOG_LINKS)
        out: dict[tuple[Container, str, str], tuple[float, float]] = {}
        for gpu, process in measured:
            cid = process_container_id(self.paths.procfs, process.pid)
            container = names.get(cid) if cid else None
            if container is None:
                continue  # not in a pod (the host's, a Slurm job's), or its container is gone
            key = (container, str(gpu.index), gpu.uuid)
            sm, memory = out.get(key, (0.0, 0.0))
            out[key] = (sm + (process.sm_utilization or 0.0), memory + (process.memory_utilization or 0.0))
        return out

    def _list(self) -> ListPodResourcesResponse:
        fake = self.context.seams.get(KUBELET_POD_RESOURCES)
        if fake is not None:  # the simulated node (simulation/kubernetes.py)
            return fake(self.options.timeout)
        try:
            mode = self.socket.stat().st_mode
        except FileNotFoundError:
            if not self.socket.parent.is_dir():
                raise NothingHere(
                    f"no {self.socket.parent} (not a Kubernetes node, or the kubelet's pod-resources "
                    "directory is not mounted into the agent's container)"
                ) from None
            raise PodResourcesError(f"no kubelet socket at {self.socket} (is the kubelet running?)") from None
        if not stat.S_ISSOCK(mode):
            raise PodResourcesError(f"{self.socket} is not a socket")
        return list_pod_resources(self.socket, self.options.timeout)

    def _uuid_by_minor(self) -> dict[str, str]:
        """Device minor number -> GPU UUID, from the NVIDIA driver's procfs (readable by anyone)."""
        found: dict[str, str] = {}
        root = self.paths.procfs / "driver" / "nvidia" / "gpus"
        try:
            gpu_dirs = sorted(root.iterdir())
        except OSError:
            return found
        for gpu_dir in gpu_dirs:
            try:
                text = read_text(gpu_dir / "information")
            except OSError:
                continue
            fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
            minor, uuid = fields.get("Device Minor", "").strip(), fields.get("GPU UUID", "").strip()
            if minor and uuid:
                found[minor] = uuid
        return found
