"""The configs' resolvers are registered by training.resolvers.register_resolvers, never by importing a module."""

import subprocess
import sys

from omegaconf import OmegaConf

from transformer_nmt.training.resolvers import RESOLVERS

NAMES = sorted(RESOLVERS)


def in_fresh_interpreter(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_imports_register_no_resolver_register_resolvers_does_and_a_second_call_changes_nothing():
    """One fresh interpreter (importing the training modules is most of its cost): nothing is registered by the
    imports; after register_resolvers() the configs resolve, and calling it again changes nothing."""
    out = in_fresh_interpreter(
        "import transformer_nmt.training.run_dir, transformer_nmt.training.precision, transformer_nmt.training.app, "
        "transformer_nmt.training.resolvers\n"
        f"from omegaconf import OmegaConf\nprint([n for n in {NAMES!r} if OmegaConf.has_resolver(n)])\n"
        "from transformer_nmt.training.resolvers import register_resolvers\n"
        "register_resolvers()\n"
        "cfg = OmegaConf.create({'run_id': 'job7', 'sweep_id': 'sw', 'trainer': {'precision': '32-true'},\n"
        "    'run': '${run_name:${run_id}}', 'sweep': '${sweep_name:${sweep_id}}',\n"
        "    'dropout': '${by_precision:{32-true: 0.1, bf16-mixed: 0.3}}'})\n"
        "before = OmegaConf.to_container(cfg, resolve=True)\n"
        "register_resolvers()\n"
        "assert OmegaConf.to_container(cfg, resolve=True) == before\n"
        "print(before['run'], before['sweep'], before['dropout'])")
    assert out.splitlines() == ["[]", "job7 sw 0.1"]


def test_the_tests_and_apps_see_every_resolver():
    assert all(OmegaConf.has_resolver(name) for name in NAMES)  # conftest registers them, as train.py does
