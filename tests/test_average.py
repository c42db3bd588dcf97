"""Averaging averages one training run: checkpoints of another run (an older run's files left in the window by a
restart with ckpt_path=null, another seed, other settings) are refused unless allow_mixed=true, another vocabulary
always; an average is never an input (its output is left out of dir=, an earlier average is refused); last >= 1.
A training run keeps its identity through resumes and a fresh start gets a new one."""

import pytest
import torch
from tiny_checkpoint import reordered_pieces, tiny_tokenizer, write_checkpoint

from transformer_nmt.checkpoint import CKPT_FINGERPRINT, CKPT_MODEL_CONFIG, CKPT_RUN, atomic_torch_save, load_checkpoint
from transformer_nmt.inference.average import AVERAGED_FROM
from transformer_nmt.inference.average import main as average_main
from transformer_nmt.training.module import TranslationModule

KEY = "encoder_layers.0.feed_forward.linear1.weight"


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer(vocab_size=100)


def write(path, tokenizer, step, run, seed=None, **changes):
    """A checkpoint of training run ``run`` at ``step`` (weights: a seed per file), with ``changes`` to what it
    records (None: the key removed, as in checkpoints written before it existed); returns its weights."""
    model = write_checkpoint(path, tokenizer, seed=step if seed is None else seed, step=step, run=run)
    if changes:
        checkpoint = torch.load(path, weights_only=True)
        for key, value in changes.items():
            checkpoint.pop(key) if value is None else checkpoint.__setitem__(key, value)
        atomic_torch_save(checkpoint, path)
    return model.state_dict()


def test_a_restart_leaves_an_older_runs_checkpoints_and_averaging_refuses_the_mix(tmp_path, tokenizer):
    recent = tmp_path / "recent"
    for step in (400, 450, 500):  # the first run's window, with higher steps than the restarted run has reached
        write(recent / f"step{step:07d}.ckpt", tokenizer, step, run="run-old", seed=0)
    new = {step: write(recent / f"step{step:07d}.ckpt", tokenizer, step, run="run-new", seed=0) for step in (100, 150)}
    command = [f"dir={recent}", "last=2", f"output={tmp_path / 'avg.ckpt'}"]
    with pytest.raises(SystemExit, match=r"2 different training runs \(run run-new / run run-old\): step0000100.ckpt, "
                                         r"step0000150.ckpt; step0000400.ckpt, step0000450.ckpt, step0000500.ckpt"):
        average_main(command)  # the last 2 by step are both the old run's: checked over the whole directory
    assert not (tmp_path / "avg.ckpt").exists()
    for step in (400, 450, 500):  # the fix the message gives: the other run's files out of the window
        (recent / f"step{step:07d}.ckpt").unlink()
    model, _, _ = load_checkpoint(average_main(command))
    torch.testing.assert_close(model.state_dict()[KEY], (new[100][KEY] + new[150][KEY]) / 2, atol=1e-7, rtol=0)


def test_the_output_is_never_an_input_and_an_average_is_refused(tmp_path, tokenizer):
    for step in (10, 20, 30):
        write(tmp_path / f"step{step:07d}.ckpt", tokenizer, step, run="one")
    output = tmp_path / "averaged.ckpt"  # inside the window
    first = torch.load(average_main([f"dir={tmp_path}", "last=2", f"output={output}"]), weights_only=True)
    assert first[AVERAGED_FROM] == [str(tmp_path / "step0000020.ckpt"), str(tmp_path / "step0000030.ckpt")]
    again = torch.load(average_main([f"dir={tmp_path}", "last=2", f"output={output}"]), weights_only=True)
    assert again[AVERAGED_FROM] == first[AVERAGED_FROM]  # its own output left out, not averaged in
    torch.testing.assert_close(again["state_dict"], first["state_dict"], atol=0, rtol=0)
    with pytest.raises(SystemExit, match=rf"checkpoint {output} is an average \(of 2 checkpoints\)"):
        average_main([f"dir={tmp_path}", "last=2", f"output={tmp_path / 'other.ckpt'}"])
    with pytest.raises(SystemExit, match=rf"checkpoint {output} is an average"):
        average_main([f"inputs=[{tmp_path / 'step0000010.ckpt'},{output}]", f"output={tmp_path / 'x.ckpt'}"])
    with pytest.raises(SystemExit, match=rf"output={output} is also one of the inputs"):
        average_main([f"inputs=[{tmp_path / 'step0000010.ckpt'},{output}]", f"output={output}"])


