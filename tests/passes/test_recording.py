"""fxremat/recording.py, graph_record.py and replay.py without Inductor: a joint graph recorded as fxremat's
partitioner received it writes down the same after its rebuild, with the meta partitioners read, and partitioned
again chooses the recorded plan; off, the recording costs the partition one question."""

import json

import pytest
import torch
from functorch.compile import aot_function
from helpers import noop_compiler

import fxremat
from fxremat import graph_record, recording, replay
from fxremat.options import Options
from fxremat_passes import _torch_private as tp
from fxremat_passes._torch_private import recording as tp_recording


def _step(x, w1, w2, running_mean, running_var):
    h = torch.nn.functional.batch_norm(x @ w1, running_mean, running_var, training=True)
    return (torch.nn.functional.gelu(h) @ w2).relu().sum()


def _record(options: Options):
    reports = []
    fn = aot_function(
        _step,
        noop_compiler,
        noop_compiler,
        partition_fn=fxremat.make_partition_fn(options, reports),
        decompositions=tp.inductor_decompositions(),
        keep_inference_input_mutations=True,
    )
    torch.manual_seed(0)
    args = [torch.randn(64, 32, requires_grad=True), torch.randn(32, 48, requires_grad=True)]
    args += [torch.randn(48, 16, requires_grad=True), torch.zeros(48), torch.ones(48)]
    with recording.recording() as recorder:
        fn(*args).backward()
    return recorder, reports


@pytest.fixture(scope="module")
def recorded():
    recorder, reports = _record(Options.create(memory_price=20.0))
    return json.loads(json.dumps(recorder.to_data())), reports  # through JSON, as the files hold it


def test_the_joint_is_recorded_with_the_meta_partitioners_read(recorded):
    data, reports = recorded
    (entry,) = data["graphs"]
    assert entry["partitioner"] == "fxremat" and entry["num_fwd_outputs"] >= 1
    assert entry["plan"]["saved"] == sorted(r.name for r in reports[0].saved)
    nodes = entry["joint"]["nodes"]
    assert len(nodes) == reports[0].num_joint_nodes
    tags = {n["meta"].get("partitioner_tag") for n in nodes if "meta" in n}
    assert {"is_forward", "is_backward", "must_be_in_forward"} <= tags  # the running stats' copy_ stays in forward
    placeholders = [n for n in nodes if n["op"] == "placeholder"]
    assert all(n["meta"]["desc"]["desc"].endswith(")") for n in placeholders)
    assert entry["config"]["inductor"] and "activation_memory_budget" in entry["config"]["functorch"]
    assert entry["profile"]["name"] == "cpu" and entry["simulator"]["backend"] == "cpp"


def test_the_rebuilt_joint_writes_down_as_recorded_with_shared_storages(recorded):
    data, _ = recorded
    joint_data = data["graphs"][0]["joint"]
    joint = graph_record.graph_from_dict(joint_data)
    assert graph_record.graph_to_dict(joint) == joint_data
    output = [n for n in joint.graph.nodes if n.op == "output"][0]
    assert type(output.meta["desc"][0]).__name__ == "PlainAOTOutput"  # descriptors rebuilt as objects
    tensors = [n for n in joint_data["nodes"] if isinstance(n.get("val"), dict) and "t" in n["val"]]
    storage = {n["name"]: n["val"]["t"][5] for n in tensors}
    nodes = {n.name: n for n in joint.graph.nodes}
    views = [  # (view, its base) by the recorded storage numbers: a transposed weight, say
        (name, row["args"][0]["n"])
        for row in joint_data["nodes"]
        for name in [row["name"]]
        if row["op"] == "call_function" and row["args"] and isinstance(row["args"][0], dict)
        and storage.get(row["args"][0].get("n")) is not None and storage.get(name) == storage[row["args"][0]["n"]]
    ]
    assert views
    for view, base in views:
        assert tp.storage_identity(nodes[view].meta["val"]) == tp.storage_identity(nodes[base].meta["val"])


def test_a_cpu_recording_rebuilt_on_cuda_metadata():
    _, reports = _record(Options.create())
    recorder, _ = _record(Options.create())
    joint = graph_record.graph_from_dict(recorder.to_data()["graphs"][0]["joint"], device="cuda")
    vals = [n.meta["val"] for n in joint.graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)]
    assert vals and all(v.device.type == "cuda" for v in vals)


