"""The docs (README.md and every docs/*.md) say only what the project has.

- Every relative link and image resolves: the file exists and a `#anchor` names a heading of it.
- Every `python -m transformer_nmt.X` and `python scripts|benchmarks|studies/X.py` names a module or script that
  exists, and every `scripts/`, `benchmarks/`, `studies/`, `tests/` or `notebooks/` file a command or code span names
  exists.
- Every key=value in those commands is an option of that command: for the Hydra apps (train, prepare) the
  overrides compose, in-process, as `--cfg job` would compose them; the checkpoint tools and scripts parse it
  with their option parser (transformer_nmt.options, over the command's OPTIONS dataclass), and a script's
  flags and their values are what its own argparse parser accepts (spelt out, not abbreviated). A module without
  an OPTIONS table takes no key=value, and a module's other words are errors, but for the sentences explore takes.
- A code span that holds only key=value overrides composes with train or prepare, or is an option of one of
  the tools; one whose value is a Python literal (`is_causal=True`, `stop="bound"`) is a Python argument, and an
  upper-case key (`NMT_CKPT=...`) an environment variable.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import copy
import importlib
import io
import json
import pkgutil
import re
import runpy
import shlex
import sys
from functools import cache
from pathlib import Path
from unittest import mock

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
# the commands that are not the package's: docs, studies, benchmarks
SCRIPT_HOMES = ("scripts", "benchmarks", "studies")
CONF_DIR = ROOT / "src" / "transformer_nmt" / "conf"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
INLINE = re.compile(r"`([^`\n]+(?:\n(?!\n)[^`\n]*)*)`")  # a code span, which may wrap but not cross a blank line
LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.M)
COMMAND = re.compile(r"(?:python3? +-m +transformer_nmt\.(\w+)|(?<![\w-])-m +transformer_nmt\.(\w+)"
                     r"|python3? +((?:scripts|benchmarks|studies)/[\w./-]+)|(transformer-nmt-(?:train|prepare)))")
PATH = re.compile(r"(?<![\w./-])((?:scripts|benchmarks|studies|tests|notebooks)/[\w./-]+\.(?:py|sh|sbatch|ipynb))")
OVERRIDE = re.compile(r"^[+~]{0,2}[A-Za-z_][\w.@/-]*=")
PYTHON_VALUE = re.compile(r"=(True|False|None|\"[^\"]*\"|'[^']*')$")  # is_causal=True: a Python argument
ENV_VAR = re.compile(r"^[A-Z][A-Z0-9_]*=")  # NMT_CKPT=..., an environment variable, not an option
HYDRA_APPS = {"train", "prepare"}
FREE_WORDS = {"explore"}  # modules whose other arguments are free text (explore's are sentences)
HYDRA_FLAGS = {"-m", "--multirun", "--help"}
HYDRA_FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p"}
SHELL_STOP = {"<", ">", "|", "||", "&&", ";", "&", "2>&1"}


# --- reading markdown ----------------------------------------------------------------------------------------
def split_code(text: str) -> tuple[str, list[str]]:
    """(the prose with code removed, the code: fenced blocks with continuation lines joined, then inline spans)."""
    blocks = [block.replace("\\\n", " ") for block in FENCE.findall(text)]
    prose = FENCE.sub("", text)
    spans = [" ".join(span.split()) for span in INLINE.findall(prose)]
    return INLINE.sub("", prose), blocks + spans


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for _, title in HEADING.findall(FENCE.sub("", path.read_text(encoding="utf-8"))):
        base = slug(title)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def link_problems(path: Path, text: str) -> list[str]:
    prose, _ = split_code(text)
    problems = []
    for target in LINK.findall(prose):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.exists():
            problems.append(f"{path.name}: link {target!r}: {resolved} does not exist")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            problems.append(f"{path.name}: link {target!r}: no heading with anchor #{anchor} in {resolved.name}")
    return problems


def commands(code: str) -> list[tuple[str, list[str], str]]:
    """(tool, argv, line) for each command in a piece of code: tool is a module name (train, translate, ...) or a
    script path (scripts/x.py); argv stops at a pipe, a redirection or a comment."""
    found = []
    for line in code.splitlines():
        for match in COMMAND.finditer(line):
            module = match[1] or match[2]
            tool = module or match[3] or match[4].removeprefix("transformer-nmt-")
            try:
                words = shlex.split(line[match.end():], comments=True)
            except ValueError as error:
                found.append((tool, [f"<unparsable: {error}>"], line))
                continue
            argv = []
            for word in words:
                if word in SHELL_STOP or word.startswith((">", "<", "2>")):
                    break
                argv.append(word)
            found.append((tool, argv, line))
    return found


# --- what the tools accept -----------------------------------------------------------------------------------
@cache
def tool_options() -> dict[str, object]:
    """key=value options of every tool that is not a Hydra app (each command of the package whose module, or the
    module of its ``main``, has an OPTIONS dataclass), and of the scripts that take key=value options."""
    import transformer_nmt

    tools = {}
    for module in pkgutil.iter_modules(transformer_nmt.__path__):
        command = importlib.import_module(f"transformer_nmt.{module.name}")
        home = sys.modules[command.main.__module__] if hasattr(command, "main") else command  # a thin entry's
        options = getattr(home, "OPTIONS", None)  # a command's options dataclass
        if options is not None:
            tools[module.name] = options
    for script in sorted(p for home in SCRIPT_HOMES for p in (ROOT / home).glob("*.py")):  # key=value scripts
        if re.search(r"^OPTIONS = ", script.read_text(encoding="utf-8"), flags=re.M):
            tools[f"{script.parent.name}/{script.name}"] = script_options(script)
    return tools


def script_options(path: Path) -> dict:
    """A script's ``OPTIONS = {...}`` table of defaults, read from its source (scripts are commands, not modules
    to import: their imports assume scripts/ on sys.path)."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "OPTIONS" for t in node.targets):
            return {ast.literal_eval(key): literal_or_none(value) for key, value in zip(node.value.keys,
                                                                                       node.value.values)}
    raise AssertionError(f"{path} has no OPTIONS table")


