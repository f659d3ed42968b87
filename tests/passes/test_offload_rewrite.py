"""PyTorch's offload rewrite driven on fxremat's split (``_torch_private/offload.py``, docs/DESIGN.md §16), run on
CPU through ``aot_autograd``.  PyTorch's ``ao`` ops need pinned memory and a device stream, so on torch 2.13 the
rewritten graphs run with registered stand-ins of the same schemas (an identity copy each way; a wait that returns
its input, marked side-effecting as ``ao::wait_tensor`` is); torch 2.11's ``prims.device_put`` runs as it is.
Checked: the graphs' structure, the waits' and reloads' places, gradients equal eager, and (a property over random
choices) that no offloaded value is read before its reload's wait."""

from __future__ import annotations

import random
import warnings

import pytest
import torch
import torch.fx as fx
from torch.fx.node import has_side_effect

from fxremat_passes._torch_private import offload as tp_offload

pytestmark = pytest.mark.skipif(tp_offload.offload_unavailable() is not None, reason="no offload rewrite")

_lib = torch.library.Library("fxremat_standin", "DEF")
_lib.define("offload(Tensor tensor) -> Tensor")
_lib.define("reload(Tensor tensor, Device device, SymInt[] size, SymInt[] stride) -> Tensor")
_lib.define("wait_tensor(Tensor(a) tensor, Tensor? keepalive=None, Tensor? last_use_of_storage=None) -> Tensor(a)")
_lib.impl("offload", lambda t: t.clone(), "CompositeExplicitAutograd")
_lib.impl(
    "reload",
    lambda t, device, size, stride: torch.empty_strided(size, stride, dtype=t.dtype, device=device).copy_(t),
    "CompositeExplicitAutograd",
)
_lib.impl("wait_tensor", lambda t, keepalive=None, last=None: t, "CompositeExplicitAutograd")
has_side_effect(torch.ops.fxremat_standin.wait_tensor.default)


def stand_in(gm: fx.GraphModule) -> fx.GraphModule:
    """The ``ao`` ops replaced by the stand-ins (torch 2.13's rewrite)."""
    if not tp_offload.is_async():
        return gm
    ops = {
        torch.ops.ao.offload.default: torch.ops.fxremat_standin.offload.default,
        torch.ops.ao.reload.default: torch.ops.fxremat_standin.reload.default,
        torch.ops.ao.wait_tensor.default: torch.ops.fxremat_standin.wait_tensor.default,
    }
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in ops:
            node.target = ops[node.target]
    gm.recompile()
    return gm


class Mlp(torch.nn.Module):
    def __init__(self, width: int = 32, depth: int = 3):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(depth))

    def forward(self, x):
        for layer in self.layers:
            x = torch.nn.functional.gelu(layer(x)) * torch.sigmoid(x)
        return x.sum()


def compiled_step(model, x, choose, record: dict):
    """One step through ``aot_function`` with fxremat's partition, the rewrite on the values ``choose(saved)``
    picks, and the stand-ins; (loss, gradients)."""
    from functorch.compile import aot_function, make_boxed_func

    import fxremat
    from fxremat.options import Options

    inner = fxremat.make_partition_fn(Options.create(), [])

    def partition(gm, joint_inputs, **kwargs):
        fw, bw = inner(gm, joint_inputs, **kwargs)
        saved = fw.graph.output_node().args[0][kwargs["num_fwd_outputs"] :]
        names = choose([n for n in saved if isinstance(n, fx.Node) and tp_offload.refusal(n) is None])
        tp_offload.rewrite_offloads(fw, bw, names, **record.get("places", {}))
        record.update(fw=fw, bw=bw, names=names)
        return stand_in(fw), stand_in(bw)

    params = dict(model.named_parameters())

    def step(p, x):
        return torch.func.functional_call(model, p, (x,))

    noop = lambda gm, _: make_boxed_func(gm.forward)  # noqa: E731
    fn = aot_function(step, fw_compiler=noop, bw_compiler=noop, partition_fn=partition)
    p = {k: v.detach().clone().requires_grad_() for k, v in params.items()}
    loss = fn(p, x)
    loss.backward()
    return loss, {k: v.grad for k, v in p.items()}


def eager_step(model, x):
    model.zero_grad()
    loss = model(x)
    loss.backward()
    return loss, {k: v.grad for k, v in model.named_parameters()}


