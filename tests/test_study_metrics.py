"""A metric added as docs/evaluation.md says (one ``@register``ed class; here inside this test module) serves the
Table 3 and ablation summaries, a study's choice on val and analyze_heads with nothing else edited, each in its
direction; and the paired tests those summaries run go through the metric: sacreBLEU's own for BLEU, the same
bootstrap over sentence values for a metric that is their mean."""

from __future__ import annotations

import csv
import json
import statistics

import pytest
from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest
from study_scripts import load_study
from test_summarize_ablation import REFERENCES, WRONG, mixed, write_run

import transformer_nmt.analysis.ablation as ablation
from transformer_nmt.analysis import table3
from transformer_nmt.metrics import catalog, significance
from transformer_nmt.metrics.base import REGISTERED, Metric, MetricResult, register
from transformer_nmt.metrics.significance import paired_bootstrap_of_means


class LengthGap(Metric):
    """A toy: the mean over sentences of |hypothesis words - reference words|; lower is better."""

    name, higher_is_better, title = "length_gap", False, "Gap"

    def sentence_values(self, hypotheses, references, sources=None):
        return [float(abs(len(h.split()) - len(r.split()))) for h, r in zip(hypotheses, references)]

    def compute(self, hypotheses, references, sources=None):
        self.check_inputs(hypotheses, references, sources)
        values = self.sentence_values(hypotheses, references)
        return MetricResult(sum(values) / len(values), "length_gap:whitespace")


@pytest.fixture
def toy_metric(monkeypatch):
    """LengthGap registered for one test (the registry restored after it)."""
    monkeypatch.setattr(catalog, "REGISTERED", dict(REGISTERED))
    monkeypatch.setattr("transformer_nmt.metrics.base.REGISTERED", catalog.REGISTERED)
    register(LengthGap)
    return LengthGap.name


def short(n_right: int) -> list[str]:
    """The first ``n_right`` sentences right (no gap), the others two words long (7 fewer than the reference)."""
    return REFERENCES[:n_right] + [" ".join(w.split()[:2]) for w in WRONG[n_right:]]


def test_the_ablation_summary_reports_a_registered_metric_in_its_direction_with_its_own_paired_test(
        toy_metric, tmp_path):
    """docs/table3's layout: the base (3 seeds) near the references' lengths, h=1 far shorter (a larger gap: worse
    for a lower-is-better metric), h=2 as long as the base; the table, csv and notes are the toy's."""
    (tmp_path / "val_references.txt").write_text("".join(r + "\n" for r in REFERENCES))
    for seed in (1, 2, 3):
        write_run(tmp_path / "base" / f"seed{seed}", seed, 20.0 + seed, mixed(50 + seed))  # gap (10 - seed) * 6 / 60
    for seed in (1, 2):
        write_run(tmp_path / "heads1" / f"seed{seed}", seed, 30.0, short(20), n_heads=1)  # gap 40 * 7 / 60
        write_run(tmp_path / "heads2" / f"seed{seed}", seed, 22.0, mixed(50 + seed), n_heads=2)  # the base's outputs
    table3.main(["table", "--study", str(tmp_path), "--metrics", toy_metric, "bleu"], root=tmp_path)
    text = (tmp_path / "ablation.md").read_text(encoding="utf-8")
    table = [line for line in text.splitlines() if line.startswith("|")]
    header = [c.strip() for c in table[0].strip("|").split("|")]
    rows = {r[header.index("h")]: r for r in ([c.strip() for c in line.strip("|").split("|")] for line in table[2:])}
    gap = header.index("Gap (dev)")
    assert header[gap:gap + 5] == ["Gap (dev)", "n", "ΔGap", "p", "p<0.05"]  # the first metric's block, then BLEU's
    assert header[gap + 5:gap + 10] == ["BLEU (dev)", "n", "ΔBLEU", "p", "p<0.05"]
    base_gaps = [(10 - seed) * 6 / 60 for seed in (1, 2, 3)]  # computed from the hypotheses: no val_length_gap
    assert rows["4"][gap] == ablation.cell(statistics.fmean(base_gaps), statistics.stdev(base_gaps))
    assert rows["1"][gap] == ablation.cell(40 * 7 / 60, 0.0) and rows["1"][gap + 2] == f"{40 * 7 / 60 - 0.8:+.2f}"
    # h=1's gap is far larger under both paired seeds (p from the toy's own sentence values), h=2's outputs equal
    assert float(rows["1"][gap + 3]) < 0.05 and rows["1"][gap + 4] == "✓"
    assert rows["2"][gap + 3] == "1.000" and rows["2"][gap + 4] == ""
    assert "Gap: lower is better (a negative ΔGap is an improvement)." in text
    assert "Gap: p from the same bootstrap over its sentence values" in text
    assert "BLEU: lower is better" not in text
    with open(tmp_path / "ablation.csv", newline="") as f:
        records = {r["h"]: r for r in csv.DictReader(f)}
    assert float(records["1"]["length_gap_mean"]) == round(40 * 7 / 60, 4) and records["1"]["p_seeds"] == "1 2"
    assert float(records["1"]["bleu_mean"]) == 30.0 and records["1"]["bleu_p_seeds"] == "1 2"  # BLEU from results
    for name in ("length_gap_vs_heads.png", "length_gap_vs_params.png", "ablation_rows.png", "bleu_vs_heads.png",
                 "ablation_rows_bleu.png"):
        assert (tmp_path / name).read_bytes().startswith(b"\x89PNG"), name


