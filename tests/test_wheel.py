"""The package works installed as a wheel, not only from the checkout: the wheel holds every file of
src/transformer_nmt (the Hydra configs and the explorer's page included), and, installed into a fresh venv, it
trains the smoke recipe (shortened) from a directory outside the repository and translates with the checkpoint.

The wheel is built once per session from a copy of the sources (no stale build/ or egg-info of the checkout can
leak into it), without build isolation so that no index is needed (setuptools comes from the dev extra).

The venv the wheel goes into sees the running interpreter's packages (torch, Lightning, Hydra) through a ``.pth``
file naming that interpreter's site-packages directories, whatever it is: the machine's own Python, a venv, a
conda env. ``--system-site-packages`` would not do: from inside a venv it points at the base interpreter, which
need not have them. A directory named in a ``.pth`` file goes on ``sys.path`` without its own ``.pth`` files being
run, so the checkout's editable install (a ``.pth`` of the running interpreter) stays out: the package can only
come from the wheel, which the test checks."""

import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "src" / "transformer_nmt"
MULTI30K = REPO / "data" / "multi30k"


def package_files() -> set[str]:
    """Every file of the package in the checkout, as a path in the wheel (transformer_nmt/...)."""
    return {p.relative_to(PACKAGE.parent).as_posix() for p in PACKAGE.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}


def clean_env() -> dict[str, str]:
    """The environment of the installed package: no PYTHONPATH pointing at the checkout's src/."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONNOUSERSITE": "1"}


def running_site_packages() -> list[Path]:
    """The site-packages directories of the interpreter running the tests, where torch and co. are installed."""
    dirs = [*site.getsitepackages(), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    found = []
    for d in map(Path, dirs):
        if d.is_dir() and d not in found:
            found.append(d)
    return found


def venv_seeing_running_packages(env_dir: Path) -> Path:
    """A fresh venv whose site-packages holds a ``.pth`` file naming ``running_site_packages()``; its python."""
    venv.create(env_dir, system_site_packages=False, with_pip=False)
    python = env_dir / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    (Path(purelib) / "running_interpreter.pth").write_text("".join(f"{d}\n" for d in running_site_packages()))
    return python


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    shutil.copytree(REPO / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    out = tmp_path_factory.mktemp("wheel")
    # -v: pip shows the backend's output, where setuptools warns (and does not fail) about data it would drop or
    # install the deprecated way (a data directory that is not a package)
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation",
                             "--no-index", "-w", str(out), str(source)], capture_output=True, text=True, timeout=120)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-6000:]
    warnings = [line for line in log.splitlines() if "Warning" in line]
    assert not warnings, "\n".join(warnings)
    (built,) = out.glob("transformer_nmt-*.whl")
    return built


def test_the_wheel_holds_every_file_of_the_package(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = {n for n in archive.namelist() if n.startswith("transformer_nmt/")}
    expected = package_files()
    for needed in ("transformer_nmt/conf/__init__.py", "transformer_nmt/conf/train.yaml",
                   "transformer_nmt/conf/model/small.yaml", "transformer_nmt/conf/experiment/smoke.yaml",
                   "transformer_nmt/conf/hydra/launcher/slurm.yaml",
                   "transformer_nmt/analysis/explore_page.js", "transformer_nmt/analysis/explore_page.css"):
        assert needed in expected, needed  # the checkout's own layout, so that the comparison below means something
    assert names == expected, (sorted(expected - names), sorted(names - expected))


def test_the_installed_wheel_trains_and_translates_outside_the_repo(wheel, tmp_path):
    env_dir = tmp_path / "venv"
    python = venv_seeing_running_packages(env_dir)  # torch, Lightning and co. as the tests have them
    env = clean_env()
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                              "--no-index", str(wheel)], capture_output=True, text=True, timeout=120, env=env)
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    assert (env_dir / "bin" / "transformer-nmt-train").is_file()  # [project.scripts] installed with it

    work = tmp_path / "work"
    work.mkdir()
    where = subprocess.run(
        [str(python), "-c", "import json, sys, importlib.metadata as m, transformer_nmt, transformer_nmt.conf as c; "
         "d = m.distribution('transformer_nmt'); print(transformer_nmt.__file__); print(c.CONF_DIR); "
         "print(d.locate_file('')); print(json.dumps(json.loads(d.read_text('direct_url.json')))); "
         "print(*[p for p in sys.path if p], sep='\\n')"],
        cwd=work, capture_output=True, text=True, timeout=120, env=env)
    assert where.returncode == 0, where.stderr
    module_file, conf_dir, dist_root, direct_url, *path = where.stdout.splitlines()
    for installed in map(Path, (module_file, conf_dir, dist_root)):  # the package, its data, its metadata
        assert installed.is_relative_to(env_dir) and not installed.is_relative_to(REPO), installed
    assert (Path(conf_dir) / "train.yaml").is_file(), conf_dir
    origin = json.loads(direct_url)  # what pip recorded it was installed from: this wheel file, not pip -e
    assert "archive_info" in origin and origin["url"].endswith("/" + wheel.name), origin
    assert not [p for p in path if Path(p).resolve().is_relative_to(REPO / "src")], path  # the checkout's src/

    run_dir = work / "run"
    train = subprocess.run(
        [str(python), "-m", "transformer_nmt.train", "experiment=smoke", f"data.train={MULTI30K}/train",
         f"data.val={MULTI30K}/val", f"data.test={MULTI30K}/test_2016_flickr", f"hydra.run.dir={run_dir}",
         "trainer.max_steps=2", "trainer.val_check_interval=2", "trainer.limit_val_batches=1",
         "trainer.limit_test_batches=1", "train.val_bleu_max_sentences=4", "train.test_bleu_max_sentences=4",
         "attention_maps.every_n_validations=0", "trainer.enable_progress_bar=false"],
        cwd=work, capture_output=True, text=True, timeout=300, env=env)
    assert train.returncode == 0, train.stderr[-4000:]
    checkpoint = run_dir / "checkpoints" / "last.ckpt"
    assert checkpoint.is_file() and (run_dir / "results.json").is_file()
    assert (work / "data" / "cache").is_dir()  # data.cache_dir is relative to the launch directory, not the package

    translate = subprocess.run([str(python), "-m", "transformer_nmt.translate", f"ckpt={checkpoint}"],
                               input="A man is riding a bike.\n", cwd=work, capture_output=True, text=True,
                               timeout=120, env=env)
    assert translate.returncode == 0, translate.stderr[-4000:]
    assert len(translate.stdout.splitlines()) == 1, translate.stdout  # one line in, one translation out
