"""The agent scraped as prometheus-operator scrapes it through deploy/servicemonitor.yaml, on a
real Prometheus: the workload's labels arrive intact, and nothing is renamed exported_*.

One `lockstep demo --scenario kubernetes` (a training pod, a vLLM pod, two notebooks sharing GPU
7) and one Prometheus (Debian `prometheus`) whose scrape job is built here from the checked-in
YAML the way prometheus-operator builds it (pkg/prometheus/promcfg.go): `honor_labels` as the
ServiceMonitor says, the keep rules of its selector and port, the target labels the operator
adds (namespace, service, pod, container, job, endpoint), then the ServiceMonitor's own
relabelings and metricRelabelings, translated field by field.  A change to the ServiceMonitor
changes this scrape job; a field the translation does not know fails the test.

There is no API server here, so the target is a static one carrying the `__meta_kubernetes_*`
labels that kubernetes_sd (role: endpoints) would give the agent's pod: built from
deploy/service.yaml and deploy/daemonset.yaml, with a made-up node and pod name.  Prometheus
runs the operator's relabelling on them exactly as it would on discovered ones.  Two
deviations, for time: the scrape interval is 1 s (the ServiceMonitor says 15 s), and there is
no `cluster` label (kube-prometheus-stack has none on its own series unless it is configured).

Checked against that Prometheus:
- the operator's target labels are there (so the test scrapes what an operator install sees);
- no lockstep_* series carries an exported_* label;
- every query in docs/deploy.md returns the workload's k8s_namespace/k8s_pod/k8s_container
  with the scenario's exact values;
- every dashboard variable query returns the scenario's exact values;
- the inference and Kubernetes alerts, rendered by Prometheus (their expressions' thresholds
  relaxed so that they fire on a calm node), name the workload's server, model, pod and node.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from alerts import render, rules
from alerts.model import Alert
from lockstep import thresholds as T
from lockstep.simulation.gpu import GPU_UUIDS
from lockstep.simulation.workloads import VLLM_MODEL, VLLM_URL
from tests.support import LOCKSTEP, REPO, free_port, http_get, require_real, wait_until
from tests.support.prometheus import PROMETHEUS, is_ready, start_demo, start_prometheus, stop_all
from tests.support.queries import checked_in, variable_queries

DEPLOY = REPO / "deploy"
NODE_NAME = "gpu-node-17"  # the Kubernetes node the agent's pod runs on (made up: no API server)
AGENT_POD = "lockstep-7xq2m"  # the DaemonSet's pod on that node
SCRAPE_INTERVAL = "1s"

# The workload's containers of the kubernetes scenario (simulation/kubernetes.py), by GPU index.
TRAINER = ("training", "llama-70b-worker-0", "trainer")
VLLM = ("inference", "vllm-llama-8b-7d9f6c-x2kqz", "vllm")
ALICE = ("research", "notebook-alice", "jupyter")
BOB = ("research", "notebook-bob", "jupyter")
EMBEDDINGS = ("inference", "embeddings-6b7c9-w4kxd", "tei")  # GPU 6 through a DRA ResourceClaim
PODS_BY_GPU = {
    0: {TRAINER},
    1: {TRAINER},
    2: {TRAINER},
    3: {TRAINER},
    4: {VLLM},
    5: {VLLM},
    6: {EMBEDDINGS},
    7: {ALICE, BOB},
}
EVERY_POD_GPU = {pod for pods in PODS_BY_GPU.values() for pod in pods}

# What each query of docs/deploy.md must return, as (k8s_namespace, k8s_pod, k8s_container)
# of its series.  A query added to the docs fails the test until its expected answer is here.
DOCS_QUERIES: dict[str, set[tuple[str, str, str]]] = {
    'lockstep_k8s_container_gpu_sm_utilization_ratio{instance="NODE:12400", gpu="3"}': PODS_BY_GPU[3],
    "lockstep_k8s_pod_gpu_info * on(uuid) group_left(gpu) lockstep_gpu_utilization_ratio": EVERY_POD_GPU,
    'lockstep_k8s_pod_gpu_info * on(uuid) group_left(gpu) (lockstep_gpu_clock_event_active{reason="hw_slowdown"} '
    "== 1)": set(),  # no GPU of the scenario is throttled: runs, returns nothing
}
GPU_3_QUERY = 'lockstep_k8s_container_gpu_sm_utilization_ratio{instance="NODE:12400", gpu="3"}'


# --- prometheus-operator's scrape job for a ServiceMonitor ------------------------------------


def _documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def _sanitize(label: str) -> str:
    """Kubernetes label name -> Prometheus label name, as kubernetes_sd and the operator do."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", label)


