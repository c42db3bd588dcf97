"""One line in, one line out, whatever the model decodes: a translation that decodes to a line break, a tab or
another control character (byte fallback, an imported vocabulary) is written as one line of plain text, so the
output keeps one line per input line, the n-best TSV its four fields, and no escape sequence reaches a terminal."""

import pytest
from tiny_checkpoint import tiny_tokenizer, write_checkpoint

from transformer_nmt.data.tokenizer import Tokenizer
from transformer_nmt.inference.evaluate import main as evaluate_main
from transformer_nmt.inference.translate import main as translate_main
from transformer_nmt.inference.translate import plain_line

DECODED = "red\x1b[31m\ttab\nnew\rline\x00end\x7f\x9b2J\u2028 "  # what a crafted vocabulary can decode to
WRITTEN = "red [31m tab new line end  2J"  # line breaks and controls become spaces, trailing blanks go
INPUT = ["A dog runs.", "", "Two men talk."]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "model.ckpt"
    write_checkpoint(path, tiny_tokenizer(vocab_size=100))
    return path


@pytest.fixture
def crafted_decoding(monkeypatch):
    real = Tokenizer.decode
    monkeypatch.setattr(Tokenizer, "decode", lambda self, ids: DECODED if list(ids) else real(self, ids))


def test_plain_line_rule():
    assert plain_line(DECODED) == WRITTEN
    assert plain_line("Ein Hund rennt.") == "Ein Hund rennt."
    assert plain_line("") == ""


def translate(tmp_path, checkpoint, *options) -> str:
    (tmp_path / "in.txt").write_text("".join(line + "\n" for line in INPUT), encoding="utf-8")
    translate_main([f"ckpt={checkpoint}", f"input={tmp_path / 'in.txt'}", f"output={tmp_path / 'out.txt'}",
                    "max_len_offset=3", *options])
    return (tmp_path / "out.txt").read_text(encoding="utf-8")


def no_controls(text: str, allowed: str) -> bool:
    return not [c for c in text if (ord(c) < 0x20 or 0x7f <= ord(c) <= 0x9f) and c not in allowed]


def test_translate_writes_one_plain_line_per_input_line(tmp_path, checkpoint, crafted_decoding):
    written = translate(tmp_path, checkpoint, "beam=1")
    assert written.split("\n") == [WRITTEN, "", WRITTEN, ""]  # the blank line stays blank
    assert no_controls(written, "\n")


def test_the_n_best_tsv_keeps_four_fields(tmp_path, checkpoint, crafted_decoding):
    written = translate(tmp_path, checkpoint, "beam=2", "n_best=2")
    rows = [line.split("\t") for line in written.split("\n")[:-1]]
    assert len(rows) == 2 * len(INPUT) and all(len(row) == 4 for row in rows)
    assert [row[0] for row in rows] == ["1", "1", "2", "2", "3", "3"]
    assert {row[3] for i, row in enumerate(rows) if row[0] != "2"} == {WRITTEN}
    assert no_controls(written, "\n\t")


def test_alignment_stays_its_own_field(tmp_path, checkpoint, crafted_decoding):
    written = translate(tmp_path, checkpoint, "beam=1", "print_alignment=hard")
    rows = [line.split("\t") for line in written.split("\n")[:-1]]
    assert len(rows) == len(INPUT) and [len(row) for row in rows] == [2, 2, 2] and rows[0][0] == WRITTEN


def test_evaluate_writes_and_scores_the_same_plain_lines(tmp_path, checkpoint, crafted_decoding):
    (tmp_path / "src.txt").write_text("".join(line + "\n" for line in INPUT), encoding="utf-8")
    (tmp_path / "ref.txt").write_text("red tab\n\nnew line\n", encoding="utf-8")
    result = evaluate_main([f"ckpt={checkpoint}", f"src={tmp_path / 'src.txt'}", f"ref={tmp_path / 'ref.txt'}",
                            f"out={tmp_path / 'eval'}", "name=crafted", "beam=1", "max_len_offset=3"])
    written = (tmp_path / "eval" / "crafted.hyp").read_text(encoding="utf-8")
    assert written.split("\n") == [WRITTEN, "", WRITTEN, ""] and no_controls(written, "\n")
    assert result["sentences"] == len(INPUT)
