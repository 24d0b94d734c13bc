"""A fake NVML: the part of pynvml's surface the GPU collector uses, driven by a spec.

NVML has no simulator and needs a GPU, so the collector's tests, ``lockstep demo`` and
``lockstep run/once --gpu.fake-nvml SPEC`` use this instead.  It is faithful where the
collector depends on NVML's behaviour:

- it raises pynvml's own exception classes (``pynvml.NVMLError_NotSupported``,
  ``NVMLError_GpuIsLost``, ``NVMLError_Timeout``, ``NVMLError_Uninitialized``, ...);
- it returns pynvml's own structures where the collector reads them: device handles are
  real ``c_nvmlDevice_t`` pointers, ``nvmlDeviceGetFieldValues`` returns an array of
  ``c_nvmlFieldValue_t`` with each field's own ``nvmlReturn`` and ``valueType``, events
  are ``c_nvmlEventData_t``, PCI info is ``nvmlPciInfo_t``, processes are pynvml's
  friendly objects (``usedGpuMemory`` None when not available);
- ``nvmlInit``/``nvmlShutdown`` are reference counted, and every call outside an
  initialised session raises ``NVMLError_Uninitialized``;
- XID events reach an event set only if they happen after the GPU was registered in it
  (events before registration are lost, as with NVML); a wait with
  nothing to deliver raises ``NVMLError_Timeout``; a set with a lost GPU raises
  ``NVMLError_GpuIsLost`` from the wait;
- a lost GPU (fallen off the bus) raises ``NVMLError_GpuIsLost`` from every call,
  including ``nvmlDeviceGetHandleByIndex``, while ``nvmlDeviceGetCount`` still counts it.

Values are a pure function of the spec and the fake's time ``t`` (seconds): counters grow
with ``t`` at the rates the spec gives.  The time comes from ``set_time`` (the simulated
node) or, with ``real_time=True``, from the seconds since the fake was made.

Every call is counted per GPU in ``calls`` (``(function, gpu_index)`` -> count; the
index is None for calls that concern no GPU), so tests can assert that an unsupported call
was made once and the benchmark can report calls per GPU per round.

The spec format is documented in docs/gpu.md.  ``load_spec(path)`` reads a YAML file and
``parse_spec(data)`` a mapping; both raise ``FakeSpecError`` naming what is wrong and where.

One job per module:

- ``capabilities``: what each architecture and consumer GPUs lack, the names a spec uses,
  how a driver numbers the fields, the constants answers are built from;
- ``spec``: the spec model (``FakeSpec``, ``GpuSpec``, ...); ``spec_yaml``: reading and
  checking it from YAML;
- ``state``: the state every area shares, and the gate each call passes (``FakeState.enter``);
- ``library``: ``FakeNvml``, made of one part per area: ``devices``, ``measurements``,
  ``processes``, ``fields``, ``gpm``, ``mig``, ``events`` (with ``clocks``, the clock event
  reasons over time);
- ``from_spec_file``: the fake of ``--gpu.fake-nvml SPEC``, the one function agent/cli.py
  calls into this package.
"""

from lockstep.simulation.fake_nvml.capabilities import (
    MIB,
    PROCESS_SAMPLE_PERIOD_US,
    PROCESS_SAMPLES_EPOCH_US,
    field_names,
)
from lockstep.simulation.fake_nvml.library import FakeNvml, fake_from_gpus, from_spec_file
from lockstep.simulation.fake_nvml.spec import (
    FakeSpec,
    FakeSpecError,
    GpuSpec,
    MigDeviceSpec,
    ProcessSpec,
    XidEventSpec,
    default_pci_bus_id,
    default_uuid,
    with_defaults,
)
from lockstep.simulation.fake_nvml.spec_yaml import load_spec, parse_spec

__all__ = [
    "MIB",
    "PROCESS_SAMPLES_EPOCH_US",
    "PROCESS_SAMPLE_PERIOD_US",
    "FakeNvml",
    "FakeSpec",
    "FakeSpecError",
    "GpuSpec",
    "MigDeviceSpec",
    "ProcessSpec",
    "XidEventSpec",
    "default_pci_bus_id",
    "default_uuid",
    "fake_from_gpus",
    "field_names",
    "from_spec_file",
    "load_spec",
    "parse_spec",
    "with_defaults",
]
