"""The dependencies a collector reads through, which the simulated node and tests may replace.

Every replaceable dependency is one typed field of ``Seams``.  ``None`` means "the real one"
(pynvml, the real ``scontrol``, the kubelet's socket, ...): the collector that owns the
dependency picks its real implementation, so this module imports no collector.  The class
has ``__slots__``: a misspelt seam (``seams.statfs = ...``) raises ``AttributeError``, and
``Seams(statfs=...)`` raises ``TypeError``, instead of silently leaving the real dependency
in place.  In production ``CollectorContext.seams`` is ``Seams()``: nothing replaced.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # types only: importing them would load grpc/ctypes code for every collector
    from lockstep.collectors.ethtool import StatsReader
    from lockstep.collectors.gpu.provider import NvmlProvider
    from lockstep.collectors.podresources.api_pb2 import ListPodResourcesResponse


@dataclass(slots=True)
class Seams:
    # The pynvml functions the GPU collector calls (collectors/gpu/provider.py): the fake NVML
    # of the simulated node, the tests and ``--gpu.fake-nvml`` (simulation/fake_nvml/); pynvml when None.
    nvml: NvmlProvider | None = None
    # Seconds since the epoch, for timestamps the collectors export (time.time when None).
    wall_clock: Callable[[], float] | None = None
    # ``scontrol ARGS`` with a timeout in seconds -> its stdout; raises OSError or
    # subprocess.CalledProcessError like the real one (collectors/slurm/scontrol.py run_scontrol).
    scontrol: Callable[[list[str], float], str] | None = None
    # The kubelet's pod-resources List call with a timeout in seconds.
    kubelet_pod_resources: Callable[[float], ListPodResourcesResponse] | None = None
    # A NIC's driver info and ethtool statistics (the SIOCETHTOOL ioctl when None).
    ethtool: StatsReader | None = None
    # GET URL with a timeout in seconds -> the body; raises OSError (lockstep.collectors.inference.fetch.fetch_http).
    inference_http: Callable[[str, float], str] | None = None
    # statvfs(mountpoint) for the filesystem collector (os.statvfs when None).
    statvfs: Callable[[str], os.statvfs_result] | None = None
    # The monotonic timer that measures how long a statfs took (time.perf_counter when None).
    stat_timer: Callable[[], float] | None = None
