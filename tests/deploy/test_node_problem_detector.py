"""deploy/node-problem-detector/lockstep-health-check.json, node-problem-detector's custom plugin
configuration (its protocol: ../shared/reference/node-health.md): the command it runs is
`lockstep health-check` with flags the CLI accepts, asked for the agent the DaemonSet runs,
ending within the plugin's timeout, its one line within what the plugin reads."""

from __future__ import annotations

import json
from typing import Any

import yaml

from lockstep import thresholds as T
from lockstep.agent.cli import build_parser
from lockstep.agent.registry import discover
from tests.support import REPO

PLUGIN = REPO / "deploy" / "node-problem-detector" / "lockstep-health-check.json"


def test_the_plugin_runs_the_health_check_within_its_timeout() -> None:
    config: dict[str, Any] = json.loads(PLUGIN.read_text())
    assert config["plugin"] == "custom"
    (rule,) = config["rules"]
    assert (rule["type"], rule["path"]) == ("permanent", "/usr/local/bin/lockstep")
    # The condition the rule sets is one the plugin declares (its healthy state).
    assert [c["type"] for c in config["conditions"]] == [rule["condition"]]
    args = build_parser(discover()).parse_args(rule["args"])
    assert args.command == "health-check"
    # The check gives up (unknown) before node-problem-detector kills it (unknown too, but unsaid).
    assert args.timeout < T.seconds(rule["timeout"]) <= T.seconds(config["pluginConfig"]["timeout"])
    # Its one line fits what node-problem-detector reads of stdout.
    assert config["pluginConfig"]["max_output_length"] >= T.HEALTH_REASON_CHARACTERS


def test_it_asks_the_agent_where_the_daemonset_serves_it() -> None:
    (rule,) = json.loads(PLUGIN.read_text())["rules"]
    agent = rule["args"][rule["args"].index("--agent") + 1]
    daemonset = yaml.safe_load((REPO / "deploy" / "daemonset.yaml").read_text())
    pod = daemonset["spec"]["template"]["spec"]
    (port,) = [p["containerPort"] for c in pod["containers"] for p in c.get("ports", []) if p.get("name") == "metrics"]
    assert pod["hostNetwork"] is True  # the agent listens on the node's loopback too
    assert agent == f"http://127.0.0.1:{port}/metrics"
