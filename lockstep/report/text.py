"""The report as text for a terminal: every line at most WIDTH columns, times in UTC.

What Prometheus' labels hold (a job's name, which its user chooses; a node, an alert, a label)
reaches an administrator's terminal: every control character in them a terminal acts on (C0
but none, DEL, C1: `ESC ] 0 ; ... BEL` retitles the window, `ESC [ 2 J` clears it) is written
visibly, `\x1b`, before the text is laid out (issue 46).  Only the renderer's own line breaks
are line breaks.
"""

from __future__ import annotations

import dataclasses
import re
import textwrap
import time
from typing import Any, TypeVar

from lockstep.report.model import Point, Report
from lockstep.report.notes import human

WIDTH = 100
BARS = "▁▂▃▄▅▆▇█"


# C0, DEL and C1; and the lone surrogates a JSON string may escape, which no output could encode.
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
V = TypeVar("V")


def visible(text: str) -> str:
    """The text with each control character as its escape: ESC as `\x1b`, a newline as `\x0a`."""
    return CONTROL.sub(lambda m: f"\\x{ord(m[0]):02x}" if ord(m[0]) < 0x100 else f"\\u{ord(m[0]):04x}", text)


def made_visible(value: V) -> V:
    """A copy of a report (or any part of it) with every string made visible."""
    out: Any
    if isinstance(value, str):
        out = visible(value)
    elif isinstance(value, list):
        out = [made_visible(v) for v in value]
    elif isinstance(value, dict):
        out = {made_visible(k): made_visible(v) for k, v in value.items()}
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = dataclasses.replace(
            value, **{f.name: made_visible(getattr(value, f.name)) for f in dataclasses.fields(value)}
        )
    else:
        out = value
    return out  # type: ignore[no-any-return]


def stamp(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))


def sparkline(points: list[Point], width: int = 60) -> str:
    """The values as block characters, averaged into at most `width` columns."""
    values = [p.value for p in points]
    if not values:
        return ""
    if len(values) > width:
        size = len(values) / width
        values = [
            sum(chunk) / len(chunk)
            for chunk in (values[int(i * size) : max(int((i + 1) * size), int(i * size) + 1)] for i in range(width))
        ]
    low, high = min(values), max(values)
    if high - low <= 1e-9 * max(abs(high), 1.0):
        return BARS[3] * len(values)
    return "".join(BARS[min(len(BARS) - 1, int((v - low) / (high - low) * len(BARS)))] for v in values)


def wrap(text: str, indent: str = "  ", first: str | None = None) -> list[str]:
    return textwrap.wrap(
        text, WIDTH, initial_indent=indent if first is None else first, subsequent_indent=indent + "  "
    ) or [indent]


ALERT_LABELS = ("rank", "gpu", "host", "device", "port", "mountpoint", "interface", "root", "comm")


def placed(rank: str, host: str, gpu: str) -> str:
    return ", ".join(x for x in (f"rank {rank}" if rank else "", host, f"GPU {gpu}" if gpu else "") if x)


def gib(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**30:.1f}"


