"""The transfer stream's schedule on hand-built step timelines (docs/DESIGN.md §16): exact placements, stalls and
bytes (``simulator/transfer.py``, plain numbers); and ``choice/offload.py``'s units of a hand-built split and its
choice among them."""

from __future__ import annotations

import pytest

from fxremat_passes.simulator.transfer import OffloadUnit, Schedule, place

GB = 10**9


def link(nbytes: int) -> float:  # 1 GB/s
    return nbytes / GB


def step(forward: int, backward: int, held: int = 10 * GB) -> Schedule:
    """``forward`` points of 1 s, the boundary (0 s), ``backward`` points of 1 s; ``held`` bytes at every point."""
    seconds = (1.0,) * forward + (0.0,) + (1.0,) * backward
    return Schedule((held,) * len(seconds), seconds, forward_points=forward, first_backward=forward + 1)


def test_an_offload_hidden_in_both_windows():
    schedule = step(4, 4)
    placed = place(schedule, [OffloadUnit("a", 2 * GB, last_forward_use=0, first_backward_use=8)], link)
    assert placed.copy_spans == ((1.0, 3.0),)  # issued after point 0 ran
    assert placed.waits == (3,)  # point 3 starts at 3 s, when the copy is done
    assert placed.reloads == (6,)  # use at 7 s: the 2 s reload starts at 5 s, before point 6
    assert placed.reload_spans == ((5.0, 7.0),)
    assert placed.exposed_seconds == 0.0
    assert placed.bytes_held == (10 * GB,) * 3 + (8 * GB,) * 3 + (10 * GB,) * 3
    assert placed.peak_bytes == 10 * GB


def test_a_copy_longer_than_the_forward_stalls_at_its_end_and_its_reload_at_the_use():
    schedule = step(4, 4)
    placed = place(schedule, [OffloadUnit("a", 10 * GB, last_forward_use=0, first_backward_use=8)], link)
    assert placed.waits == (4,)  # the forward's end, before the boundary
    assert placed.reloads == (5,)  # it would have to start before backward: at backward's first point
    # the wait stalls from 4 s to 11 s; the reload then runs 11-21 s, the use would start at 14 s
    assert placed.copy_spans == ((1.0, 11.0),)
    assert placed.reload_spans == ((11.0, 21.0),)
    assert placed.stalls == (14.0,)
    assert placed.exposed_seconds == 14.0
    assert placed.bytes_held[4] == 0 and placed.bytes_held[5] == 10 * GB


def test_copies_share_one_stream_first_come_first_served():
    schedule = step(6, 6)
    units = [
        OffloadUnit("a", 2 * GB, last_forward_use=0, first_backward_use=12),
        OffloadUnit("b", 2 * GB, last_forward_use=0, first_backward_use=12),
    ]
    placed = place(schedule, units, link)
    assert placed.copy_spans == ((1.0, 3.0), (3.0, 5.0))
    assert placed.waits == (3, 5)
    # both used at 11 s: b's reload ends there, a's by b's start
    assert placed.reload_spans == ((7.0, 9.0), (9.0, 11.0))
    assert placed.reloads == (8, 10)
    assert placed.exposed_seconds == 0.0
    assert placed.bytes_held[3] == 8 * GB and placed.bytes_held[5] == 6 * GB and placed.bytes_held[9] == 8 * GB
    assert placed.bytes_held[10] == 10 * GB


def test_no_units_leave_the_timeline_as_it_was():
    schedule = step(3, 3)
    placed = place(schedule, [], link)
    assert placed.bytes_held == schedule.bytes_held and placed.exposed_seconds == 0.0


def test_uses_outside_their_phase_are_refused():
    with pytest.raises(ValueError, match="forward, then backward"):
        place(step(3, 3), [OffloadUnit("a", GB, last_forward_use=3, first_backward_use=5)], link)
    with pytest.raises(ValueError, match="the forward's points"):
        Schedule((1, 2), (1.0, 1.0), forward_points=3, first_backward=3)


