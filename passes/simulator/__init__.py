"""The step's memory without running it, as Inductor would compile the graphs (docs/ARCHITECTURE.md, DESIGN §6)."""
