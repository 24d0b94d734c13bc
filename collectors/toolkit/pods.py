"""The Kubernetes pod a process runs in, from its cgroup, and where the kubelet keeps the pod's logs.

The kubelet puts each pod's containers in a cgroup named after the pod's UID, with either
cgroup driver: ``.../kubepods-burstable-pod<uid, '_' for '-'>.slice/cri-containerd-<id>.scope``
(systemd) or ``.../kubepods/burstable/pod<uid>/<id>`` (cgroupfs); a process's cgroup is set by
the kubelet and the runtime, not by what runs in it.  The container runtime writes each
container's output to ``/var/log/pods/<namespace>_<pod>_<uid>/<container>/<restart>.log``
(the CRI logging format: ``<RFC 3339 time> stdout|stderr F|P <text>``).
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass
from pathlib import Path

from lockstep.agent.files import read_text

_POD_IN_CGROUP = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})(?:\.slice)?(?:/|$)"
)
POD_LOGS = "/var/log/pods"


def pod_uid_of_process(procfs: Path, pid: int) -> str:
    """The UID of the pod whose cgroup the process is in, "" if none (or it is gone)."""
    try:
        match = _POD_IN_CGROUP.search(read_text(procfs / str(pid) / "cgroup"))
    except OSError:
        return ""
    return match.group(1).replace("_", "-") if match else ""


@dataclass(frozen=True)
class PodLogs:
    namespace: str
    pod: str
    uid: str
    directory: str  # host path of /var/log/pods/<namespace>_<pod>_<uid>


def pod_log_directories(rootfs: Path, uids: set[str], pod_logs: str = POD_LOGS) -> list[PodLogs]:
    """The log directories of the pods with these UIDs (host paths), found by listing /var/log/pods
    under ``rootfs``; a pod whose directory is not there (yet) is left out."""
    if not uids:
        return []
    base = Path(str(rootfs) + pod_logs) if str(rootfs) != "/" else Path(pod_logs)
    try:
        names = os.listdir(base)
    except OSError:
        return []
    found = []
    for name in sorted(names):
        namespace, _, rest = name.partition("_")
        pod, _, uid = rest.rpartition("_")
        if uid in uids and namespace and pod:
            found.append(PodLogs(namespace, pod, uid, f"{pod_logs}/{name}"))
    return found


def pod_log_pattern(logs: PodLogs) -> str:
    """The glob of the pod's containers' log files (host path)."""
    return f"{glob.escape(logs.directory)}/*/*.log"