def literal_or_none(node: ast.expr):
    """A default written as a literal; None (any value) for one computed from elsewhere (e.g. DecodeConfig's)."""
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None


GROUPS = {d.name for d in CONF_DIR.iterdir() if d.is_dir()}  # data, experiment, model, trainer


@cache
def composed(app: str, groups: tuple[str, ...]):
    """conf/APP.yaml composed with these config-group choices (hydra node included), as Hydra composes it."""
    from transformer_nmt.training.config import register_configs

    register_configs()  # the schemas conf/train.yaml and conf/prepare.yaml compose over
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(app, overrides=list(groups), return_hydra_config=True)


@cache
def hydra_problem(app: str, overrides: tuple[str, ...], multirun: bool = False) -> str | None:
    """None if the overrides compose with conf/APP.yaml, else Hydra's error. Hydra's own steps: config-group
    choices build the defaults list (compose, cached per set of choices), then the value overrides are applied
    to the result in struct mode (``ConfigLoaderImpl._apply_overrides_to_config``, what compose does next).
    With -m each value of a sweep (``a=1,2``) is composed with the other overrides."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    try:
        parsed = parser.parse_overrides(list(overrides))
        fixed = [o for o in parsed if not o.is_sweep_override()]
        variants = [fixed]
        for sweep in (o for o in parsed if o.is_sweep_override()):
            if not multirun:
                return f"{sweep.input_line} is a sweep: it needs -m"
            variants += [fixed + parser.parse_overrides([f"{sweep.get_key_element()}={value}"])
                         for value in sweep.sweep_string_iterator()]
        for variant in variants:
            groups = [o for o in variant if o.key_or_group.split("@")[0] in GROUPS or "/" in o.key_or_group]
            cfg = copy.deepcopy(composed(app, tuple(o.input_line for o in groups)))
            ConfigLoaderImpl._apply_overrides_to_config([o for o in variant if o not in groups], cfg)
    except Exception as error:  # hydra raises several kinds: any of them means the overrides do not compose
        return f"{type(error).__name__}: {error}".splitlines()[0]
    return None


def option_problem(tool: str, pairs: list[str]) -> str | None:
    """None if every key=value is an option of the tool and parses, else what is wrong."""
    from transformer_nmt.options import parse_options

    options = tool_options()[tool]
    try:
        if isinstance(options, (dict, type)):  # a dataclass of options, or a script's table of defaults
            parse_options(pairs, options)
        else:
            unknown = sorted(set(OmegaConf.from_cli(pairs)) - set(options))
            if unknown:
                return f"unknown option(s) {unknown}; known: {', '.join(options)}"
    except (SystemExit, Exception) as error:
        return str(error)
    return None


def argv_problems(tool: str, argv: list[str]) -> list[str]:
    pairs = [w for w in argv if OVERRIDE.match(w) and not ENV_VAR.match(w)]
    rest = [w for w in argv if w not in pairs]
    if tool in HYDRA_APPS:
        loose, skip = [], False
        for word in rest:
            if skip:
                skip = False
            elif word in HYDRA_FLAGS_WITH_VALUE:
                skip = True
            elif word not in HYDRA_FLAGS:
                loose.append(word)
        problems = [f"{word!r} is neither an override nor a flag of {tool}" for word in loose]
        problem = hydra_problem(tool, tuple(pairs), multirun=bool(HYDRA_FLAGS & set(rest)))
        return problems + ([f"overrides {pairs} do not compose: {problem}"] if problem else [])
    if tool == "reproduce":  # its own run_dir=, train=, experiment=, alphas=, then overrides of the recipe
        own = dict(p.split("=", 1) for p in pairs if p.split("=")[0] in ("run_dir", "train", "experiment", "alphas"))
        train = tuple([f"experiment={own.get('experiment', 'multi30k_cpu')}",
                       *(p for p in pairs if p.split("=")[0] not in own)])
        problem = hydra_problem("train", train)
        return [f"overrides {list(train)} do not compose: {problem}"] if problem else []
    if tool.startswith(tuple(f"{home}/" for home in SCRIPT_HOMES)) and script_parses_flags(tool):
        return flag_problems(tool, argv)  # key=value words too: its parser says what it makes of them
    if tool.startswith(tuple(f"{home}/" for home in SCRIPT_HOMES)):
        problems = [f"{tool} parses no --flags (no argparse), given {word}" for word in rest if word.startswith("-")]
        if pairs and tool not in tool_options():
            problems.append(f"{tool} takes no key=value options, given {pairs}")
        elif pairs:
            problem = option_problem(tool, pairs)
            problems += [f"{tool} {pairs}: {problem}"] if problem else []
        return problems
    if tool not in tool_options():  # a module without an OPTIONS table reads no key=value
        return [f"transformer_nmt.{tool} takes no key=value options, given {pairs}"] if pairs else []
    problems = [] if tool in FREE_WORDS else [f"{word!r} is not a key=value option of {tool}" for word in rest]
    problem = option_problem(tool, pairs)
    return problems + ([f"{tool} {pairs}: {problem}"] if problem else [])


def script_parses_flags(tool: str) -> bool:
    """Whether scripts/X.py reads its command line with argparse (the scripts that take key=value use
    transformer_nmt.options; table3.py and summarize_ablation.py read words)."""
    return "import argparse" in (ROOT / tool).read_text(encoding="utf-8")


class _Parsing(Exception):
    """Raised where a script would parse its command line; carries the parser it built."""


@cache
def script_parser(tool: str) -> argparse.ArgumentParser:
    """The argparse parser of scripts/X.py as its main builds it: the script runs as __main__, with scripts/ on
    sys.path as when it is run, up to its parse, which raises the parser instead of parsing (nothing after it
    runs); sys.path, sys.argv and the scripts' own modules (recipe.py, baselines.py) are as they were after."""
    path = ROOT / tool

    def capture(self, args=None, namespace=None):
        raise _Parsing(self)

    saved_path, saved_argv, saved_modules = list(sys.path), sys.argv, set(sys.modules)
    sys.path.insert(0, str(path.parent))
    sys.argv = [str(path)]
    try:
        with mock.patch.object(argparse.ArgumentParser, "parse_known_args", capture):
            runpy.run_path(str(path), run_name="__main__")
    except _Parsing as parsing:
        return parsing.args[0]
    finally:
        sys.path[:], sys.argv = saved_path, saved_argv
        for name in set(sys.modules) - saved_modules:
            if Path(getattr(sys.modules[name], "__file__", None) or "/").parent == path.parent:
                del sys.modules[name]
    raise AssertionError(f"{tool} imports argparse but its __main__ parsed no command line")


