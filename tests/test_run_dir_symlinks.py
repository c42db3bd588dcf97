"""A run dir's files are the run's own: a symbolic link (or a hard link) planted where the run writes its lock,
config.yaml or the validation hypotheses is never written through; the file it points to stays as it was. A
launch refuses a run dir whose .hydra/, job log, checkpoints/ or tensorboard/ is a link, before Hydra writes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import KEPT
from tiny_corpus import tiny_config, tiny_overrides, write_tiny_corpus

from transformer_nmt import run_files
from transformer_nmt.training import planted_links
from transformer_nmt.training.app import train
from transformer_nmt.training.run_dir import LaunchError
from transformer_nmt.training.run_dir_lock import run_dir_lock


@pytest.mark.parametrize("link", ["symlink", "hardlink"])
def test_a_lock_file_planted_as_a_link_is_refused_and_its_target_untouched(tmp_path, victim, link):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    lock = run_dir / run_files.LOCK
    lock.symlink_to(victim) if link == "symlink" else os.link(victim, lock)
    with pytest.raises(LaunchError, match=rf"{lock} is (a symbolic link|linked from elsewhere).*remove it"):
        with run_dir_lock(run_dir):
            raise AssertionError("the lock was taken")
    assert victim.read_text() == KEPT


def test_the_lock_is_still_taken_in_a_fresh_and_a_used_run_dir(tmp_path):
    for _ in range(2):  # the second time, the first launch's lock file is there
        with run_dir_lock(tmp_path / "run"):
            assert (tmp_path / "run" / run_files.LOCK).is_file()


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
    (planted_links.RunDirLogFile) refuses the run dir first, naming every link; nothing is written through one."""
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
    assert planted_links.planted_links(run_dir) == []
    (run_dir / run_files.RESULTS).symlink_to(victim)
    (run_dir / run_files.HYDRA).symlink_to(victim.parent, target_is_directory=True)
    assert planted_links.planted_links(run_dir, replaced=False) == [f"{run_dir / run_files.HYDRA} is a symbolic link "
                                                            f"(to {str(victim.parent)!r})"]
    assert planted_links.planted_links(run_dir)[1:] == [f"{run_dir / run_files.RESULTS} is a symbolic link "
                                                 f"(to {str(victim)!r})"]


# Hydra's job_logging choices, and a user's own (written by the test under a config dir of theirs).
JOB_LOGGING = ["default", "disabled", "none", "stdout", "mine"]
MY_JOB_LOGGING = """version: 1
formatters:
  plain:
    format: '%(levelname)s %(message)s'
handlers:
  to_file:
    class: logging.FileHandler
    formatter: plain
    filename: ${hydra.runtime.output_dir}/mine.log
root:
  level: INFO
  handlers: [to_file]
disable_existing_loggers: false
"""


def launch_arguments(home, corpus, run_dir, job_logging: str, *overrides: str) -> list[str]:
    """The arguments of ``python -m transformer_nmt.train`` for the tiny model on the tiny corpus into ``run_dir``
    with ``hydra/job_logging=job_logging`` (``mine``: a user's own, from a config dir of theirs under ``home``)."""
    choice = [f"hydra/job_logging={job_logging}"]
    if job_logging == "mine":
        (home / "myconf" / "hydra" / "job_logging").mkdir(parents=True, exist_ok=True)
        (home / "myconf" / "hydra" / "job_logging" / "mine.yaml").write_text(MY_JOB_LOGGING)
        choice.append(f"hydra.searchpath=[file://{home / 'myconf'}]")
    return [*tiny_overrides(corpus), *choice, f"hydra.run.dir={run_dir}", *overrides]


@pytest.fixture(scope="module")
def job_logging_launches(tmp_path_factory):
    """For each choice, two launches of the command: one trains (2 steps) in a fresh run dir, one is pointed at a
    run dir with planted links. All ten run in one process (tests/train_launches.py: logging put back as a fresh
    interpreter has it before each), which pays the training imports once instead of ten times; the planted-links
    refusal of the command in its own process is test_the_command_refuses_a_run_dir_with_planted_links_...'s."""
    root = tmp_path_factory.mktemp("job_logging")
    corpus = write_tiny_corpus(root / "corpus", n_train=24, n_eval=4)
    cases, launches = {}, []
    for job_logging in JOB_LOGGING:
        home = root / job_logging
        victim = home / "home" / "victim.txt"
        victim.parent.mkdir(parents=True)
        victim.write_text(KEPT)
        kept_dir = home / "home" / "models"
        kept_dir.mkdir()
        (kept_dir / run_files.LAST).write_text(KEPT)
        case = {"run_dir": home / "run", "linked": home / "linked", "victim": victim, "kept_dir": kept_dir}
        case["links"] = plant_links(case["linked"], victim, kept_dir)
        launches += [launch_arguments(home, corpus, case["run_dir"], job_logging, "trainer.max_steps=2",
                                      "trainer.limit_val_batches=0", "validate_at_end=false"),
                     launch_arguments(home, corpus, case["linked"], job_logging, "trainer.max_steps=2")]
        cases[job_logging] = case
    (root / "launches.json").write_text(json.dumps(launches))
    tests = Path(__file__).resolve().parent
    driver = subprocess.run([sys.executable, str(tests / "train_launches.py"), str(root / "launches.json"),
                             str(root / "results.json")], capture_output=True, text=True, timeout=600,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert driver.returncode == 0, driver.stderr[-3000:]
    results = iter(json.loads((root / "results.json").read_text()))
    for case in cases.values():
        case["trained"], case["refused"] = next(results), next(results)
    return cases


@pytest.mark.parametrize("job_logging", JOB_LOGGING)
def test_every_job_logging_choice_trains_and_refuses_planted_links(job_logging_launches, job_logging):
    """conf/train.yaml makes Hydra's file handler the guarded one (planted_links.RunDirLogFile) whatever the choice;
    where the choice has no file handler the entry is the guard alone, and where no logging is configured at all
    (``none``) the callback planted_links.RunDirGuard refuses. Each choice trains (2 steps), and each refuses a run
    dir with planted links before Hydra writes anything there."""
    case = job_logging_launches[job_logging]
    run_dir, trained, refused = case["run_dir"], case["trained"], case["refused"]
    assert trained["returncode"] == 0, trained["stderr"][-3000:]
    assert (run_dir / run_files.RESULTS).is_file() and (run_dir / run_files.HYDRA / "config.yaml").is_file()
    logs = {"default": ["train.log"], "mine": ["mine.log"]}.get(job_logging, [])
    assert sorted(p.name for p in run_dir.glob("*.log")) == logs  # the guard alone writes no file
    for name in logs:
        assert "trainer.max_steps" in (run_dir / name).read_text() or (run_dir / name).stat().st_size > 0

    assert refused["returncode"] != 0
    for path in case["links"]:
        assert str(path) in refused["stderr"], (path, refused["stderr"][-3000:])
    assert case["victim"].read_text() == KEPT
    assert sorted(p.name for p in case["kept_dir"].iterdir()) == [run_files.LAST]
    assert sorted(p.name for p in case["linked"].iterdir()) == sorted([run_files.HYDRA, "train.log",
                                                                       run_files.CHECKPOINTS, run_files.TENSORBOARD])
