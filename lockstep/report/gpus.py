"""The GPUs section: each GPU the job held, its use, power, throttling, ECC and XID errors over
the job."""

from __future__ import annotations

from collections.abc import Callable

from lockstep import thresholds as T
from lockstep.node_faults import events
from lockstep.report.model import Gpu
from lockstep.report.prometheus import Sample
from lockstep.report.scope import (
    Scope,
    host_of_instance,
    increase_over_job,
    natural,
    quote,
)

# Clock event reasons that cost the job no work: the GPU had none (idle), a display's clocks.
NOT_THROTTLING_REASONS = ("idle", "display_clock_setting")


def gpu_section(scope: Scope) -> list[Gpu]:
    if not scope.instances:
        return []
    hosts = host_of_instance(scope)
    gpus: dict[tuple[str, str], Gpu] = {}
    for labels in scope.series_of("lockstep_slurm_job_gpu_info"):
        key = (labels.get("instance", ""), labels.get("uuid", ""))
        gpus[key] = Gpu(node=hosts.get(key[0], key[0]), gpu=labels.get("gpu", ""), uuid=key[1])
    if not gpus:
        return []
    whole = scope.whole

    def each(expr: str, put: Callable[[Gpu, Sample], object]) -> None:
        for sample in scope.at_end(expr):
            gpu = gpus.get((sample.labels.get("instance", ""), sample.labels.get("uuid", "")))
            if gpu is not None:
                put(gpu, sample)

    def setter(name: str) -> Callable[[Gpu, Sample], None]:
        return lambda g, s: setattr(g, name, s.value)

    each(f"avg_over_time({scope.nodes('lockstep_gpu_utilization_ratio')}[{whole}])", setter("utilization_avg"))
    each(f"max_over_time({scope.nodes('lockstep_gpu_memory_used_bytes')}[{whole}])", setter("memory_peak_bytes"))
    each(f"max_over_time({scope.nodes('lockstep_gpu_memory_total_bytes')}[{whole}])", setter("memory_total_bytes"))

    def increased(name: str, label: str, into: Callable[[Gpu], dict[str, float]], digits: int | None) -> None:
        for sample in increase_over_job(scope, name):
            gpu = gpus.get((sample.labels.get("instance", ""), sample.labels.get("uuid", "")))
            if gpu is not None and sample.value > 0:
                into(gpu)[sample.labels.get(label, "?")] = round(sample.value, digits)

    each(f"avg_over_time({scope.nodes('lockstep_gpu_power_watts')}[{whole}])", setter("power_avg_watts"))
    each(f"max_over_time({scope.nodes('lockstep_gpu_power_watts')}[{whole}])", setter("power_max_watts"))
    increased("lockstep_gpu_clock_event_seconds_total", "reason", lambda g: g.throttle_seconds, 1)
    increased("lockstep_gpu_ecc_errors_total", "type", lambda g: g.ecc_errors, None)
    # The agent's own XID count is born at a GPU's first XID and starts again with the agent (a
    # restart inside the job is a reset the edges would not see); its series exist only on GPUs
    # that had one, so reading them over the job reads few samples.
    each(
        f"{events(scope.nodes('lockstep_gpu_xid_errors_total'), whole)} > 0",
        lambda g, s: g.xid_errors.__setitem__(s.labels.get("xid", "?"), round(s.value)),
    )
    # Reasons without a time counter (NVML has none for hw_slowdown, and older drivers none at
    # all): the share of samples active, read only for the reasons that some GPU of the job does
    # not count the time of, and that cost work (4 of the 11 an H100 reports: reading all 11
    # GPU by GPU over a day's samples was the report's slowest read).
    unread = sorted(reasons_timed_everywhere(scope, set(gpus)) | set(NOT_THROTTLING_REASONS))
    untimed = f"reason!~{quote('|'.join(unread))}"
    each(
        f"avg_over_time({scope.nodes('lockstep_gpu_clock_event_active', untimed)}[{whole}]) > 0",
        lambda g, s: g.throttle_seconds.setdefault(
            s.labels.get("reason", "?"), round(s.value * scope.span * scope.scale, 1)
        ),
    )
    out = sorted(gpus.values(), key=lambda g: (natural(g.node), natural(g.gpu)))
    for gpu in out:
        for name in ("utilization_avg", "power_avg_watts", "power_max_watts"):
            value = getattr(gpu, name)
            if value is not None:
                setattr(gpu, name, round(value, 3))
        gpu.idle = gpu.utilization_avg is not None and gpu.utilization_avg < T.GPU_IDLE_ACTIVITY_RATIO
    return out


def reasons_timed_everywhere(scope: Scope, gpus: set[tuple[str, str]]) -> set[str]:
    """The clock event reasons whose time every one of the job's GPUs (instance, uuid) counts,
    from the series API (no sample read)."""
    counted: dict[tuple[str, str], set[str]] = {gpu: set() for gpu in gpus}
    for labels in scope.exported_on_nodes("lockstep_gpu_clock_event_seconds_total"):
        gpu = (labels.get("instance", ""), labels.get("uuid", ""))
        if gpu in counted:
            counted[gpu].add(labels.get("reason", ""))
    return set.intersection(*counted.values()) if counted else set()