def flag_problems(tool: str, argv: list[str]) -> list[str]:
    """What the script's own parser rejects in ``argv`` (an unknown flag, a value outside its choices or of the wrong
    type, a word it takes no place for), and every flag written other than as the parser defines it (argparse
    would also take an unambiguous abbreviation: the docs spell flags out)."""
    parser = script_parser(tool)
    problems = [f"{tool} defines no option {flag}" for flag in (w.split("=")[0] for w in argv if w.startswith("-"))
                if flag not in parser._option_string_actions]
    if problems or {"-h", "--help"} & set(argv):  # --help would print and exit
        return problems
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            parser.parse_args(argv)
    except SystemExit:
        return [f"{tool} {shlex.join(argv)}: {errors.getvalue().strip().splitlines()[-1]}"]
    return []


def standalone_problem(pairs: list[str]) -> str | None:
    """None if the overrides compose with train or prepare, or are all options of one tool."""
    if any(option_problem(tool, pairs) is None for tool in tool_options()):
        return None
    if hydra_problem("train", tuple(pairs)) is None or hydra_problem("prepare", tuple(pairs)) is None:
        return None
    return (f"{pairs} composes with neither train nor prepare, and is no tool's option: "
            f"{hydra_problem('train', tuple(pairs))}")


def command_problems(path: Path, text: str) -> list[str]:
    _, code = split_code(text)
    problems = []
    for piece in code:
        found = commands(piece)
        for tool, argv, line in found:
            if "/" not in tool and not (ROOT / "src" / "transformer_nmt" / f"{tool}.py").is_file():
                problems.append(f"{path.name}: no module transformer_nmt.{tool} (in {line.strip()!r})")
            elif "/" in tool and not (ROOT / tool).is_file():
                problems.append(f"{path.name}: no script {tool} (in {line.strip()!r})")
            else:
                problems += [f"{path.name}: {problem}" for problem in argv_problems(tool, argv)]
        for named in set(PATH.findall(piece)) - {tool for tool, _, _ in found}:
            if not (ROOT / named).exists():
                problems.append(f"{path.name}: {named} does not exist")
        words = piece.split()
        if (not COMMAND.search(piece) and words and all(OVERRIDE.match(w) for w in words)
                and not any(PYTHON_VALUE.search(w) for w in words)):
            pairs = [w for w in words if not ENV_VAR.match(w)]
            problem = standalone_problem(pairs) if pairs else None
            if problem:
                problems.append(f"{path.name}: {problem}")
    return problems


