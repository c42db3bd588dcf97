"""The attention explorer: the Python API's data, the page's encoding and size, gates from analyze_heads,
and the page driven in a real (headless) Chromium: every click's highlighted lines and cells must be the
weights in the file."""

import base64
import csv
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from tiny_checkpoint import tiny_tokenizer, write_checkpoint

from transformer_nmt.analysis import explore
from transformer_nmt.analysis.heads import all_heads
from transformer_nmt.checkpoint import load_checkpoint
from transformer_nmt.inference.attention_maps import attention_entropy
from transformer_nmt.model.transformer import Transformer, TransformerConfig

SENTENCES = ["A dog runs on the beach.", "Two men talk </script> <!-- here."]
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
SCREENSHOTS = os.environ.get("EXPLORER_SCREENSHOTS")  # a directory to keep the test's screenshots in


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(checkpoint path, model, tokenizer) of a random 2+2-layer, 2-head model."""
    path = tmp_path_factory.mktemp("explore") / "tiny.ckpt"
    write_checkpoint(path, tiny_tokenizer(), n_encoder_layers=2, n_decoder_layers=2)
    model, tokenizer, _ = load_checkpoint(path)
    return path, model, tokenizer


def read_page_data(path: Path) -> dict:
    text = path.read_text(encoding="utf-8")
    payload = re.search(r'<script type="application/json" id="explorer-data">(.*?)</script>', text, re.S).group(1)
    return json.loads(payload)


def decoded(entry: dict) -> torch.Tensor:
    """A kind's weights as the page stores them, back to floats. (layers, h, Lq, Lk)"""
    raw = bytearray(base64.b64decode(entry["data"]))
    return torch.frombuffer(raw, dtype=torch.uint8).float().view(entry["shape"]) / explore.SCALE


def test_attention_api_gives_every_head_of_every_kind_with_its_entropy(tiny):
    _, model, tokenizer = tiny
    result = explore.attention(model, tokenizer, SENTENCES + ["  "], beam=1, max_len_offset=3)
    assert len(result.sentences) == 2  # the blank one skipped
    for s in result.sentences:
        S, T = len(s.source_pieces), len(s.target_pieces)
        assert s.source_pieces[-1] == "</s>" and s.target_pieces[0] == "<s>"
        assert {k: tuple(w.shape) for k, w in s.weights.items()} == {
            "encoder": (2, 2, S, S), "decoder": (2, 2, T, T), "cross": (2, 2, T, S)}
        for w in s.weights.values():
            assert torch.allclose(w.sum(-1), torch.ones(w.shape[:-1]), atol=1e-5)
        assert torch.all(s.weights["decoder"].triu(1) == 0)  # causal
        for kind, w in s.weights.items():
            assert torch.allclose(s.entropy[kind], attention_entropy(w.flatten(0, 1).unsqueeze(0)).view(2, 2))
    assert all(torch.equal(g, torch.ones(2, 2)) for g in result.gates.values())


def test_page_is_self_contained_and_holds_the_weights_as_uint8_base64(tiny, tmp_path):
    path, model, tokenizer = tiny
    page = explore.main([f"ckpt={path}", *SENTENCES, f"output={tmp_path / 'a.html'}", "beam=1", "max_len_offset=3"])
    html = page.read_text(encoding="utf-8")
    # No fetch at view time: no src/href, no stylesheet link, no import, no URL but the SVG namespace.
    assert not re.search(r"\b(src|href)\s*=|<link|@import|url\(|import\(", html)
    assert set(re.findall(r"https?://[^\s\"']+", html)) == {"http://www.w3.org/2000/svg"}
    data = read_page_data(page)
    result = explore.attention(model, tokenizer, SENTENCES, beam=1, max_len_offset=3)
    assert [s["source"] for s in data["sentences"]] == SENTENCES  # "</script>" in a sentence did not end the tag
    for stored, s in zip(data["sentences"], result.sentences):
        assert stored["source_tokens"] == s.source_pieces and stored["target_tokens"] == s.target_pieces
        for kind, w in s.weights.items():
            assert (decoded(stored["attention"][kind]) - w).abs().max() <= 0.5 / explore.SCALE + 1e-6
            assert torch.allclose(torch.tensor(stored["entropy"][kind]), s.entropy[kind], atol=1e-4)


