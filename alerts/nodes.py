"""A node's record across jobs: the nodes that keep hurting jobs (issue 45's "lemon" nodes).

Every per-job alert that names a node (a straggling rank's, the rank or GPU that stopped first in
a hang: lockstep/thresholds.py NODE_RECORD_ALERTS) leaves its ALERTS series in Prometheus, with
the job's job_id and the node's instance; a checkpoint save that stalled leaves the record of its
slow writer (the node whose agent alone saw it stall, or whose storage showed a suspect then:
thresholds.py NODE_CHECKPOINT_WRITER_*).  Counted over NODE_RECORD_WINDOW, the distinct jobs a
node hurt are its record, and a node that hurt NODE_JOBS_HURT or more is a repeat offender:
LockstepNodeHurtsJobs.  Each job is counted once however many of its alerts named the node.
A node whose hardware needs a repair (T.NODE_REPAIR_ALERTS) pages once, with that record:
LockstepNodeNeedsRepair.
"""

from __future__ import annotations

from alerts.model import Alert, Group, Recording
from alerts.promql import WHERE, by, regex
from lockstep import thresholds as T
from lockstep.node_faults import GPU_LOST, GPUS_LOST, GPUS_LOST_RECORD, NODE_FAULTS
from lockstep.suspects import NODE_SUSPECT

JOBS_HURT = T.NODE_JOBS_HURT_RECORD
NAMED = f'ALERTS{{alertstate="firing", alertname=~"{regex(T.NODE_RECORD_ALERTS)}", job_id!=""}}'
# A checkpoint stall's slow writer (thresholds.py NODE_CHECKPOINT_WRITER_*): the stalled saves on a
# node's own storage, or seen by one agent alone, or by an agent whose node's storage shows a
# suspect, with their root's job.
WRITER = T.NODE_CHECKPOINT_WRITER_RECORD
STALLED = 'ALERTS{alertstate="firing", alertname="LockstepCheckpointStalled"}'
WRITER_EXPR = (
    f"group {by('job_id')} (\n"
    f"  (\n    {STALLED}\n"
    '    and on (cluster, instance, root) lockstep_checkpoint_info{storage="local"}\n'
    f"    or\n    {STALLED}\n    and on (cluster, root) count by (cluster, root) ({STALLED}) == 1\n"
    f"    or\n    {STALLED}\n"
    f'    and on (cluster, instance) {NODE_SUSPECT}{{suspect=~"{regex(T.NODE_CHECKPOINT_WRITER_SUSPECTS)}"}}\n  )\n'
    '  * on (cluster, instance, root) group_left (job_id) lockstep_checkpoint_info{job_id!=""}\n)'
)


def _jobs_named(matchers: str = "", sep: str = "\n    ") -> str:
    """Each (node, job) of the window: the alerts that named the node in the job, and the job's
    stalled saves it wrote (matchers: a selector's, for one node's)."""
    named = f"{NAMED[:-1]}, {matchers}}}" if matchers else NAMED
    writer = f"{WRITER}{{{matchers}}}" if matchers else WRITER
    return f"max_over_time({named}[{T.NODE_RECORD_WINDOW}]){sep}or max_over_time({writer}[{T.NODE_RECORD_WINDOW}])"


# The node's jobs, each once: what the alert lists (a query of its annotation).
NODE_JOBS = f"count by (job_id) ({_jobs_named('cluster=%q, instance=%q', sep=' ')})"
THE_NODE = "$labels.cluster $labels.instance"  # printf's arguments for one node's selector
JOBS_LIST = (
    # A raw string (backquotes) for the query: it holds double quotes.
    f'{{{{ range $i, $j := printf `{NODE_JOBS}` {THE_NODE} {THE_NODE} | query | sortByLabel "job_id" }}}}'
    "{{ if $i }}, {{ end }}{{ $j.Labels.job_id }}{{ end }}"
)


