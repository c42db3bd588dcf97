"""The option language of the commands that are not Hydra apps (transformer_nmt.options): every command declares a
dataclass, argv is read with Hydra's override grammar and typed by OmegaConf, --help lists every option."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

from transformer_nmt import export  # the command: its options, and format=marian handed to interchange/
from transformer_nmt.analysis import explore, heads
from transformer_nmt.generation.config import DecodeConfig
from transformer_nmt.inference import average, evaluate, translate
from transformer_nmt.inference.alignment import AlignmentOptions
from transformer_nmt.options import default_of, option_rows, parse_options, show

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {"translate": translate, "evaluate": evaluate, "average": average, "export": export,
            "analyze_heads": heads, "explore": explore}
BAD_VALUES = {"translate": "beam=four", "evaluate": "max_tokens=lots", "average": "last=x", "export": "force=maybe",
              "analyze_heads": "steps=ten", "explore": "alpha=high"}  # each of the wrong type for its option


def options_of(name):
    return dataclasses.fields(COMMANDS[name].OPTIONS)


@pytest.mark.parametrize("name", COMMANDS)
def test_help_lists_every_option_with_its_default_and_help(name, capsys):
    module = COMMANDS[name]
    with pytest.raises(SystemExit) as exit_info:
        module.main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert " ".join(module.__doc__.split("\n\n")[0].split()) in " ".join(out.split())  # the description
    listed = " ".join(out.split())
    for field in options_of(name):
        assert field.metadata["help"], f"{name}: option {field.name} has no help text"
        default = default_of(field)
        # a nested dataclass (evaluate's metric.NAME.KEY) is listed key by key; a long key=default on its own line
        rows = (option_rows(type(default), f"{field.name}.") if dataclasses.is_dataclass(default)
                else [(f"{field.name}={show(default)}", field.metadata["help"])])
        for key, help in rows:
            assert help, f"{name}: option {key} has no help text"
            assert re.search(rf"^  {re.escape(key)}( |$)", out, re.M), (name, key)
            assert " ".join(help.split()) in listed, (name, key)


def test_help_from_the_command_line_exits_0_and_writes_nothing_else(tmp_path):
    """``-h`` of the real command: exit code 0, the options on stdout, nothing on stderr or in the directory."""
    env = {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "transformer_nmt.translate", "-h"], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "beam=4 " in done.stdout and "alignment_heads=null " in done.stdout
    assert done.stderr == "" and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", COMMANDS)
def test_an_unknown_option_is_refused_naming_it_and_the_known_ones(name):
    with pytest.raises(SystemExit, match="unknown option 'beem'") as exit_info:
        COMMANDS[name].main(["beem=2"])
    known = str(exit_info.value).split("known options: ")[1]
    assert [f.name for f in options_of(name)] == known.split(" (")[0].split(", ")


@pytest.mark.parametrize("name", COMMANDS)
def test_a_badly_typed_value_is_refused_naming_the_option(name):
    given = BAD_VALUES[name]
    key = given.split("=")[0]
    field = next(f for f in options_of(name) if f.name == key)
    with pytest.raises(SystemExit, match=rf"^{re.escape(given)}: .*; {key} is {re.escape(str(field.type))} "
                                         rf"\(default {re.escape(show(field.default))}\)\nknown options: "):
        COMMANDS[name].main([given])


def test_values_parse_as_hydra_parses_them():
    parsed = parse_options(["alignment_heads=[0,1]", "output='4'", "beam=1", "alpha=1", "ckpt=null",
                            "input=/data/a-b.en.gz"], translate.TranslateOptions)
    assert parsed.alignment_heads == [0, 1]
    assert parsed.output == "4"  # quoted: a string, as Hydra reads it
    assert (parsed.beam, parsed.alpha) == (1, 1.0) and isinstance(parsed.alpha, float)
    assert parsed.ckpt is None and parsed.input == "/data/a-b.en.gz"
    assert parse_options(["alignment_heads=[0,1]", "alignment_heads=null"], translate.TranslateOptions
                         ).alignment_heads is None  # the last value wins, as in Hydra
    paths = parse_options(["inputs=[a.ckpt,'b c.ckpt']", "output=x"], average.AverageOptions).inputs
    assert paths == ["a.ckpt", "b c.ckpt"]
    assert parse_options(["force=true"], export.ExportOptions).force is True
    assert parse_options([], translate.TranslateOptions) == translate.TranslateOptions()


@pytest.mark.parametrize("given, problem", [("beam=1,4", "a sweep"), ("+beam=1", "no +, ++, ~"),
                                            ("~beam", "no +, ++, ~"), ("beam=[1", "is not key=value"),
                                            ("alignment_heads=[0,x]", "alignment_heads is Optional")])
def test_what_hydra_means_otherwise_is_refused(given, problem):
    with pytest.raises(SystemExit, match=re.escape(problem)):
        parse_options([given], translate.TranslateOptions)


def test_decoding_defaults_and_help_come_from_decode_config():
    """Every option a command shares with DecodeConfig (and AlignmentOptions) has its default and help, but for
    analyze_heads' beam, greedy by design."""
    for home in (DecodeConfig, AlignmentOptions):
        shared = {f.name: f for f in dataclasses.fields(home)}
        for name in COMMANDS:
            for field in options_of(name):
                if field.name in shared and (name, field.name) != ("analyze_heads", "beam"):
                    assert default_of(field) == default_of(shared[field.name]), (name, field.name)
                    assert field.metadata["help"].startswith(shared[field.name].metadata["help"].split(";")[0]), (
                        name, field.name)
    assert heads.HeadsOptions().beam == 1


