"""Options: one frozen, validated object, passed explicitly.  Environment variables are read here and nowhere else.

Bad input fails at ``fxremat.backend(...)`` time with a message that names the option and what is allowed.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from dataclasses import dataclass
from typing import Any

from fxremat_passes import _torch_private as tp
from fxremat_passes._torch_private import offload as tp_offload
from fxremat_passes.graph.costs import PROFILES, DeviceProfile

ENV_REPORT_DIR = "FXREMAT_REPORT_DIR"
ENV_VERIFY = "FXREMAT_VERIFY"
ENV_COMPARE = "FXREMAT_COMPARE"
_TRUE_WORDS = ("1", "true", "yes", "on")
_FALSE_WORDS = ("", "0", "false", "no", "off")
# Options that change no partition, so they stay out of cache_key(): a compile cache filled with them off serves
# them on, and the reverse.
_NOT_IN_CACHE_KEY = ("report_dir", "verify")

# What a user's checkpoint regions mean (passes/choice/contract.py): a memory contract, or fxremat's costs decide.
CHECKPOINT_MODES = ("honour", "replan")
# Default price of memory, in byte-transfer times per byte kept (lambda = memory_price / bandwidth).
# 2 sits inside the range of prices that give the same cut on the example models, below the price at which narrow
# models start recomputing their matmuls, and still prices memory above its traffic (docs/DESIGN.md §4.3 and §13,
# with the sweep that chose it).
DEFAULT_MEMORY_PRICE = 2.0

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_bytes(text: str, name: str = "memory_budget") -> int:
    """'512MiB' -> 536870912, '2GB' -> 2000000000, '1024' -> 1024."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(
            f"{name}={text!r} is not a size; use a number of bytes with an optional unit "
            "(B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), e.g. '512MiB'"
        )
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def _caller_bytes(value: Any) -> int:
    """``Options.caller_bytes``: an int number of bytes >= 0, or a size string like '64MiB'."""
    if isinstance(value, str):
        return parse_bytes(value, "caller_bytes")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TypeError(f"caller_bytes must be None, an int of bytes >= 0 or a size like '64MiB'; got {value!r}")
    return value


