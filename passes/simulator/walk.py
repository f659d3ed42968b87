"""The walk over a phase's kernels (``phase._Phase``): what each kernel allocates (or writes in place over a dying
input), what dies after it, and Inductor's own estimate of the graph's memory, which decides its buffer reuse
(``buffer_pool._pool_held``).  Storages are keyed by their root node's name (the same in a built split and in the
joint graph it was copied from)."""

from __future__ import annotations

import torch.fx as fx

from .. import _torch_private as tp
from .buffer_pool import _pool_held


class Walk:
    def __init__(self, phase, order: list[fx.Node]) -> None:
        self.phase, self.order = phase, order
        # the kernels come in order, so a storage's last reader is the last kernel that reads it
        self.last_use: dict[str, int] = {}
        last_use, kernels, unit_reads = self.last_use, phase.kernels, phase.unit_reads
        for head_pos, head in enumerate(order):
            for u in kernels[head]:
                for r in unit_reads[u]:
                    last_use[r.name] = head_pos
        self.remaining: dict[str, int] = {}  # storage name -> units still to read it
        remaining = self.remaining
        for u in phase.units:
            for r in unit_reads[u]:
                name = r.name
                remaining[name] = remaining.get(name, 0) + 1
        self.arrive: dict[int, list[str]] = {}  # kernel -> storages allocated just before it (``phase.arrivals``)
        for name in phase.arrivals:
            if name in last_use:
                self.arrive.setdefault(self._first_use(name), []).append(name)
        self.live = dict(phase.carried)
        # running sums instead of summing every live storage at every unit (linear in the graph)
        self.total = sum(self.live.values())
        self.gradients = sum(b for name, b in self.live.items() if name in phase.gradients)
        self.dies: dict[int, list[str]] = {}
        for name, k in self.last_use.items():
            self.dies.setdefault(k, []).append(name)
        # For Inductor's buffer reuse (``_pool_held``): its own estimate of the memory each kernel runs with, and the
        # buffers each kernel allocates and frees.
        self.estimated: list[int] = []
        self.counted: dict[str, int] = {}  # storages Inductor's estimate holds
        self.allocated: list[list[tuple[int, object]]] = []  # per kernel: (bytes, reuse key) of fresh buffers
        self.freed: list[list[object]] = []  # per kernel: reuse keys of the buffers it frees into the pool
        self.poolable: dict[str, object] = {}  # storage name -> reuse key, for buffers whose free enters the pool
        self.points: list[tuple[int, str, int, int]] = []  # (kernel, unit, bytes live while it runs, of them grads)

    def _first_use(self, name: str) -> int:
        kernels, unit_reads = self.phase.kernels, self.phase.unit_reads
        reads = (any(r.name == name for u in kernels[head] for r in unit_reads[u]) for head in self.order)
        return next(k for k, read in enumerate(reads) if read)

    def free(self, name: str) -> None:
        nbytes = self.live.pop(name)
        self.total -= nbytes
        if name in self.phase.gradients:
            self.gradients -= nbytes

    def run(self, phase_name: str, timeline: list) -> int:
        phase, last_use = self.phase, self.last_use
        peak = self.total
        for name in [n for n in self.live if last_use.get(n, -1) < 0 and n not in phase.keep]:
            self.free(name)  # carried in, never read here
        self.reuse = phase.inputs.buffer_reuse
        # fxremat's compiles leave saved views of forward inputs out of the estimate (_torch_private/buffer_reuse.py)
        never_freed = phase.never_freed if self.reuse == tp.ALLOCATED else frozenset()
        self.counted.update(
            (n, b)
            for n, b in phase.estimated_inputs.items()
            if (last_use.get(n, -1) >= 0 or n in phase.keep) and n not in never_freed
        )
        self.estimate = sum(self.counted.values())
        deferred: list[str] = []
        for k, head in enumerate(self.order):
            self.slices: list[str] = []
            self.allocate(k, phase.kernels[head])
            self.estimated.append(self.estimate)
            deferred += self.retire(k, phase.kernels[head])
            if self.reuse == tp.ALLOCATED:  # fxremat's bound frees what a kernel group read when it is flushed
                deferred += self.slices
            else:
                self.uncount(self.slices)
            if not self.grouped(k) or not self.grouped(k + 1):  # the last kernel is never grouped with a next one
                self.release(k, deferred)
                deferred = []
        if self.reuse is not None:
            held = _pool_held(self.estimated, self.allocated, self.freed)
        else:  # every dead buffer freed at once (allow_buffer_reuse=False)
            held = [0] * len(self.estimated)
        activation_peak = 0
        for k, name, moment, grads in self.points:
            moment += held[k]
            peak = max(peak, moment)
            activation_peak = max(activation_peak, moment - grads)
            timeline.append((phase_name, name, moment))
        phase.live = self.live
        phase.activation_peak = activation_peak
        return peak

    def allocate(self, k: int, kernel: list[fx.Node]) -> None:
        """The kernel's units allocate their storages (or write over a dying input of the same size)."""
        phase, live = self.phase, self.live
        self.allocated.append([])
        self.freed.append([])
        for name in self.arrive.get(k, ()):
            nbytes = phase.arrivals[name]
            self.count(name, nbytes)
            live[name] = nbytes
            self.total += nbytes
        for u in kernel:
            for node in phase.owned[u]:
                nbytes = phase.facts.nbytes(node)
                local = node.name not in phase.keep and self.last_use.get(node.name, -1) == k
                local = local and node not in phase.returned  # read only inside its own kernel: never leaves it
                local = local and not phase.facts.concat_kernel(node)  # a NopKernel's buffer: always allocated
                if local:  # stock Inductor's estimate counts kernel-local buffers, fxremat's compiles' does not
                    if self.reuse == tp.ESTIMATED:
                        self.count(node.name, nbytes)
                    continue
                reused = None
                if phase.inplace_allowed(u):
                    reused = phase._inplace_candidate(u, nbytes, live, self.remaining, kernel)
                    if reused is not None:
                        self.free(reused)  # Inductor writes the result over an input only this kernel still reads
                if reused is not None and self.reuse == tp.ALLOCATED and reused in self.counted:
                    self.counted[node.name] = self.counted.pop(reused)  # the same storage lives on
                else:  # stock Inductor's estimate has no in-place updates
                    self.count(node.name, nbytes)
                if phase.facts.concat_kernel(node) and self.cat_placed_in_group(k, node):
                    self.count_slices(node.name, nbytes)
                key = phase._reuse_key(u, node)
                if key is not None:
                    self.poolable[node.name] = key
                    if reused is None:
                        self.allocated[k].append((nbytes, key))
                live[node.name] = live.get(node.name, 0) + nbytes
                self.total += nbytes
                if node.name in phase.gradients:
                    self.gradients += nbytes
            self.points.append((k, u.name, self.total + phase.workspace[u], self.gradients))  # workspace: freed
            # before it returns

    def count_slices(self, name: str, nbytes: int) -> None:
        """A cat's inputs, in Inductor's estimate, until its kernel is done.  The kernels computing them write
        into slices of the ConcatKernel's buffer (``NonOwningLayout``, ``# alias`` in the output code: nothing
        allocated), but ``memory.compute_size_for_scheduler_buffer`` sizes every buffer by its numel except
        mutations, ``NoneLayout`` and multi-output ones, so ``compute_memory_timeline`` counts the cat's bytes
        twice, and the estimate's peak, which bounds the buffer pool (``_pool_held``), is higher by them: an expert
        backward that writes a cat lets the pool hold the cat's bytes through another layer's peak (Mixtral)."""
        self.count(name + "#slices", nbytes)
        self.slices.append(name + "#slices")

    def cat_placed_in_group(self, k: int, cat: fx.Node) -> bool:
        """Whether Inductor's estimate counts the cat's buffer while its slices are still counted: the ConcatKernel is a
        scheduler node of its own (``NopKernelSchedulerNode``), and the estimate counts its buffer at that node's step.
        The fused nodes are sorted by their first op's lowering order (``Scheduler.fuse_nodes_once``: ``min_order``), so
        the ConcatKernel, which reads nothing, runs after every kernel holding an op lowered before it.  Where an extern
        kernel among those runs after the slices' kernel (a recomputed SwiGLU's down-projection weight gradient, ``mm``,
        reads the product computed in the kernel that writes the gradient's slices), the group is flushed and the slices
        freed before the cat is counted (the Llama stack's first layer).  Kernel ``k`` writes the slices (the cat fuses
        with its inputs here)."""
        index, kernels = self.phase.index, self.phase.kernels
        place = k
        for j in range(k + 1, len(self.order)):
            if any(index[u] < index[cat] for u in kernels[self.order[j]]):
                place = j
        return all(self.grouped(j) for j in range(k + 1, place + 1))

    def count(self, name: str, nbytes: int) -> None:
        """A storage allocated, in Inductor's estimate of the memory each kernel runs with."""
        self.counted[name] = nbytes
        self.estimate += nbytes

    def grouped(self, k: int) -> bool:
        """Whether kernel ``k`` is a generated C++ kernel that Inductor emits in one call with its generated
        neighbours.  On CPU the scheduler adds each generated kernel to the backend's ``KernelGroup`` and frees what
        the kernels read last only when the group is flushed: before an extern kernel (a matmul, a fallback) or at
        the graph's end (``Scheduler.codegen`` -> ``Scheduler.flush`` -> ``free_buffers``).  So a run of generated
        kernels holds every input it reads until its last kernel is done.  (On CUDA each Triton kernel is its own
        call, and the frees follow each one.)"""
        if k >= len(self.order):
            return False
        return self.phase.in_kernel_group(self.order[k])

    def release(self, k: int, names: list[str]) -> None:
        """Free ``names`` (storages that died at or before kernel ``k``) after kernel ``k``; a pooled buffer enters
        Inductor's reuse pool there (``_pool_held``); fxremat's compiles bound the pool by an estimate that frees
        them here too (_torch_private/buffer_reuse.py)."""
        if self.reuse == tp.ALLOCATED:
            self.uncount(names)
        for name in names:
            if name in self.live:
                self.free(name)
                if name in self.poolable:
                    self.freed[k].append(self.poolable[name])

    def retire(self, k: int, kernel: list[fx.Node]) -> list[str]:
        """What dies after kernel ``k``: storages past their last reader, and its own outputs nobody reads later.
        Stock Inductor's estimate drops them at once; the caller frees them (``release``) when the kernel's code is
        flushed."""
        phase = self.phase
        gone: list[str] = []
        for u in kernel:
            for r in phase.unit_reads[u]:
                self.remaining[r.name] -= 1  # a kernel's reads are done when the whole kernel is
            for node in phase.owned[u]:  # written here and never read later: gone after this kernel
                if self.last_use.get(node.name, -1) < k and node.name not in phase.keep:
                    gone.append(node.name)
        gone += self.dies.get(k, ())
        dying = [name for name in gone if name not in phase.keep]
        if self.reuse != tp.ALLOCATED:  # stock Inductor's estimate frees at the last read; fxremat's at ``release``
            self.uncount(dying)
        return dying

    def uncount(self, names: list[str]) -> None:
        for name in names:
            if name in self.counted:
                self.estimate -= self.counted.pop(name)


def node_points(phase) -> dict[str, tuple[int, int]]:
    """Each node of ``phase`` (a ``phase._Phase`` that has run) by name -> (first, last) point on the step's timeline
    of the kernels that run it: a unit's member (a fused node, an item of a multi-output op), its kernel's points; a
    node no kernel stores (a view, an input, a value fused away into its readers), the points of the kernels that
    read it, through such nodes (a fused-away value is computed inside each kernel that reads it).  A node nothing
    reads (or only the output) has none.  The timeline's points are one per unit, kernel by kernel
    (``Walk.allocate``), from where the phase's run began (``_Phase.ran``)."""
    position, order = phase.ran
    points: dict = {}
    for head in order:
        units = phase.kernels[head]
        span = (position, position + len(units) - 1)
        for u in units:
            for member in phase.members[u]:
                points[member] = span
        position += len(units)
    for node in reversed(phase.nodes):
        if node not in points:
            spans = [points[u] for u in phase.view.users(node) if u in points]
            if spans:
                points[node] = (min(s[0] for s in spans), max(s[1] for s in spans))
    return {node.name: span for node, span in points.items()}
