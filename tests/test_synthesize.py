"""``python -m transformer_nmt.synthesize``: a corpus translated into pairs, one pair per input line (n per line
with n_best), the translations translate's own, in shards that a run started again after an interruption does not
translate twice."""

import json

import pytest
from tiny_checkpoint import multi30k_lines, tiny_tokenizer, write_checkpoint

from transformer_nmt.inference import synthesize
from transformer_nmt.inference.synthesize import main as synthesize_main
from transformer_nmt.inference.translate import main as translate_main

LINES = 200
FAST = ["max_len_offset=4", "threads=1"]  # a random model's outputs: short, so that the test is quick


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("synthesize")
    ckpt = folder / "model.ckpt"
    write_checkpoint(ckpt, tiny_tokenizer(vocab_size=120), max_positions=128)
    lines = multi30k_lines("train", "en", LINES)
    lines[5] = ""  # a blank line: a blank pair, still one line
    lines[100] = " ".join(lines[100:104])  # cut to max_positions, with a warning naming line 101
    (folder / "input.en").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return ckpt, folder / "input.en", lines


def translated(ckpt, source, tmp_path, *options) -> list[str]:
    """translate's output for ``source``: the reference for synthesize's target side."""
    out = tmp_path / "translate.out"
    translate_main([f"ckpt={ckpt}", f"input={source}", f"output={out}", *FAST, *options])
    return out.read_text(encoding="utf-8").split("\n")[:-1]


def test_a_corpus_interrupted_and_run_again_gives_every_pair_once(model, tmp_path, monkeypatch):
    ckpt, source, lines = model
    prefix = tmp_path / "out" / "train"
    command = [f"ckpt={ckpt}", f"input={source}", f"output={prefix}", "shard_lines=30", "src_lang=en",
               "tgt_lang=de", "beam=2", *FAST]
    calls, translate = [], synthesize.translate_hypotheses

    def interrupted(*args, **kwargs):  # a kill while the fourth shard is translated
        calls.append(kwargs["first_line"])
        if len(calls) == 4:
            raise KeyboardInterrupt
        return translate(*args, **kwargs)

    monkeypatch.setattr(synthesize, "translate_hypotheses", interrupted)
    with pytest.raises(KeyboardInterrupt):
        synthesize_main(command)
    work = tmp_path / "out" / "train.shards"
    assert sorted(p.name for p in work.glob("0*.json")) == ["000000.json", "000001.json", "000002.json"]
    (work / "000003.json.tmp-x").write_bytes(b'{"first_line": 90, "src"')  # what a kill mid-write leaves
    monkeypatch.setattr(synthesize, "translate_hypotheses", translate)
    calls.clear()
    monkeypatch.setattr(synthesize, "translate_hypotheses",
                        lambda *a, **k: calls.append(k["first_line"]) or translate(*a, **k))
    with pytest.warns(UserWarning, match=r"input line 101: \d+ tokens exceed max_positions \(128\)"):
        result = synthesize_main(command)
    assert calls == [90, 120, 150, 180]  # only the shards not written: no line translated twice
    src = (tmp_path / "out" / "train.en").read_text(encoding="utf-8").split("\n")[:-1]
    tgt = (tmp_path / "out" / "train.de").read_text(encoding="utf-8").split("\n")[:-1]
    assert src == lines and len(tgt) == LINES and tgt[5] == ""
    assert tgt == translated(ckpt, source, tmp_path, "beam=2")  # translate's own translations, line by line
    assert result["pairs"] == LINES and result["blank_input_lines"] == 1 and result["shards"] == 7
    assert [launch["shards"] for launch in result["launches"]] == [[0, 1, 2], [3, 4, 5, 6]]
    assert not work.exists()
    record = json.loads((tmp_path / "out" / "train.json").read_text())
    assert record["plan"]["models"][0]["path"] == str(ckpt) and len(record["plan"]["models"][0]["sha256"]) == 64
    assert record["plan"]["input_lines"] == LINES and record["plan"]["decode"]["beam"] == 2
    calls.clear()
    assert synthesize_main(command)["pairs"] == LINES and calls == []  # complete: nothing translated again


def test_samples_do_not_depend_on_the_shards(model, tmp_path):
    """A sampled line's seed is its line number in the whole input: shards of 7 lines draw what translate draws."""
    ckpt, source, _ = model
    prefix = tmp_path / "sampled"
    synthesize_main([f"ckpt={ckpt}", f"input={source}", f"output={prefix}", "shard_lines=7", "src_lang=en",
                     "tgt_lang=de", "sampling=true", "beam=1", "seed=3", *FAST])
    sampled = (tmp_path / "sampled.de").read_text(encoding="utf-8").split("\n")[:-1]
    assert sampled == translated(ckpt, source, tmp_path, "sampling=true", "beam=1", "seed=3")


