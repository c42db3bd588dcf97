"""What made a results file (provenance.py): every field, git's answers against git itself and its fallbacks,
nothing imported to find it; the recipe's reproduce.json names its paths relative to where it ran."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import transformer_nmt.analysis.reproduce as reproduce
from transformer_nmt import hardware, provenance
from transformer_nmt.hardware import cpu_model

REPO = Path(__file__).resolve().parents[1]
FIELDS = {"time_utc", "git", "versions", "cpu_model", "cpu_flags", "cpus", "torch_threads", "gpus", "omp_num_threads",
          "isa_variables", "load_average", "platform", "argv", "config"}


def git(*args):
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()


def test_the_record_has_every_field_and_the_values_of_this_process():
    import torch

    record = provenance.collect({"seed": 3}, argv=["train", "seed=3"])
    assert set(record) == FIELDS
    assert record["config"] == {"seed": 3} and record["argv"] == ["train", "seed=3"]
    assert record["torch_threads"] == torch.get_num_threads() and record["cpus"] >= 1
    assert record["versions"]["torch"] == torch.__version__ and record["versions"]["python"] == sys.version.split()[0]
    assert set(record["versions"]) == {"python", *provenance.PACKAGES}
    assert provenance.versions(("no-such-distribution-xyz",))["no-such-distribution-xyz"] is None
    assert record["isa_variables"] == {k: v for k, v in os.environ.items() if k in hardware.ISA_VARIABLES}
    assert hardware.isa_variables({"ONEDNN_MAX_CPU_ISA": "AVX2", "PATH": "/bin"}) == {"ONEDNN_MAX_CPU_ISA": "AVX2"}
    assert len(record["load_average"]) == 3 and json.loads(json.dumps(record)) == record  # plain JSON
    if (REPO / ".git").exists():  # a checkout (a worktree's .git is a file): git's own answers
        assert record["git"]["commit"] == git("rev-parse", "HEAD") and record["git"]["error"] is None
        assert record["git"]["dirty"] == bool(git("status", "--porcelain"))


def test_a_dirty_tree_records_its_changed_paths_and_the_digest_of_its_diff(tmp_path):
    repo = tmp_path / "checkout"
    package = repo / "src" / "transformer_nmt"
    package.mkdir(parents=True)
    (package / "model.py").write_text("d_model = 512\n")
    run = {"cwd": repo, "check": True, "capture_output": True}
    subprocess.run(["git", "init", "-q"], **run)
    subprocess.run(["git", "add", "."], **run)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one"], **run)
    clean = provenance.git_state(package)
    assert clean["dirty"] is False and clean["changed"] == [] and clean["diff_sha256"] is None
    (package / "model.py").write_text("d_model = 256\n")
    (repo / "notes.txt").write_text("untracked\n")
    first = provenance.git_state(package)
    assert first["dirty"] is True and sorted(first["changed"]) == ["notes.txt", "src/transformer_nmt/model.py"]
    assert len(first["diff_sha256"]) == 64
    (package / "model.py").write_text("d_model = 128\n")  # another change: another digest
    assert provenance.git_state(package)["diff_sha256"] != first["diff_sha256"]
    (package / "model.py").write_text("d_model = 256\n")  # the same change again: the same digest
    assert provenance.git_state(package)["diff_sha256"] == first["diff_sha256"]
    (package / "model.py").write_text("d_model = 512\n")  # only an untracked file: dirty, no tracked diff
    only_untracked = provenance.git_state(package)
    assert only_untracked["dirty"] is True and only_untracked["changed"] == ["notes.txt"]
    assert only_untracked["diff_sha256"] is None


def test_git_falls_back_outside_a_checkout_and_without_git(tmp_path, monkeypatch):
    outside = provenance.git_state(tmp_path)
    assert outside["commit"] is None and outside["dirty"] is None and outside["changed"] is None
    assert outside["diff_sha256"] is None and outside["error"].startswith("not a git checkout")
    other = tmp_path / "other_repo"  # an installed package inside some other repository is not its checkout
    (other / "site" / "transformer_nmt").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(other)], check=True)
    assert "is not this project's checkout" in provenance.git_state(other / "site" / "transformer_nmt")["error"]
    monkeypatch.setenv("PATH", str(tmp_path))  # no git on the PATH
    assert provenance.git_state() == {"commit": None, "dirty": None, "changed": None, "diff_sha256": None,
                                      "error": "git not found"}


def test_cpu_model_reads_the_model_name_line(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Example CPU @ 2.0GHz\nflags\t: avx2\n")
    assert cpu_model(cpuinfo) == "Example CPU @ 2.0GHz"
    assert cpu_model(tmp_path / "missing") is None


def test_recording_imports_neither_torch_nor_lightning():
    code = ("import sys; from transformer_nmt.provenance import collect; r = collect(); "
            "print('torch' in sys.modules, 'lightning' in sys.modules, r['torch_threads'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ)
    assert out.stdout.split() == ["False", "False", "None"]


def test_reproduce_json_names_paths_relative_to_where_it_ran_and_records_its_provenance(tmp_path, monkeypatch):
    """main(train=false) on a fabricated run dir under the launch root, its subprocesses stubbed."""
    run_dir = tmp_path / "outputs" / "multi30k_cpu_en_de" / "NAME"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "last.ckpt").write_bytes(b"")
    (run_dir / "config.yaml").write_text("seed: 7\ncheckpoint:\n  recent:\n    keep: 5\n")
    scores = {"averaged": dict(bleu=30.0, bleu_lowercase=30.5, bleu_multi30k=30.6, chrf=50.0, length_ratio=1.0,
                               bp=1.0),
              "last": dict(bleu=31.0, bleu_lowercase=31.5, bleu_multi30k=31.6, chrf=51.0, length_ratio=1.0, bp=1.0)}
    monkeypatch.setattr(reproduce, "run_step", lambda name, args, timings, root: timings.setdefault(name, 0.0))
    monkeypatch.setattr(reproduce, "evaluate",
                        lambda ckpt, split, beam, out, timings, root, trust=False, extra=(): dict(scores[ckpt.stem]))
    report = reproduce.main(["train=false", f"run_dir={run_dir}"], root=tmp_path)
    written = json.loads((run_dir / "reproduce.json").read_text())
    assert written == report and written["run_dir"] == "outputs/multi30k_cpu_en_de/NAME"
    assert written["chosen"] == "last.ckpt" and written["scores"]["test_beam4"]["bleu_multi30k"] == 31.6
    assert set(written["provenance"]) == FIELDS and written["provenance"]["config"] == {
        "seed": 7, "checkpoint": {"recent": {"keep": 5}}}
    assert reproduce.relative_path(Path("/elsewhere/run"), tmp_path) == "/elsewhere/run"  # not below: as given


def strings(node):
    if isinstance(node, dict):
        for value in node.values():
            yield from strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from strings(value)
    elif isinstance(node, str):
        yield node


@pytest.mark.parametrize("path", sorted((REPO / "docs").rglob("*reproduce.json")), ids=lambda p: p.name)
def test_committed_reproduce_files_hold_no_absolute_path(path):
    found = [s for s in strings(json.loads(path.read_text())) if s.startswith("/") or "/work/" in s]
    assert not found, f"{path}: absolute paths {found}"
