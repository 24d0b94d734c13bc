"""Where the health check's exposition comes from, within one deadline, and its outcome.

The local agent's /metrics first: it has watched the node all along (an XID an hour ago, a mount
that stopped answering), and reading it costs the node nothing.  Where nothing listens there (the
agent is not installed as a service, or is down), one round of the collectors in this process
(`local_round`, the same round as `lockstep once`).  Any other trouble with the agent (it refuses
the credentials, answers an error, is too slow, answers what is not an exposition or not a
Lockstep agent's) is an unknown outcome, said in one line: a check that cannot decide never says
healthy.

Exit status, node-problem-detector's custom plugin protocol: 0 healthy, 1 unhealthy, 2 unknown.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum

from lockstep import thresholds as T
from lockstep.health.verdicts import Exposition, Finding, Judgement, judge
from lockstep.report.transport import CutShort, Deadline, DeadlinePassed, TooLarge, opener, read_bounded


class Status(IntEnum):
    HEALTHY = 0
    UNHEALTHY = 1
    UNKNOWN = 2


@dataclass
class Outcome:
    status: Status
    line: str  # the one line: what node-problem-detector shows, and (unhealthy) the drain reason
    details: list[str] = field(default_factory=list)  # every finding and undecided verdict, a line each
    findings: list[Finding] = field(default_factory=list)

    def printed(self) -> str:
        return f"{self.status.name.lower()}: {self.line}"


class AgentUnreadable(Exception):
    """The agent answered, but not with an exposition the check can use (the message says why)."""


@dataclass(frozen=True)
class AgentAccess:
    url: str
    user: str | None = None
    password: str | None = None


@dataclass(frozen=True)
class RecordAccess:
    """Where the node's record across jobs is: a Prometheus with Lockstep's rules, and the
    node's instance label there."""

    prometheus: str
    instance: str


def node_record(record: RecordAccess, deadline: Deadline) -> tuple[Finding | None, str | None]:
    """(the repeat_offender finding, or None; why the record could not be read, or None)."""
    from lockstep.report.prometheus import Prometheus, ReportError

    selector = f"{T.NODE_JOBS_HURT_RECORD}{{instance={json.dumps(record.instance)}}}"
    try:
        prometheus = Prometheus(record.prometheus, timeout=max(0.1, deadline.left()), deadline=deadline)
        found = prometheus.query(selector, time.time())
    except ReportError as exc:
        return None, f"the node's record in Prometheus: {exc}"
    jobs = max((sample.value for sample in found), default=0.0)
    if jobs >= T.NODE_JOBS_HURT:
        return Finding(
            "repeat_offender", f"hurt {jobs:.0f} jobs in {T.NODE_RECORD_WINDOW} (LockstepNodeHurtsJobs)"
        ), None
    return None, None


def one_line(parts: list[str]) -> str:
    """The first part, with how many more there are, cut to HEALTH_REASON_CHARACTERS."""
    line = parts[0] + (f" (+{len(parts) - 1} more)" if len(parts) > 1 else "")
    # Labels come from the node (a mount point is any path a user mounted): printable only.
    line = "".join(c if c.isprintable() else "?" for c in line)
    limit = T.HEALTH_REASON_CHARACTERS - len("unhealthy: ")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def outcome_of(judgement: Judgement, source: str) -> Outcome:
    details = [f"{f.verdict}: {f.reason}" for f in judgement.findings] + [
        f"undecided: {u}" for u in judgement.undecided
    ]
    if judgement.findings:
        reasons = [f.reason for f in judgement.findings]
        return Outcome(Status.UNHEALTHY, one_line(reasons), details, judgement.findings)
    if judgement.undecided:
        return Outcome(Status.UNKNOWN, one_line(judgement.undecided), details)
    checked = ", ".join(judgement.checked) or "nothing to judge on this node"
    return Outcome(Status.HEALTHY, f"{checked} ({source})", details)


