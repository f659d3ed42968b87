"""Distributed training with fxremat's partitioner: 2 gloo processes on this machine (torch.multiprocessing.spawn).

One spawn runs every scenario in the same two workers (starting a worker and importing torch is most of the cost
here) and writes what each rank saw to a file; the tests read those files.  Each scenario catches its own exception,
so one failure does not hide the others; the process group is always destroyed.

- DDP: a model compiled with fxremat (Dynamo + AOTAutograd, no-op compilers), each rank on half the batch: losses
  and the averaged gradients equal one process on the whole batch.
- A functional collective inside forward (``_functional_collectives.all_reduce``): never recomputed, even at a
  price that recomputes everything else, and the results equal eager.
- FSDP2 (``fully_shard``) on CPU with gloo, each block compiled with fxremat: full gradients equal one process on
  the whole batch.
"""

from __future__ import annotations

import copy
import datetime
import os
import socket
import tempfile
import time
import traceback
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from robust_helpers import FP32_RTOL, close_scaled

pytestmark = pytest.mark.distributed

WORLD = 2
BATCH = 8  # the whole batch; each rank gets BATCH // WORLD rows
TIMEOUT_S = 55  # each distributed test must finish in < 60 s
# ... but the Inductor scenario: two workers each run a cold C++ compile at once on the CI's 2 cores (measured alone:
# ~55 s on torch 2.13, 75 s on 2.11; over 55 s at load >= 8)
INDUCTOR_TIMEOUT_S = 180


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MLP(nn.Module):
    def __init__(self, dim: int = 16):
        super().__init__()
        self.fc1, self.fc2, self.norm = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim), nn.LayerNorm(dim)

    def forward(self, x):
        return self.norm(self.fc2(F.gelu(self.fc1(x))))


class WithCollective(nn.Module):
    """s = all_reduce(x) (x needs no grad), then tanh(fc1(x)) * s: backward needs s.  Recomputing s from x would be
    the cheapest way to keep fewer bytes, and would run the collective again (a hang if ranks decide differently)."""

    def __init__(self, dim: int = 16):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, dim), nn.Linear(dim, dim)

    def forward(self, x):
        import torch.distributed._functional_collectives as funcol

        s = funcol.all_reduce(x * 0.5, "sum", dist.group.WORLD)
        return self.fc2(torch.tanh(self.fc1(x)) * s)


def _batch():
    generator = torch.Generator().manual_seed(123)
    return torch.randn(BATCH, 16, generator=generator)


def _loss(out):
    return out.square().mean()


def _grads(named) -> dict:
    return {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).detach().clone() for n, p in named}


def _aot_backend(reports, **options):
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    import fxremat
    from fxremat.options import Options

    def nop(gm, example_inputs):
        return make_boxed_func(gm.forward)

    partition_fn = fxremat.make_partition_fn(Options.create(strict=True, **options), reports)
    return aot_autograd(fw_compiler=nop, bw_compiler=nop, partition_fn=partition_fn)


def _reference(model, batch):
    """One process, the whole batch, eager."""
    model = copy.deepcopy(model)
    loss = _loss(model(batch))
    loss.backward()
    return loss.item(), _grads(model.named_parameters())


def _shard(batch, rank):
    rows = BATCH // WORLD
    return batch[rank * rows : (rank + 1) * rows]


def scenario_ddp(rank):
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model, batch = MLP(), _batch()
    expected_loss, expected_grads = _reference(model, batch)
    reports: list = []
    ddp = DDP(copy.deepcopy(model))
    compiled = torch.compile(ddp, backend=_aot_backend(reports))
    loss = _loss(compiled(_shard(batch, rank)))
    loss.backward()
    losses = [torch.zeros(()) for _ in range(WORLD)]
    dist.all_gather(losses, loss.detach())
    return dict(
        mean_loss=sum(x.item() for x in losses) / WORLD,
        expected_loss=expected_loss,
        grads=_grads(ddp.module.named_parameters()),
        expected_grads=expected_grads,
        reports=[r.to_dict() for r in reports],
    )


