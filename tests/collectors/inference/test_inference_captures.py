"""Every capture in tests/fixtures/inference/ replayed through the real inference collector:
each lockstep_inference_* value must equal the workload's truth written next to it (issue 28).

A capture is ``NAME.prom`` (the engine's /metrics answer) and ``NAME.json`` (which engine, how
the answer was made: captured from the engine's own metrics code by dev/capture-inference, or
written from its source where it cannot run here; the workload; the truth). The truth lists
every series the collector must emit for that answer (histograms by their _count, _sum and
+Inf bucket), so a missing, extra or wrong series fails. docs/workloads.md says how to add one.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest

from lockstep.agent.collector import CollectorContext, Paths
from lockstep.agent.seams import Seams
from lockstep.collectors.inference import InferenceCollector, InferenceOptions
from lockstep.collectors.inference.fetch import INFERENCE_HTTP
from lockstep.collectors.inference.readings import finish_reason
from lockstep.collectors.inference.targets import parse_targets
from tests.support import FIXTURES, REPO, collected

CAPTURES = sorted((FIXTURES / "inference").glob("*.json"))
# Series about the scrape or the node, not the engine's numbers.
NOT_NUMBERS = ("lockstep_inference_up", "lockstep_inference_process_info", "lockstep_inference_gpu_info")


def replayed(capture: Path) -> dict[str, float]:
    """The collector's lockstep_inference_* series for the capture, keyed as the truth is."""
    meta = json.loads(capture.read_text())
    body = capture.with_suffix(".prom").read_text()
    url = "http://127.0.0.1:9/metrics"

    def fetch(got: str, timeout: float) -> str:
        assert got == url
        return body

    context = CollectorContext(
        paths=Paths(),
        options=InferenceOptions(targets=parse_targets([f"{meta['engine']}={url}"]), discover=False),
        log=logging.getLogger("test"),
        seams=Seams(INFERENCE_HTTP.replaced_by(fetch)),
    )
    collector = InferenceCollector(context)
    try:
        samples = collected(collector)
    finally:
        collector.close()
    assert {value for (name, _), value in samples.items() if name == "lockstep_inference_up"} == {1}
    found = {}
    for (name, labels), value in samples.items():
        if not name.startswith("lockstep_inference_") or name in NOT_NUMBERS:
            continue
        shown = dict(labels)
        assert shown.pop("engine") == meta["engine"]
        assert shown.pop("server") == url
        if name.endswith("_bucket") and shown.get("le") != "+Inf":
            continue  # the engine's own buckets: their +Inf, _count and _sum are the truth
        found[name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(shown.items())) + "}"] = value
    return found


@pytest.mark.parametrize("capture", CAPTURES, ids=lambda p: p.stem)
def test_replayed_capture_equals_the_workloads_truth(capture: Path) -> None:
    truth = json.loads(capture.read_text())["truth"]
    found = replayed(capture)
    # What the collector left out of the engine's own answer (issue 29): exactly the samples the
    # engine wrote as NaN (SGLang 0.5.23's sglang:fwd_occupancy), nothing of a valid answer.
    answer = capture.with_suffix(".prom").read_text().splitlines()
    nans = sum(1 for line in answer if line and not line.startswith("#") and line.rsplit(" ", 1)[-1] == "NaN")
    assert found.pop("lockstep_inference_skipped_values_total{}") == nans
    wrong = {key: (found.get(key), want) for key, want in truth.items() if found.get(key) != pytest.approx(want)}
    extra = {key: value for key, value in found.items() if key not in truth}
    assert (wrong, extra) == ({}, {}), "series: (read, truth) where they differ; then series not in the truth"


def test_every_engine_has_captures() -> None:
    engines = {json.loads(c.read_text())["engine"] for c in CAPTURES}
    assert engines == {"vllm", "sglang", "tgi", "triton", "dynamo"}
    for capture in CAPTURES:
        meta = json.loads(capture.read_text())
        assert meta["source"].startswith(("captured", "written from source")), capture.name
        assert capture.with_suffix(".prom").exists(), capture.name


def test_every_inference_family_has_its_meaning_per_engine_in_the_vocabulary_table() -> None:
    """docs/workloads.md's "One vocabulary" table has a row for each family the engines feed,
    with a cell for each of the five engines."""
    doc = (REPO / "docs" / "workloads.md").read_text()
    table = doc.split("### One vocabulary", 1)[1].split("Rules behind the table", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| `lockstep_inference_")]
    # The collector's own diagnostics, not fed by an engine (docs/security.md, docs/workloads.md).
    own = ("lockstep_inference_skipped_values_total", "lockstep_inference_discovered_processes")
    for spec in InferenceCollector.metrics:
        if spec.name in NOT_NUMBERS or spec.name in own:
            continue
        row = [r for r in rows if re.search(f"`{spec.name}[`{{]", r.split(" | ")[0])]
        assert len(row) == 1, f"{spec.name} has no row in the vocabulary table"
        assert row[0].count(" | ") == 5, f"{spec.name}: a cell for each of the five engines"


@pytest.mark.parametrize(
    "engine_reason, reason",
    [
        ("stop", "stop"),
        ("repetition", "repetition"),
        ("Content_Filter", "content_filter"),
        ("a b/c", "other"),
        ("", "other"),
    ],
)
def test_a_finish_reason_is_kept_under_its_name_or_as_other(engine_reason: str, reason: str) -> None:
    assert finish_reason(engine_reason) == reason
