"""A run dir's files are the run's own: a symbolic link (or a hard link) planted where the run writes its lock,
config.yaml or the validation hypotheses is never written through; the file it points to stays as it was. A
launch refuses a run dir whose .hydra/, job log, checkpoints/ or tensorboard/ is a link, before Hydra writes."""

import os
import subprocess
import sys

import pytest
from conftest import KEPT
from tiny_corpus import tiny_config, tiny_overrides, write_tiny_corpus

from transformer_nmt import run_files
from transformer_nmt.training import launch
from transformer_nmt.training.app import train
from transformer_nmt.training.launch import LaunchError, run_dir_lock


@pytest.mark.parametrize("link", ["symlink", "hardlink"])
def test_a_lock_file_planted_as_a_link_is_refused_and_its_target_untouched(tmp_path, victim, link):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    lock = run_dir / launch.LOCK
    lock.symlink_to(victim) if link == "symlink" else os.link(victim, lock)
    with pytest.raises(LaunchError, match=rf"{lock} is (a symbolic link|linked from elsewhere).*remove it"):
        with run_dir_lock(run_dir):
            raise AssertionError("the lock was taken")
    assert victim.read_text() == KEPT


def test_the_lock_is_still_taken_in_a_fresh_and_a_used_run_dir(tmp_path):
    for _ in range(2):  # the second time, the first launch's lock file is there
        with run_dir_lock(tmp_path / "run"):
            assert (tmp_path / "run" / launch.LOCK).is_file()


def test_config_and_hypotheses_replace_planted_links_and_never_write_through_them(tmp_path, victim):
    corpus = write_tiny_corpus(tmp_path / "corpus", n_train=24, n_eval=4)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    names = (run_files.CONFIG, run_files.HYPOTHESES, run_files.REFERENCES)
    for name in names:
        (run_dir / name).symlink_to(victim)
    train(tiny_config(corpus, "trainer.max_steps=2", "validate_at_end=true", "trainer.limit_val_batches=1"), run_dir)
    assert victim.read_text() == KEPT
    for name in names:
        assert not (run_dir / name).is_symlink() and (run_dir / name).stat().st_size > 0, name
    assert "max_steps: 2" in (run_dir / run_files.CONFIG).read_text()
    assert not [p.name for p in run_dir.iterdir() if ".tmp-" in p.name]


def plant_links(run_dir, victim, kept_dir):
    """A run dir whose entries lead elsewhere: Hydra's three configs and the job log to ``victim`` (symbolic
    links; train.log a hard link), ``checkpoints/`` to ``kept_dir`` (a user's directory holding a last.ckpt) and
    ``tensorboard/`` to the same directory."""
    (run_dir / run_files.HYDRA).mkdir(parents=True)
    for name in run_files.HYDRA_FILES:
        (run_dir / run_files.HYDRA / name).symlink_to(victim)
    os.link(victim, run_dir / "train.log")
    (run_dir / run_files.CHECKPOINTS).symlink_to(kept_dir, target_is_directory=True)
    (run_dir / run_files.TENSORBOARD).symlink_to(kept_dir, target_is_directory=True)
    return [*(run_dir / run_files.HYDRA / name for name in run_files.HYDRA_FILES), run_dir / "train.log",
            run_dir / run_files.CHECKPOINTS, run_dir / run_files.TENSORBOARD]


def test_the_command_refuses_a_run_dir_with_planted_links_before_hydra_writes_anything(tmp_path, victim):
    """Hydra writes .hydra/ and train.log before the app takes its lock: the job log's handler
    (launch.RunDirLogFile) refuses the run dir first, naming every link; nothing is written through one."""
    corpus = write_tiny_corpus(tmp_path / "corpus", n_train=24, n_eval=4)
    kept_dir = tmp_path / "home" / "models"
    kept_dir.mkdir()
    (kept_dir / run_files.LAST).write_text(KEPT)
    run_dir = tmp_path / "run"
    links = plant_links(run_dir, victim, kept_dir)
    result = subprocess.run([sys.executable, "-m", "transformer_nmt.train", *tiny_overrides(corpus),
                             f"hydra.run.dir={run_dir}", "trainer.max_steps=2"],
                            capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode != 0
    for path in links:
        assert str(path) in result.stderr, (path, result.stderr[-3000:])
    assert "remove the links" in result.stderr
    assert victim.read_text() == KEPT and victim.stat().st_nlink == 2  # train.log's other name: still a link
    assert sorted(p.name for p in kept_dir.iterdir()) == [run_files.LAST]
    assert (kept_dir / run_files.LAST).read_text() == KEPT
    assert sorted(p.name for p in run_dir.iterdir()) == sorted([run_files.HYDRA, "train.log", run_files.CHECKPOINTS,
                                                                run_files.TENSORBOARD])  # no lock, no config.yaml
    assert sorted(p.name for p in (run_dir / run_files.HYDRA).iterdir()) == sorted(run_files.HYDRA_FILES)


@pytest.mark.parametrize("entry", [run_files.CHECKPOINTS, run_files.TENSORBOARD])
def test_train_refuses_a_checkpoint_or_event_directory_that_is_a_link(tmp_path, entry):
    """train() called as a library (no Hydra): checkpoints/ or tensorboard/ leading to a user's directory is
    refused before anything is written; the user's last.ckpt stays."""
    corpus = write_tiny_corpus(tmp_path / "corpus", n_train=24, n_eval=4)
    kept_dir = tmp_path / "home" / "models"
    kept_dir.mkdir(parents=True)
    (kept_dir / run_files.LAST).write_text(KEPT)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / entry).symlink_to(kept_dir, target_is_directory=True)
    with pytest.raises(LaunchError, match=rf"{run_dir / entry} is a symbolic link.*remove the links"):
        train(tiny_config(corpus, "trainer.max_steps=2", "ckpt_path=null"), run_dir)
    assert sorted(p.name for p in kept_dir.iterdir()) == [run_files.LAST]
    assert (kept_dir / run_files.LAST).read_text() == KEPT
    assert sorted(p.name for p in run_dir.iterdir()) == [entry]


def test_planted_links_names_only_the_run_dirs_own_entries(tmp_path, victim):
    """What lies under a linked directory is not listed; a link where a file is replaced atomically counts only with
    ``replaced``; a plain run dir has none."""
    run_dir = tmp_path / "run"
    (run_dir / run_files.CHECKPOINTS / run_files.RECENT).mkdir(parents=True)
    (run_dir / "train.log").write_text("a log\n")
    (run_dir / run_files.CHECKPOINTS / run_files.LAST).write_text("weights")
    assert launch.planted_links(run_dir) == []
    (run_dir / run_files.RESULTS).symlink_to(victim)
    (run_dir / run_files.HYDRA).symlink_to(victim.parent, target_is_directory=True)
    assert launch.planted_links(run_dir, replaced=False) == [f"{run_dir / run_files.HYDRA} is a symbolic link "
                                                            f"(to {str(victim.parent)!r})"]
    assert launch.planted_links(run_dir)[1:] == [f"{run_dir / run_files.RESULTS} is a symbolic link "
                                                 f"(to {str(victim)!r})"]