# --- the tests -----------------------------------------------------------------------------------------------
def test_the_docs_exist_and_readme_names_the_test_command():
    readme = DOCS[0].read_text(encoding="utf-8")
    assert len(DOCS) > 1, "docs/*.md is empty"
    first_block = FENCE.search(readme)[1].splitlines()
    assert "python -m pytest -q" in first_block, ".ci/run and newcomers run the test command README names first"
    assert len(readme.splitlines()) <= 250, "README is the entrance; guides and tables go to docs/"


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_links_and_images_resolve(path):
    assert link_problems(path, path.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_commands_name_real_tools_and_options(path):
    assert command_problems(path, path.read_text(encoding="utf-8")) == []


def test_the_checks_catch_what_they_check(tmp_path):
    """A doc with one mistake of each kind: every check reports its mistake, and nothing right is reported."""
    (tmp_path / "guide.md").write_text("# A guide\n\n## Real heading\n")
    doc = tmp_path / "doc.md"
    text = """# Doc
[ok](guide.md#real-heading) [file](missing.md) [anchor](guide.md#no-such-heading) ![img](gone.png)
[self](#doc) [web](https://example.org/x.md)

```bash
python -m transformer_nmt.train experiment=smoke trainer.max_steps=2
python -m transformer_nmt.trian experiment=smoke
python -m transformer_nmt.train experiment=no_such_recipe
python -m transformer_nmt.train model.n_haeds=4
python -m transformer_nmt.train -m model.n_heads=1,2 trainer=cpu,ddp
python -m transformer_nmt.train model.n_heads=1,2
python -m transformer_nmt.translate ckpt=RUN/a.ckpt beam=4 < in.en > out.de
python -m transformer_nmt.translate ckpt=RUN/a.ckpt bream=4
python -m transformer_nmt.translate ckpt=RUN/a.ckpt in.en
python -m transformer_nmt.explore ckpt=RUN/a.ckpt "A dog runs." beam=1
python -m transformer_nmt.hardware d_model=4
python -m transformer_nmt.summarize_ablation multirun/x
python scripts/no_such_script.py
python benchmarks/benchmark_model.py --tables kernels --no-such-flag
python benchmarks/benchmark_step.py --tokens 256 --no-previous-loss
python benchmarks/benchmark_model.py --tables kernal
python benchmarks/benchmark_model.py --quic
python benchmarks/benchmark_step.py --tokens many
python scripts/make_notebooks.py --fast
```

See `tests/no_such_test.py` and `scripts/gpu_check.sh`.

`data.src_lang=de data.tgt_lang=en` `beam=1` `data.no_such_key=1` `NMT_CKPT=x`
"""
    doc.write_text(text)
    links = link_problems(doc, text)
    assert len(links) == 3 and all(name in " ".join(links) for name in ("missing.md", "no-such-heading", "gone.png"))
    problems = command_problems(doc, text)
    expected = ["transformer_nmt.trian", "no_such_recipe", "n_haeds", "needs -m", "bream", "'in.en' is not",
                "transformer_nmt.hardware takes no key=value options", "no_such_script.py",
                "--no-such-flag", "--no-previous-loss", "invalid choice: 'kernal'", "--quic",
                "invalid int value: 'many'", "make_notebooks.py parses no --flags", "tests/no_such_test.py",
                "data.no_such_key"]
    assert len(problems) == len(expected), problems
    for word, problem in zip(expected, problems):
        assert word in problem, (word, problem)


def test_slugs_follow_github():
    assert slug("The loss at the paper's batch") == "the-loss-at-the-papers-batch"
    assert slug("Row (A): the number of heads") == "row-a-the-number-of-heads"
    assert slug("The model against nn.Transformer") == "the-model-against-nntransformer"
    assert slug("`precision=auto` and bf16-mixed") == "precisionauto-and-bf16-mixed"


def test_composing_in_two_steps_gives_what_compose_gives():
    """hydra_problem composes the group choices once and applies value overrides to a copy: the config it checks
    is the one Hydra's compose builds from all the overrides at once."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser

    overrides = ["experiment=wmt14_base", "trainer=ddp", "trainer.devices=8", "data.max_tokens=3125",
                 "hydra.run.dir=outputs/x/y"]
    parsed = OverridesParser.create().parse_overrides(overrides[2:])
    two_steps = copy.deepcopy(composed("train", tuple(overrides[:2])))
    ConfigLoaderImpl._apply_overrides_to_config(parsed, two_steps)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        at_once = compose("train", overrides=overrides, return_hydra_config=True)
    two_steps, at_once = (OmegaConf.to_container(cfg) for cfg in (two_steps, at_once))
    for cfg in (two_steps, at_once):  # what Hydra records about the overrides, not what they set
        del cfg["hydra"]["overrides"], cfg["hydra"]["runtime"], cfg["hydra"]["job"]["override_dirname"]
    assert two_steps == at_once
    assert at_once["data"]["max_tokens"] == 3125 and at_once["hydra"]["run"]["dir"] == "outputs/x/y"


# --- generated tables and the layout -------------------------------------------------------------------------
def docs_tables(*args: str, root: Path = ROOT):
    import subprocess

    return subprocess.run([sys.executable, str(root / "scripts" / "docs_tables.py"), *args], cwd=root,
                          capture_output=True, text=True, timeout=120)


def test_generated_tables_are_what_their_raw_files_give():
    """Every block between `generated by scripts/docs_tables.py` markers is what the tool writes from the
    committed raw files now (run `python scripts/docs_tables.py` after changing one)."""
    result = docs_tables("--check")
    assert result.returncode == 0, result.stderr


def test_the_check_fails_on_an_edited_number_and_an_unknown_block(tmp_path):
    import shutil

    for name in ("README.md", "docs", "scripts", "data/multi30k/val.de.gz"):  # what the tool reads
        copy_ = shutil.copytree if (ROOT / name).is_dir() else shutil.copy
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        copy_(ROOT / name, tmp_path / name)
    readme = tmp_path / "README.md"
    text = readme.read_text(encoding="utf-8")
    start = text.index("<!-- generated by scripts/docs_tables.py: readme-table3 -->")
    row = text.index("| (A) | h 16 |", start)
    readme.write_text(text[:row] + text[row:].replace("-0.90", "-0.60", 1), encoding="utf-8")
    result = docs_tables("--check", root=tmp_path)
    assert result.returncode == 1 and "README.md: readme-table3" in result.stderr
    assert docs_tables(root=tmp_path).returncode == 0 and readme.read_text(encoding="utf-8") == text  # rewritten back
    readme.write_text(text.replace("readme-table3 -->", "readme-tabel3 -->"), encoding="utf-8")
    result = docs_tables("--check", root=tmp_path)
    assert result.returncode == 1 and "unknown generated block 'readme-tabel3'" in result.stderr


def test_readme_layout_names_every_module_and_script():
    text = DOCS[0].read_text(encoding="utf-8")
    layout = text[text.index("## Layout"):text.index("## Guides")]
    package = ROOT / "src" / "transformer_nmt"
    files = [p for p in package.rglob("*") if p.is_file() and p.suffix in (".py", ".js", ".css")
             and p.name != "__init__.py" and "conf" not in p.relative_to(package).parts]
    files += [p for home in SCRIPT_HOMES for p in (ROOT / home).iterdir() if p.is_file()]
    # the commands at the top are named as commands (`train`), every other file by its name
    missing = [str(p.relative_to(ROOT)) for p in files
               if f"`{p.name}`" not in layout and not (p.parent == package and f"`{p.stem}`" in layout)]
    assert not missing, f"README's Layout table does not name {missing}"


def test_the_avx2_runs_committed_val_hypotheses_score_what_their_reports_say():
    """The re-tune table's p-values read hyps/RUN/val.de: each file is the chosen model's val output, scoring (cased
    sacreBLEU against data/multi30k/val.de.gz) the val BLEU its reproduce.json records at the chosen alpha."""
    from sacrebleu.metrics import BLEU

    from transformer_nmt.inference.translate import read_lines

    references = read_lines(ROOT / "data/multi30k/val.de.gz")
    runs = sorted(p.name for p in (ROOT / "docs/quality/avx2/hyps").iterdir())
    assert {"avx2_sim", "fp32_drop005", "fp32_ema", "fp32_ema_drop005"} <= set(runs)
    for run in runs:
        hyps = (ROOT / "docs/quality/avx2/hyps" / run / "val.de").read_text(encoding="utf-8").splitlines()
        recorded = json.loads((ROOT / f"docs/quality/avx2/{run}_reproduce.json").read_text())
        score = BLEU().corpus_score(hyps, [references]).score
        assert score == pytest.approx(recorded["scores"]["val_beam4"]["bleu"], abs=5e-4), run
