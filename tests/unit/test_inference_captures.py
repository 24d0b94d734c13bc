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
from pathlib import Path

import pytest

from lockstep.agent.collector import CollectorContext, Paths
from lockstep.agent.seams import Seams
from lockstep.collectors.inference import InferenceCollector, InferenceOptions
from lockstep.collectors.inference.fetch import INFERENCE_HTTP
from lockstep.collectors.inference.targets import parse_targets
from tests.support import FIXTURES, collected

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
