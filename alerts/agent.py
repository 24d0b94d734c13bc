"""Agent alerts: a collector failing, an agent Prometheus cannot scrape."""

from __future__ import annotations

from alerts.gpu import GPU_COLLECTOR_STUCK
from alerts.model import Alert, Group
from alerts.promql import WHERE, label, on
from lockstep import thresholds as T

AGENT_ALERTS = Group(
    "lockstep-agent.alerts",
    (
        Alert(
            "LockstepCollectorFailing",
            "warning",
            "10m",
            # A GPU collector stuck in NVML is LockstepGPUFellOffBus's (critical, within minutes).
            f"lockstep_collector_up == 0\nunless {on('collector')} {GPU_COLLECTOR_STUCK}",
            f"Collector {label('collector')} on {WHERE} is failing",
            f"The {label('collector')} collector of the agent on {WHERE} has failed or been stuck past its deadline "
            "for 10 minutes: its metrics are missing, and the alerts built on them cannot fire. "
            "`lockstep doctor` and the agent's log say why.",
        ),
        Alert(
            "LockstepAgentDown",
            "critical",
            "5m",
            f'up{{job="{T.AGENT_JOB}"}} == 0\nor\nabsent(up{{job="{T.AGENT_JOB}"}})',
            "{{ if $labels.instance }}Lockstep agent on " + WHERE + " is down{{ else }}No Lockstep agent is scraped"
            "{{ end }}",
            "{{ if $labels.instance }}Prometheus cannot scrape the Lockstep agent on " + WHERE + "{{ else }}"
            f'Prometheus has no target in scrape job "{T.AGENT_JOB}" at all{{{{ end }}}}: no other Lockstep '
            "alert can fire for a node whose agent is not scraped. Check the agent's service "
            "(systemctl status lockstep, or the "
            "DaemonSet's pod) and the network path from Prometheus.",
        ),
    ),
)
