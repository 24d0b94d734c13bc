"""Where the health check reads the node from, and what it says when it cannot: the agent's
/metrics served by an in-process HTTP server that answers as told (an exposition, a 401, a drip,
an answer too large), nothing listening (one round of the collectors instead), a round that
hangs or fails.  Every answer is one line, within the deadline."""

from __future__ import annotations

import base64
import threading
import time
from http.server import BaseHTTPRequestHandler

import pytest

from lockstep.health.check import AgentAccess, RecordAccess, Status, check
from tests.support import free_port
from tests.support.agent_http import agent, answer, exposition
from tests.support.fake_prometheus import FakePrometheus, Rule, serving, vector

LOST = exposition("gpu-lost").encode()


def cut(line: str) -> str:
    return line if len(line) <= 69 else line[:66] + "..."


def test_the_agents_exposition_is_judged() -> None:
    with agent(answer(200, LOST)) as url:
        outcome = check(AgentAccess(url), None, 10)
    assert (outcome.status, outcome.printed()) == (
        Status.UNHEALTHY,
        "unhealthy: GPU 5 lost (fell off the bus) (+1 more)",
    )


def test_an_agent_asking_for_credentials_is_given_them_or_the_answer_is_unknown() -> None:
    expected = "Basic " + base64.b64encode(b"health:s3cret").decode()

    def respond(handler: BaseHTTPRequestHandler) -> None:
        if handler.headers.get("Authorization") == expected:
            answer(200, LOST)(handler)
        else:
            answer(401, b"Unauthorized\n", {"WWW-Authenticate": 'Basic realm="lockstep"'})(handler)

    with agent(respond) as url:
        refused = check(AgentAccess(url), None, 10)
        given = check(AgentAccess(url, "health", "s3cret"), None, 10)
    # Cut to fit the longest status word ("unhealthy: ") in 80 characters.
    assert refused.printed() == "unknown: " + cut(
        f"the agent at {url} answered HTTP 401 Unauthorized (give --agent-user and --agent-password-file)"
    )
    assert refused.status == Status.UNKNOWN
    assert given.status == Status.UNHEALTHY


def test_an_agent_that_drips_is_unknown_at_the_deadline() -> None:
    def respond(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Length", "1000000")
        handler.end_headers()
        for _ in range(60):
            handler.wfile.write(b"#")
            handler.wfile.flush()
            time.sleep(0.5)

    with agent(respond) as url:
        started = time.monotonic()
        outcome = check(AgentAccess(url), None, 2)
        took = time.monotonic() - started
    assert outcome.printed() == f"unknown: the agent at {url} did not answer within 2s"
    assert took < 10  # the deadline (2 s) and the reads in flight, never the drip's 30 s


def test_an_answer_too_large_cut_short_not_an_exposition_or_not_locksteps_is_unknown() -> None:
    with agent(answer(200, b"", {"Content-Length": str(64 << 20)})) as url:
        assert check(AgentAccess(url), None, 10).line == f"the agent at {url} answered more than 32 MiB"
    with agent(answer(200, b"lockstep_", {"Content-Length": "1000"})) as url:  # and the server closes
        assert check(AgentAccess(url), None, 10).printed() == "unknown: " + cut(
            f"the agent at {url} answered a body cut short (after 9 of its 1000 bytes)"
        )
    with agent(answer(200, b"\x00\x01 not an exposition\n")) as url:
        assert check(AgentAccess(url), None, 10).printed() == "unknown: " + cut(
            f"agent {url}: not an exposition (line 1: invalid metric name: not)"
        )
    with agent(answer(200, b"node_load1 0.5\n")) as url:  # node_exporter, or anything else on the port
        assert check(AgentAccess(url), None, 10).printed() == "unknown: " + cut(
            f"agent {url}: not a Lockstep agent (no lockstep_collector_state)"
        )


def closed_port_url() -> str:
    return f"http://127.0.0.1:{free_port()}/metrics"


def test_with_no_agent_one_round_of_the_collectors_is_judged() -> None:
    rounds = []

    def local_round() -> bytes:
        rounds.append(1)
        return LOST

    outcome = check(AgentAccess(closed_port_url()), local_round, 10)
    assert (outcome.status, outcome.line, len(rounds)) == (
        Status.UNHEALTHY,
        "GPU 5 lost (fell off the bus) (+1 more)",
        1,
    )
    healthy = exposition("healthy").encode()
    assert check(AgentAccess(closed_port_url()), lambda: healthy, 10).line == (
        "8 GPUs, 10 IB ports, 7 mounts (one round of the collectors: no agent answers)"
    )


def test_a_round_that_hangs_or_fails_is_unknown_and_no_agent_without_a_round_too() -> None:
    release = threading.Event()

    def hangs() -> bytes:
        release.wait(30)
        return LOST

    try:
        outcome = check(AgentAccess(closed_port_url()), hangs, 1)
    finally:
        release.set()
    assert outcome.printed() == "unknown: no agent, and a round of the collectors took over 1s"

    def fails() -> bytes:
        raise RuntimeError("cannot start a thread")

    assert check(AgentAccess(closed_port_url()), fails, 5).printed() == (
        "unknown: no agent, and a round of the collectors failed: cannot start a thread"
    )
    url = closed_port_url()
    assert check(AgentAccess(url), None, 5).printed() == f"unknown: no agent answers at {url}"


@pytest.mark.parametrize("status", [500, 503])
def test_an_agent_answering_an_error_is_unknown(status: int) -> None:
    with agent(answer(status, b"oops\n")) as url:
        outcome = check(AgentAccess(url), None, 10)
    assert outcome.status == Status.UNKNOWN
    assert outcome.line.startswith(f"the agent at {url} answered HTTP {status}")


HEALTHY = exposition("healthy").encode()


def test_a_node_whose_record_names_it_in_enough_jobs_is_unhealthy() -> None:
    rule = Rule(r"^instance:lockstep_jobs_hurt:count7d\{", vector(({"instance": "n07:12400"}, 4.0)))
    with serving(FakePrometheus([rule])) as fake, agent(answer(200, HEALTHY)) as url:
        outcome = check(AgentAccess(url), None, 10, RecordAccess(fake.url, "n07:12400"))
    assert (outcome.status, outcome.line) == (Status.UNHEALTHY, "hurt 4 jobs in 7d (LockstepNodeHurtsJobs)")
    assert fake.seen == ['instance:lockstep_jobs_hurt:count7d{instance="n07:12400"}']


def test_a_node_below_the_record_threshold_or_with_none_is_healthy() -> None:
    below = Rule(r"^instance:lockstep_jobs_hurt:count7d\{", vector(({"instance": "n13:12400"}, 2.0)))
    with serving(FakePrometheus([below])) as fake, agent(answer(200, HEALTHY)) as url:
        assert check(AgentAccess(url), None, 10, RecordAccess(fake.url, "n13:12400")).status == Status.HEALTHY
    with serving(FakePrometheus([])) as fake, agent(answer(200, HEALTHY)) as url:  # never named: no series
        assert check(AgentAccess(url), None, 10, RecordAccess(fake.url, "n01:12400")).status == Status.HEALTHY


def test_a_record_that_cannot_be_read_is_undecided() -> None:
    nobody = f"http://127.0.0.1:{free_port()}"
    with agent(answer(200, HEALTHY)) as url:
        outcome = check(AgentAccess(url), None, 10, RecordAccess(nobody, "n01:12400"))
    assert outcome.status == Status.UNKNOWN
    assert outcome.line.startswith("the node's record in Prometheus: ")
