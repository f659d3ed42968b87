"""Inductor's kernel fusion over a phase's units (``phase.py``), and the order the fused kernels run in.

Units of Inductor's own kernels fuse when they share a read or one reads the other, their loops match and fusing
makes no cycle: most bytes read at one index first, then the closest pair (``Scheduler.score_fusion``,
``access.py``); never horizontally across more than ``FUSION_DISTANCE`` scheduler nodes; never where the backend
simulated refuses it (``SchedulingRules.fusion_vetoes``, ``backends/``).  A fused kernel runs at its earliest
member's place, dependencies first (``Scheduler.fuse_nodes`` then ``topological_sort_schedule``).
"""

from __future__ import annotations

import heapq

import torch.fx as fx

from .access import add_horizontal, at_another_index, priority
from .lowering import KERNEL_CLASSES
from .rules import FusionVetoes

# Scheduler nodes apart beyond which Inductor does not fuse horizontally (torch/_inductor/scheduler.py).
FUSION_DISTANCE = 64
# fxremat's compiles refuse a vertical fusion that drags more than this many times the bytes it saves ahead of its place
# (``_torch_private.inductor_vetoes_dragging_fusions``); 32 is Inductor's own trade of extra memory for bytes moved
# (``Scheduler.can_fusion_increase_peak_memory``).
DRAG_FACTOR = 32
# In a backward recomputed segment by segment (``segments.py``), a horizontal fusion (two kernels sharing a read,
# neither reading the other) that drags more than 4 times the bytes it saves is refused too: fusing two segments'
# recomputed norms of one input (a block run twice) would run the later segment's recompute at the earlier one's
# place, all of it live at once, which is what segmenting avoids.  Not 1: unfused, the shared read stays live until
# the later kernel.  The value sits between the drags of the two (docs/DESIGN.md §5.4 and §13:
# benchmarks/investigations/checkpoint_twice.py's model B, ``peak_table.py``'s BERT and stack rows at 0.0).
HORIZONTAL_DRAG_FACTOR = 4


def drags_too_much(moved_bytes: int, shared_bytes: int, vertical: bool = True) -> bool:
    """Whether a fusion that saves ``shared_bytes`` of memory traffic but makes work writing ``moved_bytes`` run
    earlier than it would (``scheduler.dragged_nodes``) is refused in fxremat's compiles."""
    factor = DRAG_FACTOR if vertical else HORIZONTAL_DRAG_FACTOR
    return moved_bytes > factor * max(shared_bytes, 1)


