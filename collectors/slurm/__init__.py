"""The Slurm collector: the jobs running on this node, their CPU, memory and GPUs, and the node's state.

One job per module: ``metrics`` (the declarations), ``cgroups`` (a job's processes and usage from
its cgroups), ``gres`` (gres.conf and Slurm's index notation), ``scontrol`` (requests to slurmctld,
rate- and time-limited, in a background thread), ``collector`` (the collector).
"""

from lockstep.collectors.slurm.collector import SlurmCollector, SlurmOptions

__all__ = ["SlurmCollector", "SlurmOptions"]
