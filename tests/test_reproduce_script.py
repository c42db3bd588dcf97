"""transformer_nmt.reproduce (transformer_nmt.analysis.reproduce) trains for an hour, so CI checks its pieces:
the run directory it scores (the one ``transformer_nmt.train`` picks), the BLEU-against-minutes curve read back
from TensorBoard events, and the refusal to score a run that was never trained."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from torch.utils.tensorboard import SummaryWriter

import transformer_nmt.analysis.reproduce as reproduce_module

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def reproduce():
    return reproduce_module


@pytest.mark.parametrize("direction, folder", [([], "multi30k_cpu_en_de"),
                                               (["data.src_lang=de", "data.tgt_lang=en"], "multi30k_cpu_de_en")])
def test_run_directory_is_the_one_train_picks_for_the_recipe_and_direction(reproduce, direction, folder):
    run_dir = reproduce.run_directory(["experiment=multi30k_cpu", *direction, "run_id=NAME"], REPO)
    assert run_dir == REPO / "outputs" / folder / "NAME"


def test_validation_curve_reads_every_val_bleu_with_minutes_since_the_first_event_file(reproduce, tmp_path):
    writer = SummaryWriter(tmp_path / "tensorboard" / "version_0")
    created = int(next((tmp_path / "tensorboard").rglob("events.out.tfevents.*")).name.split(".")[3])
    for minutes, step, bleu in [(7.0, 245, 2.44), (14.5, 490, 20.125), (22.0, 735, 27.5)]:
        writer.add_scalar("val/bleu", bleu, step, walltime=created + 60 * minutes)
        writer.add_scalar("train/loss", 3.0, step, walltime=created + 60 * minutes)
    writer.close()
    assert reproduce.validation_curve(tmp_path) == [(7.0, 245, 2.44), (14.5, 490, 20.12), (22.0, 735, 27.5)]
    assert reproduce.validation_curve(tmp_path / "never_trained") == []


def test_scoring_a_run_without_checkpoints_names_the_missing_file(reproduce, tmp_path):
    with pytest.raises(SystemExit, match=r"last\.ckpt does not exist"):
        reproduce.main(["train=false", f"run_dir={tmp_path}"])
    with pytest.raises(SystemExit, match="train='maybe'"):
        reproduce.main(["train=maybe"])


def test_paths_below_the_launch_directory_become_relative_and_nothing_else_changes(reproduce, tmp_path):
    config = {"run_dir": f"{tmp_path}/outputs/x/RUN", "callbacks": {"last": {"dirpath": f"{tmp_path}/outputs/x/RUN/c"}},
              "argv": [f"hydra.run.dir={tmp_path}/outputs", "/etc/elsewhere", f"{tmp_path}"], "steps": 3, "none": None,
              "sibling": f"{tmp_path}-other/outputs"}
    assert reproduce.relative_strings(config, tmp_path) == {
        "run_dir": "outputs/x/RUN", "callbacks": {"last": {"dirpath": "outputs/x/RUN/c"}},
        "argv": [f"hydra.run.dir={tmp_path}/outputs", "/etc/elsewhere", f"{tmp_path}"], "steps": 3, "none": None,
        "sibling": f"{tmp_path}-other/outputs"}


def test_the_search_is_the_runs_own_and_the_alphas_to_choose_among(reproduce):
    from omegaconf import OmegaConf

    tiny = OmegaConf.create({"decode": {"beam": 5, "length_penalty": "power", "alpha": 1.0}})
    assert reproduce.run_search(tiny, None) == ({"beam": 5, "length_penalty": "power", "alpha": 1.0}, [1.0])
    assert reproduce.run_search(tiny, "0.8,1.0,1.2")[1] == [0.8, 1.0, 1.2]
    older = OmegaConf.create({"model": {}})  # a run written before the decode node: the paper's search
    assert reproduce.run_search(older, None) == ({"beam": 4, "length_penalty": "gnmt", "alpha": 0.6}, [0.6])
    # the default: the CPU hour's candidates for its runs (by config name), none for any other run
    hour = OmegaConf.create({"name": "multi30k_cpu_de_en", "decode": {"beam": 4}})
    assert reproduce.run_search(hour, reproduce.recipe_alphas(hour)) == (
        {"beam": 4, "length_penalty": "gnmt", "alpha": 0.6}, [1.0, 1.4])  # beside the run's own 0.6
    assert reproduce.recipe_alphas(OmegaConf.create({"name": "multi30k_tiny_en_de"})) is None
    assert reproduce.recipe_alphas(older) is None
    with pytest.raises(SystemExit, match="alphas='x'"):
        reproduce.run_search(tiny, "x")


def test_what_the_run_trained_is_said_against_what_it_planned(reproduce):
    from omegaconf import OmegaConf

    config = OmegaConf.create({"trainer": {"max_steps": 8000, "max_epochs": 1000, "max_time": "00:01:25:00"}})
    budget = reproduce.planned_and_trained({"steps": 2143, "epochs": 35.13}, config)
    assert budget == {"planned": {"max_steps": 8000, "max_epochs": 1000, "max_time": "00:01:25:00"},
                      "trained": {"steps": 2143, "epochs": 35.13}}
    assert reproduce.describe_budget(budget) == ("trained 2,143 of 8,000 planned updates, 35.13 epochs (at most "
                                                 "1000), time limit 00:01:25:00")
    hour = reproduce.planned_and_trained({"steps": 5900}, OmegaConf.create({"trainer": {"max_steps": -1}}))
    assert reproduce.describe_budget(hour) == "trained 5,900 updates"


def test_a_recipe_hour_is_said_against_its_reference_run_whose_numbers_are_its_raw_files(reproduce):
    from omegaconf import OmegaConf

    hour = OmegaConf.create({"name": "multi30k_cpu_en_de",
                             "trainer": {"max_steps": -1, "max_epochs": 100, "max_time": "00:00:55:00"}})
    reference = reproduce.REFERENCE_HOURS[("multi30k_cpu_en_de", "bf16-mixed")]
    slow = reproduce.planned_and_trained({"steps": 3307, "epochs": 26.9, "precision": "bf16-mixed",
                                          "model": reference["model"]}, hour)  # the reference's model
    assert slow["reference"] == {key: reference[key] for key in ("run", "steps", "epochs")}
    assert reproduce.describe_budget(slow).endswith(
        f"time limit 00:00:55:00, {3307 / reference['steps']:.2f}x the {reference['steps']:,} updates "
        f"({reference['epochs']} epochs) of the recipe's reference run {reference['run']} (docs/quality.md)")
    # no reference: another run (a recipe's other direction, the tiny recipe), another precision, no time limit
    for name in ("multi30k_cpu_de_en", "multi30k_tiny_en_de"):
        other = OmegaConf.merge(hour, {"name": name})
        assert "reference" not in reproduce.planned_and_trained({"steps": 9, "precision": "bf16-mixed"}, other)
    assert "reference" not in reproduce.planned_and_trained({"steps": 9, "precision": "32-true"}, hour)
    # fp32 (an AVX2-only host): said against the AVX2 hour's updates, its model's dropout 0.1, not bf16's 0.3
    fp32 = reproduce.REFERENCE_HOURS[("multi30k_cpu_en_de", "32-true")]
    avx2 = reproduce.planned_and_trained({"steps": 2940, "precision": "32-true", "model": fp32["model"]}, hour)
    assert avx2["reference"] == {"run": "avx2_sim", "steps": 5880, "epochs": 11.95,
                                 "updates_of": "issue 51's AVX2-only hour"}
    assert reproduce.describe_budget(avx2).endswith(
        "0.50x the 5,880 updates (11.95 epochs) of the recipe's reference run avx2_sim (docs/quality.md; its updates: "
        "issue 51's AVX2-only hour)")
    assert "reference" not in reproduce.planned_and_trained(
        {"steps": 2940, "precision": "32-true", "model": reference["model"]}, hour)  # bf16's model in fp32
    steps = OmegaConf.merge(hour, {"trainer": {"max_steps": 8000, "max_time": None}})
    assert "reference" not in reproduce.planned_and_trained({"steps": 9, "precision": "bf16-mixed"}, steps)
    assert {precision for _, precision in reproduce.REFERENCE_HOURS} == {"bf16-mixed", "32-true"}
    for (name, precision), run in reproduce.REFERENCE_HOURS.items():  # the numbers are the run's own
        results = json.loads((REPO / "docs" / "quality" / f"{run['raw']}_results.json").read_text())
        report = json.loads((REPO / "docs" / "quality" / f"{run['raw']}_reproduce.json").read_text())
        assert (results["steps"], results["epochs"], results["precision"]) == (run["steps"], run["epochs"], precision)
        assert report["run_dir"].startswith(f"outputs/{name}/")
        if "updates_of" in run:  # another host's hour trained in full here: that hour's updates, no time limit
            assert (report["planned"]["max_time"], report["planned"]["max_steps"]) == (None, run["steps"])
            hour_there = json.loads((REPO / "docs" / "quality" / "avx2" / "issue51_amd_hour.json").read_text())
            assert (hour_there["steps"], hour_there["epochs"], hour_there["max_time"]) == \
                (run["steps"], run["epochs"], run["max_time"])
        else:
            assert report["planned"]["max_time"] == run["max_time"]


def test_the_package_command_scores_in_the_launch_directory(tmp_path):
    """python -m transformer_nmt.reproduce is the script's command with the launch directory as the root."""
    command = subprocess.run([sys.executable, "-m", "transformer_nmt.reproduce", "train=false", f"run_dir={tmp_path}"],
                             capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert command.returncode == 1 and f"{tmp_path}/checkpoints/last.ckpt does not exist" in command.stderr, \
        command.stderr


def test_a_scalar_curve_keeps_the_later_value_of_a_step_logged_twice(reproduce, tmp_path):
    for version, values in (("version_0", [(61, 5.5), (122, 4.9)]), ("version_1", [(122, 4.8), (183, 4.2)])):
        writer = SummaryWriter(tmp_path / "tensorboard" / version)
        created = int(next((tmp_path / "tensorboard" / version).glob("events.out.tfevents.*")).name.split(".")[3])
        for n, (step, loss) in enumerate(values):
            writer.add_scalar("val/loss", loss, step, walltime=created + 1000 * int(version[-1]) + n)
        writer.close()
    assert reproduce.scalar_curve(tmp_path, "val/loss") == [(61, 5.5), (122, 4.8), (183, 4.2)]
    assert reproduce.scalar_curve(tmp_path, "val/bleu") == []


def test_help_prints_the_usage_and_a_flag_is_refused_naming_it(reproduce, capsys):
    with pytest.raises(SystemExit) as done:
        reproduce.main(["--help"])
    assert done.value.code == 0 and "python -m transformer_nmt.reproduce [experiment=" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="takes KEY=VALUE options .* not --epochs"):
        reproduce.main(["experiment=multi30k_tiny", "--epochs"])


