"""The solver tier: plain numbers, no torch (min-cut, MILP, budgets, shortlists; docs/ARCHITECTURE.md)."""