def render(report: Report) -> str:
    report = made_visible(report)
    job = report.job
    out: list[str] = []
    title = f"Lockstep report: job {job.job_id}" + (f" (cluster {job.cluster})" if job.cluster else "")
    out.append(title)
    out.append("=" * min(len(title), WIDTH))
    out += wrap(report.verdict, indent="", first="")
    out.append("")
    out.append("Job")
    facts = [
        ("state", job.state),
        ("from", f"{stamp(job.start)} to {stamp(job.end)} UTC ({human(job.duration_seconds)})"),
        ("name", " ".join(x for x in (job.job_name, f"user {job.user}" if job.user else "") if x) or "-"),
        ("where", f"partition {job.partition or '-'}, account {job.account or '-'}"),
        ("nodes", ", ".join(job.hosts or job.nodes) or "-"),
        ("size", f"{job.ranks} ranks, {job.gpus} GPUs"),
    ]
    for key, value in facts:
        out += wrap(value, first=f"  {key:<7}", indent=" " * 9)
    if report.gpus:
        out.append("")
        out.append("GPUs")
        out.append(f"  {'node':<12} {'gpu':>3} {'util':>5} {'mem peak/total GiB':>18} {'power avg/max W':>15}  notes")
        for g in report.gpus:
            util = "-" if g.utilization_avg is None else f"{g.utilization_avg:.0%}"
            mem = f"{gib(g.memory_peak_bytes)}/{gib(g.memory_total_bytes)}"
            power = "-" if g.power_avg_watts is None else f"{g.power_avg_watts:.0f}/{g.power_max_watts or 0:.0f}"
            extra = []
            if g.idle:
                extra.append("IDLE")
            throttled = {r: s for r, s in g.throttle_seconds.items() if r not in ("sw_power_cap", "sync_boost")}
            extra += [f"{r} {human(s)}" for r, s in sorted(throttled.items())]
            extra += [f"XID {x} x{n:g}" for x, n in sorted(g.xid_errors.items())]
            extra += [f"ECC {t} x{n:g}" for t, n in sorted(g.ecc_errors.items())]
            line = f"  {g.node[:12]:<12} {g.gpu:>3} {util:>5} {mem:>18} {power:>15}  {', '.join(extra)}"
            out += wrap(line, first="", indent=" " * 62) if len(line) > WIDTH else [line]
    out.append("")
    out.append("Steps")
    steps = report.steps
    if not steps.source:
        out.append("  no step series for this job (no training or framework logs)")
    else:
        median = "-" if steps.median_step_seconds is None else f"{steps.median_step_seconds:.3g} s"
        out.append(f"  {steps.steps:.0f} steps ({steps.source} logs), median step time {median}")
        if steps.timeline:
            low, high = min(p.value for p in steps.timeline), max(p.value for p in steps.timeline)
            out.append(f"  step time  {sparkline(steps.timeline)}  {low:.3g}-{high:.3g} s")
        tokens = [p for p in steps.tokens_per_second if p.value > 0]
        if tokens:
            out.append(f"  tokens/s   {sparkline(tokens)}  {tokens[0].value:.4g} -> {tokens[-1].value:.4g}")
        for stall in steps.stalls:
            out.append(f"  stall: no step from {stamp(stall.start)} for {human(stall.seconds)}")
    out.append("")
    out.append("Stragglers")
    if not report.stragglers:
        out.append("  none")
    for s in report.stragglers:
        who = f"rank {s.rank}" + (f" on {s.host}" if s.host else "") + (f" GPU {s.gpu}" if s.gpu else "")
        kind = "collective straggler" if s.kind == "nccl" else "straggler"
        measure = f"peers wait {s.ratio:.0%}" if s.kind == "nccl" else f"{s.ratio:.2f}x median work"
        out += wrap(
            f"{who}: {kind}, {measure}, for {human(s.seconds)} from {stamp(s.start)}; "
            f"about {s.share_lost:.1%} of the job lost" + (f"; communicator {s.comm}" if s.comm else ""),
            first="  - ",
            indent="    ",
        )
        for item in s.evidence or ["no suspect on its node"]:
            out += wrap(item, first="      evidence: ", indent="      ")
    out.append("")
    out.append("Checkpoints")
    if not report.checkpoints:
        out.append("  no checkpoint root for this job")
    for root in report.checkpoints:
        out += wrap(f"{root.root} on {root.node}", first="  ", indent="  ")
        durations = root.durations_seconds
        longest = human(max(durations)) if durations else "-"
        out.append(
            f"    {root.saves:.0f} saves, every {human(root.cadence_seconds)} "
            f"(expected {human(root.expected_interval_seconds)}), longest save {longest}"
        )
        out.append(f"    last completed {stamp(root.last_success)}, work at risk {human(root.work_at_risk_seconds)}")
        for stall in root.stalls:
            out.append(f"    stall: a save in progress {human(stall.seconds)} (from {stamp(stall.start)})")
    out.append("")
    out.append("Hangs")
    if not report.hangs and report.post_mortem is None:
        out.append("  none")
    for h in report.hangs:
        who = placed(h.rank, h.host, h.gpu)
        out += wrap(f"{h.alert} from {stamp(h.start)}" + (f": {who}" if who else ""), first="  - ", indent="    ")
    if report.post_mortem is not None:
        pm = report.post_mortem
        who = placed(pm.rank, pm.host, pm.gpu)
        out += wrap(f"post-mortem: first to stop: {who or 'no single rank'} ({pm.how})", first="  ", indent="  ")
    out.append("")
    out.append("Alerts during the job")
    if not report.alerts:
        out.append("  none")
    for a in report.alerts:
        where = ", ".join(f"{k}={v}" for k, v in sorted(a.labels.items()) if k in ALERT_LABELS)
        out += wrap(
            f"{a.alertname} ({a.severity or '-'}) {stamp(a.start)} to {stamp(a.end)}" + (f": {where}" if where else ""),
            first="  - ",
            indent="    ",
        )
    out.append("")
    out.append("Fabric and filesystem events on the job's nodes")
    if not report.events:
        out.append("  none")
    for e in report.events:
        out += wrap(f"{e.node}: {e.what}" + (f" ({e.count:g})" if e.count else ""), first="  - ", indent="    ")
    out.append("")
    out.append("Notes")
    for note in report.notes:
        out += wrap(note, first="  - ", indent="    ")
    out.append("")
    out += wrap(f"Grafana: {report.grafana_url}", first="", indent="  ")
    return "\n".join(line.rstrip() for line in out) + "\n"
