"""Where the string form leaves its reports: ``fxremat.string_backend_reports()``, in compile order whatever the
``options=`` (a run's reports are the list's end)."""

from __future__ import annotations

import plain_loop
import pytest
import torch

import fxremat

pytestmark = pytest.mark.usefixtures("no_codegen")


def test_string_reports_in_compile_order():
    before = len(fxremat.string_backend_reports())
    for price in (3.0, 4.0, 3.0):  # the third compile goes to the first one's backend again
        torch._dynamo.reset()
        model = torch.compile(plain_loop.tiny_mlp(), backend="fxremat", options={"memory_price": price})
        model(torch.randn(2, 16)).sum().backward()
    new = fxremat.string_backend_reports()[before:]
    assert [r.memory_price for r in new] == [3.0, 4.0, 3.0]
