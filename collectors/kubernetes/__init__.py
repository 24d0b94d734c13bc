"""Kubernetes collector: which pod and container hold which GPU.

Asks the kubelet's pod-resources API (gRPC, ``v1.PodResourcesLister/List``) on its unix
socket, ``/var/lib/kubelet/pod-resources/kubelet.sock``, and exports one
``lockstep_k8s_pod_gpu_info{k8s_namespace,k8s_pod,k8s_container,resource,gpu,uuid} 1`` per GPU held by a
container, so any per-GPU series can be attributed to a pod by a join on ``uuid``.

On a GPU shared by several pods that join gives each pod the whole GPU's utilisation, so each
container's own share is exported too: ``lockstep_k8s_container_gpu_sm_utilization_ratio`` and
``..._memory_utilization_ratio``, summed over its processes' NVML per-process samples (published
by the GPU collector), each host PID mapped to its container through ``/proc/<pid>/cgroup`` and
the kubelet's log links (containers.py).  Series are per container and GPU, never per
PID, so they are bounded by the containers running on the node's GPUs.

The kubelet names devices as the device plugin does.  NVIDIA's plugin uses GPU UUIDs
(``GPU-...``), MIG device UUIDs (``MIG-...``) and, with time-slicing, a UUID plus ``::N``
for the replica; GKE's plugin uses device file names (``nvidia0``), which are mapped to UUIDs
through the driver's ``/proc/driver/nvidia/gpus/*/information``.  GPUs allocated through
Dynamic Resource Allocation come in the same answer (``dynamic_resources``, dra.py),
with the DRA driver (``gpu.nvidia.com``) as ``resource``.  ``gpu`` is the NVML index
when the GPU collector has published it (the GPU inventory, agent/gpus.py), else empty.

The kubelet is asked at most every ``refresh`` (30 s); rounds in between re-serve that
answer.  Each call has its own deadline (``timeout``, 5 s) well inside the collector's, and
goes over a fresh channel: a missing, dead or hung kubelet costs one bounded call, never a
stuck worker or a background reconnect loop.

One job per module: ``collector`` (the options, the kubelet call, the round), ``containers``
(which container a host process runs in), ``dra`` (GPUs allocated through Dynamic Resource
Allocation); ``podresources`` holds the kubelet API's generated gRPC code.
"""

from lockstep.collectors.kubernetes.collector import (
    KUBELET_POD_RESOURCES,
    KubernetesCollector,
    KubernetesOptions,
    PodResourcesError,
    list_pod_resources,
)

# Besides the collector and its options: the seam the simulated node replaces, and the
# kubelet call with its error, which the tests make against a kubelet of their own.
__all__ = [
    "KUBELET_POD_RESOURCES",
    "KubernetesCollector",
    "KubernetesOptions",
    "PodResourcesError",
    "list_pod_resources",
]
