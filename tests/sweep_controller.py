"""``python -m transformer_nmt.train`` as tests/test_sweeps.py launches its sweep, except for one constant of submitit:
the wait for the result file of a job that died without writing one (submitit allows a shared file system 15 s to show
it; the test's killed job never writes one, and its file system is local), cut to 1 s."""

import runpy

from submitit.core.core import Job

Job._results_timeout_s = 1
runpy.run_module("transformer_nmt.train", run_name="__main__", alter_sys=True)