def scenario_collective(rank):
    results = {}
    torch.manual_seed(0)
    model = WithCollective()
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(rank))  # different data per rank
    eager = copy.deepcopy(model)
    expected_out = eager(x)
    _loss(expected_out).backward()
    for label, options in {"price 1e6": dict(memory_price=1e6), "budget 0": dict(memory_budget=0.0)}.items():
        torch._dynamo.reset()
        reports: list = []
        mine = copy.deepcopy(model)
        out = torch.compile(mine, backend=_aot_backend(reports, **options))(x)
        _loss(out).backward()
        results[label] = dict(
            out=out.detach(),
            grads=_grads(mine.named_parameters()),
            reports=[r.to_dict() for r in reports],
        )
    results["expected_out"] = expected_out.detach()
    results["expected_grads"] = _grads(eager.named_parameters())
    return results


def scenario_fsdp2(rank):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model, batch = nn.Sequential(MLP(), MLP()), _batch()
    expected_loss, expected_grads = _reference(model, batch)
    try:  # can this torch run FSDP2 on CPU/gloo at all?  (an eager step, no fxremat involved)
        mesh = init_device_mesh("cpu", (WORLD,))
        probe = copy.deepcopy(model)
        for block in probe:
            fully_shard(block, mesh=mesh)
        fully_shard(probe, mesh=mesh)
        _loss(probe(_shard(batch, rank))).backward()
    except Exception as error:
        return dict(unsupported=f"{type(error).__name__}: {error}")
    sharded, reports = copy.deepcopy(model), []
    for block in sharded:
        # each block compiled (what torchtitan does); FSDP's all-gather/reduce-scatter hooks run around it
        block.compile(backend=_aot_backend(reports))
        fully_shard(block, mesh=mesh)
    fully_shard(sharded, mesh=mesh)
    loss = _loss(sharded(_shard(batch, rank)))
    loss.backward()  # FSDP averages the reduce-scattered gradients over ranks, as DDP does
    losses = [torch.zeros(()) for _ in range(WORLD)]
    dist.all_gather(losses, loss.detach())
    return dict(
        mean_loss=sum(x.item() for x in losses) / WORLD,
        expected_loss=expected_loss,
        grads=_grads(sharded.named_parameters()),
        expected_grads=expected_grads,
        reports=[r.to_dict() for r in reports],
    )


def scenario_collective_inductor(rank):
    """The same model through real Inductor (fxremat's backend): the collective survives codegen unrecomputed."""
    from fxremat.backend import backend_from_compile_args

    torch.manual_seed(0)
    model = WithCollective()
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(rank))
    eager = copy.deepcopy(model)
    expected_out = eager(x)
    _loss(expected_out).backward()
    # compile_threads=1: no pool of compile workers per rank (two ranks share 2 cores)
    backend = backend_from_compile_args(options=dict(strict=True, memory_price=1e6, compile_threads=1))
    out = torch.compile(model, backend=backend)(x)
    _loss(out).backward()
    return dict(
        out=out.detach(),
        grads=_grads(model.named_parameters()),
        expected_out=expected_out.detach(),
        expected_grads=_grads(eager.named_parameters()),
        reports=[r.to_dict() for r in backend.reports],
    )


SCENARIOS = {"ddp": scenario_ddp, "collective": scenario_collective, "fsdp2": scenario_fsdp2}
INDUCTOR_SCENARIOS = {"collective_inductor": scenario_collective_inductor}


def _worker(rank: int, port: int, out_dir: str, names: tuple[str, ...]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)  # two processes on a 2-core machine
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=30))
    try:
        for name in names:
            scenario = {**SCENARIOS, **INDUCTOR_SCENARIOS}[name]
            start = time.perf_counter()
            try:
                result = dict(ok=True, value=scenario(rank))
            except Exception as error:  # recorded for the test to report (or skip on, for FSDP2)
                result = dict(ok=False, error=f"{type(error).__name__}: {error}", trace=traceback.format_exc())
            result["seconds"] = time.perf_counter() - start
            torch.save(result, Path(out_dir) / f"{name}-{rank}.pt")
            dist.barrier()  # the next scenario starts on both ranks together
    finally:
        dist.destroy_process_group()


def _load(path: Path) -> dict:
    if not path.exists():
        return dict(ok=False, error="the worker wrote no result (it died first?)", trace="")
    return torch.load(path, weights_only=False)