@pytest.mark.parametrize("options, message", [
    (["last=0"], r"last=0: give the number of checkpoints to average, >= 1"),
    (["last=-1"], r"last=-1: give the number"),
    (["inputs=[]"], r"inputs=\[\]: list the checkpoints"),
])
def test_nothing_to_average_is_an_error(tmp_path, tokenizer, options, message):
    write(tmp_path / "step0000010.ckpt", tokenizer, 10, run="one")
    extra = [] if options[0].startswith("inputs") else [f"dir={tmp_path}"]
    with pytest.raises(SystemExit, match=message):
        average_main([*extra, *options, f"output={tmp_path / 'out' / 'avg.ckpt'}"])


def test_checkpoints_without_a_run_identity_are_compared_by_settings(tmp_path, tokenizer):
    """Written before runs recorded an identity: the fingerprint and the model config decide; the attention
    kernel (the same arithmetic) may differ, another vocabulary is refused even with allow_mixed=true."""
    a, b = tmp_path / "a.ckpt", tmp_path / "b.ckpt"
    pair = [f"inputs=[{a},{b}]", f"output={tmp_path / 'avg.ckpt'}"]
    write(a, tokenizer, 10, run=None, seed=1, **{CKPT_RUN: None})
    config = torch.load(a, weights_only=True)[CKPT_MODEL_CONFIG]
    write(b, tokenizer, 20, run=None, seed=2, **{CKPT_RUN: None, CKPT_FINGERPRINT: {"seed": 1}})
    average_main(pair)  # same settings (fingerprint), no identity recorded: one run as far as can be told
    write(b, tokenizer, 20, run=None, seed=2, **{CKPT_RUN: None, CKPT_FINGERPRINT: {"seed": 2}})
    with pytest.raises(SystemExit, match=r"2 different runs with other settings \(run fingerprints\) \(seed: 1 / 2\)"):
        average_main(pair)
    write(b, tokenizer, 20, run=None, seed=2, **{CKPT_RUN: None, CKPT_FINGERPRINT: None,
                                                CKPT_MODEL_CONFIG: {**config, "dropout": 0.3}})
    with pytest.raises(SystemExit, match=r"2 different model configs \(dropout: 0.0 / 0.3\)"):
        average_main(pair)
    write(b, tokenizer, 20, run=None, seed=2, **{CKPT_RUN: None, CKPT_FINGERPRINT: None,
                                                CKPT_MODEL_CONFIG: {**config, "attention": "plain"}})
    average_main(pair)
    write_checkpoint(b, tiny_tokenizer(vocab_size=120), seed=2, step=20, run=None)
    with pytest.raises(SystemExit, match=r"2 different vocabularies .*allow_mixed=true does not apply"):
        average_main([*pair, "allow_mixed=true"])
    write_checkpoint(a, reordered_pieces(reordered_pieces(tokenizer)), seed=1, step=10, run=None)
    write_checkpoint(b, reordered_pieces(tokenizer), seed=2, step=20, run=None)  # one source model, other ids
    with pytest.raises(SystemExit, match=r"2 different vocabularies .*allow_mixed=true does not apply"):
        average_main([*pair, "allow_mixed=true"])


def test_a_training_run_keeps_its_identity_through_a_resume_and_a_fresh_start_gets_a_new_one(tokenizer):
    config = {"vocab_size": tokenizer.vocab_size, "d_model": 16, "n_heads": 2, "n_encoder_layers": 1,
              "n_decoder_layers": 1, "d_ff": 32}
    first, restarted = TranslationModule(config, tokenizer=tokenizer), TranslationModule(config, tokenizer=tokenizer)
    assert first.training_run != restarted.training_run
    saved = {}
    first.on_save_checkpoint(saved)
    assert saved[CKPT_RUN] == first.training_run
    resumed = TranslationModule(config, tokenizer=tokenizer)
    resumed.on_load_checkpoint(saved)  # what trainer.fit(ckpt_path=...) calls
    again = {}
    resumed.on_save_checkpoint(again)
    assert again[CKPT_RUN] == first.training_run