def test_a_logged_step_prints_nothing_and_keeps_its_output_in_the_file(reproduce, tmp_path, capfd):
    timings = {}
    reproduce.run_step("say", ["json.tool", "--help"], timings, tmp_path, log=tmp_path / "eval" / "say.log")
    assert capfd.readouterr().out == ""
    assert "usage:" in (tmp_path / "eval" / "say.log").read_text() and list(timings) == ["say"]
    with pytest.raises(SystemExit, match=r"fail failed \(exit status 2\).*its output: .*fail\.log"):
        reproduce.run_step("fail", ["json.tool", "--no-such-flag"], timings, tmp_path, log=tmp_path / "fail.log")


def test_an_evaluate_prints_one_line_with_its_name_bleu_and_seconds(reproduce, tmp_path, monkeypatch, capsys):
    """The whole record stays in its file (written by evaluate); the terminal gets one line."""
    def fake_step(name, args, timings, root, log=None):
        option = {arg.partition("=")[0]: arg.partition("=")[2] for arg in args[1:]}
        out, stem = Path(option["out"]), option["name"]
        (out / f"{stem}.json").write_text(json.dumps({"bleu": 27.456, "chrf": 55.0, "provenance": {"argv": args}}))
        timings[name] = 0.5
        return 30.2

    monkeypatch.setattr(reproduce, "run_step", fake_step)
    search = {"beam": 4, "length_penalty": "gnmt", "alpha": 0.6}
    record = reproduce.evaluate(tmp_path / "averaged.ckpt", "val", search, tmp_path, {}, tmp_path)
    assert record["chrf"] == 55.0
    assert capsys.readouterr().out.splitlines() == [
        f"evaluate val_averaged_beam4_gnmt0.6: BLEU 27.46, 30 s (record: {tmp_path}/val_averaged_beam4_gnmt0.6.json)"]


def test_the_choices_follow_the_select_on_metrics_direction_and_keep_the_first_of_equals(reproduce):
    records = {"averaged": {"bleu": 30.1, "ter": 55.0}, "last": {"bleu": 30.4, "ter": 52.0},
               "other": {"bleu": 30.4, "ter": 60.0}}
    assert reproduce.choose(records, "bleu") == "last"  # higher is better; "other" ties with it, after it
    assert reproduce.choose(records, "ter") == "last"  # lower is better
    assert reproduce.choose({"a": {"ter": 50.0}, "b": {"ter": 50.0}}, "ter") == "a"
    with pytest.raises(SystemExit, match="select_on: no metric named 'blue'"):
        reproduce.main(["train=false", "select_on=blue"])
