"""Opt-in calibration: measure this machine's matmul FLOP/s and copy bandwidth once, cache the profile.

``fxremat.backend(device="calibrated")`` uses it.  The fixed default profiles stay the default so that the same
graph gives the same cut on every machine; a calibrated profile is part of the cache key like any other option
(its numbers, not the word "calibrated", go into ``uuid()``).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
from pathlib import Path

import torch

from fxremat_passes.graph.costs import DeviceProfile

from .measure import device_seconds

MATMUL_SIZE = 1024  # 2 GFLOP per matmul: long enough to time, short enough to run at import of a training job
COPY_BYTES = 64 * 2**20  # larger than any cache: measures memory, not L3
REPEATS = 5


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fxremat"


def _device_label(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device).replace(" ", "_")
    return f"{platform.machine()}-{platform.processor() or 'cpu'}".replace(" ", "_")


def _median_seconds(fn, device: torch.device) -> float:
    """Median seconds of ``fn`` after one warm-up run (``measure.device_seconds``: CUDA events on a GPU)."""
    samples = [device_seconds(fn, device.type) for _ in range(REPEATS + 1)]
    return statistics.median(samples[1:])  # the first run warms up


def measure(device: torch.device) -> DeviceProfile:
    a = torch.randn(MATMUL_SIZE, MATMUL_SIZE, device=device)
    b = torch.randn(MATMUL_SIZE, MATMUL_SIZE, device=device)
    flops = 2 * MATMUL_SIZE**3 / _median_seconds(lambda: a @ b, device)
    src = torch.empty(COPY_BYTES // 4, device=device)
    dst = torch.empty_like(src)
    bandwidth = 2 * COPY_BYTES / _median_seconds(lambda: dst.copy_(src), device)  # read + write
    name = f"calibrated:{_device_label(device)}"
    return DeviceProfile(name, (("default", float(flops)),), float(bandwidth))


def calibrate(
    device: str | torch.device = "cpu", *, force: bool = False, directory: Path | None = None
) -> DeviceProfile:
    """This machine's profile: read from the cache, or measured (a short matmul and a large copy) and cached."""
    device = torch.device(device)
    threads = torch.get_num_threads() if device.type == "cpu" else 0
    path = (directory or cache_dir()) / f"profile-{_device_label(device)}-t{threads}-torch{torch.__version__}.json"
    if path.exists() and not force:
        data = json.loads(path.read_text())
        return DeviceProfile(data["name"], tuple(tuple(x) for x in data["peak_flops_by_dtype"]), data["mem_bandwidth"])
    profile = measure(device)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "name": profile.name,
                "peak_flops_by_dtype": profile.peak_flops_by_dtype,
                "mem_bandwidth": profile.mem_bandwidth,
            }
        )
    )
    return profile
