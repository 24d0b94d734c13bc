"""The fake NVML's field values (``nvmlDeviceGetFieldValues``): every field a GPU has, GPU-wide
and per NVLink link, each answered with its own return code and value type, numbered as the
spec's driver numbers them.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pynvml

from lockstep.simulation.fake_nvml.capabilities import (
    BLACKWELL_NVLINK_FIELDS,
    CLOCK_EVENT_DURATION_FIELDS,
    RECOVERY_ACTIONS,
    field_names,
)
from lockstep.simulation.fake_nvml.clocks import event_seconds
from lockstep.simulation.fake_nvml.spec import GpuSpec
from lockstep.simulation.fake_nvml.state import FakeState


class FieldValues:
    """The field values of the GPUs, the requests counted per field and the failures a test set."""

    def __init__(self, state: FakeState) -> None:
        self._state = state
        self._names = field_names(state.spec.driver_version)
        # How often each field was asked for in nvmlDeviceGetFieldValues: (gpu, field name) -> count.
        self.requests: Counter[tuple[int, str]] = Counter()
        self.failures: dict[tuple[int, str], int] = {}  # (gpu, field name) -> the return code to answer with

    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: Sequence[int | tuple[int, int]]) -> Any:
        with self._state.lock:
            index, gpu = self._state.gpu(handle, "nvmlDeviceGetFieldValues")
            values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
            now_us = int(time.time() * 1e6)
            tables = self._field_tables(gpu)
            members = {
                pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
                pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
                pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
            }
            for value, requested in zip(values, field_ids):
                field_id, scope = requested if isinstance(requested, tuple) else (requested, 0)
                value.fieldId, value.scopeId, value.timestamp, value.latencyUsec = field_id, scope, now_us, 0
                value.nvmlReturn, value.valueType, number = self._field(index, field_id, scope, tables)
                if value.nvmlReturn == pynvml.NVML_SUCCESS:
                    setattr(value.value, members[value.valueType], number)
            return values

    def _field(
        self, index: int, field_id: int, scope: int, tables: tuple[dict[str, Any], ...]
    ) -> tuple[int, int, float]:
        """(nvmlReturn, valueType, value) of one field."""
        device, link_up, link_down = tables
        name = self._names.get(field_id)
        self.requests[(index, name or str(field_id))] += 1
        failure = self.failures.get((index, name or str(field_id)))
        if failure is not None:
            return failure, 0, 0
        if name is None or name in self._state.unsupported[index]:
            return pynvml.NVML_ERROR_NOT_SUPPORTED, 0, 0
        if name in device:
            return (pynvml.NVML_SUCCESS, *device[name])
        if name not in link_up:
            return pynvml.NVML_ERROR_NOT_SUPPORTED, 0, 0
        if not 0 <= scope < self._state.spec.gpus[index].nvlink_links:  # per-link fields: scopeId is the link
            return pynvml.NVML_ERROR_INVALID_ARGUMENT, 0, 0
        table = link_down if scope in self._state.spec.gpus[index].nvlink_down else link_up
        return (pynvml.NVML_SUCCESS, *table[name])

    def _field_tables(self, gpu: GpuSpec) -> tuple[dict[str, Any], ...]:
        """Every field's (valueType, value) now: GPU-wide, and per link for an up and a down link."""
        since_load = self._state.since_load
        ull, uint = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
        links = gpu.nvlink_links
        errors = gpu.nvlink_errors
        device: dict[str, tuple[int, float]] = {
            "NVML_FI_DEV_ECC_SBE_VOL_TOTAL": (ull, gpu.ecc_corrected),
            "NVML_FI_DEV_ECC_DBE_VOL_TOTAL": (ull, gpu.ecc_uncorrected),
            "NVML_FI_DEV_ECC_SBE_AGG_TOTAL": (ull, gpu.ecc_aggregate_corrected + gpu.ecc_corrected),
            "NVML_FI_DEV_ECC_DBE_AGG_TOTAL": (ull, gpu.ecc_aggregate_uncorrected + gpu.ecc_uncorrected),
            "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION": (uint, RECOVERY_ACTIONS[gpu.recovery_action]),
            "NVML_FI_DEV_RETIRED_SBE": (ull, gpu.retired_pages_single_bit),
            "NVML_FI_DEV_RETIRED_DBE": (ull, gpu.retired_pages_double_bit),
            "NVML_FI_DEV_RETIRED_PENDING": (ull, int(gpu.retired_pages_pending)),
            "NVML_FI_DEV_REMAPPED_COR": (uint, gpu.remapped_rows_correctable),
            "NVML_FI_DEV_REMAPPED_UNC": (uint, gpu.remapped_rows_uncorrectable),
            "NVML_FI_DEV_REMAPPED_PENDING": (uint, int(gpu.remapped_rows_pending)),
            "NVML_FI_DEV_REMAPPED_FAILURE": (uint, int(gpu.remapped_rows_failed)),
            "NVML_FI_DEV_MEMORY_TEMP": (uint, gpu.memory_temperature_celsius),
            "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION": (ull, since_load(gpu, gpu.power_watts) * 1000),  # mJ
            "NVML_FI_DEV_PCIE_REPLAY_COUNTER": (ull, gpu.pcie_replays),
            "NVML_FI_DEV_PCIE_COUNT_TX_BYTES": (
                ull,
                since_load(gpu, gpu.pcie_transmitted_bytes_per_second),
            ),
            "NVML_FI_DEV_PCIE_COUNT_RX_BYTES": (ull, since_load(gpu, gpu.pcie_received_bytes_per_second)),
            "NVML_FI_DEV_NVLINK_LINK_COUNT": (uint, links),
            "NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": (ull, links * errors.get("crc_flit", 0)),
            "NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": (ull, links * errors.get("crc_data", 0)),
            "NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": (ull, links * errors.get("replay", 0)),
            "NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": (ull, links * errors.get("recovery", 0)),
        }
        for reason, reason_field in CLOCK_EVENT_DURATION_FIELDS.items():
            device[reason_field] = (ull, event_seconds(gpu, reason, self._state.t) * 1e9)  # nanoseconds
        link_up: dict[str, tuple[int, float]] = {
            "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX": (
                ull,
                since_load(gpu, gpu.nvlink_transmitted_bytes_per_second) / 1024,
            ),
            "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX": (
                ull,
                since_load(gpu, gpu.nvlink_received_bytes_per_second) / 1024,
            ),
            "NVML_FI_DEV_NVLINK_GET_STATE": (uint, pynvml.NVML_NVLINK_STATE_ACTIVE),
            "NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY": (ull, errors.get("replay", 0)),
            "NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY": (ull, errors.get("recovery", 0)),
            "NVML_FI_DEV_NVLINK_ERROR_DL_CRC": (ull, errors.get("crc_flit", 0)),
        }
        for counter, counter_field in BLACKWELL_NVLINK_FIELDS.items():
            link_up[counter_field] = (ull, gpu.nvlink_counters.get(counter, 0))
        link_down = {
            **link_up,
            "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX": (ull, 0),  # a down link carried nothing (in this fake)
            "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX": (ull, 0),
            "NVML_FI_DEV_NVLINK_GET_STATE": (uint, pynvml.NVML_NVLINK_STATE_INACTIVE),
        }
        rounded = tuple(
            {name: (kind, round(number)) for name, (kind, number) in t.items()} for t in (device, link_up, link_down)
        )
        return rounded
