"""NCCL's own telemetry, for jobs whose code reports nothing: two collectors.

- ``nccl_inspector`` (inspector.py): follows the dump files of NCCL's Inspector profiler plugin
  (NCCL 2.28.3+, JSON lines per process: from 2.30.3 one per recorded operation, before it the
  latest collective of each communicator at each dump) and
  exports per job, communicator, rank and collective the counts, execution seconds and bytes
  from which rates give the time per collective (the straggler is the rank with the shortest)
  and the bus bandwidth.
- ``nccl_ras`` (ras.py): asks the local NCCL RAS service (NCCL 2.24+, JSON from 2.28.7) for
  the job's communicators: their size, missing and dead ranks, and the collective counts and
  status of the ranks (a hang: counts that stop, ranks that stop answering).

docs/workloads.md says how a job switches them on.
"""

from lockstep.collectors.nccl.inspector import InspectorCollector, InspectorOptions
from lockstep.collectors.nccl.ras import RasCollector, RasOptions

__all__ = ["InspectorCollector", "InspectorOptions", "RasCollector", "RasOptions"]