def test_each_decoding_default_is_written_once():
    """Beam 4, alpha 0.6 and the offset 50 appear, as numbers, only in DecodeConfig's module: anywhere in the
    package, Python or YAML (a 50 that is no length offset, such as a percentile, is not a decoding default)."""
    pattern = re.compile(r"beam.{0,4}[=:].{0,3}\b4\b|\b0\.6\b|(offset|max_len).{0,12}\b50\b|\b4, 0\.6|0\.6, 50\b")
    package = ROOT / "src" / "transformer_nmt"
    found = [f"{path.relative_to(package)}:{number}" for path in sorted(package.rglob("*"))
             if path.suffix in (".py", ".yaml") and path != package / "generation" / "config.py"
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
             if pattern.search(line)]
    assert found == []
    definition = re.compile(r"^    (beam: int = field\(default=4|alpha: float = field\(default=0\.6"
                            r"|max_len_offset: int = field\(default=50)\b")
    definitions = [line for line in (package / "generation" / "config.py").read_text().splitlines()
                   if definition.search(line)]
    assert len(definitions) == 3, definitions  # beam, alpha, max_len_offset: one line each


def test_explore_tells_options_from_sentences():
    options, sentences = explore.split_arguments(["beam=1", "--help", "A man, a plan=x.", "output='a b.html'",
                                                  "alignment_heads=[0,1]", "Two dogs."])
    assert options == ["beam=1", "--help", "output='a b.html'", "alignment_heads=[0,1]"]
    assert sentences == ["A man, a plan=x.", "Two dogs."]


def test_every_decoding_setting_reaches_every_command_that_decodes():
    """The commands' options extend the decoding dataclasses instead of listing their fields: translate, evaluate
    and synthesize take every DecodeConfig setting, explore and analyze_heads every SearchConfig one (they decode
    natively), so a setting added there needs no line in any command."""
    from transformer_nmt.generation.config import SearchConfig
    from transformer_nmt.inference import synthesize

    for options, home in ((translate.TranslateOptions, DecodeConfig), (evaluate.EvaluateOptions, DecodeConfig),
                          (synthesize.SynthesizeOptions, DecodeConfig), (explore.ExploreOptions, SearchConfig),
                          (heads.HeadsOptions, SearchConfig)):
        assert issubclass(options, home), options
        assert {f.name for f in dataclasses.fields(home)} <= {f.name for f in dataclasses.fields(options)}
    assert "engine" not in {f.name for f in dataclasses.fields(explore.ExploreOptions)}  # native only
    with pytest.raises(SystemExit, match=r"n_best=3: evaluate scores each line's best translation"):
        evaluate.main(["ckpt=any.ckpt", "split=val", "n_best=3"])
