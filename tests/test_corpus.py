"""Reading parallel corpora in every format, the bad-input errors, and filtering."""

import gzip
import json
import re

import datasets
import numpy as np
import pytest

from transformer_nmt.data.corpus import CorpusError, CorpusSpec, filter_pairs, write_split

EN = ["A dog runs.", "Two men talk.", "  A child plays.  "]
DE = ["Ein Hund rennt.", "Zwei Männer reden.", "Ein Kind spielt."]


def spec(fmt, train, langs=("en", "de"), **kw):
    return CorpusSpec(format=fmt, langs=langs, locations={"train": str(train), "val": None, "test": None}, **kw)


def read(sp, tmp_path, split="train"):
    write_split(sp, split, tmp_path / "out.arrow")
    ds = datasets.Dataset.from_file(str(tmp_path / "out.arrow"))
    return ds[sp.langs[0]], ds[sp.langs[1]]


def write_lines(path, lines, gz=False):
    data = "".join(line + "\n" for line in lines).encode()
    path.write_bytes(gzip.compress(data) if gz else data)


@pytest.mark.parametrize("gz_src,gz_tgt", [(False, False), (True, True), (True, False)])
def test_text_prefix_reads_plain_and_gzipped_files(tmp_path, gz_src, gz_tgt):
    write_lines(tmp_path / ("train.en.gz" if gz_src else "train.en"), EN, gz_src)
    write_lines(tmp_path / ("train.de.gz" if gz_tgt else "train.de"), DE, gz_tgt)
    en, de = read(spec("text", tmp_path / "train"), tmp_path)
    assert en == [s.strip() for s in EN] and de == DE


def test_text_direction_switch_keeps_language_columns(tmp_path):
    write_lines(tmp_path / "train.en", EN)
    write_lines(tmp_path / "train.de", DE)
    de, en = read(spec("text", tmp_path / "train", langs=("de", "en")), tmp_path)
    assert de == DE and en[0] == EN[0]


def test_tsv_with_column_languages(tmp_path):
    (tmp_path / "train.tsv").write_text("".join(f"{d}\t{e}\n" for e, d in zip(EN, DE)))
    en, de = read(spec("tsv", tmp_path / "train.tsv", columns=("de", "en")), tmp_path)
    assert en[1] == EN[1] and de[1] == DE[1]


def test_tsv_wrong_number_of_columns_names_line(tmp_path):
    (tmp_path / "train.tsv").write_text("a\tb\nonly one column\n")
    with pytest.raises(CorpusError, match=r"train.tsv:2: expected 2 tab-separated columns"):
        read(spec("tsv", tmp_path / "train.tsv"), tmp_path)


@pytest.mark.parametrize("nested", [False, True])
def test_jsonl_flat_and_translation_objects(tmp_path, nested):
    rows = [{"en": e, "de": d} for e, d in zip(EN, DE)]
    rows = [{"translation": r, "id": i} for i, r in enumerate(rows)] if nested else rows
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    en, de = read(spec("jsonl", tmp_path / "train.jsonl"), tmp_path)
    assert de == DE and len(en) == 3


@pytest.mark.parametrize("value", [None, 3, ["a"]])
def test_a_jsonl_sentence_that_is_not_a_string_names_file_line_and_language(tmp_path, value):
    rows = [{"en": "A dog.", "de": "Ein Hund."}, {"en": value, "de": "Nichts."}]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(CorpusError, match=rf"train.jsonl:2: 'en' is {re.escape(json.dumps(value))}, not a string"):
        read(spec("jsonl", tmp_path / "train.jsonl"), tmp_path)


def hub_dataset():
    rows = {"translation": [{"de": d, "en": e} for e, d in zip(EN, DE)]}
    return datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows),
                                 "validation": datasets.Dataset.from_dict(rows)})


def test_hub_schema_from_save_to_disk(tmp_path):
    hub_dataset().save_to_disk(str(tmp_path / "wmt_like"))
    sp = CorpusSpec("hub", ("de", "en"), {"train": "train", "val": "validation"}, hub_name=str(tmp_path / "wmt_like"))
    de, en = read(sp, tmp_path, split="val")
    assert de == DE and en[0] == EN[0]