def read_after_wait(bw: fx.GraphModule, names: list[str]) -> None:
    """No node but the transfer ops reads an offloaded value before its reload's wait: every reader of a value's
    host copy is its reload (or that reload's wait), and every other reader reads the wait's output, after it."""
    position = {n: i for i, n in enumerate(bw.graph.nodes)}
    transfer = {"reload", "wait_tensor", "device_put"}
    for name in names:
        host = next(n for n in bw.graph.nodes if n.op == "placeholder" and n.name.endswith(name))
        for user in host.users:
            assert user.op == "call_function" and user.target.__name__.split(".")[0] in transfer, user.name
        reloaded = [u for u in host.users if u.target.__name__.split(".")[0] in ("wait_tensor", "device_put")]
        if not reloaded:  # 2.13: the wait reads the reload's output
            reloaded = [w for u in host.users for w in u.users if w.target.__name__.split(".")[0] == "wait_tensor"]
        (ready,) = reloaded
        for user in ready.users:
            assert position[user] > position[ready]
        reload = next(iter(host.users))
        if reload is not ready:  # 2.13: the reload's output is read by its wait alone
            assert list(reload.users) == [ready]


@pytest.mark.parametrize("how_many", [1, 3])
def test_offloaded_values_run_through_pytorchs_rewrite(how_many):
    torch.manual_seed(0)
    model, x = Mlp(), torch.randn(8, 32)
    record: dict = {}
    loss, grads = compiled_step(model, x, lambda saved: [n.name for n in saved][:how_many], record)
    eager_loss, eager_grads = eager_step(model, x)
    assert torch.allclose(loss, eager_loss)
    for key, grad in eager_grads.items():
        torch.testing.assert_close(grads[key], grad)
    fw, bw, names = record["fw"], record["bw"], record["names"]
    assert len(names) == how_many
    offloads = [n for n in fw.graph.nodes if n.name.startswith("cpu_offload_")]
    assert sorted(n.name.removeprefix("cpu_offload_") for n in offloads) == sorted(names)
    read_after_wait(bw, names)


@pytest.mark.skipif(not tp_offload.is_async(), reason="the ao ops' waits and reloads: torch 2.13 and later")
def test_waits_and_reloads_go_where_the_schedule_puts_them(monkeypatch):
    torch.manual_seed(0)
    model, x = Mlp(depth=4), torch.randn(8, 32)
    record: dict = {"places": {"waits": {}, "reloads": {}}}

    def choose(saved):
        name = saved[0].name
        record["places"]["waits"][name] = ""  # the forward's end
        return [name]

    def first_reader(fw, bw, name):  # the reload named its first reader: it stays where the rewrite put it
        return tp_offload.reload_precedes(next(n for n in bw.graph.nodes if n.name == name)).name

    inner = tp_offload.rewrite_offloads

    def rewrite(fw, bw, names, waits=None, reloads=None):
        record["first"] = first_reader(fw, bw, names[0])
        inner(fw, bw, names, waits, {names[0]: record["first"]})

    monkeypatch.setattr(tp_offload, "rewrite_offloads", rewrite)
    compiled_step(model, x, choose, record)
    fw, bw, (name,) = record["fw"], record["bw"], record["names"]
    order = [n.name for n in fw.graph.nodes]
    assert order[-2] == f"cpu_offload_{name}" and order[-1] == "output"
    bw_order = [n.name for n in bw.graph.nodes]
    reload = bw_order.index(f"async_gpu_reload_{name}")
    assert bw_order[reload + 1 : reload + 3] == [f"gpu_reload_{name}", record["first"]]
    monkeypatch.undo()
    with pytest.raises(ValueError, match="cannot offload"):
        tp_offload.rewrite_offloads(fw, bw, ["no_such_value"])


def test_no_offloaded_value_is_read_before_its_reload_wait_property():
    for seed in range(6):
        rng = random.Random(seed)
        torch.manual_seed(seed)
        model, x = Mlp(width=16, depth=rng.randint(2, 4)), torch.randn(4, 16)
        record: dict = {}

        def choose(saved, rng=rng):
            return [n.name for n in saved if rng.random() < 0.5]

        loss, grads = compiled_step(model, x, choose, record)
        _, eager_grads = eager_step(model, x)
        for key, grad in eager_grads.items():
            torch.testing.assert_close(grads[key], grad)
        read_after_wait(record["bw"], record["names"])


