"""Hostile input, round two (issue 29): one bad value costs one sample, never a collector's output.

Item 4: a lone surrogate in a training job id, or a non-UTF-8 byte in a directory name under a
checkpoint root, made rendering raise, and every series of that collector vanished.  Item 14: a
label over the 4,096-character cap dropped a target's ``up`` and a job's ``job_info``.  Both are
now made safe in one place for every collector (agent/samples.py): unencodable characters
backslash-escaped, values over the cap cut and ended with a hash of the whole; counted in
``lockstep_collector_altered_label_values_total``.  Each test runs the real collector through a
worker and the exporter, as a scrape would, and parses both formats.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import time
from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics

from lockstep.agent.collector import Collector, CollectorContext, Paths
from lockstep.agent.exporter import SnapshotExporter
from lockstep.agent.samples import MAX_LABEL_VALUE_CHARS, TRUNCATED_MARK, safe_label_value
from lockstep.agent.scheduler import Worker, WorkerView
from lockstep.agent.seams import WALL_CLOCK, Seams
from lockstep.collectors.checkpoint import CheckpointCollector, CheckpointOptions
from lockstep.collectors.checkpoint.config import parse_roots
from lockstep.collectors.inference import InferenceCollector, InferenceOptions
from lockstep.collectors.inference.fetch import INFERENCE_HTTP
from lockstep.collectors.inference.targets import parse_targets
from lockstep.collectors.slurm import SlurmCollector, SlurmOptions
from lockstep.collectors.training import TrainingCollector, TrainingOptions
from tests.support import FIXTURES, context, samples, wait_until
from tests.support.scontrol import fake_scontrol

OPENMETRICS = "application/openmetrics-text; version=1.0.0"


@dataclasses.dataclass
class Served:
    text: dict  # the text format's samples by (name, labels)
    openmetrics: dict  # the same from the OpenMetrics rendering, parsed by its own parser
    view: WorkerView


def served(collector: Collector) -> Served:
    """One round of the collector run by a worker, scraped in both formats."""
    worker = Worker(collector, interval=3600, deadline=30, staleness_intervals=2, log=logging.getLogger("t.worker"))
    worker.start()
    try:
        wait_until(lambda: worker.view().runs_total >= 1, timeout=30, what="a round")
    finally:
        worker.stop()
        worker.join(30)
    view = worker.view()
    exporter = SnapshotExporter(lambda: [view])
    text = exporter.render()[0].decode()
    om = exporter.render(OPENMETRICS)[0].decode()
    parsed = {}
    for family in parse_openmetrics(om):  # raises on invalid OpenMetrics
        for sample in family.samples:
            parsed[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return Served(samples(text), parsed, view)


def self_metric(result: Served, name: str, collector: str) -> float:
    return result.text[(f"lockstep_collector_{name}", frozenset({("collector", collector)}))]


def of(values: dict, name: str, **labels: str) -> float:
    return values[(name, frozenset(labels.items()))]


# --- item 4: characters UTF-8 cannot encode ---


def _record(job_id: str, step: int, metric: str, value: float) -> str:
    # json.dumps writes a lone surrogate as the escape "\ud800", which json.loads reads back as one.
    record = {"ts": 1_767_312_000 + step, "job_id": job_id, "rank": 0, "host": "h", "step": step}
    return json.dumps({**record, "metric": metric, "value": value}) + "\n"


def test_a_surrogate_job_id_costs_nothing_of_a_healthy_job(tmp_path: Path) -> None:
    lines = [_record(job, n, "step_time_sec", 2.0) for n in range(3) for job in ("7", "\ud800")]
    (tmp_path / "ranks.jsonl").write_text("".join(lines))
    opts = TrainingOptions(logs=(str(tmp_path / "*.jsonl"),), start_at="beginning")
    result = served(TrainingCollector(context(options=opts)))
    for values in (result.text, result.openmetrics):
        healthy = {"job_id": "7", "rank": "0", "host": "h"}
        assert of(values, "lockstep_training_steps_total", **healthy) == 3
        assert of(values, "lockstep_training_step_seconds_total", **healthy) == 6.0
        # The bad job is served too, its id backslash-escaped (six ASCII characters).
        bad = {"job_id": "\\ud800", "rank": "0", "host": "h"}
        assert of(values, "lockstep_training_steps_total", **bad) == 3
    bad_series = [labels for name, labels in result.text if ("job_id", "\\ud800") in labels]
    assert self_metric(result, "up", "training") == 1
    assert self_metric(result, "altered_label_values_total", "training") == len(bad_series) == 6
    assert self_metric(result, "rejected_samples_total", "training") == 0


def test_a_non_utf8_directory_under_a_checkpoint_root_costs_nothing_of_its_neighbour(tmp_path: Path) -> None:
    now = time.time()
    parent = tmp_path / "ckpt"
    for name in (b"good", b"bad\xff"):  # \xff never appears in UTF-8
        root = os.path.join(os.fsencode(parent), name)
        os.makedirs(os.path.join(root, b"iter_0000050", b"mp_rank_00"))
        with open(os.path.join(root, b"iter_0000050", b"mp_rank_00", b"model_optim_rng.pt"), "wb") as f:
            f.write(b"x" * 700)
        with open(os.path.join(root, b"latest_checkpointed_iteration.txt"), "wb") as f:
            f.write(b"50\n")
    collector = CheckpointCollector(
        CollectorContext(
            paths=Paths(rootfs=tmp_path),
            options=CheckpointOptions(roots=parse_roots([{"path": "/ckpt/*", "watch": "poll"}])),
            log=logging.getLogger("test"),
            seams=Seams(WALL_CLOCK.replaced_by(lambda: now)),
        )
    )
    try:
        result = served(collector)
    finally:
        collector.close()
    for values in (result.text, result.openmetrics):
        assert of(values, "lockstep_checkpoint_last_size_bytes", root="/ckpt/good") == 700
        # Python reads the byte 0xff of a file name as the lone surrogate \udcff: escaped.
        assert of(values, "lockstep_checkpoint_last_size_bytes", root="/ckpt/bad\\udcff") == 700
    bad_series = [labels for name, labels in result.text if ("root", "/ckpt/bad\\udcff") in labels]
    assert self_metric(result, "up", "checkpoint") == 1
    assert self_metric(result, "altered_label_values_total", "checkpoint") == len(bad_series) == 10


# --- item 14: a label over the 4,096-character cap ---


def test_a_value_over_the_cap_is_cut_with_a_hash_of_the_whole() -> None:
    long_a, long_b = "a" * 5000, "a" * 4999 + "b"  # differ only past the cap
    cut_a, cut_b = safe_label_value(long_a), safe_label_value(long_b)
    assert len(cut_a) == len(cut_b) == MAX_LABEL_VALUE_CHARS
    digest = hashlib.sha256(long_a.encode()).hexdigest()[:16]
    assert cut_a == "a" * (MAX_LABEL_VALUE_CHARS - 26) + TRUNCATED_MARK + digest
    assert cut_a != cut_b  # two values, two series
    assert safe_label_value("x" * MAX_LABEL_VALUE_CHARS) == "x" * MAX_LABEL_VALUE_CHARS  # at the cap: as it is
    assert safe_label_value("caf\u00e9 \ud800") == "caf\u00e9 \\ud800"  # UTF-8 is kept, a surrogate escaped


def _vllm_body(model: str, running: int) -> str:
    return f'# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{model_name="{model}"}} {running}\n'


def test_a_model_name_over_the_cap_keeps_its_targets_up(tmp_path: Path) -> None:
    long_model = "m" * 5000
    bodies = {
        "http://127.0.0.1:9001/metrics": _vllm_body(long_model, 4),
        "http://127.0.0.1:9002/metrics": _vllm_body("small", 2),
    }
    targets = parse_targets(["vllm=http://127.0.0.1:9001/metrics", "vllm=http://127.0.0.1:9002/metrics"])
    collector = InferenceCollector(
        dataclasses.replace(
            context(proc=tmp_path, options=InferenceOptions(targets=targets, discover=False)),
            seams=Seams(INFERENCE_HTTP.replaced_by(lambda url, timeout: bodies[url])),
        )
    )
    try:
        result = served(collector)
    finally:
        collector.close()
    cut = safe_label_value(long_model)
    for values in (result.text, result.openmetrics):
        long_labels = {"engine": "vllm", "server": "http://127.0.0.1:9001/metrics", "model": cut}
        assert of(values, "lockstep_inference_up", **long_labels) == 1  # was absent: the target vanished
        assert of(values, "lockstep_inference_requests_running", **long_labels) == 4
        small = {"engine": "vllm", "server": "http://127.0.0.1:9002/metrics", "model": "small"}
        assert of(values, "lockstep_inference_up", **small) == 1
        assert of(values, "lockstep_inference_requests_running", **small) == 2
    assert self_metric(result, "altered_label_values_total", "inference") == 2
    assert self_metric(result, "rejected_samples_total", "inference") == 0


def test_a_job_name_over_the_cap_keeps_its_job_info(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_scontrol(tmp_path, monkeypatch)
    tree = tmp_path / "v2"
    shutil.copytree(FIXTURES / "slurm" / "v2", tree, symlinks=True)
    environ = tree / "proc" / "5001" / "environ"
    name = "n" * 5000
    environ.write_bytes(
        environ.read_bytes().replace(b"SLURM_JOB_NAME=pretrain 70b", b"SLURM_JOB_NAME=" + name.encode())
    )
    collector = SlurmCollector(context(proc=tree / "proc", sys_=tree / "sys", options=SlurmOptions(node_name="node07")))
    result = served(collector)
    labels = {
        "job_id": "101",
        "user": "alice",
        "account": "llm",
        "partition": "gpu",
        "job_name": safe_label_value(name),
        "array_job_id": "",
        "array_task_id": "",
    }
    for values in (result.text, result.openmetrics):
        assert of(values, "lockstep_slurm_job_info", **labels) == 1  # was absent
        assert of(values, "lockstep_slurm_job_cpu_seconds_total", job_id="101") == 123.456789
    assert self_metric(result, "altered_label_values_total", "slurm") == 1


# --- item 11: engine histograms with bounds that are no histogram's ---


def _ttft(model: str, buckets: list[tuple[str, float]], count: float, total: float) -> str:
    lines = [f'vllm:time_to_first_token_seconds_bucket{{le="{le}",model_name="{model}"}} {n}' for le, n in buckets]
    lines.append(f'vllm:time_to_first_token_seconds_count{{model_name="{model}"}} {count}')
    lines.append(f'vllm:time_to_first_token_seconds_sum{{model_name="{model}"}} {total}')
    return "\n".join(lines) + "\n"


# One model per defect, each next to nothing else; "good" is a valid histogram.
HISTOGRAMS = {
    "good": [("0.1", 1), ("1.0", 3), ("+Inf", 5)],
    "nan": [("0.1", 1), ("NaN", 3), ("+Inf", 5)],
    "minus-inf": [("-Inf", 0), ("1.0", 3), ("+Inf", 5)],
    "alias": [("1", 5), ("1.0", 5), ("+Inf", 5)],  # the same bucket twice: was added up to 10
    "alias-inf": [("1.0", 3), ("1e400", 5), ("+Inf", 5)],  # 1e400 is +Inf as a float
    "decreasing": [("0.1", 4), ("1.0", 2), ("+Inf", 5)],
    "no-inf": [("0.1", 1), ("1.0", 3)],
}


def test_engine_histograms_with_bad_bounds_are_refused_and_the_output_stays_valid(tmp_path: Path) -> None:
    body = "# TYPE vllm:time_to_first_token_seconds histogram\n" + "".join(
        _ttft(model, buckets, 5, 2.5) for model, buckets in HISTOGRAMS.items()
    )
    body += "".join(f'vllm:num_requests_running{{model_name="{model}"}} 1\n' for model in HISTOGRAMS)
    endpoint = "http://127.0.0.1:9001/metrics"
    collector = InferenceCollector(
        dataclasses.replace(
            context(
                proc=tmp_path, options=InferenceOptions(targets=parse_targets([f"vllm={endpoint}"]), discover=False)
            ),
            seams=Seams(INFERENCE_HTTP.replaced_by(lambda url, timeout: body)),
        )
    )
    try:
        result = served(collector)  # served() parses the OpenMetrics rendering: it raised before
    finally:
        collector.close()
    name = "lockstep_inference_time_to_first_token_seconds"
    for values in (result.text, result.openmetrics):
        good = {"engine": "vllm", "server": endpoint, "model": "good"}
        assert {
            labels["le"]: v
            for (n, ls), v in values.items()
            if n == f"{name}_bucket" and (labels := dict(ls))["model"] == "good"
        } == {"0.1": 1, "1.0": 3, "+Inf": 5}
        assert of(values, f"{name}_count", **good) == 5
        assert of(values, f"{name}_sum", **good) == 2.5
        histogram_models = {dict(ls)["model"] for n, ls in values if n.startswith(name)}
        assert histogram_models == {"good"}
        for model in HISTOGRAMS:  # the rest of each model's data stays
            assert of(values, "lockstep_inference_up", engine="vllm", server=endpoint, model=model) == 1
    assert of(result.text, "lockstep_inference_skipped_values_total", engine="vllm", server=endpoint) == 6
