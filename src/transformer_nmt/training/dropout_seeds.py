"""The seed of each micro-batch's dropout masks: a pure function of where training is, so that a resumed run draws
the masks an uninterrupted one would."""

from __future__ import annotations

import torch


def dropout_seed(seed: int, rank: int, global_step: int, batch_idx: int) -> int:
    """The seed of the dropout masks of one micro-batch: a pure function of where training is.

    Seeding every micro-batch from (seed, rank, optimizer step, batch index) instead of carrying one
    generator through the run makes a resumed run draw the same masks as an uninterrupted one, however
    many random numbers data loading or validation consumed in between; ranks draw different masks.
    """
    return hash((seed, rank, global_step, batch_idx)) & 0x7FFF_FFFF_FFFF_FFFF


def seed_dropout_masks(seed: int, rank: int, global_step: int, batch_idx: int) -> None:
    """Seed torch's generator for the micro-batch at (``global_step``, ``batch_idx``) on ``rank`` of a run seeded
    ``seed``: the dropout masks it draws next are that micro-batch's (``dropout_seed``)."""
    torch.manual_seed(dropout_seed(seed, rank, global_step, batch_idx))
