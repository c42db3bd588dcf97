"""The training step never makes the host wait for the device between logging steps.

Over optimizer steps that do not log, every Python-level way to read a tensor on the host is counted
(``Tensor.item``, ``tolist``, ``cpu``, ``numpy``, ``nonzero``, ``__bool__``, ``__float__``, ``__int__``,
``torch.nonzero``, ``torch.cuda.synchronize``), wherever the call comes from: our code, Lightning's loops
and callbacks, the optimizer; and so is every operator whose result depends on tensor values in a way
that needs them on the host (``aten._local_scalar_dense``, ``nonzero``, ``masked_select``, indexing with a
boolean mask, ...), even when C++ issues it: a dispatch mode sees those. The count must be zero but for
the calls ``NOT_SYNCS`` names. On a CUDA device the same steps also run under
``torch.cuda.set_sync_debug_mode("error")``, which catches what neither sees (a host-to-device copy of a
Python number, a ``.to("cpu")``).
"""

import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import Callback
from tiny_corpus import tiny_config, write_tiny_corpus
from torch.utils._python_dispatch import TorchDispatchMode

import transformer_nmt.training.app as train_app

HOST_READS = [(torch.Tensor, name) for name in
              ("item", "tolist", "cpu", "numpy", "nonzero", "__bool__", "__float__", "__int__")]
HOST_READS += [(torch, "nonzero"), (torch.cuda, "synchronize")]

aten = torch.ops.aten
VALUE_DEPENDENT = {aten._local_scalar_dense.default, aten.nonzero.default, aten.masked_select.default,
                   aten.unique_consecutive.default, aten._unique2.default, aten.repeat_interleave.Tensor}
INDEXING = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default}


DISPATCH_FILES = ("torch/utils/_python_dispatch.py", "torch/_ops.py", "torch/_compile.py",
                  "torch/_dynamo/eval_frame.py")


def call_site(frame) -> tuple[str, str]:
    """(file, function) of the first frame outside this test and torch's dispatch machinery."""
    while frame is not None and (frame.f_code.co_filename == __file__ or
                                 frame.f_code.co_filename.endswith(DISPATCH_FILES)):
        frame = frame.f_back
    path = Path(frame.f_code.co_filename).as_posix() if frame else "<C++>"
    site = "/".join(path.split("/")[-3:]) if "/torch/" in path else path.split("/")[-1]
    return site.removeprefix("site-packages/"), frame.f_code.co_name if frame else ""


class ValueDependentOps(TorchDispatchMode):
    """Records every operator that must read tensor values on the host to run."""

    def __init__(self, calls: Counter):
        super().__init__()
        self.calls = calls

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        boolean_index = func in INDEXING and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] if len(args) > 1 else ()) or ())
        if func in VALUE_DEPENDENT or boolean_index:
            self.calls[(*call_site(sys._getframe(1)), str(func))] += 1
        return func(*args, **kwargs)


# (file, function) of calls that read a tensor on the host without waiting for the device, and why.
NOT_SYNCS = {
    # Non-fused Adam (our CPU default) keeps its step counter in a CPU tensor precisely so that reading it
    # needs no device; fused Adam, used on CUDA, keeps it on the device and never reads it.
    ("torch/optim/optimizer.py", "_get_value"),
}


class CountHostReads(Callback):
    """Counts host reads from the end of optimizer step ``first`` to the end of step ``last``: the loop's
    bookkeeping, the next batch's loading and transfer, forward, backward, the optimizer and callbacks."""

    def __init__(self, first: int, last: int):
        self.first, self.last = first, last
        self.calls, self.steps, self._on = Counter(), 0, False
        self.mode = ValueDependentOps(self.calls)
        self._originals = [(owner, name, getattr(owner, name)) for owner, name in HOST_READS]

    def _count(self, owner, name, original):
        def wrapper(*args, **kwargs):
            if self._on:
                self.calls[(*call_site(sys._getframe(1)), name)] += 1
            return original(*args, **kwargs)
        return wrapper

    def on_train_start(self, trainer, pl_module):
        for owner, name, original in self._originals:
            setattr(owner, name, self._count(owner, name, original))

    def on_train_end(self, trainer, pl_module):
        for owner, name, original in self._originals:
            setattr(owner, name, original)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        cuda = pl_module.device.type == "cuda"
        if trainer.global_step == self.first:
            self._on = True
            self.mode.__enter__()
            if cuda:
                torch.cuda.set_sync_debug_mode("error")
        elif trainer.global_step == self.last and self._on:
            self._on = False
            self.mode.__exit__(None, None, None)
            if cuda:
                torch.cuda.set_sync_debug_mode("default")
            self.steps = self.last - self.first


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_tiny_corpus(tmp_path_factory.mktemp("corpus"), n_train=400)


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("trainer, precision", [
    ("cpu", "32-true"),
    pytest.param("gpu", "bf16-mixed", marks=[pytest.mark.cuda, CUDA]),
    pytest.param("gpu", "16-mixed", marks=[pytest.mark.cuda, CUDA]),
])
def test_steps_between_logging_steps_never_read_the_device(corpus, tmp_path, monkeypatch, trainer, precision):
    counter = CountHostReads(first=2, last=9)
    build_callbacks = train_app.build_callbacks
    monkeypatch.setattr(train_app, "build_callbacks", lambda *a: build_callbacks(*a) + [counter])
    cfg = tiny_config(corpus, f"trainer={trainer}", f"trainer.precision={precision}", "trainer.max_steps=10",
                      "trainer.log_every_n_steps=50", "trainer.enable_progress_bar=true",
                      "train.clip_grad_norm=1.0", "train.val_bleu_max_sentences=0", "data.max_tokens=256")
    trained = train_app.train(cfg, tmp_path / "run")

    assert trained.global_step == 10 and trained.num_training_batches > 10  # the window held no epoch end
    assert counter.steps == 7  # steps 3..9 counted, none of them a logging step
    unexplained = {call: n for call, n in counter.calls.items() if call[:2] not in NOT_SYNCS}
    assert unexplained == {}, f"host reads between logging steps: {unexplained}"
