"""``reproduce train=false run_dir=DIR`` on a run directory someone else made (issue 52): evaluate's rule on recorded
data paths holds (no trust unless this command trained the run or the user passes trust_data_paths=true), nothing is
written through a planted link (eval/, reproduce.json), the run's config.yaml is data (no interpolation resolved, its
values checked), and the recipe's reference hour applies only to a run of its time limit and model."""

import json

import pytest
import torch
import yaml
from tiny_checkpoint import tiny_tokenizer, write_checkpoint

import transformer_nmt.analysis.reproduce as reproduce
from transformer_nmt.checkpoint import CKPT_DATA_CONFIG, atomic_torch_save

SECRET = "s3cret-token-value"


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer(vocab_size=100)


def config(**changes) -> dict:
    base = {"name": "multi30k_cpu_en_de", "checkpoint": {"recent": {"keep": 2}},
            "decode": {"beam": 2, "length_penalty": "gnmt", "alpha": 0.6},
            "trainer": {"max_steps": 20, "max_epochs": 5, "max_time": None}}
    for dotted, value in changes.items():
        node = base
        *parents, last = dotted.split(".")
        for part in parents:
            node = node[part]
        node[last] = value
    return base


@pytest.fixture
def foreign(tmp_path, tokenizer):
    """A downloaded run directory (outside the launch directory ``home``) whose checkpoints record data paths
    outside it, absolute: a file of the user's that evaluate would copy into eval/*.ref."""
    home, run_dir = tmp_path / "home", tmp_path / "download" / "RUN"
    home.mkdir()
    (run_dir / "checkpoints" / "recent").mkdir(parents=True)
    private = tmp_path / "private"
    private.mkdir()
    for lang in ("en", "de"):
        (private / f"val.{lang}").write_text(f"{SECRET} {lang}\n")
    for step, path in ((1, run_dir / "checkpoints" / "recent" / "step1.ckpt"),
                       (2, run_dir / "checkpoints" / "recent" / "step2.ckpt"),
                       (2, run_dir / "checkpoints" / "last.ckpt")):
        write_checkpoint(path, tokenizer, step=step, run="downloaded")
        checkpoint = torch.load(path, weights_only=True)
        checkpoint[CKPT_DATA_CONFIG] = {"src_lang": "en", "tgt_lang": "de", "train": str(private / "val"),
                                        "val": str(private / "val"), "test": str(private / "val")}
        atomic_torch_save(checkpoint, path)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config()))
    return home, run_dir


@pytest.fixture
def steps(monkeypatch):
    """reproduce's steps recorded instead of run: each evaluate "writes" its NAME.json with a score."""
    calls = []

    def run_step(name, args, timings, root, log=None):  # reproduce.run_step's signature
        calls.append(args)
        options = dict(arg.split("=", 1) for arg in args[1:])
        if args[0] == "transformer_nmt.evaluate":
            out = reproduce.Path(options["out"])
            out.mkdir(parents=True, exist_ok=True)
            (out / f"{options['name']}.json").write_text(json.dumps(
                {"bleu": 1.0, "bleu_lowercase": 1.0, "chrf": 1.0, "length_ratio": 1.0, "bp": 1.0}))
        timings[name] = 0.0
        return 0.0

    monkeypatch.setattr(reproduce, "run_step", run_step)
    return calls


def test_a_foreign_run_is_evaluated_under_evaluates_rule_and_trust_only_when_asked(foreign, steps):
    home, run_dir = foreign
    reproduce.main(["train=false", f"run_dir={run_dir}"], root=home)
    evaluations = [args for args in steps if args[0] == "transformer_nmt.evaluate"]
    assert len(evaluations) == 7 and all("trust_data_paths=false" in args for args in evaluations)
    steps.clear()
    reproduce.main(["train=false", f"run_dir={run_dir}", "trust_data_paths=true"], root=home)
    assert all("trust_data_paths=true" in args for args in steps if args[0] == "transformer_nmt.evaluate")
    with pytest.raises(SystemExit, match="trust_data_paths='yes': use true or false"):
        reproduce.main(["train=false", f"run_dir={run_dir}", "trust_data_paths=yes"], root=home)


def test_the_real_evaluate_refuses_the_foreign_checkpoints_recorded_paths(foreign, monkeypatch):
    """End to end (average and evaluate as processes): evaluate refuses the absolute recorded path, reproduce stops
    naming the step, and the user's file was not copied into eval/."""
    home, run_dir = foreign
    monkeypatch.chdir(home)
    with pytest.raises(SystemExit, match=r"evaluate val_averaged_beam2_gnmt0.6 failed \(exit status 1"):
        reproduce.main(["train=false", f"run_dir={run_dir}"], root=home)
    copied = [path for path in (run_dir / "eval").rglob("*") if path.is_file()] if (run_dir / "eval").exists() else []
    assert not any(SECRET in path.read_text() for path in copied)
    assert not (run_dir / "reproduce.json").exists()


def test_a_planted_eval_link_is_refused_before_any_step(foreign, steps, tmp_path):
    home, run_dir = foreign
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (run_dir / "eval").symlink_to(elsewhere)
    with pytest.raises(SystemExit, match=rf"{run_dir / 'eval'} is a symbolic link \(to {elsewhere}\)"):
        reproduce.main(["train=false", f"run_dir={run_dir}"], root=home)
    assert steps == [] and list(elsewhere.iterdir()) == []