# ServiceMonitor RelabelConfig fields -> Prometheus relabel_config keys (monitoring.coreos.com/v1).
RELABEL_FIELDS = {
    "sourceLabels": "source_labels",
    "separator": "separator",
    "targetLabel": "target_label",
    "regex": "regex",
    "modulus": "modulus",
    "replacement": "replacement",
    "action": "action",
}


def _relabel(config: dict[str, Any], where: str) -> dict[str, Any]:
    unknown = set(config) - set(RELABEL_FIELDS)
    assert not unknown, f"{where}: fields this test does not translate: {sorted(unknown)}"
    out = {RELABEL_FIELDS[k]: v for k, v in config.items()}
    if "action" in out:
        out["action"] = out["action"].lower()  # the operator accepts Replace as well as replace
    return out


ENDPOINT_FIELDS = {"port", "path", "interval", "scrapeTimeout", "relabelings", "metricRelabelings", "honorLabels"}


def operator_scrape_job(monitor: dict[str, Any], index: int, targets: list[dict[str, Any]]) -> dict[str, Any]:
    """The scrape job prometheus-operator generates for endpoint ``index`` of ``monitor``, with
    static ``targets`` standing in for kubernetes_sd_configs (role: endpoints)."""
    meta, spec = monitor["metadata"], monitor["spec"]
    endpoint = spec["endpoints"][index]
    unknown = set(endpoint) - ENDPOINT_FIELDS
    assert not unknown, f"servicemonitor.yaml endpoint {index}: fields this test does not translate: {sorted(unknown)}"
    assert set(spec) <= {"selector", "endpoints"}, f"servicemonitor.yaml spec: untranslated {sorted(spec)}"
    assert set(spec["selector"]) == {"matchLabels"}, "only matchLabels selectors are translated"
    relabel: list[dict[str, Any]] = [{"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"}]
    for key, wanted in sorted(spec["selector"]["matchLabels"].items()):
        relabel.append(
            {
                "action": "keep",
                "source_labels": [
                    f"__meta_kubernetes_service_label_{_sanitize(key)}",
                    f"__meta_kubernetes_service_labelpresent_{_sanitize(key)}",
                ],
                "regex": f"({wanted});true",
            }
        )
    relabel += [
        {"action": "keep", "source_labels": ["__meta_kubernetes_endpoint_port_name"], "regex": endpoint["port"]},
        {
            "source_labels": [
                "__meta_kubernetes_endpoint_address_target_kind",
                "__meta_kubernetes_endpoint_address_target_name",
            ],
            "separator": ";",
            "regex": "Node;(.*)",
            "replacement": "${1}",
            "target_label": "node",
        },
        {
            "source_labels": [
                "__meta_kubernetes_endpoint_address_target_kind",
                "__meta_kubernetes_endpoint_address_target_name",
            ],
            "separator": ";",
            "regex": "Pod;(.*)",
            "replacement": "${1}",
            "target_label": "pod",
        },
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job", "replacement": "${1}"},
        {"target_label": "endpoint", "replacement": endpoint["port"]},
    ]
    relabel += [_relabel(r, f"relabelings[{i}]") for i, r in enumerate(endpoint.get("relabelings", []))]
    # The operator's sharding (one shard here): hashmod of the address, keep shard 0.
    relabel += [
        {"source_labels": ["__address__"], "target_label": "__tmp_hash", "modulus": 1, "action": "hashmod"},
        {"source_labels": ["__tmp_hash"], "regex": "0", "action": "keep"},
    ]
    return {
        "job_name": f"serviceMonitor/{meta['namespace']}/{meta['name']}/{index}",
        "honor_labels": bool(endpoint.get("honorLabels", False)),
        "metrics_path": endpoint.get("path", "/metrics"),
        "scheme": "http",
        "scrape_interval": SCRAPE_INTERVAL,
        "scrape_timeout": SCRAPE_INTERVAL,
        "static_configs": targets,
        "relabel_configs": relabel,
        "metric_relabel_configs": [
            _relabel(r, f"metricRelabelings[{i}]") for i, r in enumerate(endpoint.get("metricRelabelings", []))
        ],
    }


