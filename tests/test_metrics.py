"""Metrics as registered objects (metrics/): what each declares, the values against sacreBLEU's own functions, the
registry's refusals, and COMET read from a tiny local model directory (tests/tiny_comet.py) against an independent
recomputation of its formula; evaluate writing a metric asked for by name."""

from __future__ import annotations

import json
import math

import pytest
import sacrebleu
import torch
import yaml
from tiny_checkpoint import multi30k_lines, tiny_tokenizer, write_checkpoint

from transformer_nmt.inference.evaluate import REPORTED, score
from transformer_nmt.inference.evaluate import main as evaluate_main
from transformer_nmt.metrics import catalog
from transformer_nmt.metrics.base import REGISTERED, Metric, MetricResult, register

HYPOTHESES = ["a man rides a red bike", "two dogs play in snow", "the cat sleeps"]
REFERENCES = ["a man rides a red bicycle", "two dogs play in the snow", "a cat is sleeping"]


def test_the_built_in_metrics_declare_name_direction_and_sources():
    declared = {name: (catalog.higher_is_better(name), catalog.metric_class(name).needs_sources)
                for name in catalog.names()}
    assert declared == {"bleu": (True, False), "bleu_lowercase": (True, False), "chrf": (True, False),
                        "chrfpp": (True, False), "ter": (False, False), "bleu_multi30k": (True, False),
                        "comet": (True, True)}
    assert catalog.mode("ter") == "min" and catalog.mode("bleu") == "max" and catalog.mode("comet") == "max"


@pytest.mark.parametrize("name, reference", [
    ("bleu", lambda h, r: sacrebleu.corpus_bleu(h, [r])),
    ("bleu_lowercase", lambda h, r: sacrebleu.corpus_bleu(h, [r], lowercase=True)),
    ("chrf", lambda h, r: sacrebleu.corpus_chrf(h, [r])),
    ("chrfpp", lambda h, r: sacrebleu.corpus_chrf(h, [r], word_order=2)),
    ("ter", lambda h, r: sacrebleu.corpus_ter(h, [r])),
])
def test_sacrebleu_metrics_equal_sacrebleus_functions_and_sign_as_it_does(name, reference):
    result = catalog.build(name).compute(HYPOTHESES, REFERENCES)
    expected = reference(HYPOTHESES, REFERENCES)
    assert result.value == pytest.approx(expected.score, abs=1e-9)
    assert result.signature.startswith("nrefs:1|case:") and f"version:{sacrebleu.__version__}" in result.signature
    assert ("case:lc" in result.signature) == (name in ("bleu_lowercase", "ter"))  # TER is case-insensitive by default
    assert ("nw:2" in result.signature) == (name == "chrfpp")


def test_evaluates_default_record_keeps_its_keys():
    """Old records stay readable: the default metrics are written under the keys evaluate always wrote."""
    written = score(HYPOTHESES, REFERENCES, "en")
    assert REPORTED == ["bleu", "bleu_lowercase", "chrf", "bleu_multi30k"]
    assert list(written) == ["bleu", "length_ratio", "bp", "bleu_signature", "bleu_lowercase",
                             "bleu_lowercase_signature", "chrf", "chrf_signature", "bleu_multi30k",
                             "bleu_multi30k_signature"]
    assert written["bleu"] == round(sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES]).score, 4)
    more = score(HYPOTHESES, REFERENCES, metrics=["ter", "chrfpp"])
    assert list(more) == ["ter", "ter_signature", "chrfpp", "chrfpp_signature"]


def test_the_registry_refuses_unknown_and_repeated_names():
    with pytest.raises(ValueError, match="metrics: no metric named 'blue'; the registered ones are .*bleu"):
        catalog.compute(["blue"], HYPOTHESES, REFERENCES)
    with pytest.raises(ValueError, match="metrics: bleu named twice"):
        catalog.check_names(["bleu", "chrf", "bleu"])

    class Other(Metric):
        name, higher_is_better = "bleu", True

        def compute(self, hypotheses, references, sources=None):
            return MetricResult(0.0, "")

    with pytest.raises(ValueError, match="metric 'bleu' is registered twice"):
        register(Other)
    assert REGISTERED["bleu"].__name__ == "Bleu"


def test_a_metric_that_needs_sources_refuses_to_run_without_them():
    metric = catalog.build("comet")
    with pytest.raises(ValueError, match="metric comet needs the source sentences"):
        metric.compute(HYPOTHESES, REFERENCES)
    with pytest.raises(ValueError, match="metric comet needs metric.comet.model=DIR"):
        metric.check()


