"""The Kubernetes manifests in deploy/: schemas, lint, kustomize, and that they fit the agent.

Core kinds are validated with kubernetes-validate (strict: unknown fields are errors) against
the schemas it ships, offline.  ServiceMonitor is a Prometheus Operator CRD for which
kubernetes-validate has no schema and none can be fetched here: its schema validation is
skipped on purpose, and the fields the scrape depends on are checked by hand instead.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from lockstep import __version__
from lockstep.agent.cli import build_parser
from lockstep.agent.registry import discover
from tests.support import REPO, lockstep, require_real

DEPLOY = REPO / "deploy"
KUSTOMIZATION = DEPLOY / "kustomization.yaml"
# The oldest Kubernetes the manifests are meant for (pod-resources v1 List is GA from 1.28)
# and the newest kubernetes-validate knows.
VERSIONS = ("1.28", kubernetes_validate.utils.latest_version())
CRDS = {("monitoring.coreos.com/v1", "ServiceMonitor"), ("monitoring.coreos.com/v1", "PrometheusRule")}


def kustomization() -> dict[str, Any]:
    return yaml.safe_load(KUSTOMIZATION.read_text())


def resources() -> list[dict[str, Any]]:
    docs = []
    for name in kustomization()["resources"]:
        docs += [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]
    return docs


def one(kind: str, docs: list[dict[str, Any]] | None = None, name: str | None = None) -> dict[str, Any]:
    (found,) = [d for d in (docs or resources()) if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    return found


def agent_configmap() -> dict[str, Any]:
    """The agent's config (the other ConfigMaps hold dashboards: tests/dashboards/test_dashboards.py)."""
    return one("ConfigMap", name="lockstep-config")


def container() -> dict[str, Any]:
    (c,) = one("DaemonSet")["spec"]["template"]["spec"]["containers"]
    return c


def flags() -> dict[str, str]:
    return dict(a.removeprefix("--").split("=", 1) for a in container()["args"] if a.startswith("--"))


@pytest.mark.real
def test_yamllint_is_clean() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "yamllint", "--strict", "-c", ".yamllint.yaml", "deploy/", ".yamllint.yaml"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


@pytest.mark.parametrize("version", VERSIONS)
def test_core_kinds_match_the_kubernetes_schemas(version: str) -> None:
    checked = []
    for doc in resources():
        if (doc["apiVersion"], doc["kind"]) in CRDS:
            continue  # no schema available offline: see test_service_monitor_scrapes_the_service
        kubernetes_validate.validate(doc, version, strict=True)
        checked.append(doc["kind"])
    assert sorted(set(checked)) == ["ConfigMap", "DaemonSet", "Namespace", "Service", "ServiceAccount"]


def test_kustomization_lists_every_manifest_and_pins_this_version() -> None:
    listed = set(kustomization()["resources"])
    assert listed == {p.name for p in DEPLOY.glob("*.yaml")} - {KUSTOMIZATION.name}
    assert kustomization()["images"] == [{"name": "lockstep", "newTag": __version__}]
    assert container()["image"] == f"lockstep:{__version__}"


