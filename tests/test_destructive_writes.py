"""Writes that must not destroy what they replace or read: ``export force=true`` replaces only an export, and only
once the new one is complete (a failure in between keeps the old); ``translate output=F`` refuses an F it reads;
``average`` never overwrites last.ckpt or a checkpoint a run can resume from; ``evaluate`` says which earlier
evaluation of another checkpoint it replaces."""

import json
import os
from pathlib import Path

import pytest
import torch
from tiny_checkpoint import tiny_tokenizer, write_checkpoint

from transformer_nmt.checkpoint import atomic_torch_save
from transformer_nmt.export import main as export_main
from transformer_nmt.inference.average import AVERAGED_FROM
from transformer_nmt.inference.average import main as average_main
from transformer_nmt.inference.evaluate import main as evaluate_main
from transformer_nmt.inference.translate import main as translate_main

FORMATS = ["ctranslate2", "marian"]


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer(vocab_size=100)


@pytest.fixture
def ckpt(tmp_path, tokenizer):
    path = tmp_path / "model" / "model.ckpt"
    write_checkpoint(path, tokenizer)
    return path


def snapshot(directory: Path) -> dict:
    """{relative path: bytes} of every file under ``directory``."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def export(ckpt, output, fmt, *extra):
    pytest.importorskip("ctranslate2" if fmt == "ctranslate2" else "transformers")
    return export_main([f"ckpt={ckpt}", f"output={output}", f"format={fmt}", *extra])


# --- export force=true ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", FORMATS)
def test_export_force_refuses_a_directory_that_is_not_an_export_and_names_what_it_holds(tmp_path, ckpt, fmt):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "last.ckpt").write_bytes(b"weeks of training")
    (run_dir / "config.yaml").write_text("seed: 1\n")
    before = snapshot(run_dir)
    with pytest.raises(SystemExit, match=rf"output={run_dir} holds .*checkpoints/.*config.yaml.*not .*export"):
        export(ckpt, run_dir, fmt, "force=true")
    assert snapshot(run_dir) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "run"]  # no temporary directory left


@pytest.mark.parametrize("fmt", FORMATS)
def test_export_force_replaces_an_export_only_once_the_new_one_is_complete(tmp_path, ckpt, tokenizer, monkeypatch,
                                                                           fmt):
    output = tmp_path / "exported"
    export(ckpt, output, fmt)
    old = snapshot(output)
    write_checkpoint(ckpt, tokenizer, seed=1)  # other weights: another export
    replace = os.replace

    def killed_at_the_swap(src, dst):  # the new export's rename into place fails (a full disk, a kill)
        if Path(dst) == output and ".tmp-" in Path(src).name:
            raise OSError(28, "No space left on device")
        return replace(src, dst)

    monkeypatch.setattr(os, "replace", killed_at_the_swap)
    with pytest.raises(OSError, match="No space left"):
        export(ckpt, output, fmt, "force=true")
    assert snapshot(output) == old  # the old export is whole, where it was
    monkeypatch.setattr(os, "replace", replace)
    export(ckpt, output, fmt, "force=true")
    new = snapshot(output)
    assert new.keys() == old.keys() and new != old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exported", "model"]  # no backup, no temporary left


# --- translate output= ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("same_as", ["input", "prefix", "score_reference", "ckpt"])
def test_translate_refuses_an_output_that_is_one_of_its_inputs(tmp_path, ckpt, same_as):
    text = tmp_path / "text.txt"
    text.write_text("A dog runs.\nTwo men talk.\n")
    other = tmp_path / "other.txt"
    other.write_text("Ein Hund.\nZwei Männer.\n")
    files = {"input": other, "prefix": other, "score_reference": other, "ckpt": ckpt}
    files[same_as] = text if same_as != "ckpt" else ckpt
    output = ckpt if same_as == "ckpt" else tmp_path / "." / "text.txt"  # another spelling of the same file
    argv = [f"ckpt={files['ckpt']}", f"input={files['input']}", f"output={output}", "beam=1", "max_len_offset=5"]
    if same_as in ("prefix", "score_reference"):
        argv.append(f"{same_as}={files[same_as]}")
    before = {p: p.read_bytes() for p in (text, other, ckpt)}
    with pytest.raises(SystemExit, match=rf"output={output} is the file .*{same_as}="):
        translate_main(argv)
    assert {p: p.read_bytes() for p in before} == before


def test_translate_refuses_a_hard_link_to_its_input_too(tmp_path, ckpt):
    text = tmp_path / "text.txt"
    text.write_text("A dog runs.\n")
    os.link(text, tmp_path / "alias.txt")
    with pytest.raises(SystemExit, match=r"is the file .*input="):
        translate_main([f"ckpt={ckpt}", f"input={text}", f"output={tmp_path / 'alias.txt'}", "beam=1"])
    assert text.read_text() == "A dog runs.\n"


# --- average output= -----------------------------------------------------------------------------------------------

def training_checkpoints(directory, tokenizer):
    for step in (10, 20):
        write_checkpoint(directory / f"step{step}.ckpt", tokenizer, step=step, run="run-1")


def test_average_never_writes_last_ckpt(tmp_path, tokenizer):
    directory = tmp_path / "checkpoints"
    training_checkpoints(directory, tokenizer)
    with pytest.raises(SystemExit, match=r"output=.*last.ckpt: .*resume"):
        average_main([f"dir={directory}", f"output={directory / 'last.ckpt'}"])
    assert not (directory / "last.ckpt").exists()


def test_average_refuses_to_overwrite_a_resumable_checkpoint_but_replaces_an_earlier_average(tmp_path, tokenizer):
    directory = tmp_path / "checkpoints"
    training_checkpoints(directory, tokenizer)
    resumable = tmp_path / "keep.ckpt"
    write_checkpoint(resumable, tokenizer, step=30, run="run-1")
    checkpoint = torch.load(resumable, weights_only=True)
    checkpoint["optimizer_states"] = [{"state": {}, "param_groups": []}]
    atomic_torch_save(checkpoint, resumable)
    before = resumable.read_bytes()
    with pytest.raises(SystemExit, match=rf"output={resumable} .*optimizer state"):
        average_main([f"dir={directory}", f"output={resumable}"])
    assert resumable.read_bytes() == before
    average = tmp_path / "averaged.ckpt"
    average_main([f"dir={directory}", f"output={average}"])
    average_main([f"inputs=[{directory / 'step10.ckpt'}]", f"output={average}"])  # an average: replaced
    assert torch.load(average, weights_only=True)[AVERAGED_FROM] == [str(directory / "step10.ckpt")]


# --- evaluate over an earlier evaluation -----------------------------------------------------------------------------

@pytest.mark.parametrize("same_as", ["src", "ref", "ckpt", "src as a symbolic link", "ref as a hard link"])
def test_evaluate_refuses_an_output_that_is_one_of_its_inputs(tmp_path, tokenizer, same_as):
    """evaluate src=D/t.hyp ref=D/t.ref out=D name=t replaced its own source with the hypotheses: refused, naming
    the option, with every input as it was; another spelling or a link of an input too."""
    data = tmp_path / "data"
    data.mkdir()
    src, ref, ckpt = data / "a.en", data / "a.de", data / "m.ckpt"
    src.write_text("A dog runs.\nTwo men talk.\n")
    ref.write_text("Ein Hund rennt.\nZwei Männer reden.\n")
    out, name = tmp_path / "." / "data", "t"
    if same_as == "src":
        src = src.rename(data / "t.hyp")
    elif same_as == "ref":
        ref = ref.rename(data / "t.ref")
    elif same_as == "ckpt":
        ckpt, name = data / "t.json", "t"
    elif same_as == "src as a symbolic link":
        out = tmp_path / "links"
        out.mkdir()
        (out / "t.ref").symlink_to(src)
    else:
        out = tmp_path / "links"
        out.mkdir()
        os.link(ref, out / "t.hyp")
    write_checkpoint(ckpt, tokenizer)
    before = snapshot(tmp_path)
    option = same_as.split()[0]
    with pytest.raises(SystemExit, match=rf"out={out} name={name} writes .*, which is the file {option}="):
        evaluate_main([f"ckpt={ckpt}", f"src={src}", f"ref={ref}", f"out={out}", f"name={name}", "beam=1",
                       "max_len_offset=5"])
    assert snapshot(tmp_path) == before


def test_evaluate_names_the_earlier_evaluation_of_another_checkpoint_it_replaces(tmp_path, tokenizer, capsys):
    (tmp_path / "test.en").write_text("A dog runs.\n")
    (tmp_path / "test.de").write_text("Ein Hund rennt.\n")
    first, second = tmp_path / "run" / "step10.ckpt", tmp_path / "run" / "step20.ckpt"
    write_checkpoint(first, tokenizer, step=10)
    write_checkpoint(second, tokenizer, step=20)
    common = [f"src={tmp_path / 'test.en'}", f"ref={tmp_path / 'test.de'}", f"out={tmp_path / 'eval'}", "beam=1",
              "max_len_offset=5"]
    evaluate_main([f"ckpt={first}", *common])
    evaluate_main([f"ckpt={first}", *common])  # the same checkpoint again: nothing to say
    assert "replac" not in capsys.readouterr().err
    evaluate_main([f"ckpt={second}", *common])
    assert (f"{tmp_path / 'eval' / 'test.en.json'} holds the evaluation of '{first}'; replacing it with that of "
            f"{second}" in " ".join(capsys.readouterr().err.split()))
    planted = "\x1b]2;owned\x07\x1b[2J"  # what a planted NAME.json may say: shown as a literal, never sent as is
    (tmp_path / "eval" / "test.en.json").write_text(json.dumps({"checkpoint": planted}))
    evaluate_main([f"ckpt={second}", *common])
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err and repr(planted) in err
