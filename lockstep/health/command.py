"""`lockstep health-check`: its flags, and the command.

Prints one line on stdout (`healthy: ...`, `unhealthy: <reason>`, `unknown: <why>`), then every
finding on stderr, a line each; exits 0 healthy, 1 unhealthy, 2 unknown (node-problem-detector's
custom plugin protocol; Slurm ignores the status).  With --drain, an unhealthy node is drained in
Slurm (drain.py), and what was done is said on stderr.
"""

from __future__ import annotations

import argparse
import socket
import sys
import urllib.parse
from collections.abc import Callable, Sequence
from pathlib import Path

from lockstep import thresholds as T
from lockstep.report.command import positive

# The agent's CLI imports this module for the flags; the check itself (HTTP, the parser, the
# verdicts) is imported when one runs: a running agent never loads it.


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--agent",
        metavar="URL",
        help="the local agent's /metrics (default: the address the configuration serves on, on this host)",
    )
    parser.add_argument("--agent-user", metavar="USER", help="basic-auth user, where the agent asks for one")
    parser.add_argument(
        "--agent-password-file", metavar="FILE", type=Path, help="the file holding that user's password"
    )
    parser.add_argument(
        "--timeout",
        type=positive,
        default=T.HEALTH_CHECK_SECONDS,
        metavar="SECONDS",
        help=f"the whole check's deadline: past it, the answer is unknown (default {T.HEALTH_CHECK_SECONDS:g})",
    )
    parser.add_argument(
        "--drain",
        action="store_true",
        help='Slurm: drain this node when unhealthy (Reason="lockstep: ..."); never a node someone else '
        "drained, never undrained",
    )
    parser.add_argument(
        "--node", metavar="NAME", help="Slurm's name for this node (default $SLURMD_NODENAME or the short host name)"
    )
    parser.add_argument(
        "--prometheus",
        metavar="URL",
        help="a Prometheus with Lockstep's rules: the node's record across jobs is judged too (repeat_offender)",
    )
    parser.add_argument(
        "--instance",
        metavar="LABEL",
        help="this node's instance label in that Prometheus (default: the short host name and the agent's port)",
    )


def default_instance(agent_url: str) -> str:
    """The instance label Prometheus gives this node's agent where it scrapes it by host name:
    the short host name and the agent's port."""
    port = urllib.parse.urlsplit(agent_url).port or 12400
    return f"{socket.gethostname().split('.')[0]}:{port}"


def unknown(problems: Sequence[str]) -> int:
    """The configuration could not be loaded: unknown, in the one line the protocol reads."""
    print(f"unknown: {problems[0] if problems else 'configuration'}")
    for problem in problems[1:]:
        print(f"lockstep: {problem}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace, default_url: str, local_round: Callable[[], bytes] | None) -> int:
    from lockstep.health.check import AgentAccess, Outcome, RecordAccess, Status, check, one_line
    from lockstep.health.drain import DrainError, drain, node_name
    from lockstep.report.transport import Deadline

    deadline = Deadline(args.timeout)
    password = None
    if args.agent_password_file is not None:
        try:
            password = args.agent_password_file.read_text().rstrip("\n")
        except OSError as exc:
            print(
                Outcome(Status.UNKNOWN, one_line([f"--agent-password-file: {exc.strerror}: {exc.filename}"])).printed()
            )
            return Status.UNKNOWN
    access = AgentAccess(args.agent or default_url, args.agent_user, password)
    record = None
    if args.prometheus:
        record = RecordAccess(args.prometheus, args.instance or default_instance(access.url))
    outcome = check(access, local_round, args.timeout, record)
    print(outcome.printed(), flush=True)
    for line in outcome.details:
        print(f"lockstep: {line}", file=sys.stderr)
    if args.drain and outcome.status == Status.UNHEALTHY:
        try:
            print(f"lockstep: {drain(node_name(args.node), outcome.line, deadline)}", file=sys.stderr)
        except DrainError as exc:
            print(f"lockstep: --drain: {exc}", file=sys.stderr)
    return outcome.status
