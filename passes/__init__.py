"""fxremat's graph passes, installed as ``fxremat_passes``, one package per stage of a partition: ``graph`` (facts
and costs), ``solver`` (torch-free), ``simulator``, ``choice``, ``rewrite``, and ``_torch_private``
(docs/ARCHITECTURE.md)."""
