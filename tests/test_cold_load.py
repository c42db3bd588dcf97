"""Loading a checkpoint initialises nothing it replaces: no random draws, no torch._dynamo import (the meta-device
layout of the loader's guards would import it through torch's Python reference kernels: seconds of every cold
translate), and the model it gives holds the file's weights exactly, in the model's own dtype."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny_checkpoint import tiny_tokenizer, write_checkpoint

from transformer_nmt.checkpoint import load_checkpoint, read_checkpoint
from transformer_nmt.model.transformer import Transformer

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {"sinusoidal": {}, "rotary": {"positions": "rotary"},
           "learned_untied_bias": {"positions": "learned", "tie_embeddings": False, "output_bias": True,
                                   "norm_first": True, "norm": "rmsnorm", "activation": "swiglu"}}
# A fresh interpreter: is torch._dynamo loaded after `import torch`, after importing translate's path, after loading
# each checkpoint and translating one line with it?
PROBE = """
import json, sys
import torch
seen = {"import torch": "torch._dynamo" in sys.modules}
from transformer_nmt.checkpoint import load_checkpoint
from transformer_nmt.inference.translate import translate_ids
seen["import translate"] = "torch._dynamo" in sys.modules
for path in sys.argv[1:]:
    model, tokenizer, _ = load_checkpoint(path)
    translate_ids(model, tokenizer, ["A man is riding a bike."], beam=2, max_len_offset=3)
    seen[path] = "torch._dynamo" in sys.modules
print(json.dumps(seen))
"""


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    folder, tokenizer = tmp_path_factory.mktemp("cold_load"), tiny_tokenizer()
    paths = {}
    for name, config in CONFIGS.items():
        paths[name] = folder / f"{name}.ckpt"
        write_checkpoint(paths[name], tokenizer, **config)
    return paths


def test_loading_and_translating_import_no_dynamo_where_importing_torch_does_not(checkpoints):
    done = subprocess.run([sys.executable, "-c", PROBE, *map(str, checkpoints.values())], capture_output=True,
                          text=True, timeout=600, env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    if seen.pop("import torch"):
        pytest.skip(f"torch {torch.__version__} imports torch._dynamo by itself: the cold-start benchmark measures it")
    assert seen == dict.fromkeys(["import translate", *map(str, checkpoints.values())], False)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_loading_draws_no_random_numbers_and_holds_the_files_weights(checkpoints, name):
    """The generator's state is the same after a load (building the model initialised every weight, a draw each),
    each parameter equals the file's tensor, the tables built from the config equal those of a model built the
    ordinary way, and so do the outputs."""
    file_weights = {k.removeprefix("model."): v for k, v in read_checkpoint(checkpoints[name])["state_dict"].items()}
    torch.manual_seed(1)
    state = torch.random.get_rng_state()
    model, _, meta = load_checkpoint(checkpoints[name])
    assert torch.equal(torch.random.get_rng_state(), state)
    reference = Transformer(model.config)  # initialised at random, then overwritten by copying: the old way
    reference.load_state_dict(file_weights)
    reference.eval()
    assert set(model.state_dict()) == set(file_weights)
    for key, value in model.state_dict().items():
        assert value.dtype == torch.float32 and torch.equal(value, file_weights[key]), key
    buffers = dict(reference.named_buffers())
    assert buffers.keys() == dict(model.named_buffers()).keys()
    for key, value in model.named_buffers():
        assert value.device.type == "cpu" and torch.equal(value, buffers[key]), key
    src, tgt = torch.randint(4, model.config.vocab_size, (2, 7)), torch.randint(4, model.config.vocab_size, (2, 5))
    with torch.no_grad():
        assert torch.equal(model(src, tgt), reference(src, tgt))
    assert all(p.requires_grad for p in model.parameters())


def test_weights_stored_in_another_dtype_load_in_the_models(tmp_path):
    """A file whose weights are bf16 gives a float32 model (what copying into an initialised model gave)."""
    path = tmp_path / "bf16.ckpt"
    write_checkpoint(path, tiny_tokenizer())
    checkpoint = read_checkpoint(path)
    checkpoint["state_dict"] = {k: v.to(torch.bfloat16) for k, v in checkpoint["state_dict"].items()}
    torch.save(checkpoint, path)
    model, _, _ = load_checkpoint(path)
    for key, value in model.state_dict().items():
        assert value.dtype == torch.float32
        assert torch.equal(value, checkpoint["state_dict"]["model." + key].float()), key
