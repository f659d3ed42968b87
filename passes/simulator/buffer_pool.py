"""Inductor's buffer reuse (the wrapper's memory planning), replayed on the simulator's kernels."""

from __future__ import annotations

import numpy as np


def _pool_held(estimated: list[int], allocated: list[list], freed: list[list]) -> list[int]:
    """Bytes Inductor's buffer reuse holds during each kernel, beyond what is live.

    Inductor's wrapper (``memory_plan_reuse``: ``FreeIfNotReusedLine``/``AllocateLine``) does not free a dead
    buffer at once: it pools it, and a later allocation of the same size and dtype takes the most recently pooled
    one, so the storage stays allocated from the free to that allocation.  It does so only while the
    range's peak plus that buffer stays within the graph's peak by its own estimate (``should_reuse_buffer``, which
    then adds the buffer to the range), or when the two kernels are adjacent.  The estimate
    (``estimate_peak_memory``) has no in-place updates, counts buffers local to a fused kernel, and no tangents or
    parameters; it is higher than what is live, so the pooled buffers fill the slack up to it: the real peak is near
    that estimate, not the live bytes: on a recompute-heavy plan, one layer's MLP buffers can be held through the next
    layer's attention (docs/DESIGN.md §6)."""
    held = [0] * len(estimated)
    if not any(allocated):
        return held
    estimate = np.array(estimated, dtype=np.int64)
    ceiling = int(estimate.max())
    extra = np.zeros(len(estimated), dtype=np.int64)
    pool: dict[object, list[int]] = {}
    for k in range(len(estimated)):
        for nbytes, key in allocated[k]:
            stack = pool.get(key)
            if not stack:
                continue
            f = stack[-1]
            if f + 1 == k or nbytes + int(estimate[f + 1 : k].max(initial=0)) <= ceiling:
                stack.pop()
                estimate[f + 1 : k] += nbytes
                extra[f + 1 : k] += nbytes
        for key in freed[k]:
            pool.setdefault(key, []).append(k)
    return extra.tolist()
