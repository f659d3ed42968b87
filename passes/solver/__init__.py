"""solver: see docs/ARCHITECTURE.md."""
