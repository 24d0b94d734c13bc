"""GPUs allocated through Dynamic Resource Allocation (ResourceClaims), as the kubelet's
pod-resources API reports them in ``ContainerResources.dynamic_resources``.

Each allocated device of a claim comes as a ``ClaimResource``: since Kubernetes 1.31 with its
DRA driver, pool and device name (NVIDIA's driver ``gpu.nvidia.com`` names a whole GPU
``gpu-<NVML index>``), and with the CDI devices the container gets, fully qualified
``vendor/class=name``: NVIDIA's driver gives ``k8s.gpu.nvidia.com/device=gpu-3`` and a
claim-specific ``k8s.gpu.nvidia.com/claim=<claim UID>-gpu-3``; CDI specs made by
``nvidia-ctk`` name GPUs ``nvidia.com/gpu=<index>`` or by UUID ``nvidia.com/gpu=GPU-...``.
Before 1.31 only the CDI names are there.  Every form is reduced to a GPU: a UUID as it is, an
index through the GPU collector's inventory (agent/gpus.py).

Not mapped (left out, not guessed): MIG devices allocated through DRA (``gpu-3-mig-...``: the
name gives the parent GPU and a placement, not the MIG device's UUID) and names of drivers not
in the collector's ``dra_drivers`` option.

The kubelet fills ``dynamic_resources`` only with its feature gate
``KubeletPodResourcesDynamicResources``: alpha (off by default) from 1.27, beta (on) from 1.34.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

DEFAULT_DRA_DRIVERS = ("gpu.nvidia.com",)
# The device part of a name: gpu-<index> (NVIDIA's DRA driver), <index> (nvidia-ctk's CDI specs),
# a GPU's or MIG device's UUID.
_BY_INDEX = re.compile(r"^(?:gpu-)?(\d+)$")
_BY_UUID = re.compile(r"^(?:GPU|MIG)-[0-9a-fA-F-]+$")
# NVIDIA's claim-specific CDI device: <claim UID>-<device name>.
_CLAIM_DEVICE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}-(.+)$")


@dataclass(frozen=True, order=True)
class DraDevice:
    """One device of one claim, used by one container."""

    namespace: str
    pod: str
    container: str
    driver: str  # the DRA driver (gpu.nvidia.com); exported as the resource
    device: str  # gpu-3, 3, GPU-..., MIG-...


def _driver_of_cdi(kind: str) -> str:
    """The DRA driver a CDI kind belongs to: k8s.gpu.nvidia.com/claim -> gpu.nvidia.com; for a
    kind made outside DRA (nvidia.com/gpu) its vendor."""
    vendor = kind.split("/", 1)[0]
    return vendor.removeprefix("k8s.")


def dra_devices(response: Any, drivers: Sequence[str]) -> list[DraDevice]:
    """The devices of the wanted DRA drivers in a List (or Get) answer, one per container and
    device however many names the kubelet gives it, sorted."""
    found = set()
    for pod in response.pod_resources:
        for container in pod.containers:
            for dynamic in container.dynamic_resources:
                for claimed in dynamic.claim_resources:
                    names: list[tuple[str, str]] = []  # (driver, device)
                    if claimed.device_name:
                        names.append((claimed.driver_name, claimed.device_name))
                    for cdi in claimed.cdi_devices:
                        kind, _, device = cdi.name.partition("=")
                        if not device:
                            continue
                        match = _CLAIM_DEVICE.match(device)
                        if kind.endswith("/claim") and match:
                            device = match.group(1)
                        names.append((claimed.driver_name or _driver_of_cdi(kind), device))
                    for driver, device in names:
                        if any(fnmatch.fnmatchcase(driver, p) for p in drivers):
                            found.add(DraDevice(pod.namespace, pod.name, container.name, driver, device))
    return sorted(found)


def uuid_of_dra_device(device: str, uuid_by_index: dict[int, str]) -> str | None:
    """The UUID a DRA or CDI device name stands for, None when it cannot be told."""
    if _BY_UUID.match(device):
        return device
    match = _BY_INDEX.match(device)
    if match:
        return uuid_by_index.get(int(match.group(1)))
    return None