def test_reproduce_json_replaces_a_planted_link_and_leaves_its_target(foreign, steps, tmp_path):
    home, run_dir = foreign
    startup = tmp_path / "bashrc"
    startup.write_text("# the user's shell start-up file\n")
    (run_dir / "reproduce.json").symlink_to(startup)
    reproduce.main(["train=false", f"run_dir={run_dir}"], root=home)
    assert startup.read_text() == "# the user's shell start-up file\n"
    assert not (run_dir / "reproduce.json").is_symlink()
    assert json.loads((run_dir / "reproduce.json").read_text())["chosen"] in ("averaged.ckpt", "last.ckpt")


def test_the_config_is_data_no_interpolation_is_resolved(foreign, steps, monkeypatch):
    """An environment variable named by an interpolation is never read: where the value is checked it is refused
    (trainer.max_time is no DD:HH:MM:SS), elsewhere it is copied as the text it is."""
    home, run_dir = foreign
    monkeypatch.setenv("SECRET_TOKEN", SECRET)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config(**{"trainer.max_time": "${oc.env:SECRET_TOKEN}"})))
    with pytest.raises(SystemExit, match=r"config.yaml: trainer.max_time='\$\{oc.env:SECRET_TOKEN\}' is not a value "
                                         r"a run writes there") as refused:
        reproduce.main(["train=false", f"run_dir={run_dir}"], root=home)
    assert SECRET not in str(refused.value) and steps == []
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config(**{"data": {"note": "${oc.env:SECRET_TOKEN}"}})))
    reproduce.main(["train=false", f"run_dir={run_dir}"], root=home)
    text = (run_dir / "reproduce.json").read_text()
    assert SECRET not in text and "${oc.env:SECRET_TOKEN}" in text


@pytest.mark.parametrize("key, value", [("trainer.max_time", "00:01:00:00\necho owned >> ~/.bashrc"),
                                        ("trainer.max_steps", "20; rm -rf ~"), ("checkpoint.recent.keep", -1),
                                        ("decode.length_penalty", "gnmt alpha=9"), ("decode.beam", True),
                                        ("name", ["a"])])
def test_values_of_the_wrong_kind_are_refused_naming_the_key(foreign, steps, key, value):
    home, run_dir = foreign
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config(**{key: value})))
    with pytest.raises(SystemExit, match=rf"config.yaml: {key}=.* is not a value a run writes there"):
        reproduce.main(["train=false", f"run_dir={run_dir}"], root=home)
    assert steps == []


def test_a_run_that_kept_no_recent_checkpoints_is_refused_before_any_step(foreign, steps):
    home, run_dir = foreign  # keep=0 is the option's default: a value a run writes, but nothing to average
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config(**{"checkpoint.recent.keep": 0})))
    with pytest.raises(SystemExit, match=r"kept no recent checkpoints \(checkpoint.recent.keep=0\)"):
        reproduce.main(["train=false", f"run_dir={run_dir}"], root=home)
    assert steps == []


def test_the_reference_hour_applies_only_to_its_time_limit_and_model():
    reference = reproduce.REFERENCE_HOURS[("multi30k_cpu_en_de", "bf16-mixed")]
    hour = config(**{"trainer.max_time": "00:00:55:00", "trainer.max_steps": -1})
    results = {"steps": 3307, "precision": "bf16-mixed", "model": {**reference["model"], "attention": "sdpa"}}
    assert reproduce.planned_and_trained(results, hour)["reference"] == {"run": "I", "steps": 5194, "epochs": 42.23}
    longer = config(**{"trainer.max_time": "00:02:00:00"})
    assert "reference" not in reproduce.planned_and_trained(results, longer)
    wider = {**results, "model": {**results["model"], "d_model": 512}}
    assert "reference" not in reproduce.planned_and_trained(wider, hour)
    assert "reference" not in reproduce.planned_and_trained({k: v for k, v in results.items() if k != "model"}, hour)


def test_the_reference_numbers_are_run_is_own():
    root = reproduce.Path(__file__).resolve().parents[1]
    for run in reproduce.REFERENCE_HOURS.values():
        results = json.loads((root / "docs" / "quality" / f"{run['raw']}_results.json").read_text())
        assert {k: v for k, v in results["model"].items() if k not in ("attention", "attention_block_size")} == \
            run["model"]
        # an hour's time limit, or, for another host's hour trained in full here, none
        assert results["fingerprint"]["trainer.max_time"] == (None if "updates_of" in run else run["max_time"])


def test_test_false_scores_val_only_and_stops_trainings_own_test(foreign, steps):
    """``test=false``: the choices on val as ever, no evaluate of test (beam or greedy), the training command told
    ``run_test=false``, and the report's scores val's alone."""
    home, run_dir = foreign
    report = reproduce.main([f"run_dir={run_dir}", "test=false", "trust_data_paths=false"], root=home)
    (train,) = [args for args in steps if args[0] == "transformer_nmt.train"]
    assert "run_test=false" in train
    splits = [dict(a.split("=", 1) for a in args[1:])["split"] for args in steps
              if args[0] == "transformer_nmt.evaluate"]
    assert splits and set(splits) == {"val"}
    assert sorted(report["scores"]) == ["val_beam1", "val_beam2"]
    steps.clear()
    report = reproduce.main([f"run_dir={run_dir}", "trust_data_paths=false"], root=home)  # the default: test too
    assert sorted(report["scores"]) == ["test_beam1", "test_beam2", "val_beam1", "val_beam2"]
    assert not any("run_test=false" in args for args in steps)
    with pytest.raises(SystemExit, match="test='no': use true or false"):
        reproduce.main([f"run_dir={run_dir}", "test=no"], root=home)