def _spawn(names, timeout_s: float = TIMEOUT_S) -> dict:
    """Run the named scenarios in 2 fresh workers; kill them if they overrun ``timeout_s``."""
    out_dir = tempfile.mkdtemp(prefix="fxremat-dist-")
    start = time.perf_counter()
    context = mp.start_processes(
        _worker, args=(_free_port(), out_dir, tuple(names)), nprocs=WORLD, join=False, start_method="spawn"
    )
    try:
        while not context.join(timeout=max(1.0, timeout_s - (time.perf_counter() - start))):
            if time.perf_counter() - start > timeout_s:
                pytest.fail(f"distributed workers still running after {timeout_s} s")
    finally:
        for process in context.processes:  # never leave a worker behind
            if process.is_alive():
                process.kill()
    results = {n: [_load(Path(out_dir) / f"{n}-{r}.pt") for r in range(WORLD)] for n in names}
    results["seconds"] = time.perf_counter() - start
    return results


@pytest.fixture(scope="module")
def results():
    return _spawn(SCENARIOS)


def _value(results, name, rank):
    result = results[name][rank]
    assert result["ok"], f"{name} on rank {rank}: {result['error']}\n{result['trace']}"
    return result["value"]


def _assert_grads(actual: dict, expected: dict, what: str) -> None:
    assert set(actual) == set(expected), (sorted(actual), sorted(expected))
    bad = {n: e for n in expected if (e := close_scaled(actual[n], expected[n], FP32_RTOL)) is not None}
    assert not bad, f"{what}: {bad}"


def test_ddp_matches_one_process_on_the_whole_batch(results):
    for rank in range(WORLD):
        value = _value(results, "ddp", rank)
        assert abs(value["mean_loss"] - value["expected_loss"]) <= FP32_RTOL * abs(value["expected_loss"])
        _assert_grads(value["grads"], value["expected_grads"], f"DDP rank {rank}")
        assert value["reports"] and all(r["fallback_reason"] is None for r in value["reports"])


def test_functional_collective_is_never_recomputed(results):
    for rank in range(WORLD):
        value = _value(results, "collective", rank)
        for label in ("price 1e6", "budget 0"):
            run = value[label]
            assert close_scaled(run["out"], value["expected_out"], FP32_RTOL) is None, (rank, label)
            _assert_grads(run["grads"], value["expected_grads"], f"rank {rank} {label}")
            (report,) = run["reports"]
            ops = {row["op"] for row in report["recomputed"]}
            assert not {op for op in ops if "c10d" in op}, (label, ops)
            reasons = dict(report["never_recomputed"])
            assert any("collective" in reason for reason in reasons), reasons
            # not vacuous: at this price everything else that can be recomputed is
            assert ops, "nothing recomputed at all"


def test_fsdp2_matches_one_process_on_the_whole_batch(results):
    for rank in range(WORLD):
        value = _value(results, "fsdp2", rank)
        if "unsupported" in value:  # eager FSDP2 itself failed: the exception is the reason
            pytest.skip(f"FSDP2 on CPU/gloo does not work with torch {torch.__version__}: {value['unsupported']}")
        assert abs(value["mean_loss"] - value["expected_loss"]) <= FP32_RTOL * abs(value["expected_loss"])
        _assert_grads(value["grads"], value["expected_grads"], f"FSDP2 rank {rank}")
        assert len(value["reports"]) == 2, "one partition per compiled block"
        assert all(r["fallback_reason"] is None for r in value["reports"])


def test_distributed_scenarios_fit_the_time_budget(results):
    assert results["seconds"] < TIMEOUT_S


@pytest.mark.inductor
def test_functional_collective_through_inductor():
    results = _spawn(INDUCTOR_SCENARIOS, INDUCTOR_TIMEOUT_S)
    for rank in range(WORLD):
        value = _value(results, "collective_inductor", rank)
        assert close_scaled(value["out"], value["expected_out"], FP32_RTOL) is None
        _assert_grads(value["grads"], value["expected_grads"], f"Inductor rank {rank}")
        (report,) = value["reports"]
        assert not {row["op"] for row in report["recomputed"] if "c10d" in row["op"]}
        assert any("collective" in reason for reason, _ in report["never_recomputed"])
    assert results["seconds"] < INDUCTOR_TIMEOUT_S
