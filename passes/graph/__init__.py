"""graph: see docs/ARCHITECTURE.md."""
