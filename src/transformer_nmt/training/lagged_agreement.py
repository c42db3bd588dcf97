"""Whether any rank raised a flag, agreed every optimizer step one step late, without a host sync (an asynchronous
all-reduce): how the ranks agree to stop on a signal that reached one of them (slurm.SlurmRequeue)."""

from __future__ import annotations

import torch


class LaggedAgreement:
    """Whether any rank raised its flag, agreed every step without waiting for the other ranks: each step
    starts an asynchronous all-reduce (MAX) of this rank's flag and reads the one started a step earlier,
    long finished by then. Every rank reads the same value at the same step. The flag lives in one tensor on
    the device, filled in place (a kernel argument, no host-to-device copy); on CUDA the result is copied to
    one pinned host buffer behind an event, so reading it waits for the previous step's kernels at most."""

    def __init__(self):
        self._value = None  # the flag on the device, all-reduced in place
        self._host = None  # on CUDA: pinned host memory the result is copied to
        self._pending = None  # (work, event or None)

    def exchange(self, flag: bool, device: torch.device) -> bool:
        """Start agreeing on ``flag``; return what the ranks agreed on at the previous call."""
        previous = self.result()
        if self._value is None or self._value.device != device:
            self._value = torch.zeros(1, device=device)
            self._host = torch.zeros(1, pin_memory=True) if self._value.is_cuda else self._value
        self._value.fill_(float(flag))
        work = torch.distributed.all_reduce(self._value, op=torch.distributed.ReduceOp.MAX, async_op=True)
        event = None
        if self._value.is_cuda:
            work.wait()  # NCCL: orders the current stream after the all-reduce; the host does not wait
            self._host.copy_(self._value, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
        self._pending = (work, event)
        return previous

    def result(self) -> bool:
        """What the last started agreement gave (False if none), waiting for it if it is still running."""
        if self._pending is None:
            return False
        work, event = self._pending
        self._pending = None
        if event is not None:
            event.synchronize()
        else:
            work.wait()
        return bool(self._host.item())
