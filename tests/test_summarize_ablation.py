"""transformer_nmt.analysis.ablation (transformer_nmt.summarize_ablation) on synthetic runs (results.json +
val_hypotheses.txt): grouping over seeds and sweep directories, mean ± std, Table 3 rows, paired significance
against the base, CSV and plots; no training."""

import csv
import json
import statistics
from pathlib import Path

import pytest

import transformer_nmt.analysis.ablation as summarize_ablation

# The base of conf/experiment/ablation_base.yaml: N 2, d_model 128, d_ff 512, h 4, d_k = d_v = 32, P_drop 0.1,
# eps_ls 0.1, sinusoids.
BASE = dict(n_layers=2, d_model=128, d_ff=512, n_heads=4, dropout=0.1, label_smoothing=0.1, positions="sinusoidal")
# 60 "validation sentences": references, and hypotheses that get all, or none, of them right.
REFERENCES = [f"a dog number {i} runs across the green field" for i in range(60)]
WRONG = [f"cat {i} sleeps" for i in range(60)]


def write_run(directory: Path, seed: int, val_bleu: float, hypotheses: list[str] | None, **settings) -> Path:
    """One run directory as transformer_nmt.train leaves it (results.json, val_hypotheses.txt)."""
    s = {**BASE, **settings}
    per_head = s["d_model"] // s["n_heads"]
    directory.mkdir(parents=True)
    (directory / "results.json").write_text(json.dumps({
        "overrides": [f"seed={seed}"], "seed": seed, "n_heads": s["n_heads"], "d_model": s["d_model"],
        "d_k": s.get("d_k", per_head), "d_v": per_head, "n_layers": s["n_layers"], "n_decoder_layers": s["n_layers"],
        "d_ff": s["d_ff"], "dropout": s["dropout"], "label_smoothing": s["label_smoothing"],
        "positions": s["positions"], "parameters": 1_949_696 * s["n_layers"] // 2, "val_loss": 3.1,
        "val_ppl": 5.0 + seed / 10, "val_bleu": val_bleu, "test_bleu": None, "train_tgt_tokens_per_sec": 1e4,
        "steps": 700, "wall_seconds": 300.0, "precision": "bf16-mixed", "cpu_flags": ["avx2"]}))
    if hypotheses is not None:
        (directory / "val_hypotheses.txt").write_text("".join(h + "\n" for h in hypotheses))
    return directory


def mixed(n_right: int) -> list[str]:
    """Hypotheses with the first ``n_right`` sentences right and the others wrong."""
    return REFERENCES[:n_right] + WRONG[n_right:]


@pytest.fixture
def two_sweeps(tmp_path):
    """A base sweep (5 seeds) and a heads sweep (h 1 and 16, 2 seeds each) in two directories, the references
    once above them (as in docs/table3). h=1 is far better than the base under both seeds; h=16 is better
    under seed 1 only (under seed 2 it gets another one sentence right than the base, one fewer)."""
    (tmp_path / "val_references.txt").write_text("".join(r + "\n" for r in REFERENCES))
    for seed, bleu in zip(range(1, 6), [20.0, 21.0, 22.0, 23.0, 24.0]):
        write_run(tmp_path / "base" / "RUN" / str(seed - 1), seed, bleu, mixed(20))
    heads = tmp_path / "heads" / "RUN"
    write_run(heads / "0", 1, 30.0, mixed(45), n_heads=1)
    write_run(heads / "1", 2, 31.0, mixed(45), n_heads=1)
    write_run(heads / "2", 1, 26.0, mixed(45), n_heads=16)
    write_run(heads / "3", 2, 21.5, mixed(19)[:-1] + REFERENCES[-1:], n_heads=16)
    write_run(heads / "4", 1, 19.0, None, dropout=0.0)  # no hypotheses: no p-value
    return tmp_path


def test_groups_seeds_and_directories_with_mean_std_and_paired_p(two_sweeps):
    out = two_sweeps / "summary"
    text = summarize_ablation.summarize([two_sweeps / "base" / "RUN", two_sweeps / "heads" / "RUN"], out,
                                        resamples=200)
    table = [line for line in text.splitlines() if line.startswith("|")]
    header = [c.strip() for c in table[0].strip("|").split("|")]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table[2:]]
    col = {name: header.index(name) for name in ("h", "BLEU (dev)", "n", "ΔBLEU", "p", "p<0.05", "P_drop")}
    assert [(row[0], row[col["h"]]) for row in rows] == [("base", "4"), ("A", "1"), ("A", "16"), ("D", "")]
    base, h1, h16, drop = rows
    expected = [20.0, 21.0, 22.0, 23.0, 24.0]
    assert base[col["BLEU (dev)"]] == f"{statistics.fmean(expected):.2f} ± {statistics.stdev(expected):.2f}"
    assert base[col["n"]] == "5" and h1[col["n"]] == "2" and drop[col["n"]] == "1"
    assert h1[col["BLEU (dev)"]] == f"30.50 ± {statistics.stdev([30.0, 31.0]):.2f}" and h1[col["ΔBLEU"]] == "+8.50"
    # Far better under both seeds: significant; better under one seed only: the largest p (seed 2, equal) is not.
    assert float(h1[col["p"]]) < 0.05 and h1[col["p<0.05"]] == "✓"
    assert float(h16[col["p"]]) > 0.5 and h16[col["p<0.05"]] == ""
    assert drop[col["p"]] == "-" and drop[col["P_drop"]] == "0.0"  # settings equal to the base's are blank
    assert "Base noise: n=5 seeds" in text and "200 resamples" in text and "SACREBLEU_SEED=12345" in text

    with open(out / "ablation.csv", newline="") as f:
        records = {(r["row"], r["h"]): r for r in csv.DictReader(f)}
    assert records[("A", "16")]["seeds"] == "1 2" and records[("A", "16")]["p_seeds"] == "1 2"
    assert float(records[("base", "4")]["bleu_std"]) == pytest.approx(statistics.stdev(expected), abs=1e-4)
    for name in ("bleu_vs_heads.png", "bleu_vs_params.png", "ablation_rows.png"):
        png = (out / name).read_bytes()
        assert png.startswith(b"\x89PNG") and len(png) > 1000, name


