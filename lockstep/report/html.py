"""The report as one self-contained HTML file: inline CSS and SVG plots, no script, nothing
fetched from the network (tests/report/test_html_browser.py opens it in headless Chromium)."""

from __future__ import annotations

from html import escape

from lockstep.report.model import Point, Report
from lockstep.report.notes import human
from lockstep.report.text import stamp

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em auto; max-width: 60em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.1em; margin-top: 1.6em; border-bottom: 1px solid #ccc; }
.verdict { font-size: 1.1em; background: #f4f4f8; padding: .8em; border-left: 4px solid #446; }
table { border-collapse: collapse; } td, th { padding: .2em .7em; text-align: left; border-bottom: 1px solid #eee; }
.bad { color: #a00; } svg { background: #fafafa; border: 1px solid #ddd; }
"""


def plot(points: list[Point], title: str, unit: str, width: int = 720, height: int = 160) -> str:
    """An inline SVG line plot of the points (time on x)."""
    if len(points) < 2:
        return f"<p>{escape(title)}: not enough data</p>"
    xs = [p.t for p in points]
    ys = [p.value for p in points]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(0.0, min(ys)), max(ys) or 1.0
    pad = 30

    def sx(x: float) -> float:
        return pad + (x - x0) / ((x1 - x0) or 1) * (width - 2 * pad)

    def sy(y: float) -> float:
        return height - pad - (y - y0) / ((y1 - y0) or 1) * (height - 2 * pad)

    line = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in zip(xs, ys))
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
        f'aria-label="{escape(title)}"><title>{escape(title)}</title>'
        f'<polyline fill="none" stroke="#36c" stroke-width="1.5" points="{line}"/>'
        f'<text x="{pad}" y="16" font-size="12">{escape(title)} ({escape(unit)}), max {y1:.4g}</text>'
        f'<text x="{pad}" y="{height - 8}" font-size="11">{escape(stamp(x0))}</text>'
        f'<text x="{width - pad}" y="{height - 8}" font-size="11" text-anchor="end">{escape(stamp(x1))} UTC</text>'
        "</svg>"
    )


def table(headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def items(lines: list[str]) -> str:
    if not lines:
        return "<p>none</p>"
    return "<ul>" + "".join(f"<li>{escape(line)}</li>" for line in lines) + "</ul>"


def render(report: Report) -> str:
    job = report.job
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>Lockstep report: job {escape(job.job_id)}</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<h1>Lockstep report: job {escape(job.job_id)}"
        + (f" (cluster {escape(job.cluster)})" if job.cluster else "")
        + "</h1>",
        f'<p class="verdict" id="verdict">{escape(report.verdict)}</p>',
        "<h2>Job</h2>",
        table(
            ["state", "from (UTC)", "to (UTC)", "duration", "user", "partition", "ranks", "GPUs"],
            [
                [
                    job.state,
                    stamp(job.start),
                    stamp(job.end),
                    human(job.duration_seconds),
                    job.user,
                    job.partition,
                    str(job.ranks),
                    str(job.gpus),
                ]
            ],
        ),
        f"<p>Nodes: {escape(', '.join(job.hosts or job.nodes) or '-')}</p>",
        "<h2>GPUs</h2>",
    ]
    rows = []
    for g in report.gpus:
        rows.append(
            [
                g.node,
                g.gpu,
                "-" if g.utilization_avg is None else f"{g.utilization_avg:.0%}",
                "-" if g.memory_peak_bytes is None else f"{g.memory_peak_bytes / 2**30:.1f}",
                "-" if g.memory_total_bytes is None else f"{g.memory_total_bytes / 2**30:.1f}",
                "-" if g.power_avg_watts is None else f"{g.power_avg_watts:.0f}",
                ", ".join(f"{r} {human(s)}" for r, s in sorted(g.throttle_seconds.items())),
                ", ".join(f"XID {x} x{n:g}" for x, n in sorted(g.xid_errors.items()))
                + " ".join(f"ECC {t} x{n:g}" for t, n in sorted(g.ecc_errors.items())),
                "idle" if g.idle else "",
            ]
        )
    parts.append(
        table(["node", "GPU", "util", "mem peak GiB", "mem total GiB", "power W", "throttled", "errors", ""], rows)
        if rows
        else "<p>no GPU of the job known (no Slurm GPU attribution)</p>"
    )
    steps = report.steps
    parts.append("<h2>Steps</h2>")
    if steps.source:
        median = "-" if steps.median_step_seconds is None else f"{steps.median_step_seconds:.3g} s"
        parts.append(f"<p>{steps.steps:.0f} steps ({escape(steps.source)} logs), median step time {median}</p>")
        parts.append(plot(steps.timeline, "step time", "s"))
        if any(p.value > 0 for p in steps.tokens_per_second):
            parts.append(plot(steps.tokens_per_second, "throughput", "tokens/s"))
        parts.append(items([f"no step from {stamp(s.start)} for {human(s.seconds)}" for s in steps.stalls]))
    else:
        parts.append("<p>no step series for this job</p>")
    parts.append("<h2>Stragglers</h2>")
    parts.append(
        items(
            [
                f"rank {s.rank} {s.host} {('GPU ' + s.gpu) if s.gpu else ''} ({s.kind}): {s.ratio:.2f} for "
                f"{human(s.seconds)} from {stamp(s.start)}, {s.share_lost:.1%} of the job lost; evidence: "
                + ("; ".join(s.evidence) or "none")
                for s in report.stragglers
            ]
        )
    )
    parts.append("<h2>Checkpoints</h2>")
    parts.append(
        table(
            ["root", "node", "saves", "cadence", "expected", "longest save", "stalls", "work at risk"],
            [
                [
                    r.root,
                    r.node,
                    f"{r.saves:.0f}",
                    human(r.cadence_seconds),
                    human(r.expected_interval_seconds),
                    human(max(r.durations_seconds)) if r.durations_seconds else "-",
                    ", ".join(human(s.seconds) for s in r.stalls),
                    human(r.work_at_risk_seconds),
                ]
                for r in report.checkpoints
            ],
        )
        if report.checkpoints
        else "<p>no checkpoint root for this job</p>"
    )
    parts.append("<h2>Hangs</h2>")
    hang_lines = [f"{h.alert} from {stamp(h.start)}: rank {h.rank or '-'}, GPU {h.gpu or '-'}" for h in report.hangs]
    if report.post_mortem is not None:
        pm = report.post_mortem
        hang_lines.append(f"post-mortem: first to stop rank {pm.rank or '-'} {pm.host} GPU {pm.gpu or '-'} ({pm.how})")
    parts.append(items(hang_lines))
    parts.append("<h2>Alerts during the job</h2>")
    parts.append(items([f"{a.alertname} ({a.severity}) {stamp(a.start)} to {stamp(a.end)}" for a in report.alerts]))
    parts.append("<h2>Fabric and filesystem events</h2>")
    parts.append(items([f"{e.node}: {e.what}" for e in report.events]))
    parts.append("<h2>Notes</h2>")
    parts.append(items(report.notes))
    url = escape(report.grafana_url)
    parts.append(f'<p>Grafana, the Slurm job dashboard: <a id="grafana" href="{url}">{url}</a></p>')
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
