"""The filesystem collector: size, free space and responsiveness per mount, NFS and Lustre client stats.

One job per module: ``metrics`` (the declarations), ``mounts`` (the mount table and which mounts
are monitored), ``nfs`` (mountstats), ``lustre`` (llite stats), ``statpool`` (statfs with a
deadline on daemon threads), ``collector`` (the collector that puts them together).
"""

from lockstep.collectors.filesystem.collector import FilesystemCollector, FilesystemOptions
from lockstep.collectors.filesystem.mounts import parse_mountinfo  # the checkpoint collector reads the same table

__all__ = ["FilesystemCollector", "FilesystemOptions", "parse_mountinfo"]
