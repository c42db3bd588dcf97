"""translate, evaluate and average on small checkpoints: line accounting, sacreBLEU agreement, averaging."""

import copy
import json
import math
import subprocess
import sys

import pytest
import torch
from tiny_checkpoint import multi30k_lines, tiny_tokenizer, write_checkpoint

from transformer_nmt.checkpoint import CKPT_TOKENIZER, CheckpointError, load_checkpoint
from transformer_nmt.inference.average import average_checkpoints
from transformer_nmt.inference.average import main as average_main
from transformer_nmt.inference.evaluate import main as evaluate_main
from transformer_nmt.inference.evaluate import score
from transformer_nmt.inference.translate import main as translate_main
from transformer_nmt.inference.translate import translate_lines


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tokenizer):
    path = tmp_path_factory.mktemp("ckpt") / "model.ckpt"
    write_checkpoint(path, tokenizer)
    return path


# --- translate ---------------------------------------------------------------------------------

def test_translate_keeps_one_output_line_per_input_line(tmp_path, checkpoint):
    long_line = " ".join(["dog"] * 80)  # far beyond max_positions 64
    lines = ["A man is riding a bike.", "", "   ", long_line, "Two dogs play in the snow.", "\u2028odd separator"]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.warns(UserWarning, match="input line 4: .* exceed max_positions \\(64\\)"):
        translate_main([f"ckpt={checkpoint}", f"input={tmp_path / 'in.txt'}", f"output={tmp_path / 'out.txt'}",
                        "beam=2"])
    out = (tmp_path / "out.txt").read_text(encoding="utf-8").split("\n")
    assert out[-1] == "" and len(out) - 1 == len(lines)  # one line each, newline-terminated
    assert out[1] == "" and out[2] == ""  # blank in, blank out


def test_translate_stdin_to_stdout_in_a_subprocess(checkpoint):
    text = "A dog runs.\n\nA woman sings on a stage.\n"
    result = subprocess.run([sys.executable, "-m", "transformer_nmt.translate", f"ckpt={checkpoint}", "beam=1"],
                            input=text, capture_output=True, text=True, check=True, timeout=120)
    lines = result.stdout.split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == ""


def test_order_is_kept_whatever_the_batching(checkpoint):
    model, tokenizer, _ = load_checkpoint(checkpoint)
    lines = multi30k_lines("val", "en", 12)
    alone = [translate_lines(model, tokenizer, [line], beam=3)[0] for line in lines]
    batched = translate_lines(model, tokenizer, lines, beam=3, max_tokens=40)  # several small batches
    assert [h[0][0] for h in batched] == [h[0][0] for h in alone]


def test_n_best_writes_n_numbered_lines_per_input(tmp_path, checkpoint):
    (tmp_path / "in.txt").write_text("A dog runs.\nA cat sleeps.\n", encoding="utf-8")
    translate_main([f"ckpt={checkpoint}", f"input={tmp_path / 'in.txt'}", f"output={tmp_path / 'out.txt'}",
                    "beam=4", "n_best=3"])
    rows = [line.split("\t") for line in (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines()]
    assert [r[0] for r in rows] == ["1", "1", "1", "2", "2", "2"]
    scores = [float(r[1]) for r in rows[:3]]
    assert scores == sorted(scores, reverse=True)


def test_unknown_option_is_named(checkpoint):
    with pytest.raises(SystemExit, match="unknown option.*beam_size"):
        translate_main([f"ckpt={checkpoint}", "beam_size=4"])


# --- checkpoints -------------------------------------------------------------------------------

@pytest.mark.parametrize("content, message", [
    (b"", "is empty"),
    (b"not a checkpoint at all", "cannot be read"),
    (None, "truncated|cannot be read"),
])
def test_bad_checkpoint_files_name_the_file(tmp_path, checkpoint, content, message):
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(checkpoint.read_bytes()[:2000] if content is None else content)
    with pytest.raises(CheckpointError, match=message) as error:
        load_checkpoint(bad)
    assert str(bad) in str(error.value)


def test_foreign_checkpoint_is_rejected(tmp_path):
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.ones(3)}, foreign)
    with pytest.raises(CheckpointError, match="not a transformer_nmt training checkpoint"):
        load_checkpoint(foreign)


