"""A run dir's files are the run's own: a symbolic link (or a hard link) planted where the run writes its lock,
config.yaml or the validation hypotheses is never written through; the file it points to stays as it was."""

import os

import pytest
from conftest import KEPT
from tiny_corpus import tiny_config, write_tiny_corpus

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