class Fusion:
    """Union-find over ``units`` (in graph order), with the unit DAG kept up to date as groups merge."""

    def __init__(
        self, units: list[fx.Node], unit_reads: dict, unit: dict, index: dict, access: dict, segmented: bool = False
    ) -> None:
        self.units, self.unit_reads, self.unit, self.index = units, unit_reads, unit, index
        self.segmented = segmented  # a backward recomputed segment by segment: horizontal drags are refused too
        self.access = access  # unit -> storage read -> its access paths (``access.py``)
        self.group = {u: u for u in units}
        self.succ: dict[fx.Node, set[fx.Node]] = {u: set() for u in units}
        self.pred: dict[fx.Node, set[fx.Node]] = {u: set() for u in units}
        for u in units:
            for r in unit_reads[u]:
                p = unit.get(r)
                if p is not None and p is not u:
                    self.succ[p].add(u)
                    self.pred[u].add(p)
        self.lo = {u: index[u] for u in units}
        self.hi = dict(self.lo)
        self.order = {u: k for k, u in enumerate(units)}
        self.first = dict(self.order)
        self.last = dict(self.order)
        self.members = {u: [u] for u in units}
        # group -> the storages its units read at another index than they are written at (``reads_at_another_index``)
        self.far = {u: {r for r, ps in access.get(u, {}).items() if any(map(at_another_index, ps))} for u in units}
        self.vetoes = FusionVetoes()  # the backend's own refusals (``fuse``)
        self.topo = TopologicalOrder(units, self.succ)  # bounds ``creates_cycle``'s search

    def find(self, u):
        group = self.group
        while group[u] is not u:
            group[u] = group[group[u]]
            u = group[u]
        return u

    def candidates(self, fusible: list[fx.Node], loop: dict, nbytes) -> dict[tuple[fx.Node, fx.Node], list[int]]:
        """Pairs that may fuse (``loop``: a unit's loop key; ``nbytes(storage)``) -> [bytes they share at one index,
        bytes they share at another] (``access.add_horizontal``)."""
        candidates: dict[tuple[fx.Node, fx.Node], list[int]] = {}
        readers: dict[fx.Node, list[fx.Node]] = {}
        for u in fusible:
            for r in self.unit_reads[u]:
                readers.setdefault(r, []).append(u)
        unit_order = self.order
        for r, us in readers.items():
            size = nbytes(r)
            p = self.unit.get(r)
            if p is not None and p in loop:
                for b in us:  # producer into consumer, where it reads the producer's value at its index
                    if b is not p and loop[b] == loop[p] and r not in self.far[b]:
                        key = (p, b) if self.index[p] < self.index[b] else (b, p)
                        candidates.setdefault(key, [0, 0])[0] += size
            # two readers (horizontal): only within FUSION_DISTANCE of each other (checked again on merging), which
            # keeps a storage read by every block (a mask, a rotary table) from making this quadratic; only readers
            # with loops of one size can fuse, so they are paired within those groups alone (in graph order, so
            # each pair is already its key).  A residual stream read through fused-away adds gives 150k pairs here
            # at 48 blocks: this loop is kept tight.
            same_size: dict[object, list[fx.Node]] = {}
            for u in sorted(us, key=unit_order.__getitem__):
                same_size.setdefault(loop[u], []).append(u)
            for group_ in same_size.values():
                orders = [unit_order[u] for u in group_]
                add_horizontal(candidates, r, size, group_, orders, self.access, FUSION_DISTANCE)
        return candidates

    def reads_at_another_index(self, ga, gb) -> bool:
        """Whether a unit of one group reads a storage the other writes at another index than it is written at
        (``access.another_index``).  Inductor fuses a consumer into its producer only where every read of the
        producer's buffers matches a write (``Scheduler.can_fuse_vertical``: "memory deps did not match", via
        ``fusable_read_and_write``), and scores a pair by its equal ``MemoryDep`` s alone (``score_fusion_memory``:
        a write read at another index adds nothing; ``_score_fusion_memory_by_buffer_overlap`` counts common reads
        only, never of a reduction), refusing a pair that shares nothing ("no shared data",
        ``InductorChoices.can_fuse``).  A stored gather of expert weights read by a one-row ``bmm`` as its second
        operand (a sum over the weights' rows): score 0, ``can_fuse_vertical`` False (tests/passes/
        test_fusion_index.py; docs/DESIGN.md §6).  The C++ backend's own refusal of a pointwise loop
        whose sizes are not the reduction's (``CppScheduling._why_fuse_nodes``) is one of its vetoes
        (``backends/cpp_fusion.py``)."""
        unit, find = self.unit, self.find
        for reader, writer in ((ga, gb), (gb, ga)):
            if any(unit.get(r) is not None and find(unit[r]) is writer for r in self.far[reader]):
                return True
        return False

    def creates_cycle(self, a, b) -> bool:
        """A path a -> x -> ... -> b through another group (or b -> ... -> a): Inductor's
        ``Scheduler.will_fusion_create_cycle``.  A fused group can span far (a segmented backward's recompute fused
        with its second pass's), so a path may leave the range of graph places before ``b`` and come back through
        it (Mixtral's ``memory_budget=0.0``: a bound at ``b``'s last member had let ``bmm_3_first`` fuse with
        ``bmm_3`` across such a path, and the kernels' dependencies made a cycle).  The bound that holds is a
        topological order of the groups (``TopologicalOrder``, kept through every merge): a path runs from the
        earlier of the two to the later, through groups placed between them."""
        return self.topo.path_between(a, b)

    def too_far(self, ga, gb) -> bool:
        """Inductor refuses a horizontal fusion (two kernels sharing a read, neither reading the other) of kernels
        more than 64 scheduler nodes apart (``Scheduler.are_long_distant_nodes``: it would lengthen live ranges,
        e.g. fuse recomputations of different checkpointed segments).  Units stand for scheduler nodes."""
        first, last = self.first, self.last
        vertical = gb in self.succ[ga] or ga in self.succ[gb]
        return not vertical and max(abs(first[ga] - last[gb]), abs(first[gb] - last[ga])) > FUSION_DISTANCE

    def dragged_bytes(self, ga, gb, nbytes, horizontal: bool = False) -> int:
        """The bytes written by the kernels that fusing ``ga`` and ``gb`` runs earlier than their place: the later
        group's ancestors placed after the earlier group, less those the earlier one already has
        (``_torch_private.scheduler.dragged_nodes``, where fxremat's compiles refuse such a fusion).  Where the later
        group does not depend on the earlier (a horizontal fusion), 0 unless ``horizontal``."""
        return self._dragged(ga, gb, nbytes, horizontal)[0]

    def refused(self, ga, gb, shared_bytes: int, nbytes) -> bool:
        """fxremat's compiles refuse this fusion for the work it would drag ahead (``drags_too_much``)."""
        moved, vertical = self._dragged(ga, gb, nbytes, horizontal=self.segmented)
        return drags_too_much(moved, shared_bytes, vertical=vertical)

    def _dragged(self, ga, gb, nbytes, horizontal: bool) -> tuple[int, bool]:
        """(bytes dragged, whether the fusion is vertical); a horizontal one drags 0 unless ``horizontal``."""
        early, late = (ga, gb) if self.lo[ga] <= self.lo[gb] else (gb, ga)
        start = self.lo[early]
        reached = self._ancestors_after(late, start - 1)
        vertical = early in reached
        if not (vertical or horizontal):
            return 0, False  # Inductor's 64-node limit bounds horizontal ones (``too_far``), and the veto leaves them
        moved = {g for g in reached if self.lo[g] > start} - self._ancestors_after(early, start)
        return sum(nbytes(u) for g in moved for u in self.members[g]), vertical

    def _ancestors_after(self, group, start: int) -> set:
        pred, lo = self.pred, self.lo
        seen: set = set()
        stack = [group]
        while stack:
            for p in pred[stack.pop()]:
                if p not in seen and lo[p] > start:
                    seen.add(p)
                    stack.append(p)
        return seen

    def merge(self, ga, gb) -> None:
        succ, pred = self.succ, self.pred
        self.topo.merge(ga, gb)  # before the edges change: it reads the groups' successors as they were
        self.vetoes.merged(ga, gb)
        self.first[ga], self.last[ga] = min(self.first[ga], self.first[gb]), max(self.last[ga], self.last[gb])
        self.group[gb] = ga
        self.far[ga] |= self.far.pop(gb)
        self.members[ga].extend(self.members.pop(gb))
        self.lo[ga], self.hi[ga] = min(self.lo[ga], self.lo[gb]), max(self.hi[ga], self.hi[gb])
        for s in succ.pop(gb):
            pred[s].discard(gb)
            if s is not ga:
                pred[s].add(ga)
                succ[ga].add(s)
        for p in pred.pop(gb):
            succ[p].discard(gb)
            if p is not ga:
                succ[p].add(ga)
                pred[ga].add(p)
        succ[ga].discard(ga)
        pred[ga].discard(ga)

    def fuse(self, classes: dict, loop_of, nbytes, vetoes_of=None) -> dict[fx.Node, list[fx.Node]]:
        """Merge in Inductor's order; the kernels: group head -> its units, in graph order.

        Most bytes shared at one index first (``access.priority``); of equal ones, the two closest in order
        (Inductor's ``score_fusion``: memory score, then proximity): the recomputed norm of a block's input fuses
        with the norm backward beside it, not with a recomputed norm of the same input twenty kernels earlier (which
        would pull the whole recomputed block to there).  ``vetoes_of(fusible)``: the backend's own refusals of
        fusions among the units that are kernels (``SchedulingRules.fusion_vetoes``), or None for none."""
        fusible = [u for u in self.units if classes[u] in KERNEL_CLASSES]
        loop = {u: loop_of(u) for u in fusible}
        self.vetoes = vetoes_of(fusible) if vetoes_of is not None else FusionVetoes()
        order, index = self.order, self.index

        def ranked(kv):
            (a, b), score = kv
            return (*priority(score), abs(order[b] - order[a]), index[a], index[b])

        for (a, b), score in sorted(self.candidates(fusible, loop, nbytes).items(), key=ranked):
            ga, gb = self.find(a), self.find(b)
            if ga is gb or self.too_far(ga, gb) or self.creates_cycle(ga, gb) or self.reads_at_another_index(ga, gb):
                continue
            if self.refused(ga, gb, score[0], nbytes) or self.vetoes.refuses(self, ga, gb):
                continue
            self.merge(ga, gb)
        kernels: dict[fx.Node, list[fx.Node]] = {}
        for u in self.units:
            kernels.setdefault(self.find(u), []).append(u)
        return kernels