def test_checkpoint_loads_with_weights_only(checkpoint):
    assert isinstance(torch.load(checkpoint, weights_only=True)[CKPT_TOKENIZER], bytes)


# --- average -----------------------------------------------------------------------------------

def test_averaging_identical_checkpoints_returns_them(tmp_path, tokenizer, checkpoint):
    averaged = average_checkpoints([checkpoint, checkpoint, checkpoint])
    original = torch.load(checkpoint, weights_only=True)["state_dict"]
    assert averaged["state_dict"].keys() == original.keys()
    for key, value in original.items():
        torch.testing.assert_close(averaged["state_dict"][key], value, atol=0, rtol=0)


def test_two_seeds_average_to_the_mean_only_when_mixing_is_asked_for(tmp_path, tokenizer):
    a = write_checkpoint(tmp_path / "a.ckpt", tokenizer, seed=1, step=10)
    b = write_checkpoint(tmp_path / "b.ckpt", tokenizer, seed=2, step=20)
    inputs = [f"inputs=[{tmp_path / 'a.ckpt'},{tmp_path / 'b.ckpt'}]", f"output={tmp_path / 'avg.ckpt'}"]
    with pytest.raises(SystemExit, match=r"2 different training runs \(run run-of-seed-1 / run run-of-seed-2\): "
                                         r"a.ckpt; b.ckpt .*allow_mixed=true"):
        average_main(inputs)
    assert not (tmp_path / "avg.ckpt").exists()
    output = average_main([*inputs, "allow_mixed=true"])
    model, _, _ = load_checkpoint(output)
    for (name, p_a), p_b in zip(a.state_dict().items(), b.state_dict().values()):
        torch.testing.assert_close(model.state_dict()[name], (p_a + p_b) / 2, atol=1e-7, rtol=0)


def test_average_last_n_picks_the_highest_steps(tmp_path, tokenizer):
    models = {step: write_checkpoint(tmp_path / f"step={step}.ckpt", tokenizer, seed=step, step=step, run="one")
              for step in (5, 10, 15)}
    output = average_main([f"dir={tmp_path}", "last=2", f"output={tmp_path / 'out' / 'avg.ckpt'}"])
    model, _, _ = load_checkpoint(output)
    key = "encoder_layers.0.feed_forward.linear1.weight"
    expected = (models[10].state_dict()[key] + models[15].state_dict()[key]) / 2
    torch.testing.assert_close(model.state_dict()[key], expected, atol=1e-7, rtol=0)


# --- evaluate ----------------------------------------------------------------------------------

def test_evaluate_scores_match_the_sacrebleu_command_line(tmp_path, checkpoint):
    sources, references = multi30k_lines("val", "en", 20), multi30k_lines("val", "de", 20)
    (tmp_path / "src.en").write_text("\n".join(sources) + "\n", encoding="utf-8")
    (tmp_path / "ref.de").write_text("\n".join(references) + "\n", encoding="utf-8")
    result = evaluate_main([f"ckpt={checkpoint}", f"src={tmp_path / 'src.en'}", f"ref={tmp_path / 'ref.de'}",
                            f"out={tmp_path / 'eval'}", "beam=2", "name=val20"])
    hyp, ref = tmp_path / "eval" / "val20.hyp", tmp_path / "eval" / "val20.ref"
    assert len(hyp.read_text(encoding="utf-8").splitlines()) == 20
    assert json.loads((tmp_path / "eval" / "val20.json").read_text())["bleu"] == result["bleu"]
    for metric, flags, key in (("bleu", [], "bleu"), ("bleu", ["-lc"], "bleu_lowercase"), ("chrf", [], "chrf")):
        cli = subprocess.run([sys.executable, "-m", "sacrebleu", str(ref), "-i", str(hyp), "-m", metric, "-b",
                              "-w", "4", *flags], capture_output=True, text=True, check=True)
        assert float(cli.stdout.strip()) == pytest.approx(result[key], abs=1e-4)
    assert result["bleu_signature"].startswith("nrefs:1|case:mixed")
    assert "case:lc" in result["bleu_lowercase_signature"]
    # the checkpoint has no data config: no target language, so no Multi30k-convention BLEU, and the reason
    assert result["bleu_multi30k"] is None and "target language" in result["bleu_multi30k_signature"]
    assert result["provenance"]["config"]["options"]["beam"] == 2 and "versions" in result["provenance"]


