"""The mount table: /proc/<pid>/mountinfo, parsed.

The filesystem collector monitors the mounts it lists; the checkpoint collector asks it which
filesystem a checkpoint root is on.  Which mounts are worth monitoring is the filesystem
collector's choice (collectors/filesystem/mounts.py), not this module's.  ``unescape`` undoes
the kernel's octal escapes, which /proc/<pid>/mountstats uses too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

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
