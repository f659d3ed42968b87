"""The GPU check's recording files (``gpu_check.py``), and reading them back (``gpu_replay.py``).

A recording folder holds ``index.json`` (the run: environment, every row measured) and one folder per model
(two folders deep at most) with, gzip-compressed JSON:
  - ``<config>.json.gz``: what was measured (peak, steps, gradients), the allocator's timeline of the peak step
    (``reduce_snapshot``), and per joint graph what ``fxremat.recording`` recorded (the partition request, the
    config, profile and simulator inputs, the plan, fxremat's report, Inductor's kernels in order), the graph itself
    by file name;
  - ``joint-<sha>.json.gz``: a joint graph (``fxremat.graph_record``), written once per content: the
    configurations of one model partition the same joint graph.
Each file stays under ``FILE_LIMIT``; ``folder_bytes`` sums a folder for the committed total.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import linecache
import re
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
FILE_LIMIT = 16 * 2**20
TOTAL_LIMIT = 10 * 2**20  # committed recordings, all of them
INDEX = "index.json"
_ALLOCATION = re.compile(r"\s*(\w+)\s*=\s*empty_strided")


def write_gz(path: Path, data: Any) -> int:
    """``data`` as compact gzip-compressed JSON; its size, refused above ``FILE_LIMIT``."""
    raw = gzip.compress(json.dumps(data, separators=(",", ":"), default=str).encode(), mtime=0)
    if len(raw) > FILE_LIMIT:
        raise ValueError(f"{path.name}: {len(raw):,} bytes compressed, over the {FILE_LIMIT:,} a recording may hold")
    path.write_bytes(raw)
    return len(raw)


def read_gz(path: Path) -> Any:
    return json.loads(gzip.decompress(path.read_bytes()))


def write_config(folder: Path, model: str, config: str, recorded: dict, measured: dict) -> Path:
    """One configuration's file, its joint graphs apart (``joint-<sha>.json.gz``, once each)."""
    model_dir = folder / model
    model_dir.mkdir(parents=True, exist_ok=True)
    graphs = []
    for entry in recorded.get("graphs", []):
        entry = dict(entry)
        joint = entry.pop("joint", None)
        if joint is not None:
            text = json.dumps(joint, sort_keys=True, separators=(",", ":"))
            name = f"joint-{hashlib.sha256(text.encode()).hexdigest()[:16]}.json.gz"
            if not (model_dir / name).exists():
                write_gz(model_dir / name, joint)
            entry["joint_file"] = name
        graphs.append(entry)
    path = model_dir / f"{config}.json.gz"
    data = dict(schema_version=SCHEMA_VERSION, model=model, config=config, measured=measured, graphs=graphs)
    data["unattached_schedules"] = recorded.get("unattached_schedules", [])
    write_gz(path, data)
    return path


def read_configs(folder: Path) -> list[tuple[Path, dict]]:
    """Every configuration file of a recording folder, in name order, read."""
    paths = sorted(p for p in Path(folder).glob("*/*.json.gz") if not p.name.startswith("joint-"))
    return [(path, read_gz(path)) for path in paths]


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())


def reduce_snapshot(snapshot: dict, device: int = 0) -> dict[str, Any]:
    """The CUDA allocator's history (``torch.cuda.memory._snapshot()`` after ``_record_memory_history``) as a
    small timeline: per allocation and completed free, (``a``/``f``, the address's slot, bytes, the buffer Inductor's
    generated code named, the generated module by order of first appearance: 0 forward, 1 backward), and the peak of
    the running total above the start."""
    traces = snapshot.get("device_traces") or []
    events = traces[device] if device < len(traces) else []
    slots: dict[int, int] = {}
    modules: dict[str, int] = {}
    rows, total, peak = [], 0, 0
    for event in events:
        action = event.get("action")
        if action not in ("alloc", "free_completed"):
            continue
        slot = slots.setdefault(event["addr"], len(slots))
        size = int(event["size"])
        buffer, module = _generated_line(event.get("frames") or (), modules) if action == "alloc" else (None, None)
        rows.append([action[0], slot, size, buffer, module])
        total += size if action == "alloc" else -size
        peak = max(peak, total)
    return dict(
        columns=["action (a: alloc, f: free)", "address slot", "bytes", "buffer", "generated module"],
        events=rows,
        peak_bytes=peak,
        modules=list(modules),
    )


def _generated_line(frames, modules: dict[str, int]) -> tuple[str | None, int | None]:
    """(the buffer an allocation made, as Inductor's generated code names it; which generated module), from the
    innermost frame in the ``call`` of a module Inductor wrote, or (None, None): autograd's own allocations."""
    for frame in frames:
        filename = frame.get("filename", "")
        if frame.get("name") != "call":
            continue
        line = linecache.getline(filename, int(frame.get("line", 0)))
        if not line:
            continue
        module = modules.setdefault(Path(filename).name, len(modules))
        match = _ALLOCATION.match(line)
        return (match.group(1) if match else line.strip()[:80]), module
    return None, None
