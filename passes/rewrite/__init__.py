"""The graphs fxremat hands Inductor: the split, segments, layout pins and choice, C++ units (docs/ARCHITECTURE.md)."""
