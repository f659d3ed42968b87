"""tests/passes runs on torch.  Its fixtures (tests/helpers.py: a fixed seed before every test, autouse, and
``broken_plans``) are registered here rather than in tests/conftest.py, which imports no torch so that tests/solver
runs without it."""

from helpers import broken_plans, torch_seed  # noqa: F401  (fixtures: pytest registers those a conftest holds)