def read_agent(access: AgentAccess, deadline: Deadline) -> bytes | None:
    """The agent's exposition; None when nothing listens at the URL (no agent runs);
    AgentUnreadable for any other failure."""
    request = urllib.request.Request(access.url, headers={"Accept": "text/plain"})
    if access.user is not None:
        token = base64.b64encode(f"{access.user}:{access.password or ''}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    cap = T.HEALTH_MAX_EXPOSITION_MIB << 20
    try:
        with opener(deadline, per_read=deadline.left()).open(request) as response:
            return bytes(read_bounded(response, cap, deadline))
    except urllib.error.HTTPError as exc:
        hint = " (give --agent-user and --agent-password-file)" if exc.code == 401 else ""
        raise AgentUnreadable(f"answered HTTP {exc.code} {exc.reason or ''}".rstrip() + hint) from None
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, ConnectionRefusedError):
            return None
        raise AgentUnreadable(f"cannot be reached: {exc.reason}") from None
    except ConnectionRefusedError:
        return None
    except (DeadlinePassed, TimeoutError):
        raise AgentUnreadable(f"did not answer within {deadline.seconds:g}s") from None
    except TooLarge:
        raise AgentUnreadable(f"answered more than {T.HEALTH_MAX_EXPOSITION_MIB} MiB") from None
    except CutShort as exc:
        raise AgentUnreadable(f"answered a body cut short ({exc})") from None
    except (OSError, ValueError) as exc:  # reset, a broken answer, a URL urllib cannot use
        raise AgentUnreadable(f"failed: {exc}") from None


def in_time(work: Callable[[], bytes], deadline: Deadline) -> bytes | None:
    """work() in a thread of its own, None if it has not finished by the deadline (a collector
    blocked in the kernel cannot be stopped: the thread is left to the process's exit)."""
    result: list[bytes] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            result.append(work())
        except BaseException as exc:  # reported as the outcome, never a traceback
            failure.append(exc)

    thread = threading.Thread(target=run, name="health-check-round", daemon=True)
    thread.start()
    thread.join(max(0.0, deadline.left()))
    if failure:
        raise failure[0]
    return result[0] if result else None


def check(
    access: AgentAccess,
    local_round: Callable[[], bytes] | None,
    seconds: float,
    record: RecordAccess | None = None,
) -> Outcome:
    """The node's health, from the agent at access.url, or one round of the collectors
    (local_round) where none listens there, and with `record` the node's record in Prometheus;
    within `seconds` in all."""
    deadline = Deadline(seconds)
    agent_deadline = Deadline(min(seconds, T.HEALTH_AGENT_SECONDS))
    try:
        body = read_agent(access, agent_deadline)
    except AgentUnreadable as exc:
        return Outcome(Status.UNKNOWN, one_line([f"the agent at {access.url} {exc}"]))
    source = f"agent {access.url}"
    if body is None:
        if local_round is None:
            return Outcome(Status.UNKNOWN, one_line([f"no agent answers at {access.url}"]))
        try:
            body = in_time(local_round, deadline)
        except Exception as exc:
            return Outcome(Status.UNKNOWN, one_line([f"no agent, and a round of the collectors failed: {exc}"]))
        if body is None:
            return Outcome(
                Status.UNKNOWN, one_line([f"no agent, and a round of the collectors took over {seconds:g}s"])
            )
        source = "one round of the collectors: no agent answers"
    try:
        exposition = Exposition(body.decode("utf-8", errors="replace"))
    except ValueError as exc:
        return Outcome(Status.UNKNOWN, one_line([f"{source}: not an exposition ({exc})"]))
    if not exposition.get("lockstep_collector_state"):
        return Outcome(Status.UNKNOWN, one_line([f"{source}: not a Lockstep agent (no lockstep_collector_state)"]))
    judgement = judge(exposition)
    if record is not None:
        finding, problem = node_record(record, deadline)
        if finding is not None:
            judgement.findings.append(finding)
        if problem is not None:
            judgement.undecided.append(problem)
    return outcome_of(judgement, source)
