"""Kernels Inductor generates for one model's first training step, and how many distinct C++ kernels it compiles.

    TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 python benchmarks/kernel_count.py MODEL CONFIG [--dump DIR]

CONFIG: ``inductor`` (Inductor with PyTorch's default partitioner) or ``fxremat`` (its defaults).  One process per
run, caches off (issue #16's counts are load-independent; its times are taken by ``compile_time.py``).  Prints one
JSON line: loop nests (``torch._inductor.metrics.generated_kernel_count``) of forward and backward, the distinct
C++ kernel sources handed to ``AsyncCompile.cpp_pybinding`` (one g++ compile each: what a cold compile pays for),
fxremat's saved bytes and saved node names.  ``--dump DIR`` writes each distinct kernel's source there, named by
its hash, with the phase (fw/bw) that first compiled it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("config", choices=("inductor", "fxremat"))
    parser.add_argument("--size", default="small")
    parser.add_argument("--dump", default=None)
    args = parser.parse_args(argv)
    import torch
    from bench_models import build_workload
    from torch._inductor import async_compile, metrics

    torch.set_num_threads(1)
    sources: dict[str, str] = {}
    phase = ["fw"]
    original = async_compile.AsyncCompile.cpp_pybinding

    def recording(self, argtypes, source_code):
        key = hashlib.sha256(source_code.encode()).hexdigest()[:12]
        if key not in sources:
            sources[key] = phase[0]
            if args.dump:
                Path(args.dump).mkdir(parents=True, exist_ok=True)
                Path(args.dump, f"{phase[0]}_{key}.cpp").write_text(source_code)
        return original(self, argtypes, source_code)

    async_compile.AsyncCompile.cpp_pybinding = recording
    work = build_workload(args.model, args.size)
    if args.config == "fxremat":
        import fxremat

        backend = fxremat.backend()
    else:
        backend = "inductor"
    metrics.reset()
    compiled = torch.compile(work.model, backend=backend)
    out = compiled(*work.inputs) if not hasattr(work, "forward") else work.forward(compiled)
    fw = metrics.generated_kernel_count
    phase[0] = "bw"
    work.loss(out).backward()
    bw = metrics.generated_kernel_count - fw
    row = dict(model=args.model, config=args.config, kernels_fw=fw, kernels_bw=bw, kernels=fw + bw)
    row["cpp_distinct"] = len(sources)
    row["cpp_fw"] = sum(p == "fw" for p in sources.values())
    row["cpp_bw"] = sum(p == "bw" for p in sources.values())
    reports = getattr(backend, "reports", None)
    if reports:
        row["saved_bytes"] = [r.saved_bytes for r in reports]
        row["saved"] = [sorted(s.name for s in r.saved) for r in reports]
    print(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