def test_an_unknown_metric_is_refused_naming_the_option(tmp_path, capsys):
    with pytest.raises(SystemExit):
        ablation.main([str(tmp_path), "--metrics", "blue"])
    assert "--metrics: no metric named 'blue'" in capsys.readouterr().err


def test_bleus_paired_test_is_sacrebleus_own():
    """The summary's p for BLEU is sacreBLEU's PairedTest, to the last digit (docs/table3 regenerates unchanged)."""
    systems = [mixed(30), mixed(33), short(30)]
    ours = catalog.build("bleu").paired_bootstrap(mixed(28), systems, REFERENCES, resamples=200)
    _, theirs = PairedTest([("base", mixed(28)), *((str(i), s) for i, s in enumerate(systems))], {"BLEU": BLEU()},
                           [REFERENCES], test_type="bs", n_samples=200)()
    assert ours == [result.p_value for result in theirs["BLEU"][1:]]
    assert catalog.build("chrf").paired_bootstrap(mixed(28), systems, REFERENCES, resamples=50) is not None
    assert catalog.build("bleu_multi30k").paired_bootstrap(mixed(28), systems, REFERENCES) is None  # no such test


def test_the_bootstrap_over_sentence_values_counts_as_sacrebleus_does(monkeypatch):
    """A system better by the same amount on every sentence differs by exactly that in every resample: no resampled
    difference (less their mean) exceeds the observed one, so p = 1 / (resamples + 1); a system whose sentence
    differences cancel out is not significant; the resamples follow SACREBLEU_SEED."""
    base = [float(i % 7) for i in range(80)]
    shifted = [v + 1.0 for v in base]
    noise = [v + (0.5 if i % 2 else -0.5) for i, v in enumerate(base)]
    p_shift, p_noise = paired_bootstrap_of_means(base, [shifted, noise], resamples=99)
    assert p_shift == 1 / 100 and p_noise > 0.2
    monkeypatch.setenv("SACREBLEU_SEED", "7")
    assert significance.seed() == 7
    assert paired_bootstrap_of_means(base, [noise], resamples=99) == paired_bootstrap_of_means(base, [noise], 99)
    monkeypatch.setenv("SACREBLEU_SEED", "None")
    assert significance.seed() is None  # sacreBLEU's "none": the resamples are not fixed


def test_a_study_chooses_on_val_in_the_metrics_direction(toy_metric, tmp_path, monkeypatch):
    """ensemble_study select_on=length_gap: evaluate is asked for the metric beside its defaults, and the row with the
    smallest val gap is chosen, not the one with the best BLEU; with the default (BLEU) the largest BLEU is."""
    monkeypatch.chdir(tmp_path)
    study = load_study("ensemble_study")
    runs = {"a": (30.0, 2.0), "b": (20.0, 0.5), "c": (25.0, 1.0)}  # (val BLEU, val gap) by run
    calls = []

    def fake_evaluate(argv):
        options = dict(arg.split("=", 1) for arg in argv)
        calls.append(options)
        bleu, gap = runs[options["ckpt"].split("/")[-3]]
        return {"bleu": bleu, "length_gap": gap if "length_gap" in options.get("metrics", "") else None,
                "decode_seconds": 1.0}

    monkeypatch.setattr(study, "evaluate", fake_evaluate)
    for name in runs:
        (tmp_path / name / "checkpoints").mkdir(parents=True)
        (tmp_path / name / "checkpoints" / "last.ckpt").write_bytes(b"")
        (tmp_path / name / "results.json").write_text(json.dumps({"seed": ord(name)}))
    seeds = f"seeds=[{','.join(str(tmp_path / name) for name in runs)}]"
    chosen = study.main([seeds, "splits=[val]", "select_on=length_gap", "out=gap.json"])["chosen"]
    assert chosen == {"seeded runs": "seed 98 alone"}  # run b: the smallest gap, the lowest BLEU
    assert calls[0]["metrics"] == f"[{','.join([*study.REPORTED, 'length_gap'])}]"
    calls.clear()
    assert study.main([seeds, "splits=[val]", "out=bleu.json"])["chosen"] == {"seeded runs": "seed 97 alone"}
    assert "metrics" not in calls[0]  # the default asks evaluate for nothing more than before
    with pytest.raises(SystemExit, match="select_on: no metric named 'gap'"):
        study.main([seeds, "select_on=gap"])


def test_analyze_heads_measures_a_registered_metric(toy_metric, tmp_path):
    from tiny_checkpoint import multi30k_lines, tiny_tokenizer, write_checkpoint

    from transformer_nmt.analysis.heads import main as analyze

    write_checkpoint(tmp_path / "model.ckpt", tiny_tokenizer())
    sources, references = multi30k_lines("val", "en", 4), multi30k_lines("val", "de", 4)
    (tmp_path / "src.en").write_text("\n".join(sources) + "\n", encoding="utf-8")
    (tmp_path / "ref.de").write_text("\n".join(references) + "\n", encoding="utf-8")
    result = analyze([f"ckpt={tmp_path / 'model.ckpt'}", f"src={tmp_path / 'src.en'}", f"ref={tmp_path / 'ref.de'}",
                      f"out={tmp_path / 'heads'}", "steps=1", f"metrics=[{toy_metric},bleu]"])
    assert list(result["base"]) == ["length_gap", "bleu", "loss"]
    for row in result["heads"]:
        assert row["delta_length_gap"] == pytest.approx(row["length_gap"] - result["base"]["length_gap"])
    assert {"length_gap", "bleu"} <= set(result["pruning"][0])
    header = (tmp_path / "heads" / "head_importance.md").read_text().splitlines()[2]
    assert header.startswith("| kind | layer | head | Gap masked | change | BLEU masked | change | loss masked")