def test_n_best_gives_n_pairs_per_line_best_first(model, tmp_path):
    ckpt, source, lines = model
    result = synthesize_main([f"ckpt={ckpt}", f"input={source}", f"output={tmp_path / 'nbest'}", "src_lang=en",
                              "tgt_lang=de", "beam=3", "n_best=2", *FAST])
    src = (tmp_path / "nbest.en").read_text(encoding="utf-8").split("\n")[:-1]
    tgt = (tmp_path / "nbest.de").read_text(encoding="utf-8").split("\n")[:-1]
    assert result["pairs"] == len(src) == len(tgt) == 2 * LINES
    assert src == [line for line in lines for _ in range(2)]
    listed = translated(ckpt, source, tmp_path, "beam=3", "n_best=2")
    assert tgt == [row.split("\t")[3] if row.count("\t") == 3 else "" for row in listed]


def test_another_command_over_the_same_shards_or_outputs_is_refused(model, tmp_path, monkeypatch):
    ckpt, source, _ = model
    prefix = tmp_path / "train"
    command = [f"ckpt={ckpt}", f"input={source}", f"output={prefix}", "shard_lines=50", "src_lang=en",
               "tgt_lang=de", *FAST]
    translate = synthesize.translate_hypotheses

    def interrupted(*args, **kwargs):
        if kwargs["first_line"] == 50:
            raise KeyboardInterrupt
        return translate(*args, **kwargs)

    monkeypatch.setattr(synthesize, "translate_hypotheses", interrupted)
    with pytest.raises(KeyboardInterrupt):
        synthesize_main(command)
    monkeypatch.setattr(synthesize, "translate_hypotheses", translate)
    with pytest.raises(SystemExit, match=r"train.shards holds the shards of another synthesis \(its plan.json "
                                         r"differs in: decode\)"):
        synthesize_main([*command, "beam=1"])
    synthesize_main([*command, "threads=2"])  # how fast it runs is not what it writes: finished
    other = tmp_path / "other.en"
    other.write_text("A dog runs.\n", encoding="utf-8")
    with pytest.raises(SystemExit, match=r"train.en, .*train.de, .*train.json exist\(s\) and are not this "
                                         r"synthesis's"):
        synthesize_main([f"ckpt={ckpt}", f"input={other}", f"output={prefix}", "src_lang=en", "tgt_lang=de", *FAST])
    with pytest.raises(SystemExit, match=r"would write .*input.en, the file input=.* names"):
        synthesize_main([f"ckpt={ckpt}", f"input={source}", f"output={source.with_suffix('')}", "src_lang=en",
                         "tgt_lang=de", *FAST])
    with pytest.raises(SystemExit, match=r"tgt_lang=json: PREFIX.json is the synthesis's own"):
        synthesize_main([f"ckpt={ckpt}", f"input={source}", f"output={tmp_path / 'x'}", "src_lang=en",
                         "tgt_lang=json", *FAST])
    with pytest.raises(SystemExit, match=r"src_lang='../x' is not a language code"):
        synthesize_main([f"ckpt={ckpt}", f"input={source}", f"output={tmp_path / 'x'}", "src_lang=../x",
                         "tgt_lang=de", *FAST])


def test_shards_left_without_their_plan_are_never_taken_into_another_synthesis(model, tmp_path):
    """Two launches racing on the final cleanup can leave PREFIX.shards/ holding a shard but no plan.json (one
    removes the directory while the other writes a shard into it). Another command then publishes its own plan
    there: the stale shard (first line and count as this command's) is translated again, not taken."""
    ckpt, source, lines = model
    prefix = tmp_path / "out" / "train"
    work = prefix.with_name("train.shards")
    work.mkdir(parents=True)
    stale = {"first_line": 0, "input_lines": 30, "src": ["STALE"] * 30, "tgt": ["STALE"] * 30, "launch": "other",
             "seconds": 0.0, "plan_sha256": "0" * 64}
    (work / "000000.json").write_text(json.dumps(stale))
    synthesize_main([f"ckpt={ckpt}", f"input={source}", f"output={prefix}", "shard_lines=30", "src_lang=en",
                     "tgt_lang=de", "beam=1", *FAST])
    target = prefix.with_name("train.de").read_text(encoding="utf-8").split("\n")[:-1]
    assert len(target) == LINES and "STALE" not in target
    assert target == translated(ckpt, source, tmp_path, "beam=1")
