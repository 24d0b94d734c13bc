"""Checkpoint collector: when saves start and finish under configured roots, and how long they take.

A *root* is a directory holding a job's checkpoints (configured as glob patterns such as
``/lustre/ckpt/*``, host paths resolved under --path.rootfs).  Each entry directly in a
root is one *save*, recognised by how the common writers mark a save's start and end:

- PyTorch DCP: a directory of ``*.distcp`` shards; ``.metadata`` is written last.
- NeMo: a ``NAME-unfinished`` marker exists while ``NAME`` (``NAME.ckpt``, ``NAME.nemo``) is written.
- Megatron: ``iter_NNNNNNN/``; complete once ``latest_checkpointed_iteration.txt`` reaches N.
- generic: anything else; complete when nothing in it changed for ``quiet_period``, or at once
  when it appears by renaming a temporary name (``tmp-NAME``, ``NAME.tmp``, ``NAME.partial``).

Times come from the files themselves, so polling and inotify agree and an agent restart
loses nothing: a save starts at the earliest of when the agent first saw a trace of it and
its oldest file's mtime; it ends at its completion marker's mtime (DCP ``.metadata``,
Megatron's tracker file), or its newest file's mtime (NeMo, generic; for a renamed item the
rename time, its ctime).  An incomplete save that started before the newest completed save
is an abandoned leftover (a crashed job's), not in progress.

Watching: ``inotify`` (watch.py, down to ``max_watch_depth`` levels below the root) sees
writes made on this node only; a root on a network filesystem written by other nodes needs
``poll``; ``auto`` (default) polls roots on network and FUSE filesystems and watches the
others.  Polling rescans a root every run; inotify rescans only after events (and every few
minutes, in case events were lost).  Either way a scan stats at most ``max_files`` files per
root and reports when it stopped there.

Files: collector.py (roots, watching, a run, the metrics), config.py (the roots' settings),
markers.py (the writers' file names), scan.py (a root's listing into observed saves),
walk.py (one save's files), watch.py (inotify, depth-bounded), evaluate.py (observed saves
into complete and in progress), state.py (what is known across runs), metrics.py (the
declarations).
"""

from lockstep.collectors.checkpoint.collector import CheckpointCollector
from lockstep.collectors.checkpoint.config import CheckpointOptions

__all__ = ["CheckpointCollector", "CheckpointOptions"]
