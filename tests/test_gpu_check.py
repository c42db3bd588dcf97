"""scripts/gpu_check.py runs only where a GPU is lent: the package pieces it is built on are checked here, so that a
change to them cannot break it unseen (its CPU dry run: GPU_CHECK_ALLOW_CPU=1 scripts/gpu_check.sh DIR)."""

import pytest
import torch

from transformer_nmt.data.synthetic import synthetic_batches

# the CPU dry run's sizes (scripts/gpu_check.py: SIZES without CUDA)
VOCAB, MAX_TOKENS, PAIRS = 500, 600, 4000


@pytest.mark.parametrize("multiple", [1, 8])
def test_synthetic_batches_respect_the_token_budget_and_the_pad_multiple(multiple):
    batches = synthetic_batches(5, VOCAB, MAX_TOKENS, PAIRS, multiple=multiple)
    assert len(batches) == 5
    for batch in batches:
        for side in ("src", "tgt"):
            assert batch[side].numel() <= MAX_TOKENS and batch[side].shape[1] % multiple == 0
            assert int(batch[side].max()) < VOCAB
        assert batch["src"].shape[0] == batch["tgt"].shape[0] == len(batch["index"])


def test_synthetic_targets_are_a_fixed_function_of_the_source():
    """The task is learnable (the check's loss must fall): one source id always maps to one target id."""
    mapping = {}
    for batch in synthetic_batches(5, VOCAB, MAX_TOKENS, PAIRS, seed=3):
        src, tgt = batch["src"], batch["tgt"][:, 1:]  # after bos: the permuted source, resized to its length
        for row in range(src.shape[0]):
            n = min(int((src[row] > 3).sum()), int((tgt[row] > 3).sum()))
            for s, t in zip(src[row, :n].tolist(), tgt[row, :n].tolist()):
                assert mapping.setdefault(s, t) == t
    assert len(mapping) > 10
    first, again = (synthetic_batches(2, VOCAB, MAX_TOKENS, PAIRS, seed=3) for _ in range(2))
    assert all(torch.equal(a["src"], b["src"]) and torch.equal(a["tgt"], b["tgt"]) for a, b in zip(first, again))
