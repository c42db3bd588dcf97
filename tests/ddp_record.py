"""Test-only (tests/test_ddp.py): a callback that records, per rank, the batches it trained on, the model's weights
at the start (after a resume restored them) and the end of the fit, the moving average of the weights, the last
validation's greedy hypotheses as that rank holds them after the gather, and the final metrics, into ``out``."""

import json
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback


class Record(Callback):
    def __init__(self, out: str):
        self.out, self.batches, self.initial = Path(out), [], None

    def on_train_start(self, trainer, pl_module) -> None:
        self.initial = {k: v.detach().clone() for k, v in pl_module.model.state_dict().items()}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.batches.append(batch["index"].tolist())

    def on_train_end(self, trainer, pl_module) -> None:
        rank = trainer.global_rank
        average = pl_module.ema.averaged_weights() if pl_module.ema is not None else None
        torch.save({"initial": self.initial, "final": pl_module.model.state_dict(), "average": average},
                   self.out / f"weights{rank}.pt")
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
        (self.out / f"rank{rank}.json").write_text(json.dumps({
            "batches": self.batches, "metrics": metrics, "world_size": trainer.world_size,
            "hypotheses": {str(i): text for i, text in pl_module.hypotheses.get("val", {}).items()}}))