def test_a_new_metric_is_one_registered_class(monkeypatch):
    """What docs/evaluation.md's "add a metric" says: a registered class is computed by name, its direction known."""
    monkeypatch.setattr(catalog, "REGISTERED", dict(REGISTERED))
    monkeypatch.setattr("transformer_nmt.metrics.base.REGISTERED", catalog.REGISTERED)

    @register
    class Length(Metric):
        name, higher_is_better = "words", False

        def compute(self, hypotheses, references, sources=None):
            return MetricResult(float(sum(len(h.split()) for h in hypotheses)), "words:whitespace")

    assert score(HYPOTHESES, REFERENCES, metrics=["words"]) == {"words": 14.0, "words_signature": "words:whitespace"}
    assert catalog.mode("words") == "min"


# --- COMET -------------------------------------------------------------------------------------------------------

transformers = pytest.importorskip("transformers", reason="COMET needs the optional transformers ([hf])")

from tiny_comet import SAMPLES, write_tiny_comet  # noqa: E402 (after the skip: it needs transformers)

COMET_TOLERANCE = 1e-5  # float32, one sentence alone against a padded batch: far below any difference that matters


@pytest.fixture(scope="module", params=[True, False], ids=["layer_norm", "plain_mix"])
def comet_dir(request, tmp_path_factory):
    return write_tiny_comet(tmp_path_factory.mktemp("comet"), seed=3, layer_norm=request.param)


def independent_comet(model_dir, samples) -> list[float]:
    """COMET's formula written out with plain torch ops over the checkpoint's tensors, one sentence at a time (no
    padding, no masks): the encoder's hidden states from transformers, everything after them by hand."""
    from transformers import AutoConfig, AutoTokenizer, XLMRobertaModel

    state = torch.load(model_dir / "checkpoints" / "model.ckpt", weights_only=True)["state_dict"]
    hparams = yaml.safe_load((model_dir / "hparams.yaml").read_text())
    config = AutoConfig.from_pretrained(model_dir / "encoder")
    tokenizer = AutoTokenizer.from_pretrained(model_dir / "encoder")
    encoder = XLMRobertaModel(config, add_pooling_layer=False).eval()
    encoder.load_state_dict({k.removeprefix("encoder.model."): v for k, v in state.items()
                             if k.startswith("encoder.model.")})
    weights = torch.softmax(torch.cat([state[f"layerwise_attention.scalar_parameters.{i}"]
                                       for i in range(config.num_hidden_layers + 1)]), 0)

    def embed(text):
        ids = tokenizer(text, truncation=True, max_length=config.max_position_embeddings - 4, return_tensors="pt")
        with torch.no_grad():
            layers = encoder(**ids, output_hidden_states=True).hidden_states
        if hparams["layer_norm"]:
            layers = [(h - h.mean()) / torch.sqrt(((h - h.mean()) ** 2).mean() + 1e-12) for h in layers]
        mixed = state["layerwise_attention.gamma"] * sum(w * h for w, h in zip(weights, layers))
        return mixed[0].mean(0)  # (d,): the average over the sentence's tokens

    values = []
    for src, mt, ref in samples:
        s, h, r = embed(src), embed(mt), embed(ref)
        x = torch.cat([h, r, h * r, (h - r).abs(), h * s, (h - s).abs()])
        for j in range(len(hparams["hidden_sizes"])):
            x = torch.tanh(state[f"estimator.ff.{3 * j}.weight"] @ x + state[f"estimator.ff.{3 * j}.bias"])
        j = len(hparams["hidden_sizes"])
        values.append(float(state[f"estimator.ff.{3 * j}.weight"] @ x + state[f"estimator.ff.{3 * j}.bias"]))
    return values


def comet_options(model_dir, **change):
    options = catalog.MetricOptions()
    options.comet.model, options.comet.device = str(model_dir), "cpu"
    for key, value in change.items():
        setattr(options.comet, key, value)
    return options


def test_comet_equals_an_independent_recomputation_of_its_formula(comet_dir):
    sources, hypotheses, references = (list(column) for column in zip(*SAMPLES))
    metric = catalog.build("comet", comet_options(comet_dir, batch_size=3))  # batches of 3 and 1: padding inside
    expected = independent_comet(comet_dir, SAMPLES)
    assert metric.sentence_values(hypotheses, references, sources) == pytest.approx(expected, abs=COMET_TOLERANCE)
    result = metric.compute(hypotheses, references, sources)
    assert result.value == pytest.approx(math.fsum(expected) / len(expected), abs=COMET_TOLERANCE)
    assert len(set(round(v, 4) for v in expected)) == len(expected)  # the sentences differ: the test can tell them
    assert result.signature.startswith("nrefs:1|model:") and "ckpt-sha256:" in result.signature


