"""Alignments from cross-attention: pieces merged into words, AER, the permutation task whose truth is
known, and translate's print_alignment lines."""

import io
import json
import re
from pathlib import Path

import pytest
import sentencepiece as spm
import torch
from tiny_checkpoint import multi30k_lines, tiny_tokenizer, write_checkpoint

from transformer_nmt.analysis import alignment_aer
from transformer_nmt.checkpoint import load_checkpoint
from transformer_nmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer
from transformer_nmt.hardware import cpu_model, isa_variables, reported_cpu_flags
from transformer_nmt.inference.alignment import (
    align,
    alignment_error_rate,
    check_alignment_options,
    hard_alignment,
    piece_words,
    word_alignment,
    word_ids,
)
from transformer_nmt.inference.attention_weights import teacher_forced_attention
from transformer_nmt.inference.translate import main as translate_main
from transformer_nmt.inference.translate import translate_ids

REPO = Path(__file__).resolve().parents[1]


def test_pieces_merge_into_the_whitespace_words_of_the_text():
    assert word_ids([" A", " d", "og", " runs", "."]) == [0, 1, 1, 2, 2]
    # A lone space joins the next visible piece; trailing ones belong to no word.
    assert word_ids([" ", "(", "x", " ", " y", " "]) == [0, 0, 0, 1, 1, -1]
    # A piece with spaces inside (an unknown piece decodes to " ⁇ ") ends the word before it and the one after.
    assert word_ids(["d", " \u2047 ", "o", "g", "", " r", "uns"]) == [0, 1, 2, 2, 3, 3, 3]


def test_words_are_those_of_the_printed_translation_and_of_the_input_line_with_unknown_pieces(checkpoint):
    """An unknown target piece is printed as " ⁇ ", a word of its own, and a special id as nothing: the rows are
    the words of the printed text. An unknown source character stays inside its word of the input line."""
    model, tokenizer, _ = load_checkpoint(checkpoint)
    piece_id = {tokenizer.id_to_piece(i): i for i in range(tokenizer.vocab_size)}
    hyp = [piece_id[p] for p in ["\u2581d", "<unk>", "o", "g", "\u2581", "<s>", "r", "un", "s"]]
    translation = tokenizer.decode(hyp)
    assert translation == "d \u2047 og runs" and "".join(tokenizer.surfaces(hyp)) == translation
    source = "A d\u2603og runs."  # the snowman is not in the vocabulary
    src = tokenizer.encode(source) + [tokenizer.eos_id]
    assert tokenizer.unk_id in src
    soft = align(model, tokenizer, src, hyp)
    assert soft.shape == (len(translation.split()), len(source.split())) == (4, 3)
    assert torch.allclose(soft.sum(1), torch.ones(4))