def test_evaluates_written_files_reproduce_its_score_exactly_with_line_breaks_inside_references(tmp_path, checkpoint):
    """References with a lone CR (kept by read_lines) or U+2028 inside a line: NAME.ref and NAME.hyp hold one line
    per sentence for any reader (str.splitlines, universal newlines, sacrebleu reading stdin), and the sacrebleu
    command line gives evaluate's scores exactly, from -i and from stdin."""
    sources = ["A dog runs.", "Two men talk.", "A child plays in the snow."]
    (tmp_path / "src.en").write_text("\n".join(sources) + "\n", encoding="utf-8")
    (tmp_path / "ref.de").write_text("x\ny\nz\n", encoding="utf-8")
    evaluate_main([f"ckpt={checkpoint}", f"src={tmp_path / 'src.en'}", f"ref={tmp_path / 'ref.de'}",
                   f"out={tmp_path / 'eval'}", "beam=1", "name=first"])
    hypotheses = (tmp_path / "eval" / "first.hyp").read_text(encoding="utf-8").split("\n")[:3]

    def broken(text, separator):  # the output with a line break inside: n-grams shared with it, BLEU > 0
        middle = len(text) // 2
        return f"{text[:middle]}{separator}{text[middle:]} extra"
    references = [broken(hypotheses[0], "\r"), broken(hypotheses[1], " \u2028"), broken(hypotheses[2], "\r")]
    (tmp_path / "ref.de").write_bytes("".join(r + "\n" for r in references).encode())
    result = evaluate_main([f"ckpt={checkpoint}", f"src={tmp_path / 'src.en'}", f"ref={tmp_path / 'ref.de'}",
                            f"out={tmp_path / 'eval'}", "beam=1", "name=test"])
    assert result["bleu"] > 0
    ref, hyp = tmp_path / "eval" / "test.ref", tmp_path / "eval" / "test.hyp"
    for path in (ref, hyp):
        assert len(path.read_text(encoding="utf-8").splitlines()) == 3
        with open(path, encoding="utf-8") as f:  # universal newlines, as Python reads by default
            assert len(f.readlines()) == 3
    for metric, key in (("bleu", "bleu"), ("chrf", "chrf")):
        cli = [sys.executable, "-m", "sacrebleu", str(ref), "-m", metric, "-b", "-w", "4"]
        from_file = subprocess.run([*cli, "-i", str(hyp)], capture_output=True, text=True, check=True)
        with open(hyp, "rb") as stdin:
            from_stdin = subprocess.run(cli, stdin=stdin, capture_output=True, text=True, check=True)
        assert float(from_file.stdout) == float(from_stdin.stdout) == result[key], metric


def test_evaluate_reports_length_ratio_and_brevity_penalty():
    references = ["a man rides a red bike", "two dogs play in the snow"]  # 12 tokens
    metrics = score(["a man rides", "two dogs play in the"], references)  # 8 tokens
    assert metrics["length_ratio"] == pytest.approx(8 / 12, abs=1e-4)
    assert metrics["bp"] == pytest.approx(math.exp(1 - 12 / 8), abs=1e-4)  # BP = exp(1 - r / c) when c < r
    assert score(references, references)["length_ratio"] == 1.0 and score(references, references)["bp"] == 1.0


# --- head importance ---------------------------------------------------------------------------

