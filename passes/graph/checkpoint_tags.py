"""The clean-up of checkpoint tags PyTorch's partitioner does before it decides anything (its
``cleanup_recompute_tags``), written with public torch API only; ``_torch_private.mark_must_save`` runs it."""

from __future__ import annotations

import torch
from torch.utils.checkpoint import CheckpointPolicy


def _must_recompute(node: torch.fx.Node) -> bool:
    return node.meta.get("recompute") in (CheckpointPolicy.MUST_RECOMPUTE, CheckpointPolicy.PREFER_RECOMPUTE)


def save_checkpoint_boundaries(joint: torch.fx.GraphModule) -> None:
    """What PyTorch's ``cleanup_recompute_tags`` does, tolerant of graphs traced without Dynamo (no
    ``ac_graph_id``, where PyTorch's version raises a TypeError): the last value of a checkpointed region that
    feeds the next region is saved, and so is a region output with a backward hook (FSDP2 + AC cycle)."""
    for node in joint.graph.nodes:
        if not _must_recompute(node):
            continue
        region = node.meta.get("ac_graph_id")
        for user in node.users:
            user_region = user.meta.get("ac_graph_id")
            if (
                _must_recompute(user)
                and isinstance(region, int)
                and isinstance(user_region, int)
                and user_region > region
            ):
                node.meta["recompute"] = CheckpointPolicy.MUST_SAVE
        if node.meta.get("has_backward_hook", False) and not any(_must_recompute(u) for u in node.users):
            node.meta["recompute"] = CheckpointPolicy.MUST_SAVE