def test_table_rows_follow_which_settings_differ_from_the_base():
    base = summarize_ablation.config_key({**BASE, "d_k": 32, "d_v": 32})
    key = lambda **s: summarize_ablation.config_key({**BASE, "d_k": 32, "d_v": 32, **s})  # noqa: E731
    row = summarize_ablation.table_row
    assert row(base, base) == "base"
    assert row(key(n_heads=8, d_k=16, d_v=16), base) == "A"  # d_k follows d_model / h
    assert row(key(d_k=16), base) == "B"
    assert row(key(n_layers=3), base) == "C" and row(key(d_model=256, d_k=64, d_v=64), base) == "C"
    assert row(key(dropout=0.0), base) == "D" and row(key(label_smoothing=0.2), base) == "D"
    assert row(key(positions="learned"), base) == "E"
    assert row(key(n_heads=8, dropout=0.0, d_k=16, d_v=16), base) == "other"
    assert summarize_ablation.base_config("ablation_base") == base


def test_the_command_prints_the_table_and_refuses_an_empty_directory(two_sweeps, tmp_path, capsys):
    summarize_ablation.main([str(two_sweeps / "base"), str(two_sweeps / "heads"), "--resamples", "100"])
    printed = capsys.readouterr().out
    assert printed == (two_sweeps / "base" / "ablation.md").read_text()  # --out: the first directory
    assert "mean ± sample std" in printed and "| n |" in printed and "| p |" in printed
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SystemExit, match="no results.json under"):
        summarize_ablation.main([str(empty)])


def test_runs_of_two_precisions_are_refused_naming_both(tmp_path):
    """precision=auto answers per machine: runs gathered from two machines may differ in precision, and a paired
    test between them would measure the precision as well as the setting."""
    write_run(tmp_path / "a" / "0", 1, 30.0, REFERENCES)
    fp32 = write_run(tmp_path / "b" / "0", 1, 29.0, REFERENCES, n_heads=2)
    results = json.loads((fp32 / "results.json").read_text())
    (fp32 / "results.json").write_text(json.dumps({**results, "precision": "32-true"}))
    with pytest.raises(SystemExit, match=r"different precisions \(bf16-mixed: 1 runs.*; 32-true: 1 runs"):
        summarize_ablation.load_runs([tmp_path / "a", tmp_path / "b"])
    assert len(summarize_ablation.load_runs([tmp_path / "a"])) == 1  # one precision: summarized


def test_a_model_option_added_since_separates_runs_and_has_its_row():
    """Every TransformerConfig field is part of a configuration (a new option needs no edit of the grouping): a
    results.json that records ``model.norm`` is another configuration than one without it (which ran with the
    default), and the rows since the paper follow which fields changed."""
    base = summarize_ablation.config_key({**BASE, "d_k": 32, "d_v": 32})
    key = lambda **model: summarize_ablation.config_key({**BASE, "d_k": 32, "d_v": 32, "model": model})  # noqa: E731
    row = summarize_ablation.table_row
    assert key(norm="layernorm", activation="relu") == base  # the defaults, recorded or not
    assert row(key(norm="rmsnorm"), base) == "G" and row(key(norm_first=True), base) == "G"
    assert row(summarize_ablation.config_key({**BASE, "d_k": 32, "d_v": 32, "d_ff": 344,
                                              "model": {"activation": "swiglu"}}), base) == "F"
    modern = {"norm": "rmsnorm", "norm_first": True, "activation": "swiglu"}
    assert row(summarize_ablation.config_key({**BASE, "d_k": 32, "d_v": 32, "d_ff": 344, "positions": "rotary",
                                              "model": modern}), base) == "H"
    record = dict(zip(summarize_ablation.KEYS, key(norm="rmsnorm", activation="geglu")))
    assert summarize_ablation.extra_changes(record, dict(zip(summarize_ablation.KEYS, base))) == \
        "norm=rmsnorm activation=geglu"