# A node whose hardware needs a repair: an alert of T.NODE_REPAIR_ALERTS fires on it.
REPAIR = f'ALERTS{{alertstate="firing", alertname=~"{regex(T.NODE_REPAIR_ALERTS)}"}}'
# What the node shows: each of those alerts, with the GPU and the XID or action it names.
REPAIR_SHOWN = (
    f"{{{{ range printf `{REPAIR[:-1]}, cluster=%q, instance=%q}}` $labels.cluster $labels.instance | query"
    ' | sortByLabel "gpu" }}'
    "{{ .Labels.alertname }}{{ with .Labels.gpu }} GPU {{ . }}{{ end }}{{ with .Labels.xid }} XID {{ . }}{{ end }}"
    "{{ with .Labels.action }} ({{ . }}){{ end }}; {{ end }}"
)
# The Slurm jobs on it now: draining it ends them or waits for them.
RUNNING_JOBS = (
    "{{ range $i, $j := printf `lockstep_slurm_job_info{cluster=%q, instance=%q}` $labels.cluster $labels.instance"
    ' | query | sortByLabel "job_id" }}{{ if $i }}, {{ end }}{{ $j.Labels.job_id }}{{ end }}'
)


def _own_faults() -> str:
    """The node's own faults in the window, from its records: "XID errors xid 79: 1; ..."."""

    def listed(record: str, says: str, by: tuple[str, ...] = (), unit: str = "") -> str:
        detail = "".join(f"{{{{ with .Labels.{label} }}}} {label} {{{{ . }}}}{{{{ end }}}}" for label in by)
        return (
            f"{{{{ range printf `{record}{{cluster=%q,instance=%q}}` $labels.cluster $labels.instance | query }}}}"
            f"{says}{detail}: {{{{ .Value }}}}{unit and ' ' + unit}; {{{{ end }}}}"
        )

    faults = [listed(f.record, f.says, f.by, f.unit) for f in NODE_FAULTS]
    return "".join([*faults, listed(GPUS_LOST_RECORD, "GPUs lost at once (most)")])


NODE_RECORDING = Group(
    "lockstep-nodes.recording",
    (
        # First: the record below reads it (on vmalert, one evaluation later).
        Recording(WRITER, WRITER_EXPR),
        Recording(
            JOBS_HURT,
            f"count {by()} (\n  count {by('job_id')} (\n    {_jobs_named()}\n  )\n)",
        ),
        # The node's own faults (lockstep/node_faults.py): one series a node that had one.
        *(Recording(fault.record, f"sum {by(*fault.by)} (\n  {fault.per_series()}\n) > 0") for fault in NODE_FAULTS),
        # GPUs lost: the count now is sparse (only nodes with one lost), so its week is cheap.
        Recording(GPUS_LOST, f"count {by()} ({GPU_LOST})"),
        Recording(GPUS_LOST_RECORD, f"max_over_time({GPUS_LOST}[{T.NODE_RECORD_WINDOW}])"),
    ),
)

NODE_ALERTS = Group(
    "lockstep-nodes.alerts",
    (
        Alert(
            "LockstepNodeHurtsJobs",
            "warning",
            "0m",
            f"{JOBS_HURT} >= {T.NODE_JOBS_HURT}",
            f"{WHERE} hurt {{{{ $value }}}} jobs in {T.NODE_RECORD_WINDOW}",
            f"{WHERE} was named by the straggler or hang alerts of, or stalled the checkpoint saves of, "
            f"{{{{ $value }}}} distinct jobs in the last "
            f"{T.NODE_RECORD_WINDOW} (jobs {JOBS_LIST}): more than chance puts on one node. A node that "
            "throttles now and then, flaps a link or loses a GPU's pace hurts a different job each day and "
            f"passes the checks between jobs. Its own faults in that time, where it had any: {_own_faults()}"
            "`lockstep report --node {{ $labels.instance }}` tells its story. Confirm it, drain it and return it "
            "as the runbook says.",
        ),
        # Issue 45: a node whose hardware needs a repair pages once, with what it shows, the jobs
        # on it and the jobs it hurt; Alertmanager groups it with those alerts by node, one page.
        Alert(
            "LockstepNodeNeedsRepair",
            "critical",
            "0m",
            f"count {by()} ({REPAIR})",
            f"{WHERE} needs a repair before it runs jobs again",
            f"{WHERE} shows {{{{ $value }}}} hardware fault(s) that need a repair or a reset: {REPAIR_SHOWN}"
            f"Slurm jobs on it now: [{RUNNING_JOBS}]. Jobs whose straggler or hang alerts named it, or whose "
            "checkpoint saves it stalled, in the last "
            f"{T.NODE_RECORD_WINDOW}: [{JOBS_LIST}]. Its own faults in that time: {_own_faults()}"
            "Drain it (`lockstep health-check --drain` on the node, or scontrol), repair it and return it as "
            "the runbook says; `lockstep report --node {{ $labels.instance }}` tells its story.",
        ),
    ),
)