def test_the_replay_chooses_the_recorded_plan_and_simulates_it(recorded):
    data, reports = recorded
    entry = data["graphs"][0]
    out = replay.replay_graph(entry, entry["joint"])
    assert out["joint_as_recorded"] and out["plan_as_recorded"], out["plan_differences"]
    assert out["simulated_peak_bytes"] == reports[0].simulated_peak_bytes == out["recorded_simulated_peak_bytes"]
    assert out["schedules"] == {"forward": None, "backward": None}  # no Inductor, no schedule recorded


def test_pytorchs_partitioner_recorded_and_replayed():
    partitioner = recording.RecordedPyTorchPartitioner(budget=0.5)
    fn = aot_function(
        _step, noop_compiler, noop_compiler, partition_fn=partitioner, keep_inference_input_mutations=True
    )
    args = [torch.randn(8, 4, requires_grad=True), torch.randn(4, 6, requires_grad=True)]
    args += [torch.randn(6, 2, requires_grad=True), torch.zeros(6), torch.ones(6)]
    with recording.recording() as recorder:
        fn(*args).backward()
    (entry,) = json.loads(json.dumps(recorder.to_data()))["graphs"]
    assert entry["partitioner"] == "pytorch" and entry["memory_budget"] == 0.5
    out = replay.replay_graph(entry, entry["joint"])
    assert out["plan_as_recorded"] and out["simulated_peak_bytes"] > 0


def test_recordings_do_not_nest_and_end_cleanly():
    with recording.recording():
        with pytest.raises(RuntimeError, match="do not nest"):
            with recording.recording():
                pass
    assert recording.current() is None


def test_schedules_compared_value_by_value():
    recorded = [
        dict(backward=False, kernels=[
            dict(kind="SchedulerNode", outputs=[["buf0", 4, "a"]]),
            dict(kind="NopKernelSchedulerNode", outputs=[["buf1", 0, "v"]]),
            dict(kind="FusedSchedulerNode", outputs=[["buf2", 4, "b"], ["buf3", 4, "c"]]),
            dict(kind="ExternKernelSchedulerNode", outputs=[["buf4", 4, "inductor_only"]]),
        ]),
    ]
    simulated = {"forward": [dict(units=["a"]), dict(units=["c"]), dict(units=["b"])], "backward": []}
    out = replay.compare_schedules(simulated, recorded)
    assert out["backward"] is None
    fwd = out["forward"]
    assert (fwd["recorded_kernels"], fwd["simulated_kernels"], fwd["kernels_same"]) == (3, 3, 1)
    assert fwd["values_recorded_only"] == 1 and fwd["kernel_agreement"] == 0.5
    assert fwd["first_differing_recorded"] == [["b", "c"]]


def test_descriptors_are_rebuilt_from_their_text_and_nothing_else():
    desc = tp_recording.descriptor_from_text("GradAOTOutput(grad_of=PlainAOTInput(idx=3))")
    assert desc.grad_of.idx == 3
    with pytest.raises(ValueError, match="not an AOTAutograd descriptor"):
        tp_recording.descriptor_from_text("__import__('os')")


def test_a_profile_and_options_survive_the_record():
    from fxremat_passes.graph.costs import PROFILES

    profile = PROFILES["h100"]
    assert recording.profile_from_dict(json.loads(json.dumps(recording.profile_to_dict(profile)))) == profile
    options = recording.options_to_dict(Options.create(peak_budget=0.5))
    assert options["peak_budget"] == 0.5 and "device" not in options


def test_simulator_inputs_survive_the_record():
    """Every field of ``SimulatorInputs`` round-trips, and a field a recording lacks takes the default's value."""
    import dataclasses

    from fxremat_passes.simulator.inputs import SimulatorInputs

    inputs = SimulatorInputs.default("cpu").with_changes(
        layout_optimisation=False, forces_layout_optimisation=True, mkldnn_enabled=False, estimate_counts_outputs=False,
        caller_bytes=123,
    )
    data = json.loads(json.dumps(recording.simulator_to_dict(inputs)))
    assert {f.name for f in dataclasses.fields(inputs)} <= set(data)
    assert replay.simulator_from_dict(data) == inputs
    lacking = {k: v for k, v in data.items() if k != "mkldnn_enabled"}
    assert replay.simulator_from_dict(lacking).mkldnn_enabled == SimulatorInputs.default("cpu").mkldnn_enabled