def test_a_page_of_five_sentences_on_the_base_model_stays_under_5_mb(tmp_path):
    tokenizer = tiny_tokenizer()  # a 200-piece vocabulary: more pieces per sentence than a real one
    torch.manual_seed(0)
    # The page's size depends on layers, heads and tokens only: the base model's 6+6 layers and 8 heads, narrow.
    model = Transformer(TransformerConfig(vocab_size=tokenizer.vocab_size, d_model=64, d_ff=64)).eval()
    assert (model.config.n_encoder_layers, model.config.n_decoder_layers, model.config.n_heads) == (6, 6, 8)
    sentences = ["A man in an orange hat starring at something.", "A Boston Terrier is running on lush green grass.",
                 "A girl in karate uniform breaking a stick with a front kick.",
                 "Five people wearing winter jackets and helmets stand in the snow.",
                 "People are fixing the roof of a house."]
    german = ["Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt.",
              "Ein Boston Terrier läuft über saftig-grünes Gras vor einem weißen Zaun.",
              "Ein Mädchen in einem Karateanzug bricht einen Stock mit einem Tritt.",
              "Fünf Leute in Winterjacken und mit Helmen stehen im Schnee.",
              "Leute Reparieren das Dach eines Hauses."]
    result = explore.attention(model, tokenizer, sentences, translations=german)  # teacher-forced: no search
    size = explore.write_page(result, tmp_path / "base.html").stat().st_size
    pieces = sum(len(s.source_pieces) + len(s.target_pieces) for s in result.sentences)
    print(f"\nbase model, 5 sentences, {pieces} pieces: {size / 1e6:.2f} MB")
    assert size < 5e6


