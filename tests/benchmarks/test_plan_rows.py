"""benchmarks/plan_rows.py: the plan-level rows come from the compile fxremat's backend would run (Inductor's joint
passes first, the layout decided by the partitioner after a contiguous choice), no Inductor code generation."""

from __future__ import annotations

from plan_rows import row


def test_a_convolution_graph_gets_the_layout_its_real_compile_decides():
    """The convnet's activations dwarf its weights: the partitioner lays it out channels-last (passes/layout_choice
    .py), as a real compile does; left to Inductor's own layout, the row held no decision at all."""
    result = row("convnet", "default")
    assert result["layout"] == ["channels_last"] and result["saved"] > 0 and result["simulated"] > 0