def test_the_backends_price_a_copy_where_they_offload():
    from fxremat_passes.graph.costs import PROFILES
    from fxremat_passes.simulator.backends import BACKENDS

    triton, cpp = BACKENDS["triton"]((2, 13)), BACKENDS["cpp"]((2, 13))
    assert triton.transfer_seconds(50 * GB, PROFILES["h100"].host_link_bandwidth) == pytest.approx(1.0)
    assert triton.transfer_seconds(GB, PROFILES["cpu"].host_link_bandwidth) is None  # no link
    assert cpp.transfer_seconds(GB, 50e9) is None  # no offload on the C++ backend
    assert PROFILES["gh200"].host_link_bandwidth == 450e9 and PROFILES["a100"].host_link_bandwidth == 25e9


def test_profiles_name_their_link():
    from fxremat import Options
    from fxremat_passes.graph.costs import DeviceProfile

    assert Options.create().profile_for("cuda", "NVIDIA GH200 480GB").name == "gh200"
    assert Options.create().profile_for("cuda", "NVIDIA H200").name == "h200"
    with pytest.raises(ValueError, match="host_link_bandwidth"):
        DeviceProfile("bad", (("default", 1e12),), 1e11, host_link_bandwidth=0.0)


def test_a_recorded_profile_keeps_its_link():
    from fxremat.recording import profile_from_dict, profile_to_dict
    from fxremat_passes.graph.costs import PROFILES

    assert profile_from_dict(profile_to_dict(PROFILES["h100"])) == PROFILES["h100"]
    old = {k: v for k, v in profile_to_dict(PROFILES["h100"]).items() if k != "host_link_bandwidth"}
    assert profile_from_dict(old).host_link_bandwidth is None


def _split_by_hand():
    """fw: ``relu`` (1 MiB, saved) read in forward only through a view, after two other kernels; its caller output
    ``add``.  bw: the saved ``relu`` read through a view after one kernel."""
    import torch
    import torch.fx as fx

    aten = torch.ops.aten
    val = torch.empty(512, 512)
    fw = fx.Graph()
    x = fw.placeholder("x")
    relu = fw.call_function(aten.relu.default, (x,))
    b = fw.call_function(aten.mul.Tensor, (x, x))
    c = fw.call_function(aten.mul.Tensor, (b, b))
    view = fw.call_function(aten.view.default, (relu, [512 * 512]))
    add = fw.call_function(aten.add.Tensor, (view, c))
    fw.output((add, relu))
    bw = fx.Graph()
    saved, tangent = bw.placeholder(relu.name), bw.placeholder("tangent")
    t = bw.call_function(aten.mul.Tensor, (tangent, tangent))
    w = bw.call_function(aten.view.default, (saved, [512, 512]))
    g = bw.call_function(aten.mul.Tensor, (w, t))
    bw.output((g,))
    for graph in (fw, bw):
        for node in graph.nodes:
            if node.op != "output":
                node.meta["val"] = val.view(-1) if node.target is aten.view.default and node in fw.nodes else val
    return fx.GraphModule({}, fw), fx.GraphModule({}, bw), (relu.name, add.name, g.name)


def test_a_storages_uses_are_read_through_its_views():
    """``offload_units``: the offload follows the storage's last forward use (here a view's reader, after two other
    kernels), and the reload precedes its first backward use (a view's reader), each the point of the kernel that
    runs it (``StepPoints``); the graph places PyTorch's rewrite puts the offload after and the reload's wait before
    are the view's reader in forward and the view in backward."""
    from fxremat_passes.choice.offload import offload_units
    from fxremat_passes.simulator.inputs import SimulatorInputs
    from fxremat_passes.simulator.liveness import StepPoints

    fw, bw, (relu, add, reader) = _split_by_hand()
    forward = {n.name: (i, i) for i, n in enumerate(fw.graph.nodes) if n.op != "output"}
    backward = {n.name: (10 + i, 10 + i) for i, n in enumerate(bw.graph.nodes) if n.op != "output"}
    fw_view, bw_view = (next(n.name for n in gm.graph.nodes if "view" in n.name) for gm in (fw, bw))
    forward[fw_view] = forward[add]  # a view runs where its reader's kernel does (``walk.node_points``)
    backward[bw_view] = backward[reader]
    (unit,) = offload_units(fw, bw, 1, StepPoints(forward, backward), SimulatorInputs.default("cpu"))
    assert unit.name == relu and unit.nbytes >= 512 * 512 * 4
    assert unit.last_forward_use == forward[add][1] == 5  # not relu's own point (1), nor an earlier kernel's
    assert unit.first_backward_use == backward[reader][0] == 14  # the view's reader, not the tangent's kernel (12)
    fw_order = [n.name for n in fw.graph.nodes]
    bw_order = [n.name for n in bw.graph.nodes]
    assert fw_order[unit.offload_after] == add and bw_order[unit.reload_by] == bw_view


