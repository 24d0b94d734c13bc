"""`lockstep report JOB_ID` and `lockstep report --node NAME`: their flags, and the command (read
the stored report, or make one; a node's story is made each time, lockstep/report/node.py).

Exit status: 0 a report was written; 1 none could be made (Prometheus unreachable, job unknown,
a bad URL, a store or output file that cannot be read or written), said in one line; 2 bad usage.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from lockstep.report import store
from lockstep.report.model import ReportError
from lockstep.thresholds import GRAFANA_URL, NODE_RECORD_WINDOW, REPORT_SECONDS
from lockstep.thresholds import REPORT_MAX_ANSWER_MIB as MAX_ANSWER_MIB

if TYPE_CHECKING:
    from lockstep.report.model import Report

# The agent's CLI imports this module for the flags; what makes a report is imported when one is
# made (rendering, building, the HTTP client): a running agent never loads it (issue 47).

PROMETHEUS_ENV = "LOCKSTEP_PROMETHEUS_URL"
DEFAULT_PROMETHEUS = "http://localhost:9090"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "job_id", metavar="JOB_ID", nargs="?", help="Slurm job id, or the job_id of the training/NCCL series"
    )
    parser.add_argument(
        "--node",
        metavar="NAME",
        help="a node's story instead of a job's: the jobs it hurt and its own faults (its Slurm node name, "
        "host name or agent instance)",
    )
    parser.add_argument(
        "--since",
        type=_window,
        default=NODE_RECORD_WINDOW,
        metavar="DURATION",
        help=f"with --node: how far back (7d, 36h, 90m; default {NODE_RECORD_WINDOW}, the node record's window)",
    )
    parser.add_argument(
        "--prometheus",
        metavar="URL",
        help="Prometheus (or Thanos, Mimir, VictoriaMetrics) query URL "
        f"(default ${PROMETHEUS_ENV} or {DEFAULT_PROMETHEUS})",
    )
    parser.add_argument("--cluster", metavar="C", help="the cluster label, when one Prometheus sees several")
    parser.add_argument("--format", choices=("text", "json", "html"), default="text")
    parser.add_argument("--output", metavar="FILE", type=Path, help="write the report here instead of stdout")
    parser.add_argument("--refresh", action="store_true", help="recompute from Prometheus even if a report is stored")
    parser.add_argument(
        "--store",
        metavar="DIR",
        help=f"where finished jobs' reports are kept (default ${store.STORE_ENV} or {store.DEFAULT_STORE})",
    )
    parser.add_argument(
        "--save",
        action="store_true",
        help="the job has ended: compute its report and store its JSON (the Slurm epilog's command)",
    )
    parser.add_argument("--grafana", metavar="URL", default=GRAFANA_URL, help="Grafana base URL for the link")
    parser.add_argument(
        "--timeout",
        type=positive,
        default=REPORT_SECONDS,
        metavar="SECONDS",
        help=f"the whole report's deadline: beyond it, it fails (default {REPORT_SECONDS:g})",
    )
    parser.add_argument(
        "--max-answer",
        dest="max_answer",
        type=positive,
        default=MAX_ANSWER_MIB,
        metavar="MIB",
        help=f"the largest answer read from Prometheus, in MiB (default {MAX_ANSWER_MIB})",
    )
    parser.add_argument(
        "--at", type=float, metavar="UNIX_TIME", help="the report as Prometheus saw the job at this time (default now)"
    )
    # Test-only: the simulated node's clock runs this many times as fast as Prometheus' (demo --speed).
    parser.add_argument("--time-scale", dest="time_scale", type=float, default=1.0, help=argparse.SUPPRESS)


def positive(text: str) -> float:
    """An argparse type: a finite number above 0 (a deadline, a size); `health-check` uses it too."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number above 0")
    return value


def _window(text: str) -> str:
    """An argparse type: a duration as Prometheus writes one (checked here, kept as written)."""
    from lockstep.report.node import since_seconds

    try:
        since_seconds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text.strip()


def render(report: Report, fmt: str) -> str:
    from lockstep.report import html, text
    from lockstep.report.model import to_json

    if fmt == "json":
        return to_json(report)
    if fmt == "html":
        return html.render(report)
    return text.render(report)


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except ReportError as exc:
        from lockstep.report import text

        # One line, whatever it quotes (a job id, a cluster or a server's error): no control
        # character reaches the terminal as one.
        print(f"lockstep: report: {text.visible(str(exc))}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    if (args.job_id is None) == (args.node is None):
        print("lockstep: report: give a JOB_ID or --node NAME (one of them)", file=sys.stderr)
        return 2
    if args.node is not None:
        return _node_report(args)
    from lockstep.report.build import build_report
    from lockstep.report.prometheus import Prometheus
    from lockstep.report.transport import Deadline

    where = store.store_dir(args.store)
    report = None
    # The job has ended when the epilog says so (--save) or has stored its report: its report then
    # ends at its last sample, however recent (the epilog runs seconds after the job's end).
    ended = args.save
    if not args.save:
        try:
            kept = store.load(where, args.job_id, args.cluster)
        except ValueError as exc:
            if not args.refresh:
                raise ReportError(f"stored report unreadable: {exc}") from None
            kept = None
        except ReportError:
            if not args.refresh:
                raise
            kept = None
        ended = kept is not None
        if not args.refresh:
            report = kept
    if report is None:
        url = args.prometheus or os.environ.get(PROMETHEUS_ENV) or DEFAULT_PROMETHEUS
        # The deadline runs from here: the whole report, every query in every thread, within it.
        prometheus = Prometheus(url, deadline=Deadline(args.timeout), max_answer_bytes=int(args.max_answer * 2**20))
        if not args.time_scale > 0:
            raise ReportError("--time-scale must be above 0")
        report = build_report(
            prometheus,
            args.job_id,
            args.cluster,
            now=args.at,
            time_scale=args.time_scale,
            grafana_url=args.grafana,
            ended=ended,
        )
    if args.save:
        try:
            path = store.save(where, report)
        except OSError as exc:
            raise ReportError(f"cannot store the report in {where}: {exc.strerror or exc}") from None
        print(f"lockstep: report of job {args.job_id} stored in {path}", file=sys.stderr)
        if args.output is None:
            return 0
    return _write(args, render(report, args.format))


def _node_report(args: argparse.Namespace) -> int:
    import time

    from lockstep.report import node
    from lockstep.report.prometheus import Prometheus
    from lockstep.report.transport import Deadline

    if args.save or args.refresh:
        print("lockstep: report: --save and --refresh are for a job's report, not --node", file=sys.stderr)
        return 2
    url = args.prometheus or os.environ.get(PROMETHEUS_ENV) or DEFAULT_PROMETHEUS
    prometheus = Prometheus(url, deadline=Deadline(args.timeout), max_answer_bytes=int(args.max_answer * 2**20))
    report = node.build_node_report(
        prometheus,
        args.node,
        args.cluster,
        now=time.time() if args.at is None else args.at,
        since=node.since_seconds(args.since),
        grafana_url=args.grafana,
    )
    return _write(args, node.render(report, args.format))


def _write(args: argparse.Namespace, body: str) -> int:
    if args.output is None:
        sys.stdout.write(body)
        sys.stdout.flush()
        return 0
    try:
        args.output.write_text(body)
    except OSError as exc:
        raise ReportError(f"cannot write {args.output}: {exc.strerror or exc}") from None
    return 0
