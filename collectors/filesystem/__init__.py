"""The filesystem collector: size, free space and responsiveness per mount, NFS and Lustre client stats.

One job per module: ``metrics`` (the declarations), ``mounts`` (which mounts are monitored; the
mount table itself is read by collectors/toolkit/mounts.py), ``nfs`` (mountstats), ``lustre``
(llite stats), ``statpool`` (statfs with a deadline on daemon threads), ``collector`` (the
collector that puts them together).
"""

from lockstep.collectors.filesystem.collector import FilesystemCollector, FilesystemOptions

__all__ = ["FilesystemCollector", "FilesystemOptions"]