def test_the_csv_names_the_fields_since_the_paper_where_a_configuration_sets_one(tmp_path):
    """Two configurations equal in every Table 3 column (RMSNorm against the base) stay apart in ablation.csv: an
    ``other`` column names what differs; a table without such fields keeps the paper's columns only."""
    keys = summarize_ablation.KEYS
    base = {**dict(zip(keys, summarize_ablation.config_key({**BASE, "d_k": 32, "d_v": 32}))), "row": "base"}
    rms = {**dict(zip(keys, summarize_ablation.config_key({**BASE, "d_k": 32, "d_v": 32,
                                                             "model": {"norm": "rmsnorm"}}))), "row": "G"}
    common = {"parameters": 1, "ppl_mean": 1.0, "ppl_std": None, "bleu_mean": 1.0, "bleu_std": None, "n": 1,
              "seeds": [1], "minutes": None}
    records = [{**base, **common, "config": "b"}, {**rms, **common, "config": "r"}]
    summarize_ablation.write_csv(records, {}, tmp_path / "with.csv")
    rows = list(csv.DictReader(open(tmp_path / "with.csv")))
    assert [r["other"] for r in rows] == ["", "norm=rmsnorm"]
    summarize_ablation.write_csv(records[:1], {}, tmp_path / "without.csv")
    assert "other" not in next(csv.DictReader(open(tmp_path / "without.csv")))


def with_fingerprint(directory: Path, **settings) -> Path:
    """``directory``'s results.json with a results fingerprint (training/fingerprint.py's keys) whose training
    settings are the plain recipe's, updated by ``settings``; the architecture and seed from the run itself."""
    results = json.loads((directory / "results.json").read_text())
    fingerprint = {"seed": results["seed"], "model.n_heads": results["n_heads"], "model.d_model": results["d_model"],
                   "train.label_smoothing": results["label_smoothing"], "train.ema_decay": None,
                   "data.spm_alpha": 0.0, "data.train_sha256": "aaaa", "trainer.max_steps": 700,
                   "trainer.precision": "bf16-mixed", **settings}
    (directory / "results.json").write_text(json.dumps({**results, "fingerprint": fingerprint}))
    return directory


def test_runs_with_other_training_settings_are_refused_naming_what_differs(tmp_path):
    """The issue's pool: plain, EMA, BPE-dropout and distilled-data runs of one architecture and four seeds would be
    one row of n=4; each setting is named with its values."""
    with_fingerprint(write_run(tmp_path / "plain", 1, 30.0, REFERENCES))
    with_fingerprint(write_run(tmp_path / "ema", 2, 31.0, REFERENCES), **{"train.ema_decay": 0.999})
    with_fingerprint(write_run(tmp_path / "bpe_dropout", 3, 29.0, REFERENCES), **{"data.spm_alpha": 0.1})
    with_fingerprint(write_run(tmp_path / "distilled", 4, 32.0, REFERENCES), **{"data.train_sha256": "bbbb"})
    with pytest.raises(SystemExit, match="different settings outside Table 3's columns") as refused:
        summarize_ablation.load_runs([tmp_path])
    lines = {line.split(":")[0].strip(): line for line in str(refused.value).splitlines()[1:-1]}
    assert sorted(lines) == ["data.spm_alpha", "data.train_sha256", "train.ema_decay"]
    assert f"0.1 (1 runs, e.g. {tmp_path / 'bpe_dropout'})" in lines["data.spm_alpha"] and "0.0 (3 runs" in \
        lines["data.spm_alpha"]
    assert f'"bbbb" (1 runs, e.g. {tmp_path / "distilled"})' in lines["data.train_sha256"]
    assert f"0.999 (1 runs, e.g. {tmp_path / 'ema'})" in lines["train.ema_decay"] and "null (3 runs" in \
        lines["train.ema_decay"]
    assert len(summarize_ablation.load_runs([tmp_path / "plain"])) == 1


def test_an_init_from_run_of_the_same_seed_is_refused_not_dropped(tmp_path):
    """A fine-tune of the same architecture and seed was dropped with only a warning (kept: the first met); its
    parent's digest names it now."""
    with_fingerprint(write_run(tmp_path / "a", 1, 30.0, REFERENCES))
    with_fingerprint(write_run(tmp_path / "b", 1, 33.0, REFERENCES), **{"init_from.sha256": "cafe"})
    with pytest.raises(SystemExit, match=r"init_from.sha256: \"absent\" \(1 runs, e.g. .*a\); \"cafe\" \(1 runs"):
        summarize_ablation.load_runs([tmp_path])


def test_runs_that_differ_only_in_the_columns_and_seed_are_summarized(tmp_path):
    with_fingerprint(write_run(tmp_path / "a", 1, 30.0, REFERENCES))
    with_fingerprint(write_run(tmp_path / "b", 2, 31.0, REFERENCES))
    with_fingerprint(write_run(tmp_path / "c", 1, 28.0, REFERENCES, n_heads=8, label_smoothing=0.0))
    runs = summarize_ablation.load_runs([tmp_path])
    assert len(runs) == 3 and len({run["config"] for run in runs}) == 2
