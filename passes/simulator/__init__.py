"""simulator: see docs/ARCHITECTURE.md."""