def discovered_target(address: str) -> dict[str, Any]:
    """What kubernetes_sd (role: endpoints) would say of the agent's pod on NODE_NAME, from the
    Service and the DaemonSet: its __meta_kubernetes_* labels, as a static target."""
    (service,) = _documents("service.yaml")
    (daemonset,) = _documents("daemonset.yaml")
    pod_spec = daemonset["spec"]["template"]["spec"]
    (container,) = pod_spec["containers"]
    (service_port,) = service["spec"]["ports"]
    (container_port,) = [p for p in container["ports"] if p["name"] == service_port["targetPort"]]
    labels = {
        "__meta_kubernetes_namespace": service["metadata"]["namespace"],
        "__meta_kubernetes_service_name": service["metadata"]["name"],
        "__meta_kubernetes_endpoints_name": service["metadata"]["name"],
        "__meta_kubernetes_endpoint_port_name": service_port["name"],
        "__meta_kubernetes_endpoint_port_protocol": service_port.get("protocol", "TCP"),
        "__meta_kubernetes_endpoint_ready": "true",
        "__meta_kubernetes_endpoint_node_name": NODE_NAME,
        "__meta_kubernetes_endpoint_address_target_kind": "Pod",
        "__meta_kubernetes_endpoint_address_target_name": AGENT_POD,
        "__meta_kubernetes_pod_name": AGENT_POD,
        "__meta_kubernetes_pod_node_name": NODE_NAME,
        "__meta_kubernetes_pod_phase": "Running",
        "__meta_kubernetes_pod_ready": "true",
        "__meta_kubernetes_pod_container_name": container["name"],
        "__meta_kubernetes_pod_container_port_name": container_port["name"],
        "__meta_kubernetes_pod_container_port_number": str(container_port["containerPort"]),
        "__meta_kubernetes_pod_controller_kind": "DaemonSet",
        "__meta_kubernetes_pod_controller_name": daemonset["metadata"]["name"],
    }
    for key, value in service["metadata"].get("labels", {}).items():
        labels[f"__meta_kubernetes_service_label_{_sanitize(key)}"] = value
        labels[f"__meta_kubernetes_service_labelpresent_{_sanitize(key)}"] = "true"
    for key, value in daemonset["spec"]["template"]["metadata"].get("labels", {}).items():
        labels[f"__meta_kubernetes_pod_label_{_sanitize(key)}"] = value
        labels[f"__meta_kubernetes_pod_labelpresent_{_sanitize(key)}"] = "true"
    return {"targets": [address], "labels": labels}


# --- the run ----------------------------------------------------------------------------------


def relaxed(expr: str) -> str:
    """An alert expression with every 'greater than a number' (and 'less than a number': a drop
    below a share of its own level) made true for any value >= 0, so that the alert fires on the
    calm scenario and Prometheus renders its annotations."""
    out = re.sub(r"[<>]\s*[0-9][0-9.e+-]*", ">= 0", expr)
    assert out != expr, f"no threshold to relax in {expr!r}"
    return out


def workload_alerts() -> list[Alert]:
    """The alerts on the inference and Kubernetes metrics: those whose annotations name a workload.
    Not the per-GPU ones (LockstepGPUIdleWhileAllocated joins the pods' GPUs): relaxed, they fire
    once per GPU of the scenario, not once; promtool proves their pod labels and annotations
    (alerts/tests/gpu_verdicts.test.yml)."""
    return [
        a for a in rules.alerts() if re.search(r"lockstep_(inference|k8s)_", a.expr) and "lockstep_gpu_" not in a.expr
    ]


