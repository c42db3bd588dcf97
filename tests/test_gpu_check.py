"""scripts/gpu_check.py runs only where a GPU is lent: its CPU-side pieces are checked here, so that a change to
the library it calls cannot break it unseen (its CPU dry run: GPU_CHECK_ALLOW_CPU=1 scripts/gpu_check.sh DIR)."""

import pytest
import torch

from script_module import load_script


@pytest.fixture(scope="module")
def gpu_check():
    return load_script("gpu_check")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU dry run's sizes")
@pytest.mark.parametrize("multiple", [1, 8])
def test_synthetic_batches_respect_the_token_budget_and_the_pad_multiple(gpu_check, multiple):
    batches = gpu_check.synthetic_batches(5, multiple=multiple)
    assert len(batches) == 5
    budget = gpu_check.SIZES["max_tokens"]
    for batch in batches:
        for side in ("src", "tgt"):
            assert batch[side].numel() <= budget and batch[side].shape[1] % multiple == 0
        assert batch["src"].shape[0] == batch["tgt"].shape[0] == len(batch["index"])