def test_comet_refuses_a_directory_that_is_not_a_regression_model(tmp_path, comet_dir):
    import shutil

    broken = tmp_path / "kiwi"
    shutil.copytree(comet_dir, broken)
    hparams = yaml.safe_load((broken / "hparams.yaml").read_text())
    (broken / "hparams.yaml").write_text(yaml.safe_dump({**hparams, "class_identifier": "unified_metric"}))
    with pytest.raises(ValueError, match="hparams.yaml: class_identifier 'unified_metric'"):
        catalog.build("comet", comet_options(broken)).check()
    (broken / "hparams.yaml").write_text(yaml.safe_dump(hparams))
    shutil.rmtree(broken / "encoder")
    with pytest.raises(ValueError, match="metric.comet.encoder=null: .*encoder holds no config.json"):
        catalog.build("comet", comet_options(broken)).check()
    state = torch.load(comet_dir / "checkpoints" / "model.ckpt", weights_only=True)
    del state["state_dict"]["estimator.ff.0.weight"]
    shutil.rmtree(broken)
    shutil.copytree(comet_dir, broken)
    torch.save(state, broken / "checkpoints" / "model.ckpt")
    with pytest.raises(ValueError, match=r"does not fit the model .* missing \['estimator.ff.0.weight'\]"):
        catalog.build("comet", comet_options(broken)).compute(["a"], ["a"], ["a"])


def test_comet_reads_no_pickled_object(tmp_path, comet_dir):
    """A checkpoint that would build an object when unpickled is refused: weights_only=True."""
    import argparse
    import shutil

    bad = tmp_path / "planted"
    shutil.copytree(comet_dir, bad)
    torch.save({"state_dict": {}, "extra": argparse.Namespace(x=1)}, bad / "checkpoints" / "model.ckpt")
    with pytest.raises(ValueError, match="not readable as weights alone"):
        catalog.build("comet", comet_options(bad)).compute(["a"], ["a"], ["a"])


@pytest.fixture(scope="module")
def nmt_checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "model.ckpt"
    write_checkpoint(path, tiny_tokenizer())
    return path


def test_evaluate_writes_bleu_and_comet(tmp_path, nmt_checkpoint, comet_dir):
    sources, references = multi30k_lines("val", "en", 6), multi30k_lines("val", "de", 6)
    (tmp_path / "src.en").write_text("\n".join(sources) + "\n", encoding="utf-8")
    (tmp_path / "ref.de").write_text("\n".join(references) + "\n", encoding="utf-8")
    result = evaluate_main([f"ckpt={nmt_checkpoint}", f"src={tmp_path / 'src.en'}", f"ref={tmp_path / 'ref.de'}",
                            f"out={tmp_path / 'eval'}", "beam=1", "metrics=[bleu,comet]",
                            f"metric.comet.model={comet_dir}", "metric.comet.device=cpu"])
    written = json.loads((tmp_path / "eval" / "src.en.json").read_text())
    assert {"bleu", "bleu_signature", "comet", "comet_signature"} <= set(written) and "chrf" not in written
    hypotheses = (tmp_path / "eval" / "src.en.hyp").read_text(encoding="utf-8").splitlines()
    expected = independent_comet(comet_dir, list(zip(sources, hypotheses, references)))
    assert written["comet"] == result["comet"] == pytest.approx(sum(expected) / len(expected), abs=1e-4)
    assert written["bleu"] == round(sacrebleu.corpus_bleu(hypotheses, [references]).score, 4)


def test_evaluate_refuses_a_bad_metric_before_decoding(tmp_path, nmt_checkpoint):
    (tmp_path / "s").write_text("a\n")
    for argv, message in ((["metrics=[bleu,blue]"], "no metric named 'blue'"),
                          (["metrics=[comet]"], "needs metric.comet.model=DIR"),
                          (["metrics=[comet]", f"metric.comet.model={tmp_path}"], "no hparams.yaml there")):
        with pytest.raises(SystemExit, match=message):
            evaluate_main([f"ckpt={nmt_checkpoint}", f"src={tmp_path / 's'}", f"ref={tmp_path / 's'}",
                           f"out={tmp_path / 'eval'}", *argv])
        assert not (tmp_path / "eval").exists()  # nothing decoded, nothing written
