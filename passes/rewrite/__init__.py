"""rewrite: see docs/ARCHITECTURE.md."""