def test_byte_pieces_give_their_character_to_the_last_of_them():
    """With byte fallback a character outside the vocabulary is several byte pieces, and a prefix ending inside
    it decodes to a replacement character: the last byte piece adds the character, the others nothing, and the
    three belong to the word the character is in."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(multi30k_lines("train", "de", 300)), model_writer=model,
                                   vocab_size=400, model_type="bpe", byte_fallback=True, character_coverage=0.98,
                                   pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID, minloglevel=2)
    tokenizer = Tokenizer.from_proto(model.getvalue())
    ids = tokenizer.encode("Ein Hund\u2603 läuft.")  # the snowman: bytes E2 98 83
    pieces = [tokenizer.id_to_piece(i) for i in ids]
    first = pieces.index("<0xE2>")
    assert pieces[first:first + 3] == ["<0xE2>", "<0x98>", "<0x83>"]
    surfaces = tokenizer.surfaces(ids)
    assert "".join(surfaces) == tokenizer.decode(ids) == "Ein Hund\u2603 läuft."
    assert surfaces[first:first + 3] == ["", "", "\u2603"]
    words = word_ids(surfaces)
    assert words[first:first + 3] == [1, 1, 1] and words[first - 1] == 1  # "Hund☃" is one word


def test_word_weights_sum_over_source_pieces_and_average_over_target_pieces():
    pieces = torch.tensor([[0.1, 0.2, 0.3, 0.4],   # target piece 0 (word 0) over source pieces (eos last)
                           [0.5, 0.1, 0.1, 0.3],   # target piece 1 (word 0)
                           [0.2, 0.2, 0.2, 0.4]])  # target piece 2 (word 1)
    soft = word_alignment(pieces, src_words=[0, 1, 1, -1], tgt_words=[0, 0, 1])
    # word 0: mean of [0.1, 0.5] and [0.5, 0.2] = [0.3, 0.35], renormalised without the eos
    assert torch.allclose(soft, torch.tensor([[0.3 / 0.65, 0.35 / 0.65], [1 / 3, 2 / 3]]))
    assert hard_alignment(soft) == [(1, 0), (1, 1)]


def test_aer_is_zero_for_the_truth_and_follows_och_and_ney():
    sure = {(0, 0), (1, 1), (2, 2)}
    assert alignment_error_rate(sure, sure) == 0
    assert alignment_error_rate({(0, 0), (2, 1)}, sure) == pytest.approx(1 - 2 / 5)
    # a possible (not sure) link counts in the numerator once, and costs no recall
    assert alignment_error_rate({(0, 0), (1, 1), (2, 2), (2, 1)}, sure, possible={(2, 1)}) == pytest.approx(1 - 7 / 7)


# The bound on the default alignments' AER, set from its measured spread (docs/alignment/aer_spread.json:
# scripts/alignment_aer_spread.py, the recipe trained over seeds at 1 thread, as this test trains, on the native and
# the AVX2 code path): another CPU's arithmetic moves training as another seed does (the recipe's own seed gives
# 0.006 natively, 0.054 on the AVX2 path, against the 0.05 this test held before), so the bound holds every
# measured run with room, twice the worst (test_the_bound_holds_the_measured_spread), not one machine's number.
AER_BOUND = 0.12
SPREAD = REPO / "docs" / "alignment" / "aer_spread.json"


def test_hard_alignments_recover_a_known_permutation():
    """A tiny model trained (seconds) to copy in a fixed reordering; its default alignments (mean of the last
    decoder layer's heads, output position) must find the permutation: AER <= AER_BOUND, each layer reported. The
    input position, which transformer_nmt.alignment says is wrong on this task, must be clearly worse in every
    layer (AER > 0.5), or the default would have no reason to be the output position."""
    task = alignment_aer
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # on a tiny model more threads only add contention
    try:
        model = task.train_permutation_model()
    finally:
        torch.set_num_threads(threads)
    table = task.aer_table(model)
    print("\n" + task.markdown(table))
    last = model.config.n_decoder_layers - 1
    assert table[last, "output"] <= AER_BOUND
    assert all(table[layer, "input"] > 0.5 for layer in range(last + 1))
    # The docs' numbers come from docs/alignment/alignment_aer.txt (scripts/docs_tables.py). Training is deterministic
    # on one machine: on one like the file's (CPU model and flags, torch, 1 thread, and the code path: the variables
    # that hold torch, MKL and oneDNN below the CPU's instruction set, none in a record written before provenance
    # kept them) the table is the file's, digit for digit; elsewhere another summation order may move the last
    # digits, and the bound above is the claim.
    record, rows = read_raw_alignment()
    if same_arithmetic(record):
        assert task.markdown(table).splitlines() == rows


def test_a_process_held_below_its_cpus_instruction_set_is_not_the_files_machine():
    """The digit-for-digit comparison is skipped where ATEN_CPU_CAPABILITY (or MKL's, oneDNN's variable) changes the
    arithmetic on the file's own CPU: the AVX2 code path moved the recipe's AER from 0.031 to 0.054 there."""
    native = {"cpu_model": cpu_model(), "cpu_flags": reported_cpu_flags(), "versions": {"torch": torch.__version__},
              "torch_threads": 1}  # a record written before provenance kept the variables: none set
    assert same_arithmetic(native, environ={})
    assert not same_arithmetic(native, environ={"ATEN_CPU_CAPABILITY": "avx2"})
    held = {**native, "isa_variables": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}}
    assert same_arithmetic(held, environ={"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "HOME": "/"})
    assert not same_arithmetic(held, environ={"ATEN_CPU_CAPABILITY": "avx2"})


def test_the_bound_holds_the_measured_spread():
    """Every measured run of the recipe (seeds x instruction sets, 1 thread as the test trains) is within half the
    bound, the input position above 0.5 in each: a CPU whose arithmetic moves the training as much as the seeds do
    stays inside. The file measures this recipe and model."""
    spread = json.loads(SPREAD.read_text(encoding="utf-8"))
    assert (spread["recipe"], spread["model"], tuple(spread["permutation"])) == (
        alignment_aer.RECIPE, alignment_aer.MODEL, alignment_aer.PERMUTATION)
    last = alignment_aer.MODEL["n_decoder_layers"] - 1
    assert {(run["isa"], run["threads"]) for run in spread["runs"]} >= {("native", 1), ("avx2", 1)}
    assert len({(run["isa"], run["seed"]) for run in spread["runs"] if run["threads"] == 1}) >= 14
    assert max(run["table"][f"{last} output"] for run in spread["runs"]) <= AER_BOUND / 2
    assert min(run["table"][f"{layer} input"] for run in spread["runs"] for layer in range(last + 1)) > 0.5


def same_arithmetic(record: dict, environ=None) -> bool:
    """Whether this process computes as the one that wrote ``record`` (a provenance record): the same CPU model and
    flags, torch, 1 thread, and the same instruction-set variables (hardware.ISA_VARIABLES) set."""
    here = isa_variables() if environ is None else isa_variables(environ)
    return (record["cpu_model"], record["cpu_flags"], record["versions"]["torch"], record["torch_threads"],
            record.get("isa_variables", {})) == (cpu_model(), reported_cpu_flags(), torch.__version__, 1, here)


def read_raw_alignment() -> tuple[dict, list[str]]:
    """(the provenance record, the table's lines) of the committed output of transformer_nmt.alignment_aer."""
    lines = (REPO / "docs" / "alignment" / "alignment_aer.txt").read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("provenance: ")
    return json.loads(lines[0].removeprefix("provenance: ")), [line for line in lines if line.startswith("|")]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("align") / "tiny.ckpt"
    write_checkpoint(path, tiny_tokenizer(), n_decoder_layers=2)
    return path


def test_translate_prints_hard_and_soft_alignments_over_words(checkpoint, tmp_path):
    src = tmp_path / "in.en"
    sentences = ["A dog runs on the beach.", "Two men talk."]
    src.write_text(f"{sentences[0]}\n\n{sentences[1]}\n")
    common = [f"ckpt={checkpoint}", f"input={src}", "beam=1", "max_len_offset=3"]
    translate_main(common + [f"output={tmp_path / 'hard'}", "print_alignment=hard"])
    translate_main(common + [f"output={tmp_path / 'soft'}", "print_alignment=soft", "alignment_layer=0",
                             "alignment_heads=[1]"])
    hard = (tmp_path / "hard").read_text().split("\n")[:-1]
    soft = (tmp_path / "soft").read_text().split("\n")[:-1]
    assert len(hard) == len(soft) == 3 and hard[1] == soft[1] == "\t"  # one line per input line, blank kept
    for line, source in zip(hard[::2], sentences):
        translation, pairs = line.split("\t")
        pairs = [tuple(map(int, p.split("-"))) for p in pairs.split()]
        assert [j for _, j in pairs] == list(range(len(translation.split())))  # every target word, in order
        assert all(0 <= i < len(source.split()) for i, _ in pairs)
    for line, source in zip(soft[::2], sentences):
        translation, rows = line.split("\t")
        rows = [[float(w) for w in row.split(",")] for row in rows.split()]
        assert len(rows) == len(translation.split()) and all(len(r) == len(source.split()) for r in rows)
        assert all(sum(r) == pytest.approx(1, abs=0.01) for r in rows)

    # The first soft line is head 1 of decoder layer 0, output position: the cross-attention of that head, the
    # model teacher-forced with the hypothesis translate printed, row t the query that predicts piece t.
    model, tokenizer, _ = load_checkpoint(checkpoint)
    (src_ids,), (((hyp, _),),) = translate_ids(model, tokenizer, sentences[:1], beam=1, max_len_offset=3)
    translation, rows = soft[0].split("\t")
    assert tokenizer.decode(hyp) == translation
    cross = teacher_forced_attention(model, src_ids, hyp, tokenizer.bos_id)["cross"]  # (layers, h, T + 1, S)

    def words(weights):  # (T + 1, S) -> (target words, source words)
        return word_alignment(weights[:-1], *piece_words(tokenizer, src_ids, hyp))

    printed = torch.tensor([[float(w) for w in row.split(",")] for row in rows.split()])
    assert torch.allclose(printed, words(cross[0, 1]), atol=6e-4)
    # ...and not the default (the mean of the last layer's heads), nor the other head: the options were used.
    for other in (cross[-1].mean(0), cross[0, 0]):
        assert (printed - words(other)).abs().max() > 0.01


def test_alignment_options_are_checked_by_name(checkpoint):
    model, _, _ = load_checkpoint(checkpoint)  # 2 decoder layers, 2 heads
    for layer, heads, position, name in [(2, None, "output", "alignment_layer"),
                                         ("x", None, "output", "alignment_layer"),
                                         (True, None, "output", "alignment_layer"),
                                         (-1, [2], "output", "alignment_heads"),
                                         (-1, [], "output", "alignment_heads"),
                                         (-1, [True], "output", "alignment_heads"),
                                         (-1, 1, "output", "alignment_heads"),
                                         (-1, None, "middle", "alignment_position")]:
        with pytest.raises(ValueError, match=name):
            check_alignment_options(model, layer, heads, position)
    check_alignment_options(model, -2, [0, 1], "input")  # in range: no error
    # From the command line: the option parser refuses a value of the wrong type (as Hydra's grammar reads it),
    # naming the option and its type; a value out of the model's range is refused naming what to write.
    common = [f"ckpt={checkpoint}", "print_alignment=hard"]
    for given, expected in [("alignment_heads=0,3", r"alignment_heads=0,3: a sweep .* a list is written "
                                                    r"alignment_heads=\[a,b\]"),
                            ("alignment_heads=true", r"alignment_heads=true: .*alignment_heads is Optional\[List\[int"),
                            ("alignment_heads=1", r"alignment_heads=1: .*alignment_heads is Optional\[List\[int"),
                            ("alignment_heads=[0,x]", r"alignment_heads=\[0,x\]: .*alignment_heads is"),
                            ("alignment_heads=[0,3]", r"alignment_heads=\[0, 3\]: give a list of head numbers in "
                                                      r"0..1, such as alignment_heads=\[0,1\]"),
                            ("alignment_layer=x", "alignment_layer=x: .*alignment_layer is int"),
                            ("alignment_layer=99", "alignment_layer=99: give a decoder layer number")]:
        with pytest.raises(SystemExit, match=expected):
            translate_main(common + [given])
    # Alignment options without print_alignment are refused, not ignored; print_alignment is checked once, first.
    for given in ("alignment_layer=99", "alignment_heads=[0]", "alignment_position=input"):
        with pytest.raises(SystemExit, match=f"{re.escape(given)} chooses the attention of print_alignment"):
            translate_main([f"ckpt={checkpoint}", given])
    with pytest.raises(SystemExit, match="print_alignment='middle': use hard or soft"):
        translate_main([f"ckpt={checkpoint}", "print_alignment=middle"])
    with pytest.raises(SystemExit, match="engine=native"):
        translate_main([f"ckpt={checkpoint}", "engine=ctranslate2", "print_alignment=hard"])
