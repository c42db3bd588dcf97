"""scripts/reproduce_multi30k.py (transformer_nmt.analysis.reproduce) trains for an hour, so CI checks its pieces:
the run directory it scores (the one ``transformer_nmt.train`` picks), the BLEU-against-minutes curve read back
from TensorBoard events, and the refusal to score a run that was never trained."""

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


def test_the_script_is_the_package_command():
    """scripts/reproduce_multi30k.py hands its arguments to the package's main (its own checkout as the root)."""
    script = subprocess.run([sys.executable, str(REPO / "scripts" / "reproduce_multi30k.py"), "train=maybe"],
                            capture_output=True, text=True, timeout=60)
    assert script.returncode == 1 and "train='maybe': use true or false" in script.stderr, script.stderr


def test_paths_below_the_launch_directory_become_relative_and_nothing_else_changes(reproduce, tmp_path):
    config = {"run_dir": f"{tmp_path}/outputs/x/RUN", "callbacks": {"last": {"dirpath": f"{tmp_path}/outputs/x/RUN/c"}},
              "argv": [f"hydra.run.dir={tmp_path}/outputs", "/etc/elsewhere", f"{tmp_path}"], "steps": 3, "none": None,
              "sibling": f"{tmp_path}-other/outputs"}
    assert reproduce.relative_strings(config, tmp_path) == {
        "run_dir": "outputs/x/RUN", "callbacks": {"last": {"dirpath": "outputs/x/RUN/c"}},
        "argv": [f"hydra.run.dir={tmp_path}/outputs", "/etc/elsewhere", f"{tmp_path}"], "steps": 3, "none": None,
        "sibling": f"{tmp_path}-other/outputs"}