@dataclass
class Run:
    prometheus: str
    instance: str

    def query(self, expr: str) -> list[dict[str, Any]]:
        status, body = http_get(f"{self.prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr}), 30)
        answer = json.loads(body)
        assert status == 200 and answer["status"] == "success", (expr, body)
        return answer["data"]["result"]

    def api(self, path: str, **params: str) -> Any:
        status, body = http_get(f"{self.prometheus}{path}?" + urllib.parse.urlencode(params), 30)
        assert status == 200, body
        return json.loads(body)["data"]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    require_real("Prometheus server (Debian package prometheus)", os.access(PROMETHEUS, os.X_OK))
    tmp = tmp_path_factory.mktemp("servicemonitor")
    processes: list[subprocess.Popen[bytes]] = []
    try:
        demo_port, prometheus_port = free_port(), free_port()
        while prometheus_port == demo_port:
            prometheus_port = free_port()
        instance = f"127.0.0.1:{demo_port}"
        demo_log = tmp / "demo.log"
        processes.append(start_demo([*LOCKSTEP, "demo", "--scenario", "kubernetes", "--listen", instance], demo_log))
        wait_until(lambda: is_ready(f"http://{instance}/healthz", processes[0], demo_log), timeout=60, what="the demo")

        (monitor,) = _documents("servicemonitor.yaml")
        # The recording rules too: the inference alerts read them.
        test_rules = {
            "groups": [
                *render.groups_dict(rules.RECORDING_GROUPS),
                {
                    "name": "workload-alerts-relaxed",
                    "rules": [
                        {**render.rule_dict(alert), "expr": relaxed(alert.expr), "for": "0s"}
                        for alert in workload_alerts()
                    ],
                },
            ]
        }
        (tmp / "relaxed.rules.yml").write_text(yaml.safe_dump(test_rules, sort_keys=False))
        config = {
            "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": SCRAPE_INTERVAL},
            "rule_files": [str(tmp / "relaxed.rules.yml")],
            "scrape_configs": [operator_scrape_job(monitor, 0, [discovered_target(instance)])],
        }
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        url = start_prometheus(tmp, prometheus_port, processes)
        result = Run(url, instance)
        # Every collector of the demo has published and been scraped, and the relaxed alerts
        # (rate() needs two samples) have fired.
        wait_until(
            lambda: (
                len(result.query("lockstep_k8s_pod_gpu_info")) == sum(len(p) for p in PODS_BY_GPU.values())
                and result.query("lockstep_inference_up")
                and len(result.api("/api/v1/alerts")["alerts"]) == len(workload_alerts())
            ),
            timeout=60,
            step=0.5,
            what="the workload's series and the relaxed alerts in Prometheus",
        )
        yield result
    finally:
        stop_all(processes)


# --- the checks -------------------------------------------------------------------------------


def workload(series: dict[str, str]) -> tuple[str, str, str]:
    return (series.get("k8s_namespace", ""), series.get("k8s_pod", ""), series.get("k8s_container", ""))


@pytest.mark.e2e
def test_the_operators_target_labels_are_on_every_series(run: Run) -> None:
    """The scrape is the operator's: the agent's own pod, namespace, ... and the node's name."""
    (build_info,) = run.query("lockstep_build_info")
    labels = build_info["metric"]
    assert {k: labels[k] for k in ("namespace", "service", "pod", "container", "endpoint", "job", "node")} == {
        "namespace": "lockstep",
        "service": "lockstep",
        "pod": AGENT_POD,
        "container": "lockstep",
        "endpoint": "metrics",
        "job": T.AGENT_JOB,  # what LockstepAgentDown's absent(up{job=...}) looks for
        "node": NODE_NAME,
    }
    assert labels["instance"] == run.instance


@pytest.mark.e2e
def test_no_lockstep_series_carries_an_exported_label(run: Run) -> None:
    series = run.api("/api/v1/series", **{"match[]": '{__name__=~"lockstep_.+"}'})
    assert len(series) > 1000
    exported = sorted({(s["__name__"], k) for s in series for k in s if k.startswith("exported_")})
    assert exported == []


def docs_queries() -> list[str]:
    """Every PromQL query of docs/deploy.md (the ```promql blocks, one query per line)."""
    text = (REPO / "docs" / "deploy.md").read_text()
    blocks = re.findall(r"```promql\n(.*?)```", text, flags=re.S)
    return [
        line.strip() for block in blocks for line in block.splitlines() if line.strip() and not line.startswith("#")
    ]


# In-process: the unit tier (no marker; tests/conftest.py), in the quick loop.
def test_every_docs_query_has_its_expected_answer() -> None:
    assert sorted(docs_queries()) == sorted(DOCS_QUERIES)


@pytest.mark.parametrize("query", sorted(DOCS_QUERIES))
@pytest.mark.e2e
def test_each_docs_query_names_the_workload(run: Run, query: str) -> None:
    result = run.query(query.replace("NODE:12400", run.instance))
    assert {workload(s["metric"]) for s in result} == DOCS_QUERIES[query]
    assert [k for s in result for k in s["metric"] if k.startswith("exported_")] == []


@pytest.mark.parametrize(("gpu", "expected"), [("3", {TRAINER: 0.96}), ("7", {ALICE: 0.55, BOB: 0.2})])
@pytest.mark.e2e
def test_which_pod_uses_a_gpu_and_how_much(run: Run, gpu: str, expected: dict[tuple[str, str, str], float]) -> None:
    """docs/deploy.md's answer, as written, for the trainer's GPU 3 and for GPU 7 shared by two notebooks."""
    query = GPU_3_QUERY.replace("NODE:12400", run.instance).replace('gpu="3"', f'gpu="{gpu}"')
    assert {workload(s["metric"]): float(s["value"][1]) for s in run.query(query)} == expected


