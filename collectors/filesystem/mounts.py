"""Which mounts of the mount table are monitored (the table itself: collectors/toolkit/mounts.py)."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from typing import Any

from lockstep.agent.options import parse_string_list

# Pseudo and container-image filesystems: not storage anyone fills (node_exporter's list,
# plus FUSE pseudo filesystems).  FUSE network filesystems (fuse.juicefs, fuse.gcsfuse,
# fuse.s3fs, fuse.sshfs, ...) hold datasets and checkpoints: they are monitored.
DEFAULT_FSTYPES_EXCLUDE = (
    "autofs",
    "binfmt_misc",
    "bpf",
    "cgroup",
    "cgroup2",
    "configfs",
    "debugfs",
    "devpts",
    "devtmpfs",
    "efivarfs",
    "erofs",
    "fusectl",
    "fuse.lxcfs",
    "fuse.portal",
    "fuse.gvfsd-fuse",
    "fuse.snapfuse",
    "hugetlbfs",
    "iso9660",
    "mqueue",
    "nfsd",
    "nsfs",
    "overlay",
    "proc",
    "pstore",
    "ramfs",
    "rpc_pipefs",
    "securityfs",
    "selinuxfs",
    "squashfs",
    "sysfs",
    "tracefs",
)
# Kernel and container-runtime internals (per-container and per-pod mounts multiply series).
DEFAULT_MOUNTPOINTS_EXCLUDE = (
    "/proc/*",
    "/sys/*",
    "/run/credentials/*",
    "/run/user/*",
    "/run/containerd/*",
    "/run/netns/*",
    "/var/lib/docker/*",
    "/var/lib/containers/*",
    "/var/lib/kubelet/*",
    "/snap/*",
)


def parse_patterns(value: Any) -> tuple[str, ...]:
    """A list of shell-style patterns (``fuse.*``, ``/var/lib/docker/*``); [] for none."""
    if value == [] or value == ():
        return ()
    return parse_string_list(value)


def matches(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)
