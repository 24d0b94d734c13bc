"""The inference engines Lockstep reads: one module per engine turns its /metrics into the
normalised Readings; this table says how to recognise each engine's answer and its port.
(docs/workloads.md has the metric table.)"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from lockstep.collectors.inference.engines import dynamo, sglang, tgi, triton, vllm
from lockstep.collectors.inference.readings import Reading, Samples


@dataclass(frozen=True)
class EngineFormat:
    name: str
    title: str
    prefix: str  # every metric of the engine starts with it: the answer is this engine's
    normalise: Callable[[Samples], dict[str, Reading]]
    default_port: int
    port_flags: tuple[str, ...]  # command-line flags that set the metrics port
    # Series without the engine's prefix that its parser reads too (vLLM's API server's HTTP
    # counters, named by prometheus-fastapi-instrumentator).
    also_parsed: tuple[str, ...] = ()

    @property
    def parsed(self) -> tuple[str, ...]:
        """The name prefixes of the series to parse."""
        return (self.prefix, *self.also_parsed)


ENGINE_FORMATS = {
    e.name: e
    for e in (
        EngineFormat("vllm", "vLLM", "vllm:", vllm.normalise, 8000, ("--port",), ("http_requests_total",)),
        EngineFormat("sglang", "SGLang", "sglang:", sglang.normalise, 30000, ("--port",)),
        EngineFormat("tgi", "TGI", "tgi_", tgi.normalise, 3000, ("--port",)),
        EngineFormat("triton", "Triton (TensorRT-LLM)", "nv_", triton.normalise, 8002, ("--metrics-port",)),
        EngineFormat("dynamo", "Dynamo", "dynamo_", dynamo.normalise, 8000, ("--http-port",)),
    )
}
