"""Which Kubernetes container a host process runs in: its cgroup names the container, and the
kubelet's log links name the container's pod, namespace and container name.

- ``/proc/<pid>/cgroup``: under ``kubepods`` the last component is the container, as the
  runtime named it: ``cri-containerd-<id>.scope``, ``crio-<id>.scope``, ``docker-<id>.scope``
  (systemd cgroup driver) or the bare ``<id>`` (cgroupfs driver), with a 64-hex-digit ID; on
  cgroup v1 every controller's line names it, on v2 the one ``0::`` line does.
- ``/var/log/containers/<pod>_<namespace>_<container>-<id>.log``: the kubelet links every
  running container's log there, whatever the runtime (containerd, CRI-O, cri-dockerd), as
  long as the container exists.  Pod, namespace and container names cannot hold ``_`` (DNS
  names and labels), so the name splits unambiguously.  Only the names are read: the links are
  not followed and no log is opened.

Neither needs the API server or the container runtime's socket.  A process in no pod (the
host's own, a Slurm job's), or in a container whose link is gone, has no container here.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from lockstep.agent.files import read_text

# Under --path.rootfs.
LOG_LINKS = Path("var/log/containers")
_CONTAINER_ID = re.compile(r"^(?:[a-z][a-z0-9-]*-)?([0-9a-f]{64})(?:\.scope)?$")
_LOG_LINK = re.compile(r"^([^_]+)_([^_]+)_([^_]+)-([0-9a-f]{64})\.log$")


@dataclass(frozen=True, order=True)
class Container:
    namespace: str
    pod: str
    name: str


def container_id(cgroup: str) -> str | None:
    """The container ID in a /proc/<pid>/cgroup text, None when the process is in no pod."""
    for line in cgroup.splitlines():
        path = line.split(":", 2)[-1]
        if "kubepods" not in path:
            continue
        for component in reversed(path.strip("/").split("/")):
            match = _CONTAINER_ID.match(component)
            if match:
                return match.group(1)
    return None


def process_container_id(procfs: Path, pid: int) -> str | None:
    """The container ID of a host process (None: no pod, or it has exited)."""
    try:
        return container_id(read_text(procfs / str(pid) / "cgroup"))
    except OSError:
        return None


def containers_by_id(log_links: Path) -> dict[str, Container]:
    """Container ID -> its pod's namespace, the pod and the container's name, from the kubelet's
    log links ({} when the directory is not there)."""
    found: dict[str, Container] = {}
    try:
        names = os.listdir(log_links)
    except OSError:
        return found
    for name in names:
        match = _LOG_LINK.match(name)
        if match:
            pod, namespace, container, cid = match.groups()
            found[cid] = Container(namespace, pod, container)
    return found
