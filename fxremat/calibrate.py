"""Opt-in calibration: measure this machine's matmul FLOP/s and copy bandwidth once, cache the profile.

``fxremat.backend(device="calibrated")`` uses it.  The matmul-class kernels' shape model (``GemmModel``,
docs/DESIGN.md §4.2) is fitted from two matmuls of one output and different depths.  The fixed default profiles
stay the default so that the same graph gives the same cut on every machine; a calibrated profile is part of the
cache key like any other option (its numbers, not the word "calibrated", go into ``uuid()``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import statistics
from pathlib import Path

import torch

from fxremat_passes.graph.costs import PROFILES, DeviceProfile
from fxremat_passes.graph.gemm_rates import GemmModel

from .measure import device_seconds

MATMUL_SIZE = 1024  # 2 GFLOP per matmul: long enough to time, short enough to run at import of a training job
COPY_BYTES = 64 * 2**20  # larger than any cache: measures memory, not L3
REPEATS = 5
# The GEMM depths timed to fit ``GemmModel.depth_half`` (docs/DESIGN.md §4.2): the square matmul above and a shallow
# one of the same output, 1/8 as deep.
SHALLOW_DEPTH = MATMUL_SIZE // 8


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


def _matmul_flops(device: torch.device, depth: int, dtype: torch.dtype) -> float:
    a = torch.randn(MATMUL_SIZE, depth, device=device, dtype=dtype)
    b = torch.randn(depth, MATMUL_SIZE, device=device, dtype=dtype)
    return 2 * MATMUL_SIZE**2 * depth / _median_seconds(lambda: a @ b, device)


def fit_depth_half(deep_flops: float, shallow_flops: float, deep: int = MATMUL_SIZE, shallow: int = SHALLOW_DEPTH):
    """``GemmModel.depth_half`` from two GEMMs of one output and depths ``deep`` > ``shallow``: the ``h`` with
    ``shallow_rate / deep_rate = [shallow / (shallow + h)] / [deep / (deep + h)]``; 0 where the shallow one was no
    slower, and at most ``deep`` (timing noise must not make every GEMM look shallow)."""
    q = shallow_flops / deep_flops
    if q >= 1:
        return 0.0
    if q <= shallow / deep:
        return float(deep)
    return min(float(deep), deep * shallow * (q - 1) / (shallow - q * deep))


def measure(device: torch.device) -> DeviceProfile:
    flops = _matmul_flops(device, MATMUL_SIZE, torch.float32)
    src = torch.empty(COPY_BYTES // 4, device=device)
    dst = torch.empty_like(src)
    bandwidth = 2 * COPY_BYTES / _median_seconds(lambda: dst.copy_(src), device)  # read + write
    name = f"calibrated:{_device_label(device)}"
    rates = [("default", float(flops))]
    if device.type == "cuda":  # the tensor cores' rate, and the model's shape terms from the device
        gemm_dtype = torch.bfloat16
        deep = _matmul_flops(device, MATMUL_SIZE, gemm_dtype)
        rates.append(("bfloat16", float(deep)))
        units, tile = torch.cuda.get_device_properties(device).multi_processor_count, 128
        attention = PROFILES["h100"].gemm.attention_efficiency  # not measured here: Hopper's (costs.py)
    else:
        gemm_dtype, deep, units, tile, attention = torch.float32, flops, 1, 1, 1.0
    depth_half = fit_depth_half(deep, _matmul_flops(device, SHALLOW_DEPTH, gemm_dtype))
    gemm = GemmModel(tuple(rates), depth_half, units=units, tile=tile, attention_efficiency=attention)
    return DeviceProfile(name, tuple(rates), float(bandwidth), gemm)


def calibrate(
    device: str | torch.device = "cpu", *, force: bool = False, directory: Path | None = None
) -> DeviceProfile:
    """This machine's profile: read from the cache, or measured (a short matmul and a large copy) and cached."""
    device = torch.device(device)
    threads = torch.get_num_threads() if device.type == "cpu" else 0
    path = (directory or cache_dir()) / f"profile-{_device_label(device)}-t{threads}-torch{torch.__version__}.json"
    if path.exists() and not force:
        data = json.loads(path.read_text())
        gemm = data.get("gemm")  # absent from a profile cached before the shape model
        if gemm is not None:
            gemm = GemmModel(**{**gemm, "rate_by_dtype": tuple(tuple(x) for x in gemm["rate_by_dtype"])})
        peaks = tuple(tuple(x) for x in data["peak_flops_by_dtype"])
        return DeviceProfile(data["name"], peaks, data["mem_bandwidth"], gemm)
    profile = measure(device)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "name": profile.name,
                "peak_flops_by_dtype": profile.peak_flops_by_dtype,
                "mem_bandwidth": profile.mem_bandwidth,
                "gemm": dataclasses.asdict(profile.gemm) if profile.gemm is not None else None,
            }
        )
    )
    return profile
