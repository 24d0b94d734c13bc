"""The mount table (mountinfo) and which of its mounts are monitored."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from dataclasses import dataclass
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

_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


def unescape(field_text: str) -> str:
    r"""mountinfo escapes space, tab, newline and backslash as \040, \011, \012, \134."""
    return _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field_text)


@dataclass(frozen=True)
class Mount:
    mountpoint: str  # as the mount table (the host) names it
    fstype: str
    device: str
    readonly: bool


def parse_mountinfo(text: str) -> tuple[list[Mount], int]:
    """Mounts in table order, and the number of lines that were not mountinfo lines.

    Format (proc(5)): ``36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue``:
    id, parent, dev, root, mountpoint, mount options, optional fields, "-", fstype, source, super options.
    """
    mounts, skipped = [], 0
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = line.split(" ")
        try:
            separator = fields.index("-", 6)
        except ValueError:
            skipped += 1
            continue
        if len(fields) < separator + 3 or not fields[0].isdigit():
            skipped += 1
            continue
        mount_options = fields[5].split(",")
        super_options = fields[separator + 3].split(",") if len(fields) > separator + 3 else []
        mounts.append(
            Mount(
                mountpoint=unescape(fields[4]),
                fstype=fields[separator + 1],
                device=unescape(fields[separator + 2]),
                readonly="ro" in mount_options or "ro" in super_options,
            )
        )
    return mounts, skipped


def parse_patterns(value: Any) -> tuple[str, ...]:
    """A list of shell-style patterns (``fuse.*``, ``/var/lib/docker/*``); [] for none."""
    if value == [] or value == ():
        return ()
    return parse_string_list(value)


def matches(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)