def normalise_budget(value: Any, name: str = "memory_budget") -> float | int | None:
    """None | float fraction in [0, 1] | int bytes >= 0.  ``bool`` is rejected (True is not a budget)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError(
            f"{name} must be None, a float in [0, 1], an int number of bytes, or a size string "
            "like '512MiB'; got a bool"
        )
    if isinstance(value, float):
        if not math.isfinite(value) or not 0.0 <= value <= 1.0:
            raise ValueError(
                f"{name}={value!r}: a float budget is a fraction in [0, 1] (0 = the "
                f"{'lowest-peak' if name == 'peak_budget' else 'fewest-bytes'} plan, 1 = the default plan); for an "
                "absolute budget pass an int of bytes or a string like '512MiB'"
            )
        return value
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{name}={value!r}: an absolute budget must be >= 0 bytes")
        return value
    if isinstance(value, str):
        return parse_bytes(value, name)
    raise TypeError(
        f"{name} must be None, a float in [0, 1], an int number of bytes, or a size string like '512MiB'; "
        f"got {type(value).__name__}"
    )


def _check_solver(name: Any) -> None:
    # the solvers (and their max-flow and HiGHS code) load here, not with fxremat: a warm compile never solves
    from fxremat_passes.solver.solvers import SOLVERS

    if name not in SOLVERS:
        raise ValueError(f"solver={name!r} is not known; use one of {list(SOLVERS)}")


def _check_loss_chunks(value: Any) -> None:
    if value is None or value == "auto":
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"loss_chunks must be None, \"auto\" or an int >= 0 (the number of chunks), got {value!r}")
    if value < 0:
        raise ValueError(
            f"loss_chunks={value!r}: the number of chunks must be >= 1, or 0 to leave the loss as traced (None: "
            "chosen under a peak_budget; \"auto\": chosen from the simulated peak with or without one)"
        )


def resolve_device(value: Any) -> DeviceProfile | str:
    if isinstance(value, DeviceProfile):
        return value
    if isinstance(value, str):
        name = value.lower()
        if name == "auto" or name in PROFILES:
            return name
        if name == "calibrated":
            # Measured once per machine and cached; resolved here so that its numbers enter the cache key.
            from .calibrate import calibrate

            return calibrate("cuda" if _cuda_available() else "cpu")
        raise ValueError(
            f"device={value!r} is not a known profile; use 'auto', 'calibrated', one of {sorted(PROFILES)}, "
            "or a fxremat.DeviceProfile"
        )
    raise TypeError(
        f"device must be 'auto', a profile name {sorted(PROFILES)} or a DeviceProfile; got {type(value).__name__}"
    )


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _switch_from_environment(name: str, on: str, off: str) -> bool | None:
    """An environment switch: True for 1/true/yes/on, False for 0/false/no/off (any case), None when unset or
    empty; anything else raises, naming the variable."""
    text = os.environ.get(name, "").strip().lower()
    if not text:
        return None
    if text in _TRUE_WORDS:
        return True
    if text in _FALSE_WORDS:
        return False
    raise ValueError(f"{name}={os.environ[name]!r} is not a switch; set it to 1 ({on}) or 0 ({off}), or unset it")


def verify_from_environment() -> bool:
    """``FXREMAT_VERIFY``: on for 1/true/yes/on, off for unset, empty, 0/false/no/off (any case)."""
    return bool(_switch_from_environment(ENV_VERIFY, "verify", "do not"))


def compare_from_environment() -> bool | None:
    """``FXREMAT_COMPARE``: True for 1/true/yes/on, False for 0/false/no/off (any case), None when unset or empty
    (then ``compare_default`` follows ``report_dir``, see ``Options.create``)."""
    return _switch_from_environment(ENV_COMPARE, "compare", "do not")


@dataclass(frozen=True)
class Options:
    """Everything that changes a partition (and so is part of the compile-cache key), and two that do not
    (``report_dir``, ``verify``).

    memory_budget    None = the default plan; float in [0, 1]; int bytes; "512MiB".
    peak_budget      None; the step's peak above what it starts with (gradients included) in bytes (int or
                     "6GiB"); or a float in [0, 1] (0 = the lowest-peak candidate, 1 = the default plan's peak): the
                     plan is the fastest candidate whose simulated step peak fits (passes/choice/peak.py).  With
                     memory_budget too, both must hold.
    memory_price     byte-transfer times charged per byte kept for backward (>= 0; higher saves less).
    device           cost profile: "auto" (the graph's device: CUDA by name, else fixed CPU constants), a profile
                     name, "calibrated" (this machine, measured once and cached), or a DeviceProfile.
    solver           a name in ``fxremat_passes.solver.solvers.SOLVERS``: "mincut" (max-flow, with a budget: price
                     search + MILP refinement on small graphs) or "milp" (the exact MILP for every graph: small graphs
                     only).
    compare_default  a report-oriented run: also run PyTorch's default partitioner on a copy (the report's
                     ``baseline_*``), fxremat's memory/recompute frontier, and simulate the step's peaks for every
                     stored report (the compile-cache copy included).  Off by default: a production compile runs
                     nothing for the report.  Default: $FXREMAT_COMPARE, else on when report_dir is set (or
                     compare_budgets is asked), else off; fxremat-report and the demo pass it explicitly.
    compare_budgets  also run PyTorch with activation_memory_budget 0.5, 0.1 and 0.0 on copies, for the report's
                     memory/recompute chart (fxremat-report turns it on; costly on large graphs).  Needs the
                     comparison: asked for alone, it turns compare_default on.
    strict           raise instead of falling back to PyTorch's partitioner when a pass fails.
    report_dir       also write every report as JSON here (default: $FXREMAT_REPORT_DIR).
    verify           on each compiled graph's first call, also run it eagerly and raise FxrematVerifyError where
                     its outputs or gradients differ (fxremat/verify.py; default: $FXREMAT_VERIFY, else off).
    backward_segments  None (default): backward recomputes the forward segment by segment, from checkpoints it
                     recomputes first (passes/rewrite/segments.py), where a memory_budget leaves no plan as low as a
                     looser budget's (budget 0.0: the whole forward recomputed); True: for every plan; False: never.
    loss_chunks      None (default): under a peak_budget, each loss region (the LM head and its cross-entropy, the
                     loss returned alone) runs in the number of chunks along the tokens that the simulated step peak
                     chooses; with no peak_budget it is left as traced (choosing costs a cut per count tried and
                     compile time per chunk); "auto": chosen with no budget too (none where chunking gains little:
                     passes/choice/loss_chunks.py); an int k >= 1: in k chunks, its gradients computed in forward
                     (passes/rewrite/loss_chunks.py, docs/DESIGN.md §14); 0: left as traced.
    caller_bytes     what the code around the compiled module holds between its forward and backward, beyond the
                     outputs (an eager loss's buffers), in bytes (int or "64MiB"); None (default): estimated, where
                     no scalar output receives a gradient, as two fp32 copies of each output that does (a
                     cross-entropy's; passes/simulator/boundary.py, docs/DESIGN.md §6.1); 0 for a loss that holds
                     nothing (``.sum()``).  Part of every simulated step peak, so of ``peak_budget``'s choice.
    checkpoints      "honour" (default): with checkpoint tags in the graph, no plan saves more bytes or has a
                     higher simulated step peak than the user's plan (passes/choice/contract.py); "replan": fxremat's
                     costs decide inside the regions too (a PREFER_RECOMPUTE tag is a bias).
    offload          False (default): saved values are kept or recomputed; "plan": under peak_budget, saved
                     storages may also be offloaded to host memory where the plan is then faster within the budget
                     (docs/DESIGN.md §16); the report lists them, but the graphs keep them on the device (one
                     warning says so); True: the same plan, and the split rewritten by PyTorch's offload machinery
                     (torch 2.13 or later; not yet run on a GPU); refused with backward_segments=True.
    """

    memory_budget: float | int | None = None
    peak_budget: float | int | None = None
    memory_price: float = DEFAULT_MEMORY_PRICE
    device: DeviceProfile | str = "auto"
    solver: str = "mincut"
    compare_default: bool = False
    compare_budgets: bool = False
    strict: bool = False
    report_dir: str | None = None
    verify: bool = False
    backward_segments: bool | None = None
    checkpoints: str = "honour"
    loss_chunks: int | str | None = None
    caller_bytes: int | None = None
    offload: bool | str = False

    @classmethod
    def create(cls, **kwargs: Any) -> Options:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise TypeError(f"unknown fxremat option(s) {unknown}; allowed: {sorted(names)}")
        values = dict(kwargs)
        if "memory_budget" in values:
            values["memory_budget"] = normalise_budget(values["memory_budget"])
        if values.get("peak_budget") is not None:
            values["peak_budget"] = normalise_budget(values["peak_budget"], "peak_budget")
        if "memory_price" in values:
            price = values["memory_price"]
            if isinstance(price, bool) or not isinstance(price, (int, float)):
                raise TypeError(f"memory_price must be a number >= 0, got {type(price).__name__}")
            if not math.isfinite(price) or price < 0:
                raise ValueError(f"memory_price={price!r} must be a finite number >= 0")
            values["memory_price"] = float(price)
        if "device" in values:
            values["device"] = resolve_device(values["device"])
        if "solver" in values:
            _check_solver(values["solver"])
        if values.get("checkpoints", "honour") not in CHECKPOINT_MODES:
            raise ValueError(
                f"checkpoints={values['checkpoints']!r} is not known; use 'honour' (the user's checkpoint regions are "
                "a memory ceiling) or 'replan' (fxremat's costs decide inside them)"
            )
        if "verify" not in values:
            values["verify"] = verify_from_environment()
        for flag in ("compare_default", "compare_budgets", "strict", "verify"):
            if flag in values and not isinstance(values[flag], bool):
                raise TypeError(f"{flag} must be True or False, got {values[flag]!r}")
        if values.get("backward_segments") not in (None, True, False):
            raise TypeError(f"backward_segments must be None, True or False, got {values['backward_segments']!r}")
        _check_loss_chunks(values.get("loss_chunks"))
        _check_offload(values.get("offload", False), values.get("peak_budget"), values.get("backward_segments"))
        if values.get("caller_bytes") is not None:
            values["caller_bytes"] = _caller_bytes(values["caller_bytes"])
        if "report_dir" not in values:
            values["report_dir"] = os.environ.get(ENV_REPORT_DIR) or None
        elif values["report_dir"] is not None and not isinstance(values["report_dir"], (str, os.PathLike)):
            raise TypeError(f"report_dir must be a path or None, got {type(values['report_dir']).__name__}")
        if values.get("report_dir") is not None:
            values["report_dir"] = os.fspath(values["report_dir"])
        if "compare_default" not in values:
            # the comparison only for a report someone will read: asked for by name, or by writing reports out
            from_environment = compare_from_environment()
            values["compare_default"] = (
                from_environment
                if from_environment is not None
                else values.get("report_dir") is not None or values.get("compare_budgets") is True
            )
        return cls(**values)

    def cache_key(self) -> str:
        """Every field, in a stable text form: part of the partitioner's uuid(), so that changing any option
        never reuses a stale cached partition."""
        parts = []
        for f in dataclasses.fields(self):
            if f.name in _NOT_IN_CACHE_KEY:  # where reports go, and checking a plan, change no partition
                continue
            value = getattr(self, f.name)
            parts.append(f"{f.name}={value!r}")
        if self.memory_budget is None:  # then PyTorch's global knob, read at compile time, sets it (fxremat/knobs.py)
            parts.append(f"torch.activation_memory_budget={tp.functorch_knob('activation_memory_budget')!r}")
        return ";".join(parts)

    def profile_for(self, device_type: str | None, device_name: str | None = None) -> DeviceProfile:
        if isinstance(self.device, DeviceProfile):
            return self.device
        if self.device != "auto":
            return PROFILES[self.device]
        if device_type == "cuda" and device_name:
            lowered = device_name.lower()
            for key in ("gh200", "h200", "h100", "a100"):  # GH200 before H200: its name holds both
                if key in lowered:
                    return PROFILES[key]
            return PROFILES["h100"]
        return PROFILES["cpu"]


def _check_offload(value, peak_budget, backward_segments) -> None:
    if not (isinstance(value, bool) or value == "plan"):  # 1 would pass for True and then act as "plan"
        raise ValueError(f"offload must be False, True or 'plan', got {value!r}")
    if value and peak_budget is None:
        raise ValueError(f"offload={value!r} chooses offloads under a peak_budget only; set peak_budget too")
    if value and backward_segments:  # the partition splits the plan again, and the offloads would be lost
        raise ValueError(
            f"offload={value!r} places its copies on the plan's split as cut; backward_segments=True splits every "
            "plan again, segment by segment: leave backward_segments at None (docs/DESIGN.md §16)"
        )
    if value is True:
        reason = tp_offload.offload_unavailable() or (
            None if tp_offload.is_async() else "this torch's rewrite copies synchronously (prims.device_put)"
        )
        if reason is not None:
            raise ValueError(
                f"offload=True needs PyTorch's asynchronous offload rewrite (torch 2.13 or later): {reason}; "
                "use offload='plan' to see the plan (docs/DESIGN.md §16)"
            )