def test_hub_schema_through_load_dataset_on_json_files(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")
    folder = tmp_path / "wmt_json"
    folder.mkdir()
    for split, ds in hub_dataset().items():
        ds.to_json(str(folder / f"{split}.jsonl"))
    sp = CorpusSpec("hub", ("en", "de"), {"train": "train"}, hub_name=str(folder))
    en, de = read(sp, tmp_path)
    assert en == [s.strip() for s in EN] and de == DE


def test_a_hub_dataset_never_runs_its_loading_script(tmp_path, monkeypatch):
    """datasets >= 4 runs none; where load_dataset still takes trust_remote_code (older versions), it is told
    False, whatever the environment says (a checkpoint's data config may name the dataset)."""
    calls = []

    def old_load_dataset(path, name=None, split=None, trust_remote_code=None):
        calls.append(trust_remote_code)
        return hub_dataset()[split]

    def new_load_dataset(path, name=None, split=None):
        calls.append("no such option")
        return hub_dataset()[split]

    monkeypatch.chdir(tmp_path)  # no local directory named like the dataset
    for fake in (old_load_dataset, new_load_dataset):
        monkeypatch.setattr(datasets, "load_dataset", fake)
        en, de = read(CorpusSpec("hub", ("en", "de"), {"train": "train"}, hub_name="someone/scripted"), tmp_path)
        assert de == DE
    assert calls == [False, "no such option"]


def test_hub_offline_error_says_how_to_use_local_files(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.chdir(tmp_path)  # no local directory named like the dataset
    sp = CorpusSpec("hub", ("en", "de"), {"train": "train"}, hub_name="wmt/wmt14", hub_config="de-en")
    with pytest.raises(CorpusError) as err:
        read(sp, tmp_path)
    message = str(err.value)
    assert "wmt/wmt14" in message and "data=local data.train=PREFIX" in message and "save_to_disk" in message


def test_line_count_mismatch_names_both_files_and_counts(tmp_path):
    write_lines(tmp_path / "train.en", EN)
    write_lines(tmp_path / "train.de.gz", DE + ["Noch einer.", "Und noch einer."], gz=True)
    with pytest.raises(CorpusError) as err:
        read(spec("text", tmp_path / "train"), tmp_path)
    assert str(err.value) == (f"line counts differ: {tmp_path}/train.en has 3 lines, {tmp_path}/train.de.gz has 5; "
                              "parallel files must be aligned line by line")


def test_invalid_utf8_names_file_and_line(tmp_path):
    write_lines(tmp_path / "train.en", EN)
    (tmp_path / "train.de").write_bytes(b"Ein Hund.\nZwei M\xe4nner.\nEin Kind.\n")  # latin-1 byte on line 2
    with pytest.raises(CorpusError, match=r"train\.de:2: invalid UTF-8 \(byte 0xe4 at column 7\).*utf8_errors=replace"):
        read(spec("text", tmp_path / "train"), tmp_path)


def test_invalid_utf8_replace_policy_counts_lines(tmp_path):
    write_lines(tmp_path / "train.en", EN)
    (tmp_path / "train.de").write_bytes(b"Ein Hund.\nZwei M\xe4nner.\nEin Kind.\n")
    stats = write_split(spec("text", tmp_path / "train", utf8_errors="replace"), "train", tmp_path / "o.arrow")
    assert stats.utf8_replaced_lines == 1 and stats.pairs == 3
    assert datasets.Dataset.from_file(str(tmp_path / "o.arrow"))["de"][1] == "Zwei M\ufffdnner."


def test_missing_file_names_path_and_config_key(tmp_path):
    write_lines(tmp_path / "train.en", EN)
    with pytest.raises(CorpusError, match=rf"data.train='{tmp_path}/train': no file {tmp_path}/train.de or "
                                          rf"{tmp_path}/train.de.gz"):
        read(spec("text", tmp_path / "train"), tmp_path)
    with pytest.raises(CorpusError, match=r"data.train: file .*nope.jsonl does not exist"):
        read(spec("jsonl", tmp_path / "nope.jsonl"), tmp_path)


def test_empty_split_is_an_error(tmp_path):
    write_lines(tmp_path / "train.en", [])
    write_lines(tmp_path / "train.de", [])
    with pytest.raises(CorpusError, match=r"data.train: split is empty"):
        read(spec("text", tmp_path / "train"), tmp_path)


def test_filter_counts_each_reason():
    src = np.array([0, 5, 300, 10, 2, 10, 1, 20])
    tgt = np.array([4, 0, 10, 300, 9, 11, 1, 21])
    keep, report = filter_pairs("train", src, tgt, max_positions=256, max_length_ratio=3.0)
    assert keep.tolist() == [5, 6, 7]
    assert (report.empty, report.too_long, report.ratio, report.kept) == (2, 2, 1, 3)
    assert str(report) == "train: filtered 5 of 8 pairs: 2 empty, 2 too long, 1 length ratio"
    keep, report = filter_pairs("test", src, tgt, max_positions=256, max_length_ratio=None)
    assert keep.tolist() == [4, 5, 6, 7] and str(report) == "test: filtered 4 of 8 pairs: 2 empty, 2 too long"


def test_filter_boundary_counts_positions_with_bos_eos():
    keep, _ = filter_pairs("train", np.array([255, 256]), np.array([255, 256]), 256, None)
    assert keep.tolist() == [0]


def test_byte_order_mark_and_crlf_are_dropped(tmp_path):
    (tmp_path / "train.en").write_bytes("\ufeffA dog.\r\nA cat.\r\n".encode())
    # U+2028 is not a line end
    (tmp_path / "train.de").write_bytes("Ein Hund.\nEine Katze\u2028mit Trenner.\n".encode())
    en, de = read(spec("text", tmp_path / "train"), tmp_path)
    assert en == ["A dog.", "A cat."] and de[1] == "Eine Katze\u2028mit Trenner."


def test_columns_must_name_both_languages():
    with pytest.raises(CorpusError, match=r"data.columns=\['en', 'fr'\] must name the two languages"):
        CorpusSpec("tsv", ("en", "de"), {"train": "x.tsv"}, columns=("en", "fr"))


@pytest.mark.parametrize("char, name", [("\x00", "NUL"), ("\x1b", "ESC"), ("\r", "a carriage return"),
                                        ("\x07", "a control character")])
def test_control_character_names_file_and_line(tmp_path, char, name):
    write_lines(tmp_path / "train.en", EN)
    write_lines(tmp_path / "train.de", [DE[0], f"Zwei{char}Männer reden.", DE[2]])
    with pytest.raises(CorpusError, match=rf"train.de:2: U\+{ord(char):04X} \({name}\) at column 5; .*"
                                          r"data.control_chars=replace"):
        read(spec("text", tmp_path / "train"), tmp_path)


def test_control_characters_in_tsv_jsonl_and_hub_rows_are_caught(tmp_path):
    (tmp_path / "train.tsv").write_text("a\tb\nc\x00\td\n")
    with pytest.raises(CorpusError, match=r"train.tsv:2: U\+0000 \(NUL\) at column 2"):
        read(spec("tsv", tmp_path / "train.tsv"), tmp_path)
    (tmp_path / "train.jsonl").write_text('{"en": "a", "de": "b"}\n{"en": "x\\u001by", "de": "z"}\n')
    with pytest.raises(CorpusError, match=r"train.jsonl:2: U\+001B \(ESC\)"):
        read(spec("jsonl", tmp_path / "train.jsonl"), tmp_path)
    rows = {"translation": [{"de": "gut", "en": "good"}, {"de": "zwei\nZeilen", "en": "two lines"}]}
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows)}).save_to_disk(str(tmp_path / "hub"))
    with pytest.raises(CorpusError, match=r"dataset .*hub split train row 1: U\+000A \(a line feed\)"):
        read(CorpusSpec("hub", ("en", "de"), {"train": "train"}, hub_name=str(tmp_path / "hub")), tmp_path)


def test_control_characters_replace_policy_counts_sentences(tmp_path):
    write_lines(tmp_path / "train.en", ["a\x00b", "tab\tstays", "c"])
    write_lines(tmp_path / "train.de", ["x\x1b\x1by", "ok", "z\x0cw"])
    stats = write_split(spec("text", tmp_path / "train", control_chars="replace"), "train", tmp_path / "o.arrow")
    ds = datasets.Dataset.from_file(str(tmp_path / "o.arrow"))
    assert ds["en"] == ["a b", "tab\tstays", "c"] and ds["de"] == ["x  y", "ok", "z w"]
    assert stats.control_replaced_sentences == 3


def test_filter_report_lists_what_reading_cleaned():
    from transformer_nmt.data.corpus import FilterReport

    report = FilterReport("train", 10, ratio=1, utf8_replaced_lines=2, control_replaced_sentences=3)
    assert str(report) == ("train: filtered 1 of 10 pairs: 1 length ratio; cleaned: 2 lines with invalid UTF-8 "
                           "replaced by U+FFFD; 3 sentences with control characters replaced by spaces")
    assert str(FilterReport("val", 4)) == "val: filtered 0 of 4 pairs: none dropped"
