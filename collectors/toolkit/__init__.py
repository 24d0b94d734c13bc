"""The code collectors share, and a map of what a collector author may import.

Collectors do not import each other: a collector is changed, disabled or rewritten on its
own, and one that reached into another's modules (the ethtool collector into the InfiniBand
collector's sysfs reader, NCCL's Inspector collector into the training collector's log
tailer) would break, or hold the other back, whenever that one changed.  What collectors
share lives here instead, with the helpers only collectors use (running ``scontrol``), so
that the agent keeps to the daemon.  This package imports no collector, and nothing here
knows a collector's record formats or metrics.

The agent's API for collectors (``lockstep.agent``; the rest of the agent is the daemon's):

- ``collector``: the protocol (``Collector``, ``MetricSpec``, ``Families``, ``NothingHere``)
  and what the agent hands a collector (``CollectorContext``, ``Paths``);
- ``options``: ``option()`` to declare options, and their parse functions
  (``parse_duration``, ``parse_string_list``, ``parse_choice``, ...);
- ``seams``: replaceable dependencies (``Seam``, ``Seams``) and the shared clocks
  (``WALL_CLOCK``, ``MONOTONIC_CLOCK``): a collector takes the times it exports or compares
  across rounds from ``context.seams.get(MONOTONIC_CLOCK) or time.monotonic``, so a test and
  the simulated node set them when they build it;
- ``files``: reading files fast (``read_text``, for procfs and the like) and, for files
  users or workloads can write, within a bound and refusing FIFOs (``read_regular_file``);
- ``gpus``: the GPU inventory the GPU collector publishes for the others.

The toolkit (``lockstep.collectors.toolkit``):

- ``follow``: following growing line-oriented files by glob through rotation and
  truncation, with inotify events and a bounded sweep (training logs, NCCL Inspector dumps);
- ``followed_logs``: ``FollowedLogs``, a collector's followed files from its first round to its
  close (the lock, the follower, the sweep, the watch and the close order), and the options
  collectors following files declare alike (``globs_option``, ``start_at_option``,
  ``idle_timeout_option``): training, framework_logs, NCCL Inspector;
- ``sysfs``: sysfs attributes read within their page, the widest counter a reading may hold,
  the RDMA devices' network interfaces;
- ``mounts``: the mount table (``/proc/<pid>/mountinfo``) parsed;
- ``procs``: the process table, command lines, listening sockets and the Slurm job of a
  process, from procfs;
- ``command``: running a command (``scontrol``) with a whole-exchange deadline and an output
  bound, killing what it started;
- ``scontrol``: the ``SCONTROL`` seam (one fake answers every collector that asks Slurm), its
  real implementation and its ``Key=Value`` records parsed;
- ``skipped``: lines skipped by reason (a collector's invalid-lines counter), logged once a
  round;
- ``pods``: the Kubernetes pod a process runs in (from its cgroup) and the pod's log
  directory under /var/log/pods.

tests/project/test_layering.py checks all three rules: no collector imports another, the
toolkit imports no collector, and collectors import of the agent only the modules above.
"""
