"""The joint graph's facts and costs: the op table, roles, node costs and the flow problem (docs/ARCHITECTURE.md)."""
