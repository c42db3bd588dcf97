"""Fixtures shared across test modules."""

import pytest

from transformer_nmt.hardware import CPU_BF16_ANSWERS, CPU_BF16_ENV
from transformer_nmt.training.resolvers import register_resolvers


@pytest.fixture(autouse=True, scope="session")
def resolvers():
    """The configs' resolvers (${run_name:}, ${sweep_name:}, ${by_precision:}), as the apps register them
    before composing: the tests compose configs themselves (hydra.compose)."""
    register_resolvers()


@pytest.fixture(params=CPU_BF16_ANSWERS)
def cpu_bf16(request, monkeypatch):
    """Each answer that trainer.precision=auto's CPU branch can get, whatever this machine's flags: a test that
    takes this fixture runs once as on a CPU with native bf16 and once as on one without (the CI guard)."""
    monkeypatch.setenv(CPU_BF16_ENV, request.param)
    return request.param