@pytest.mark.real
def test_kustomize_builds_valid_manifests_in_one_namespace() -> None:
    kubectl = shutil.which("kubectl")
    require_real("kubectl (its built-in kustomize)", kubectl is not None)
    result = subprocess.run([kubectl, "kustomize", str(DEPLOY)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    built = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert sorted(d["kind"] for d in built) == sorted(d["kind"] for d in resources())
    for doc in built:
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == "lockstep", doc["kind"]
        if (doc["apiVersion"], doc["kind"]) not in CRDS:
            kubernetes_validate.validate(doc, VERSIONS[-1], strict=True)


def test_daemonset_flags_are_the_agents_and_point_at_the_mounts() -> None:
    spec = one("DaemonSet")["spec"]["template"]["spec"]
    args = container()["args"]
    parsed = build_parser(discover()).parse_args(args)  # exits (fails) on an unknown flag
    assert parsed.command == "run"
    mounts = {m["name"]: m for m in container()["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    host_path_of = {
        mount["mountPath"]: volumes[name]["hostPath"]["path"]
        for name, mount in mounts.items()
        if "hostPath" in volumes[name]
    }
    for root, host_path in (("sysfs", "/sys"), ("procfs", "/proc"), ("rootfs", "/")):
        assert host_path_of[flags()[f"path.{root}"]] == host_path
    socket = Path(flags()["kubernetes.pod-resources-socket"])
    assert (socket.name, host_path_of[str(socket.parent)]) == ("kubelet.sock", "/var/lib/kubelet/pod-resources")
    config = Path(flags()["config"])
    assert volumes[[n for n, m in mounts.items() if m["mountPath"] == str(config.parent)][0]]["configMap"] == {
        "name": agent_configmap()["metadata"]["name"]
    }
    assert config.name in agent_configmap()["data"]


def test_daemonset_takes_no_privilege_beyond_need() -> None:
    spec = one("DaemonSet")["spec"]["template"]["spec"]
    assert (spec["hostPID"], spec["hostNetwork"], spec.get("hostIPC", False)) == (True, True, False)
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    security = container()["securityContext"]
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert (security["privileged"], security["allowPrivilegeEscalation"], security["readOnlyRootFilesystem"]) == (
        False,
        False,
        True,
    )
    host_mounts = [m for m in container()["volumeMounts"] if "hostPath" in _volume(m["name"])]
    assert [m["name"] for m in host_mounts] == ["sys", "proc", "root", "pod-resources"]
    assert all(m["readOnly"] for m in host_mounts)
    assert {m["name"]: m.get("mountPropagation") for m in host_mounts}["root"] == "HostToContainer"
    assert [r for r in resources() if r["kind"] in ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")] == []


def _volume(name: str) -> dict[str, Any]:
    (volume,) = [v for v in one("DaemonSet")["spec"]["template"]["spec"]["volumes"] if v["name"] == name]
    return volume


def test_probes_service_and_selectors_fit_together() -> None:
    daemonset, service = one("DaemonSet"), one("Service")
    pod_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert daemonset["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert service["spec"]["selector"].items() <= pod_labels.items()
    (port,) = container()["ports"]
    assert (port["name"], port["containerPort"]) == ("metrics", 12400)
    assert [(p["name"], p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [
        ("metrics", 12400, "metrics")
    ]
    # Probes go to the plain /healthz listener on the node's loopback, so they pass whatever TLS
    # the metrics port requires; the pod shares the node's network namespace, as the kubelet does.
    assert container()["args"].count("--health-listen=127.0.0.1:12401") == 1
    assert daemonset["spec"]["template"]["spec"]["hostNetwork"] is True
    for probe in ("livenessProbe", "readinessProbe"):
        assert container()[probe]["httpGet"] == {"host": "127.0.0.1", "path": "/healthz", "port": 12401}


def test_service_monitor_scrapes_the_service() -> None:
    """Schema validation skipped (a CRD, no schema offline); what the scrape needs, by hand."""
    monitor, service = one("ServiceMonitor"), one("Service")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["namespace"] == service["metadata"]["namespace"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in [p["name"] for p in service["spec"]["ports"]]
    assert (endpoint["path"], endpoint["interval"], endpoint["scrapeTimeout"]) == ("/metrics", "15s", "10s")
    assert endpoint["relabelings"] == [{"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"}]


@pytest.mark.real
def test_configmap_config_is_valid_and_the_daemonset_args_run(tmp_path: Path) -> None:
    """The ConfigMap's file passes `config check`, and `lockstep once` runs with the DaemonSet's
    flags, the host paths mapped to this machine's own (a container would see them under /host)."""
    config = tmp_path / "lockstep.yml"
    config.write_text(agent_configmap()["data"]["lockstep.yml"])
    check = lockstep("config", "check", str(config))
    assert check.returncode == 0, check.stderr
    here = {"/host/sys": "/sys", "/host/proc": "/proc", "/host/root": "/"}
    args = []
    for arg in container()["args"][1:]:
        flag, _, value = arg.partition("=")
        value = here.get(value, value)
        if flag == "--config":
            value = str(config)
        elif flag == "--kubernetes.pod-resources-socket":
            value = str(tmp_path / "no-kubelet" / "kubelet.sock")
        args.append(f"{flag}={value}")
    result = lockstep("once", *args)
    assert result.returncode == 0, result.stderr
    assert 'lockstep_collector_state{collector="kubernetes",state="nothing_here"} 1.0' in result.stdout
    assert 'lockstep_collector_state{collector="host",state="ok"} 1.0' in result.stdout
