"""Fixtures shared across test modules."""

from pathlib import Path

import pytest

from transformer_nmt.hardware import CPU_BF16_ANSWERS, CPU_BF16_ENV
from transformer_nmt.training.resolvers import register_resolvers


@pytest.fixture(autouse=True, scope="session")
def resolvers():
    """The configs' resolvers (${run_name:}, ${sweep_name:}, ${by_precision:}), as the apps register them
    before composing: the tests compose configs themselves (hydra.compose)."""
    register_resolvers()


KEPT = "the user's file, which nothing may change\n"  # what a victim file holds, before and after


@pytest.fixture
def victim(tmp_path) -> Path:
    """A file of the user's, outside any run or checkpoint directory (``tmp_path/home/victim.txt``, holding
    ``KEPT``), that a planted link or a recorded path must never make a command read or change."""
    path = tmp_path / "home" / "victim.txt"
    path.parent.mkdir()
    path.write_text(KEPT)
    return path


@pytest.fixture(params=CPU_BF16_ANSWERS)
def cpu_bf16(request, monkeypatch):
    """Each answer that trainer.precision=auto's CPU branch can get, whatever this machine's flags: a test that
    takes this fixture runs once as on a CPU with native bf16 and once as on one without (the CI guard)."""
    monkeypatch.setenv(CPU_BF16_ENV, request.param)
    return request.param


@pytest.fixture(scope="session")
def trained_checkpoint_path(request, tmp_path_factory) -> Path:
    """The small trained checkpoint of tiny_checkpoint.trained_checkpoint, trained at most once per session and
    shared by every module that needs it. It is kept between sessions in pytest's cache where the cache provider
    runs; under ``-p no:cacheprovider`` it is trained into the session's temporary directory."""
    from tiny_checkpoint import trained_checkpoint

    cache = getattr(request.config, "cache", None)  # set by the cacheprovider plugin, absent without it
    return trained_checkpoint(cache.mkdir("transformer_nmt") if cache is not None
                              else tmp_path_factory.mktemp("trained"))