def test_the_offloads_chosen_hide_first_and_stop_when_the_peak_fits():
    """``choose_offloads``: at the peak point, the unit whose copies hide (no stall alone) before the one whose
    reload stalls, though equal in size; only as many as the target needs; None where all of them are not enough;
    a unit still in use at the peak point never."""
    from fxremat_passes.choice.offload import choose_offloads

    held = [10 * GB] * 17
    held[6] = 12 * GB  # the peak, in forward
    seconds = (1.0,) * 8 + (0.0,) + (1.0,) * 8
    schedule = Schedule(tuple(held), seconds, forward_points=8, first_backward=9)
    hidden = OffloadUnit("hidden", GB, last_forward_use=0, first_backward_use=16)
    exposed = OffloadUnit("exposed", GB, last_forward_use=1, first_backward_use=9)  # reloaded by backward's first
    late = OffloadUnit("late", 4 * GB, last_forward_use=6, first_backward_use=16)  # read at the peak point
    assert place(schedule, [hidden], link).exposed_seconds == 0.0
    assert place(schedule, [exposed], link).exposed_seconds == 1.0
    chosen, placement = choose_offloads(schedule, [exposed, late, hidden], link, 11 * GB)
    assert chosen == (hidden,) and placement.peak_bytes == 11 * GB and placement.exposed_seconds == 0.0
    chosen, placement = choose_offloads(schedule, [exposed, late, hidden], link, 10 * GB)
    assert set(chosen) == {hidden, exposed} and placement.peak_bytes == 10 * GB
    assert choose_offloads(schedule, [exposed, late, hidden], link, 10 * GB - 1) is None


def test_waits_and_reloads_stand_only_where_the_graphs_order_can_put_them():
    """With each point's place in its graph (``Schedule.positions``), a wait stands before the first point after
    its copy's end whose node comes after the offload in graph order (else at forward's end), and a reload before
    the latest point that takes it, a node no later than its first reader in graph order (else the first that
    does, stalling its use); a unit no backward point takes is refused."""
    seconds = (1.0,) * 4 + (0.0,) + (1.0,) * 4
    # forward points 0-3 at graph positions 2, 6, 4, 8 (the schedule reordered them); backward 5-8 at 3, 9, 5, 7
    positions = (2, 6, 4, 8, -1, 3, 9, 5, 7)
    schedule = Schedule((10 * GB,) * 9, seconds, forward_points=4, first_backward=5, positions=positions)
    unit = OffloadUnit("a", GB, last_forward_use=0, first_backward_use=8, offload_after=6, reload_by=7)
    placed = place(schedule, [unit], link)
    assert placed.waits == (3,)  # point 2 starts at the copy's end (2 s), but its node (4) precedes the offload (6)
    assert placed.reloads == (7,)  # ideal: before point 7 (position 5 <= 7)
    late = OffloadUnit("a", GB, last_forward_use=0, first_backward_use=8, offload_after=8, reload_by=4)
    placed = place(schedule, [late], link)
    assert placed.waits == (4,)  # no forward point after graph position 8: the forward's end
    assert placed.reloads == (5,)  # only point 5 (position 3) takes it: issued at backward's start, hidden still
    assert placed.exposed_seconds == 0.0
    stalled = OffloadUnit("a", 3 * GB, last_forward_use=0, first_backward_use=8, offload_after=0, reload_by=7)
    positions = (2, 6, 4, 8, -1, 9, 9, 5, 7)  # backward's first two points take no reload
    placed = place(Schedule(schedule.bytes_held, seconds, 4, 5, positions), [stalled], link)
    assert placed.reloads == (7,) and placed.exposed_seconds == pytest.approx(2.0)  # 3 s copy from 6 s, used at 7 s
    with pytest.raises(ValueError, match="takes its reload"):
        place(schedule, [OffloadUnit("a", GB, 0, 8, offload_after=0, reload_by=2)], link)
