"""Inference collector: KV-cache pressure, queues, preemptions and latency of the
inference engines on this node, from each engine's own /metrics, in one vocabulary.

Targets are the configured ones (``--inference.target ENGINE=URL``, repeatable, or
``collectors.inference.targets``) plus the engines found running on this node: processes
whose command line is a vLLM, SGLang, TGI, Triton or Dynamo server, and the TCP port each
listens on (procfs: /proc/PID/cmdline, /proc/PID/fd, /proc/PID/net/tcp{,6}).

Each round scrapes every target concurrently (bounded thread pool), each with its own
timeout; the answer is parsed with prometheus_client's parser and normalised
(engines/, one module per engine; docs/workloads.md has the table).  A target that is down,
slow, answers with an error or with something that is not its engine's exposition gets
``lockstep_inference_up 0``; the other targets are unaffected.

Engine-to-GPU and engine-to-job ties are an info series,
``lockstep_inference_process_info{engine,server,pid,job_id}``: the engine's server
process and every process below it (its workers hold the GPU contexts), each with the
Slurm job it runs in.  The GPUs are those whose NVML compute-process list (the GPU
collector's) holds one of these pids: the seam is the pid.

Fakes: the seam ``INFERENCE_HTTP`` (fetch.py), a callable ``(url, timeout) -> str`` raising
ScrapeError or OSError, replaces HTTP (the simulated node serves its engines that way).

Files: collector.py (a round), targets.py (configured targets), discovery.py (engines among
this node's processes), fetch.py (HTTP), readings.py (an answer parsed and normalised, with
engines/ one module per engine), metrics.py (the declarations).
"""

from lockstep.collectors.inference.collector import InferenceCollector, InferenceOptions

__all__ = ["InferenceCollector", "InferenceOptions"]