def test_the_planned_offloads_run_through_the_rewrite(monkeypatch):
    """The chain on CPU: fxremat's plan with ``offload="plan"`` (the C++ backend given a host link here, as a GPU's
    Triton backend has one), its planned storages rewritten by PyTorch's machinery, run with the stand-ins:
    gradients equal eager's, and no offloaded value is read before its reload's wait."""
    from functorch.compile import aot_function, make_boxed_func

    import fxremat
    import fxremat_passes.choice.offload as choice_offload
    from fxremat.options import Options
    from fxremat_passes.simulator.backends.cpp import CppRules

    monkeypatch.setattr(CppRules, "transfer_seconds", lambda self, nbytes, link: nbytes / link, raising=False)
    monkeypatch.setattr(choice_offload, "OFFLOAD_MIN_BYTES", 0)
    torch.manual_seed(0)
    model, x = Mlp(width=64, depth=6), torch.randn(256, 64)
    reports: list = []
    inner = fxremat.make_partition_fn(Options.create(device="h100", peak_budget=0.3, offload="plan"), reports)
    record: dict = {}

    def partition(gm, joint_inputs, **kwargs):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fw, bw = inner(gm, joint_inputs, **kwargs)
        names = [row[0] for row in reports[-1].offloaded]
        tp_offload.rewrite_offloads(fw, bw, names)
        record.update(bw=bw, names=names)
        return stand_in(fw), stand_in(bw)

    noop = lambda gm, _: make_boxed_func(gm.forward)  # noqa: E731
    fn = aot_function(
        lambda p, x: torch.func.functional_call(model, p, (x,)),
        fw_compiler=noop,
        bw_compiler=noop,
        partition_fn=partition,
    )
    p = {k: v.detach().clone().requires_grad_() for k, v in model.named_parameters()}
    fn(p, x).backward()
    assert record["names"], "the plan offloads"
    _, eager_grads = eager_step(model, x)
    for key, grad in eager_grads.items():
        torch.testing.assert_close(p[key].grad, grad)
    read_after_wait(record["bw"], record["names"])


@pytest.mark.skipif(not tp_offload.is_async(), reason="offload=True: torch 2.13 and later")
def test_offload_true_rewrites_the_split_where_the_schedule_says(monkeypatch):
    """``offload=True``: the partition rewrites its split with the planned offloads, each wait and reload where the
    report's rows say; gradients equal eager's."""
    from functorch.compile import aot_function, make_boxed_func

    import fxremat
    import fxremat_passes.choice.offload as choice_offload
    from fxremat.options import Options
    from fxremat_passes.simulator.backends.cpp import CppRules

    monkeypatch.setattr(CppRules, "transfer_seconds", lambda self, nbytes, link: nbytes / link, raising=False)
    monkeypatch.setattr(choice_offload, "OFFLOAD_MIN_BYTES", 0)
    torch.manual_seed(0)
    model, x = Mlp(width=64, depth=6), torch.randn(256, 64)
    reports: list = []
    graphs: dict = {}

    def compiler(kind):
        def compile(gm, _inputs):
            graphs[kind] = gm
            return make_boxed_func(stand_in(gm).forward)

        return compile

    def step(p, x):
        return torch.func.functional_call(model, p, (x,))

    partition = fxremat.make_partition_fn(Options.create(device="h100", peak_budget=0.3, offload=True), reports)
    fn = aot_function(step, fw_compiler=compiler("fw"), bw_compiler=compiler("bw"), partition_fn=partition)
    p = {k: v.detach().clone().requires_grad_() for k, v in model.named_parameters()}
    fn(p, x).backward()
    (report,) = reports
    assert report.offloaded and report.fallback_reason is None
    _, eager_grads = eager_step(model, x)
    for key, grad in eager_grads.items():
        torch.testing.assert_close(p[key].grad, grad)
    names = [row[0] for row in report.offloaded]
    read_after_wait(graphs["bw"], names)
    fw_order = [n.name for n in graphs["fw"].graph.nodes]
    bw_order = [n.name for n in graphs["bw"].graph.nodes]
    for name, _, _, wait_before, reload_before in report.offloaded:
        wait = fw_order.index(f"cpu_offload_{name}")
        assert fw_order[wait + 1] == (wait_before or "output")
        reload = bw_order.index(f"async_gpu_reload_{name}")
        assert bw_order.index(reload_before) > reload
        between = bw_order[reload + 1 : bw_order.index(reload_before)]  # other reloads and waits only
        assert all(n.startswith(("async_gpu_reload_", "gpu_reload_")) for n in between), between


@pytest.mark.skipif(tp_offload.is_async(), reason="torch 2.11's synchronous rewrite")
def test_offload_true_is_refused_where_the_rewrite_copies_synchronously():
    from fxremat.options import Options

    with pytest.raises(ValueError, match="torch 2.13 or later"):
        Options.create(peak_budget=0.5, offload=True)