def fusion_order(kernels: dict, pred: dict, lo: dict) -> list[fx.Node]:
    """Inductor's order after fusion: each kernel at its earliest member, then dependencies first."""
    order: list[fx.Node] = []
    seen: set[fx.Node] = set()
    for head in sorted(kernels, key=lambda g: lo[g]):
        stack = [(head, iter(sorted(pred[head], key=lambda g: lo[g])))]
        if head in seen:
            continue
        seen.add(head)
        while stack:
            g, deps = stack[-1]
            nxt = next((d for d in deps if d not in seen), None)
            if nxt is None:
                order.append(g)
                stack.pop()
            else:
                seen.add(nxt)
                stack.append((nxt, iter(sorted(pred[nxt], key=lambda d: lo[d]))))
    return order


class TopologicalOrder:
    """A topological order of a ``Fusion``'s groups, kept as they merge, so that the cycle check searches only the
    groups placed between the two it would fuse (a path between them must run through those).  Two groups with no
    path between them through a third merge into one placed after every group between them that reaches the later
    one and before every group the earlier one reaches (those two sets are disjoint, else a path would join them):
    the groups between them the earlier one reaches move after the merged group, in their order, the others before.
    Where a merge does make such a path (``Fusion.merge`` called without the check, as a test does), no order is
    kept and every search runs over all groups, as Inductor's does."""

    def __init__(self, units: list, succ: dict) -> None:
        self.succ = succ  # the ``Fusion``'s, updated by it
        order = list(units) if _ordered(units, succ) else _kahn(units, succ)
        self.slots: list = order  # place -> group, None where a merged group left one
        self.place = {g: k for k, g in enumerate(order)}
        self.kept = True

    def path_between(self, a, b) -> bool:
        """Whether a path a -> x -> ... -> b or b -> x -> ... -> a runs through a group x other than the two."""
        if not self.kept:
            return self._reaches(a, b, None) or self._reaches(b, a, None)
        early, late = (a, b) if self.place[a] < self.place[b] else (b, a)
        return self._reaches(early, late, self.place[late])

    def _reaches(self, start, end, bound: int | None) -> bool:
        """Whether ``end`` is reached from ``start`` other than by their direct edge (``bound``: only through groups
        placed before it); the search ends where it finds ``end``."""
        return any(g is end for g in self._search(start, end, bound))

    def _descendants(self, start, end, bound: int | None) -> set:
        """The groups reached from ``start``, not through ``end`` nor over its direct edge to ``end`` (``bound``:
        only groups placed before it; ``end`` itself where reached otherwise)."""
        return set(self._search(start, end, bound))

    def _search(self, start, end, bound: int | None):
        """Each group ``_descendants`` holds, once, as the search reaches it (``end`` perhaps more than once)."""
        succ, place = self.succ, self.place
        stack = [s for s in succ[start] if s is not end and (bound is None or place[s] < bound)]
        seen = set(stack)
        yield from stack
        while stack:
            for s in succ[stack.pop()]:
                if s is end:
                    yield s
                elif s not in seen and (bound is None or place[s] < bound):
                    seen.add(s)
                    stack.append(s)
                    yield s

    def merge(self, ga, gb) -> None:
        """``gb`` merges into ``ga``: the merged group takes its place between the groups between them."""
        if not self.kept:
            return
        place, slots = self.place, self.slots
        early, late = (ga, gb) if place[ga] < place[gb] else (gb, ga)
        lo, hi = place[early], place[late]
        reached = self._descendants(early, late, hi)
        if late in reached:  # a path through a third group: the merge makes a cycle, no order is kept
            self.kept = False
            return
        between = [g for g in slots[lo + 1 : hi] if g is not None]
        before = [g for g in between if g not in reached]
        after = [g for g in between if g in reached]
        new = [*before, ga, *after]
        new += [None] * (hi - lo + 1 - len(new))
        slots[lo : hi + 1] = new
        for k, g in enumerate(new, lo):
            if g is not None:
                place[g] = k
        del place[gb]


def _ordered(units: list, succ: dict) -> bool:
    place = {u: k for k, u in enumerate(units)}
    return all(place[u] < place[s] for u in units for s in succ[u])


def _kahn(units: list, succ: dict) -> list:
    """``units`` in a topological order of ``succ``, graph order among those ready together."""
    place = {u: k for k, u in enumerate(units)}
    waiting = {u: 0 for u in units}
    for u in units:
        for s in succ[u]:
            waiting[s] += 1
    ready = [place[u] for u in units if not waiting[u]]
    heapq.heapify(ready)
    order = []
    while ready:
        u = units[heapq.heappop(ready)]
        order.append(u)
        for s in succ[u]:
            waiting[s] -= 1
            if not waiting[s]:
                heapq.heappush(ready, place[s])
    return order