def test_analyze_heads_masks_every_head_once_and_writes_its_reports(tmp_path, checkpoint):
    from transformer_nmt.analysis.heads import main as analyze_main

    sources, references = multi30k_lines("val", "en", 8), multi30k_lines("val", "de", 8)
    (tmp_path / "src.en").write_text("\n".join(sources) + "\n", encoding="utf-8")
    (tmp_path / "ref.de").write_text("\n".join(references) + "\n", encoding="utf-8")
    result = analyze_main([f"ckpt={checkpoint}", f"src={tmp_path / 'src.en'}", f"ref={tmp_path / 'ref.de'}",
                           f"out={tmp_path / 'heads'}", "steps=3"])
    # 1 encoder layer + 1 decoder layer (self + cross), 2 heads each
    assert [(r["kind"], r["layer"], r["head"]) for r in result["heads"]] == [
        ("encoder", 0, 0), ("encoder", 0, 1), ("decoder", 0, 0), ("decoder", 0, 1), ("cross", 0, 0), ("cross", 0, 1)]
    assert any(abs(r["delta_loss"]) > 1e-6 for r in result["heads"])  # the gates really act
    # The losses against a reference of our own: per sentence, torch's cross-entropy of the references under teacher
    # forcing, with a head silenced by zeroing its d_v input columns of W_O (out_proj) instead of gating it. A
    # sentence longer than max_positions (64; the 6th reference is 78 pieces) is cut as the tools cut it: the
    # source to 63 pieces + eos, the reference to bos + 62 pieces + eos.
    model, tokenizer, _ = load_checkpoint(checkpoint)
    cut = model.config.max_positions - 2

    from transformer_nmt.analysis.head_gates import attention_modules

    def loss_without(heads) -> float:
        silenced = copy.deepcopy(model)
        for kind, layer, head in heads:
            out_proj = attention_modules(silenced, kind)[layer].out_proj
            d_v = out_proj.in_features // 2
            out_proj.weight.data[:, head * d_v:(head + 1) * d_v] = 0.0
        total = tokens = 0
        with torch.no_grad():
            for source, reference in zip(sources, references):
                src = torch.tensor([tokenizer.encode_batch([source])[0][:cut + 1] + [tokenizer.eos_id]])
                tgt = torch.tensor([[tokenizer.bos_id] + tokenizer.encode_batch([reference])[0][:cut]
                                    + [tokenizer.eos_id]])
                logits = silenced(src, tgt[:, :-1])[0].double()  # (T - 1, V)
                total += float(torch.nn.functional.cross_entropy(logits, tgt[0, 1:], reduction="sum"))
                tokens += tgt.shape[1] - 1
        return total / tokens

    assert result["base"]["loss"] == pytest.approx(loss_without([]), rel=1e-5)
    for row in result["heads"]:
        assert row["loss"] == pytest.approx(loss_without([(row["kind"], row["layer"], row["head"])]), rel=1e-5), row
    curve = result["pruning"]
    assert [c["heads_removed"] for c in curve] == [0, 2, 4, 6]
    assert curve[0]["loss"] == pytest.approx(loss_without([]), rel=1e-5)
    every_head = [(r["kind"], r["layer"], r["head"]) for r in result["heads"]]
    assert curve[-1]["loss"] == pytest.approx(loss_without(every_head), rel=1e-5)
    for name in ("head_importance.csv", "head_importance.md", "head_importance.png", "pruning.csv", "pruning.png"):
        assert (tmp_path / "heads" / name).stat().st_size > 0
    assert len((tmp_path / "heads" / "head_importance.csv").read_text().splitlines()) == 1 + 6


def test_lone_carriage_return_does_not_split_a_line_and_bad_utf8_names_the_line(tmp_path, checkpoint):
    (tmp_path / "in.txt").write_bytes(b"A dog\rruns.\nA cat.\n")
    translate_main([f"ckpt={checkpoint}", f"input={tmp_path / 'in.txt'}", f"output={tmp_path / 'out.txt'}", "beam=1"])
    assert (tmp_path / "out.txt").read_bytes().count(b"\n") == 2
    (tmp_path / "bad.txt").write_bytes(b"fine\nbad \xff byte\n")
    with pytest.raises(SystemExit, match=r"bad.txt:2: not valid UTF-8"):
        translate_main([f"ckpt={checkpoint}", f"input={tmp_path / 'bad.txt'}"])