@pytest.mark.e2e
def test_pod_attribution_has_the_scenarios_exact_labels(run: Run) -> None:
    got = {
        (workload(s["metric"]), s["metric"]["gpu"], s["metric"]["uuid"]) for s in run.query("lockstep_k8s_pod_gpu_info")
    }
    assert got == {(pod, str(gpu), GPU_UUIDS[gpu]) for gpu, pods in PODS_BY_GPU.items() for pod in pods}


@pytest.mark.parametrize("title", sorted(checked_in()))
@pytest.mark.e2e
def test_dashboard_variables_resolve(run: Run, title: str) -> None:
    """label_values(selector, label) as Grafana asks it: the scenario's exact values."""
    expected = {
        # No cluster label under a plain kube-prometheus-stack: the dashboards' "All" (.*) matches.
        "cluster": [],
        "node": [run.instance],
        "job_id": ["4242"],
    }
    for name, variable in variable_queries(checked_in()[title]).items():
        match = re.fullmatch(r"label_values\((.+), (\w+)\)", variable)
        assert match, variable
        selector = match.group(1).replace("$cluster", ".*")
        values = run.api(f"/api/v1/label/{match.group(2)}/values", **{"match[]": selector})
        assert values == expected[name], (title, name, variable)


# The labels the inference and Kubernetes alerts' annotations may name, and their exact values.
ALERT_LABELS = {
    "server": VLLM_URL,
    "engine": "vllm",
    "model": VLLM_MODEL,
    "node": NODE_NAME,
    "instance": "<instance>",
    "k8s_namespace": VLLM[0],
    "k8s_pod": VLLM[1],
    "k8s_container": VLLM[2],
}


@pytest.mark.e2e
def test_workload_alert_annotations_name_the_workload(run: Run) -> None:
    alerts = {a["labels"]["alertname"]: a for a in run.api("/api/v1/alerts")["alerts"]}
    assert sorted(alerts) == sorted(a.name for a in workload_alerts())
    assert {"LockstepKVCachePressure", "LockstepKVCachePreemptions"} <= set(alerts)
    for alert in workload_alerts():
        fired = alerts[alert.name]
        templates = " ".join(str(v) for v in render.rule_dict(alert)["annotations"].values())  # type: ignore[union-attr]
        named = set(re.findall(r"\$labels\.(\w+)", templates))
        assert named, alert.name
        for label in named:
            want = run.instance if ALERT_LABELS.get(label) == "<instance>" else ALERT_LABELS.get(label)
            assert fired["labels"].get(label) == want, (alert.name, label, fired["labels"])
    summary = alerts["LockstepKVCachePressure"]["annotations"]["summary"]
    assert summary == f"KV cache of {VLLM_URL} is full and requests queue"
    description = alerts["LockstepKVCachePressure"]["annotations"]["description"]
    assert description.startswith(f"The vllm endpoint {VLLM_URL} ({VLLM_MODEL}) on {NODE_NAME} has used 42%")


# In-process: the unit tier (no marker; tests/conftest.py), in the quick loop.
def test_the_scrape_job_follows_the_servicemonitor() -> None:
    """Without a Prometheus: what is built from the YAML (a change there shows up here)."""
    (monitor,) = _documents("servicemonitor.yaml")
    job = operator_scrape_job(monitor, 0, [discovered_target("10.0.0.17:12400")])
    assert job["honor_labels"] is False  # the ServiceMonitor leaves honorLabels off (docs/deploy.md says why)
    assert job["job_name"] == "serviceMonitor/lockstep/lockstep/0"
    assert {"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node"} in job["relabel_configs"]
    target = job["static_configs"][0]["labels"]
    assert target["__meta_kubernetes_endpoint_port_name"] == "metrics"
    assert target["__meta_kubernetes_pod_container_name"] == "lockstep"
    with pytest.raises(AssertionError, match=r"relabelings\[0\]: fields this test does not translate: \['bogus'\]"):
        bad = {
            **monitor,
            "spec": {**monitor["spec"], "endpoints": [{"port": "metrics", "relabelings": [{"bogus": 1}]}]},
        }
        operator_scrape_job(bad, 0, [])