def test_prune_gates_off_the_least_important_heads_from_analyze_heads(tiny, tmp_path):
    path, model, _ = tiny
    heads = all_heads(model)
    importance = tmp_path / "head_importance.csv"
    with open(importance, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["kind", "layer", "head", "delta_loss"])
        writer.writeheader()
        writer.writerows({"kind": k, "layer": layer, "head": h, "delta_loss": i}
                         for i, (k, layer, h) in enumerate(heads))
    page = explore.main([f"ckpt={path}", SENTENCES[0], f"output={tmp_path / 'p.html'}", "beam=1",
                         "max_len_offset=3", "prune=0.5", f"importance={importance}"])
    gates = read_page_data(page)["gates"]
    off = {(k, layer, h) for k in gates for layer, row in enumerate(gates[k]) for h, g in enumerate(row) if g == 0}
    assert off == set(heads[: len(heads) // 2])  # the first half of the CSV: smallest loss increase
    with pytest.raises(SystemExit, match="prune="):
        explore.main([f"ckpt={path}", SENTENCES[0], "prune=2", f"importance={importance}"])
    with pytest.raises(SystemExit, match="head_importance.csv does not exist"):
        explore.main([f"ckpt={path}", SENTENCES[0], "prune=0.5"])  # analyze_heads was not run beside it
    with pytest.raises(SystemExit, match="prune=abc: .*prune is float"):  # typed by the option parser
        explore.main([f"ckpt={path}", SENTENCES[0], "prune=abc", f"importance={importance}"])
    with pytest.raises(SystemExit, match="importance= is the table that prune= reads"):  # not silently ignored
        explore.main([f"ckpt={path}", SENTENCES[0], f"importance={importance}"])
    # A table of another model's heads (here: one head more, in a layer this model lacks) names the file.
    other = tmp_path / "other.csv"
    other.write_text(importance.read_text() + "cross,7,0,9\n")
    with pytest.raises(SystemExit, match=rf"{other} does not rank this model's heads.*\('cross', 7, 0\)"):
        explore.main([f"ckpt={path}", SENTENCES[0], "prune=0.5", f"importance={other}"])


def test_options_are_key_value_and_everything_else_a_sentence(tiny):
    path = tiny[0]
    assert explore.split_arguments([f"ckpt={path}", "A = B, says he.", "beam=1", "Two men."]) == (
        [f"ckpt={path}", "beam=1"], ["A = B, says he.", "Two men."])
    with pytest.raises(SystemExit, match="beams"):  # a typo is an error, not a sentence
        explore.main([f"ckpt={path}", "beams=2", "A dog."])
    with pytest.raises(SystemExit, match="no sentence"):
        explore.main([f"ckpt={path}", " "])


# --- the page in a real browser -----------------------------------------------------------------
@pytest.fixture(scope="module")
def browser():
    webdriver = pytest.importorskip("selenium.webdriver", reason="pip install -e '.[dev]' for selenium")
    if not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)):
        pytest.skip("Debian's chromium and chromium-driver are not installed (.ci/run installs them)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="explorer-chromium-")
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={profile}", "--window-size=1280,1000"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def choose(driver, control: str, value) -> None:
    """Pick ``value`` in the page's <select id=control>, as a person does."""
    from selenium.webdriver.support.ui import Select

    Select(driver.find_element("id", control)).select_by_value(str(value))


def token(driver, side: str, index: int):
    return driver.find_element("css selector", f'#head-view text[data-side="{side}"][data-index="{index}"]')


def expected_links(weights: torch.Tensor, heads: list[int], side: str, index: int) -> dict:
    """{(head, q, k): weight} the page must highlight with ``index`` of ``side`` focused: every stored
    non-zero weight from (query side) or to (key side) that token. weights (h, Lq, Lk), as stored."""
    rows = weights[:, index, :] if side == "query" else weights[:, :, index]
    out = {}
    for h in heads:
        for j, w in enumerate(rows[h].tolist()):
            if w > 0:
                out[(h, index, j) if side == "query" else (h, j, index)] = w
    return out


def screenshot(driver, name: str, tmp_path: Path) -> Path:
    directory = Path(SCREENSHOTS) if SCREENSHOTS else tmp_path
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    driver.save_screenshot(str(path))
    assert path.stat().st_size > 10_000
    return path


def test_the_page_in_chromium_highlights_the_weights_in_the_file(browser, tiny, tmp_path):
    path, model, _ = tiny
    page = explore.main([f"ckpt={path}", *SENTENCES, f"output={tmp_path / 'tiny.html'}", "beam=1", "max_len_offset=3"])
    data = read_page_data(page)
    browser.get(page.as_uri())
    for sentence, kinds in [(1, ["cross"]), (0, ["encoder", "decoder", "cross"])]:
        choose(browser, "sentence", sentence)
        for kind in kinds:
            choose(browser, "kind", kind)
            stored = decoded(data["sentences"][sentence]["attention"][kind])  # (layers, h, Lq, Lk)
            for layer in range(stored.shape[0]):
                choose(browser, "layer", layer)
                for head in [0, 1, "all"]:
                    choose(browser, "head", head)
                    heads = [0, 1] if head == "all" else [head]
                    side, index = ("query", stored.shape[2] - 1) if layer == 0 else ("key", 0)
                    token(browser, side, index).click()  # pin: hovering away keeps it
                    state = browser.execute_script("return window.explorer.state()")
                    assert (state["sentence"], state["kind"], state["layer"], state["head"]) == (
                        sentence, kind, layer, head)
                    want = expected_links(stored[layer], heads, side, index)
                    got = {(line["head"], line["q"], line["k"]): line["w"] for line in state["lines"]}
                    assert got.keys() == want.keys(), (kind, layer, head)
                    assert all(abs(got[key] - want[key]) < 1e-4 for key in want)
                    cells = {(c["q"], c["k"]): (c["head"], c["w"]) for c in state["cells"]}
                    for (q, k), (h, w) in cells.items():  # each cell shows its strongest shown head
                        assert w == pytest.approx(max(stored[layer, g, q, k].item() for g in heads), abs=1e-4)
                        assert h in heads
                    assert {key[1:] for key in want} <= cells.keys()
    # Hovering (nothing pinned) shows what attends to a key token, and leaving it shows every line again.
    from selenium.webdriver.common.action_chains import ActionChains

    token(browser, "key", 0).click()  # unpin
    ActionChains(browser).move_to_element(token(browser, "key", 1)).perform()
    lines = browser.execute_script("return window.explorer.state()")["lines"]
    assert lines and {line["k"] for line in lines} == {1}
    ActionChains(browser).move_to_element(browser.find_element("tag name", "h1")).perform()
    assert browser.execute_script("return window.explorer.state()")["focus"] is None
    # The model view: every layer x head, with the file's entropies; a click selects that head.
    thumbs = browser.find_elements("css selector", "#model-view figure.thumb")
    entropy = data["sentences"][0]["entropy"]["cross"]
    assert [(int(t.get_attribute("data-layer")), int(t.get_attribute("data-head"))) for t in thumbs] == [
        (0, 0), (0, 1), (1, 0), (1, 1)]
    assert [float(t.get_attribute("data-entropy")) for t in thumbs] == pytest.approx(
        [e for row in entropy for e in row], abs=1e-3)
    thumbs[2].click()
    state = browser.execute_script("return window.explorer.state()")
    assert (state["layer"], state["head"], state["lines"]) == (1, 0, [])
    screenshot(browser, "explorer-tiny.png", tmp_path)
    errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert errors == []


def test_the_page_of_a_trained_model_in_chromium(browser, trained_checkpoint_path, tmp_path):
    """The trained test checkpoint (conftest: once per session): cross-attention, all heads overlaid, a target
    word pinned; the screenshot docs/images/attention_explorer.png is this one."""
    ckpt = trained_checkpoint_path
    page = explore.main([f"ckpt={ckpt}", "A dog runs on the beach.", "Two young men are playing soccer in a park.",
                         f"output={tmp_path / 'trained.html'}", "beam=4"])
    browser.get(page.as_uri())
    choose(browser, "sentence", 1)
    choose(browser, "kind", "cross")
    choose(browser, "head", "all")
    token(browser, "query", 3).click()
    browser.set_window_size(1100, 860)  # the screenshot: the controls, the head view, the matrix, the model view
    state = browser.execute_script("return window.explorer.state()")
    assert {line["head"] for line in state["lines"]} == set(range(4))  # each head in its own colour
    assert all(line["q"] == 3 for line in state["lines"])
    legend = browser.find_elements("css selector", "#head-view .legend-item")
    assert [item.text for item in legend] == ["head 0", "head 1", "head 2", "head 3"]
    screenshot(browser, "attention_explorer.png", tmp_path)
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
