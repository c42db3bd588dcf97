"""Fixtures shared across test modules."""

import fcntl
import os
from pathlib import Path

import pytest
import torch

from transformer_nmt.hardware import CPU_BF16_ANSWERS, CPU_BF16_ENV, available_cpus
from transformer_nmt.training.resolvers import register_resolvers

MAX_WORKERS = 8  # each worker imports torch and Lightning and trains tiny runs: ~1-2 GB of memory

# Every process a test launches (the apps, DDP ranks, torchrun nodes, the studies' steps) runs one intra-op thread,
# as the workers themselves do (``one_thread``): the cores are shared, and oversubscribed OpenMP threads crawl.
os.environ["OMP_NUM_THREADS"] = "1"


def pytest_xdist_auto_num_workers(config):
    """What ``-n auto`` (pyproject's addopts) means: the cores this process may run on (its affinity: a container's
    share, not the host's cores), at most MAX_WORKERS. Every test runs one torch thread (``one_thread``)."""
    return max(1, min(available_cpus(), MAX_WORKERS))


# The modules whose tests launch processes (sweeps, DDP, torchrun nodes, the studies' steps, the smoke run, the
# wheel): a minute or more each. Scheduled first, so that parallel workers end together instead of one of them
# starting the longest module last.
LONG_MODULES = ("test_sweeps.py", "test_ddp.py", "test_multinode.py", "test_back_translation_study.py",
                "test_fine_tuning_study.py", "test_distillation_study.py", "test_resume.py", "test_train_app.py",
                "test_wheel.py", "test_resume_guards.py", "test_configs.py")


def pytest_collection_modifyitems(config, items):
    """LONG_MODULES first, in that order; every other test after them in collection order."""
    rank = {name: i for i, name in enumerate(LONG_MODULES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONG_MODULES)))


@pytest.fixture(autouse=True, scope="session")
def resolvers():
    """The configs' resolvers (${run_name:}, ${sweep_name:}, ${by_precision:}), as the apps register them
    before composing: the tests compose configs themselves (hydra.compose)."""
    register_resolvers()


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One intra-op thread in every test module, restored after it: the machine's cores are shared (parallel test
    workers take one core each), and oversubscribed OpenMP threads crawl."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


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
    runs; under ``-p no:cacheprovider`` it is trained into the session's temporary directory. Parallel workers
    share the cache: one trains (one thread) while the others wait on a lock, then read what it wrote."""
    from tiny_checkpoint import trained_checkpoint

    cache = getattr(request.config, "cache", None)  # set by the cacheprovider plugin, absent without it
    directory = cache.mkdir("transformer_nmt") if cache is not None else tmp_path_factory.mktemp("trained")
    threads = torch.get_num_threads()
    with open(directory / "trained.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        torch.set_num_threads(1)
        try:
            return trained_checkpoint(directory)
        finally:
            torch.set_num_threads(threads)
