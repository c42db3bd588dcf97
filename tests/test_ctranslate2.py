"""Export to CTranslate2 and engine=ctranslate2: same log-probabilities, same translations, same CLI guarantees."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from sacrebleu.metrics import BLEU
from tiny_checkpoint import multi30k_lines, tiny_tokenizer, write_checkpoint

from transformer_nmt.checkpoint import load_checkpoint
from transformer_nmt.data.tokenizer import BOS_ID, EOS_ID
from transformer_nmt.export import main as export_main
from transformer_nmt.generation.config import DecodeConfig
from transformer_nmt.generation.search import beam_search, greedy_decode, max_output_lengths
from transformer_nmt.inference.batches import token_batches
from transformer_nmt.inference.evaluate import main as evaluate_main
from transformer_nmt.inference.export import EXPORT_INFO, cached_export, export_model
from transformer_nmt.inference.translate import encode_sources, translate_lines
from transformer_nmt.inference.translate import main as translate_main
from transformer_nmt.model.transformer import Transformer, TransformerConfig

ctranslate2 = pytest.importorskip("ctranslate2")
from transformer_nmt.inference import ctranslate2_engine  # noqa: E402
from transformer_nmt.inference.ctranslate2_engine import CTranslate2Model  # noqa: E402

IDS = {"bos_id": BOS_ID, "eos_id": EOS_ID}  # the tokenizer's special ids, which the searches take


@pytest.fixture(scope="module")
def trained(trained_checkpoint_path):
    """(checkpoint path, model, tokenizer) of a small model trained on Multi30k (conftest: once per session)."""
    model, tokenizer, _ = load_checkpoint(trained_checkpoint_path)
    return trained_checkpoint_path, model, tokenizer


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory):
    path, model, tokenizer = trained
    model_dir = export_model(model, tokenizer, tmp_path_factory.mktemp("ct2") / "model")
    return model_dir, CTranslate2Model(model_dir, threads=1)


@pytest.fixture(scope="module")
def validation():
    return multi30k_lines("val", "en", 200), multi30k_lines("val", "de", 200)


def native_greedy_ids(model, tokenizer, lines, max_tokens=2048):
    sources = encode_sources(tokenizer, lines, model.config.max_positions)
    outputs = [None] * len(lines)
    for batch in token_batches([len(s) for s in sources], max_tokens):
        src = torch.nn.utils.rnn.pad_sequence([torch.tensor(sources[i]) for i in batch], batch_first=True)
        for i, ids in zip(batch, greedy_decode(model, src, max_len_offset=DecodeConfig().max_len_offset, **IDS)):
            outputs[i] = ids
    return sources, outputs


def native_beam(model, tokenizer, lines, n_best=1, max_len_offset=DecodeConfig().max_len_offset):
    """Our beam-4 search with CTranslate2's stopping rule (stop="k_finished"): n-best (text, score) per line."""
    sources = encode_sources(tokenizer, lines, model.config.max_positions)
    src = torch.nn.utils.rnn.pad_sequence([torch.tensor(ids) for ids in sources], batch_first=True)
    hypotheses = beam_search(model, src, beam_size=4, alpha=DecodeConfig().alpha, max_len_offset=max_len_offset,
                             n_best=n_best, stop="k_finished", **IDS)
    return [[(tokenizer.decode(h.tokens), h.score) for h in hyps] for hyps in hypotheses]


# --- equality with the native engine ----------------------------------------------------------

def test_greedy_equals_native_token_for_token(trained, exported, validation):
    _, model, tokenizer = trained
    sources, native = native_greedy_ids(model, tokenizer, validation[0])
    ct2 = [hyps[0][0] for hyps in exported[1].translate_ids(sources, beam=1)]
    differ = [(i, tokenizer.decode(a), tokenizer.decode(b)) for i, (a, b) in enumerate(zip(native, ct2)) if a != b]
    assert len(differ) <= 0.02 * len(sources), "\n".join(f"line {i + 1}: native {a!r} != ct2 {b!r}"
                                                         for i, a, b in differ)
    assert sum(map(len, native)) > 5 * len(sources)  # real translations, not empty ones


def test_beam4_bleu_within_0_3_of_native(trained, exported, validation):
    """The engines as users get them: CTranslate2 stops a sentence once k hypotheses have finished, our
    default (stop="bound") once no live beam can beat the finished ones; the BLEU of both within 0.3. With
    our search under CTranslate2's rule, the beam-4 outputs are the same on at least 98% of the sentences."""
    _, model, tokenizer = trained
    sources, references = validation
    outputs = {name: [hyps[0][0] for hyps in translate_lines(engine, tokenizer, sources, beam=4)]
               for name, engine in (("native", model), ("ctranslate2", exported[1]))}
    bleu = {name: BLEU().corpus_score(hypotheses, [references]).score for name, hypotheses in outputs.items()}
    assert bleu["native"] > 1.0, bleu  # a model that translates, if poorly
    assert abs(bleu["native"] - bleu["ctranslate2"]) <= 0.3, bleu
    same_rule = [hyps[0][0] for hyps in native_beam(model, tokenizer, sources)]
    differ = [(i, a, b) for i, (a, b) in enumerate(zip(same_rule, outputs["ctranslate2"])) if a != b]
    assert len(differ) <= 0.02 * len(sources), "\n".join(f"line {i + 1}: native {a!r} != ct2 {b!r}"
                                                         for i, a, b in differ)


def test_n_best_hypotheses_and_scores_match_native(trained, exported, validation):
    """The same search: CTranslate2's n-best against ours under its stopping rule (stop="k_finished")."""
    _, model, tokenizer = trained
    lines = validation[0][:30]  # a short length limit, so that some sentences reach it
    native = native_beam(model, tokenizer, lines, n_best=4, max_len_offset=5)
    ct2 = translate_lines(exported[1], tokenizer, lines, beam=4, n_best=4, max_len_offset=5)
    same = [[t for t, _ in a] == [t for t, _ in b] and all(abs(x - y) < 1e-4 for (_, x), (_, y) in zip(a, b))
            for a, b in zip(native, ct2)]  # the 4 texts equal, in the same order, scores within 1e-4
    assert sum(same) >= 0.9 * len(lines), [(a, b) for a, b, s in zip(native, ct2, same) if not s]


# --- the export itself ---------------------------------------------------------------------------

@pytest.mark.parametrize("layout", [
    dict(norm_first=False, tie_embeddings=True),
    dict(norm_first=True, tie_embeddings=False),
    dict(norm_first=True, norm="rmsnorm", activation="swiglu", positions="rotary"),  # the "modern" combination
    dict(norm="rmsnorm", activation="geglu", positions="learned"),
    dict(positions="rotary", activation="gelu"),
], ids=["post-norm-tied", "pre-norm-untied", "pre-rmsnorm-swiglu-rotary", "rmsnorm-geglu-learned", "rotary-gelu"])
def test_export_gives_our_log_probabilities(tmp_path, layout):
    """Post-norm and pre-norm, tied and untied, LayerNorm and RMSNorm, plain and gated feed-forwards, sinusoidal,
    learned and rotary positions: CTranslate2's per-token log-probabilities of reference translations equal ours
    (teacher forcing, pad and bos forbidden as in decoding)."""
    tokenizer = tiny_tokenizer()
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(vocab_size=tokenizer.vocab_size, d_model=32, n_heads=4,
                                          n_encoder_layers=2, n_decoder_layers=2, d_ff=64, max_positions=64,
                                          **layout)).eval()
    with torch.no_grad():  # norms away from (1, 0), so a misplaced one shows
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(0.2 * torch.randn_like(param))
    translator = ctranslate2.Translator(str(export_model(model, tokenizer, tmp_path / "ct2")), intra_threads=1)

    sources = [tokenizer.encode(line)[:40] for line in multi30k_lines("val", "en", 16)]
    targets = [tokenizer.encode(line)[:40] for line in multi30k_lines("val", "de", 16)]
    pieces = [[tokenizer.id_to_piece(i) for i in ids] for ids in (*sources, *targets)]
    scored = translator.score_batch(pieces[:16], pieces[16:])
    for src, tgt, result in zip(sources, targets, scored):
        with torch.no_grad():
            logits = model(torch.tensor([src + [tokenizer.eos_id]]), torch.tensor([[tokenizer.bos_id] + tgt]))[0]
        logits[:, [tokenizer.pad_id, tokenizer.bos_id]] = float("-inf")
        ours = torch.log_softmax(logits, dim=-1)[torch.arange(len(tgt) + 1), tgt + [tokenizer.eos_id]]  # (T+1,)
        torch.testing.assert_close(torch.tensor(result.log_probs), ours, atol=1e-4, rtol=0)


def test_export_command_and_int8(tmp_path, trained, validation):
    path, model, tokenizer = trained
    export_main([f"ckpt={path}", f"output={tmp_path / 'int8'}", "quantization=int8"])
    float32 = export_model(model, tokenizer, tmp_path / "float32")
    size = {d.name: (d / "model.bin").stat().st_size for d in (tmp_path / "int8", float32)}
    assert size["int8"] < 0.5 * size["float32"]
    assert (tmp_path / "int8" / "sentencepiece.model").read_bytes() == tokenizer.model_proto
    int8 = CTranslate2Model(tmp_path / "int8", threads=1)
    hypotheses = [hyps[0][0] for hyps in translate_lines(int8, tokenizer, validation[0][:50], beam=1)]
    assert sum(h != "" for h in hypotheses) >= 45


# --- translate and evaluate with engine=ctranslate2 ----------------------------------------------

def test_translate_keeps_its_guarantees_with_ctranslate2(tmp_path, monkeypatch, trained):
    """Empty, blank and over-long lines, n_best, one line per input; the checkpoint is exported to the cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path, _, _ = trained
    lines = ["A man is riding a bike.", "", "   ", " ".join(["dog"] * 150), "Two dogs play in the snow."]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.warns(UserWarning, match="input line 4: .* exceed max_positions \\(128\\)"):
        translate_main([f"ckpt={path}", "engine=ctranslate2", f"input={tmp_path / 'in.txt'}",
                        f"output={tmp_path / 'out.txt'}", "beam=3", "n_best=2", "threads=1"])
    rows = [line.split("\t") for line in (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines()]
    assert [r[0] for r in rows] == ["1", "1", "2", "2", "3", "3", "4", "4", "5", "5"]
    assert rows[2][3] == rows[4][3] == "" and rows[0][3] != ""  # LINE, SCORE, LOG_PROB, TRANSLATION
    assert float(rows[0][1]) >= float(rows[1][1]) and float(rows[0][2]) < 0
    assert len(list((tmp_path / "cache" / "transformer_nmt" / "ctranslate2").iterdir())) == 1


def test_evaluate_with_ctranslate2_matches_native(tmp_path, trained, exported, validation):
    path = trained[0]
    for name, lines in (("src.en", validation[0][:20]), ("ref.de", validation[1][:20])):
        (tmp_path / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    files = [f"src={tmp_path / 'src.en'}", f"ref={tmp_path / 'ref.de'}", "beam=1"]
    native = evaluate_main([f"ckpt={path}", *files, f"out={tmp_path / 'native'}"])
    ct2 = evaluate_main([f"model_dir={exported[0]}", "engine=ctranslate2", *files, f"out={tmp_path / 'ct2'}"])
    assert ct2["engine"] == "ctranslate2" and ct2["sentences"] == 20
    assert (tmp_path / "ct2" / "src.en.hyp").read_text() == (tmp_path / "native" / "src.en.hyp").read_text()
    assert ct2["bleu"] == native["bleu"]


def test_translate_stdin_with_ctranslate2_in_a_subprocess(tmp_path, trained):
    """The acceptance command: echo "A dog runs." | python -m transformer_nmt.translate ckpt=... engine=ctranslate2"""
    result = subprocess.run([sys.executable, "-m", "transformer_nmt.translate", f"ckpt={trained[0]}",
                             "engine=ctranslate2"], input="A dog runs.\n", capture_output=True, text=True,
                            timeout=120, env={**os.environ, "XDG_CACHE_HOME": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.split("\n")) == 2 and result.stdout.strip() != ""


# --- errors --------------------------------------------------------------------------------------

def test_errors_name_the_option(tmp_path, trained, exported, monkeypatch):
    path, model, tokenizer = trained
    with pytest.raises(SystemExit, match="quantization='int3'"):
        export_main([f"ckpt={path}", f"output={tmp_path / 'x'}", "quantization=int3"])
    with pytest.raises(SystemExit, match="already exists.*force=true"):
        export_main([f"ckpt={path}", f"output={exported[0]}"])
    with pytest.raises(SystemExit, match="engine='onnx'"):
        translate_main([f"ckpt={path}", "engine=onnx"])
    with pytest.raises(SystemExit, match="model_dir= is an option of engine=ctranslate2"):
        translate_main([f"model_dir={exported[0]}"])
    with pytest.raises(SystemExit, match="inter_threads= is an option of engine=ctranslate2"):
        translate_main([f"ckpt={path}", "inter_threads=2"])
    with pytest.raises(SystemExit, match="not both"):
        translate_main([f"ckpt={path}", f"model_dir={exported[0]}", "engine=ctranslate2"])
    with pytest.raises(SystemExit, match=f"model_dir={tmp_path} is not a model directory"):
        translate_main([f"model_dir={tmp_path}", "engine=ctranslate2"])
    with pytest.raises(SystemExit, match="compute_type='int3'"):
        CTranslate2Model(exported[0], compute_type="int3")
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # as if not installed
    with pytest.raises(SystemExit, match=r'pip install -e "\.\[serve\]"'):
        translate_main([f"ckpt={path}", "engine=ctranslate2"])


RACER = """
import os, sys, time
from pathlib import Path
from transformer_nmt.inference.ctranslate2_engine import CTranslate2Model
from transformer_nmt.inference.export import cached_export
barrier, replace = Path(sys.argv[2]), os.replace
def replace_together(src, dst):  # both processes publish their export at the same moment: the worst interleaving
    if Path(dst).parent.name == "ctranslate2":
        (barrier / str(os.getpid())).touch()
        deadline = time.monotonic() + 60
        while len(list(barrier.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    return replace(src, dst)
os.replace = replace_together
model_dir = cached_export(sys.argv[1])
CTranslate2Model(model_dir, threads=1)
print(model_dir)
"""


def test_two_concurrent_first_uses_of_the_export_cache_both_succeed(tmp_path):
    """Two translate processes on one new checkpoint both export it; neither may fail nor remove the other's."""
    ckpt = tmp_path / "model.ckpt"
    write_checkpoint(ckpt, tiny_tokenizer(vocab_size=100))
    (tmp_path / "barrier").mkdir()
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    racers = [subprocess.Popen([sys.executable, "-c", RACER, str(ckpt), str(tmp_path / "barrier")], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(racer.communicate(timeout=180), racer.returncode) for racer in racers]
    assert len(list((tmp_path / "barrier").iterdir())) == 2, "the two exports did not meet"
    for (out, err), code in results:
        assert code == 0, err[-2000:]
    assert results[0][0][0] == results[1][0][0]  # one cache entry, complete, and nothing left beside it
    assert [p.name for p in (tmp_path / "cache" / "transformer_nmt" / "ctranslate2").iterdir()] == \
        [Path(results[0][0][0].strip()).name]


def test_the_export_cache_replaces_a_leftover_export_that_never_finished(tmp_path, monkeypatch):
    """A cache entry without EXPORT_INFO (a writer from before exports were atomic, killed mid-write) is not an
    export: the next use exports again and puts a complete one in its place, instead of failing forever."""
    ckpt = tmp_path / "model.ckpt"
    write_checkpoint(ckpt, tiny_tokenizer(vocab_size=100))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    entry = cached_export(ckpt)
    (entry / EXPORT_INFO).unlink()  # what was left: some files, no EXPORT_INFO
    assert cached_export(ckpt) == entry and (entry / EXPORT_INFO).is_file()
    assert CTranslate2Model(entry).translate_ids([[5, 6, 7]], beam=1)  # complete: it loads and translates
    assert sorted(p.name for p in entry.parent.iterdir()) == [entry.name, f"{entry.name}.lock"]


def test_export_refuses_heads_whose_width_is_not_d_model(tmp_path):
    """d_k = d_v = 7 with 4 heads at d_model 30: each head's width differs from d_model / n_heads only through
    the rounding, but 4 x 7 = 28 != 30, which CTranslate2's attention cannot hold."""
    from transformer_nmt.inference.export import transformer_spec

    tokenizer = tiny_tokenizer()
    model = Transformer(TransformerConfig(vocab_size=tokenizer.vocab_size, d_model=30, n_heads=4, d_k=7, d_v=7,
                                          n_encoder_layers=1, n_decoder_layers=1, d_ff=32, max_positions=64))
    with pytest.raises(ValueError, match=r"n_heads x d_k = n_heads x d_v = d_model \(30\); this model has n_heads 4, "
                                         r"model.d_k 7, model.d_v 7"):
        transformer_spec(model, tokenizer)


def test_n_best_log_probs_match_native(trained, exported, validation):
    """Each beam hypothesis's log-probability (CTranslate2's normalised score, restored) equals the native one's
    (the same search rule, k finished) for the hypotheses both find, and the native one equals the
    teacher-forced sum of the model's log-probabilities of its tokens and eos."""
    _, model, tokenizer = trained
    lines = validation[0][:30]
    sources = encode_sources(tokenizer, lines, model.config.max_positions)
    src = torch.nn.utils.rnn.pad_sequence([torch.tensor(ids) for ids in sources], batch_first=True)
    native = beam_search(model, src, beam_size=4, alpha=0.6, max_len_offset=50, n_best=4, stop="k_finished", **IDS)
    ct2 = exported[1].translate_hypotheses(sources, beam=4, n_best=4)
    compared = 0
    for ours, theirs in zip(native, ct2):
        by_tokens = {tuple(h.tokens): h.log_prob for h in theirs}
        for h in ours:
            if tuple(h.tokens) in by_tokens:
                assert h.log_prob == pytest.approx(by_tokens[tuple(h.tokens)], abs=2e-3)
                compared += 1
    assert compared >= 0.9 * 4 * len(lines)
    for i in range(3):  # an independent sum: a full forward pass, teacher-forced
        h = native[i][0]
        tgt = torch.tensor([[tokenizer.bos_id] + h.tokens + [tokenizer.eos_id]])
        with torch.no_grad():
            logits = model(torch.tensor([sources[i]]), tgt[:, :-1])[0].float()
        logits[:, [0, tokenizer.bos_id]] = float("-inf")
        expected = torch.log_softmax(logits, -1).gather(1, tgt[0, 1:, None]).sum()
        assert h.log_prob == pytest.approx(float(expected), abs=1e-3)


# --- greedy: one call with the largest length limit, each output cut at its own; beam: a call per limit ------

def per_limit_reference(engine, sources, beam, max_len_offset, n_best):
    """One synchronous translate_batch call per distinct length limit, each at its own limit."""
    padded = torch.nn.utils.rnn.pad_sequence([torch.tensor(s) for s in sources], batch_first=True)
    limits = max_output_lengths(engine, padded, max_len_offset).tolist()
    results = [None] * len(sources)
    for limit in set(limits):
        rows = [i for i, lim in enumerate(limits) if lim == limit]
        outputs = engine.translator.translate_batch(
            [[engine.pieces[t] for t in sources[i][:-1]] for i in rows], beam_size=beam, num_hypotheses=beam,
            length_penalty=0.6, return_end_token=True, return_scores=True, max_decoding_length=limit,
            min_decoding_length=0, max_input_length=0)
        for i, output in zip(rows, outputs):
            results[i] = [(h.tokens, h.score) for h in engine._hypotheses(output, beam, 0.6, n_best)]
    return limits, results


@pytest.mark.parametrize("beam,n_best", [(1, 1), (4, 4), (3, 1)])
def test_the_length_limit_of_each_sentence_is_its_own(trained, exported, validation, beam, n_best):
    """With max_len_offset 3 the limits bite: many outputs reach their sentence's own limit. translate_ids gives
    what a call per limit gives (the same texts in the same order, the same scores). Greedy translates in one
    call at the largest limit and cuts: without the cut, outputs would be longer than their limit."""
    _, _, tokenizer = trained
    engine = exported[1]
    sources = encode_sources(tokenizer, validation[0][:60], engine.config.max_positions)
    limits, expected = per_limit_reference(engine, sources, beam, 3, n_best)
    assert len(set(limits)) > 5  # sentences of many lengths: the largest limit is not theirs
    got = engine.translate_ids(sources, beam=beam, max_len_offset=3, n_best=n_best)
    assert [[ids for ids, _ in h] for h in got] == [[ids for ids, _ in h] for h in expected]
    if beam > 1:
        assert all(abs(a[1] - b[1]) < 1e-4 for x, y in zip(got, expected) for a, b in zip(x, y))
    at_limit = sum(any(len(ids) == limit for ids, _ in h) for h, limit in zip(expected, limits))
    assert at_limit >= 3  # the rule bit: hypotheses cut by their sentence's limit
    if beam == 1:
        uncut = engine._translate(sources, range(len(sources)), max(limits), 1, 0.6, 4096)
        assert sum(len(output.hypotheses[0]) > limit for output, limit in zip(uncut, limits)) >= 3


def test_inter_threads_translate_batches_at_once_with_the_same_outputs(trained, exported, validation):
    """inter_threads=2: two workers take the batches (max_tokens 256 cuts 100 sentences into several); each batch
    is translated as with one worker, so the outputs are the same."""
    _, _, tokenizer = trained
    two = CTranslate2Model(exported[0], threads=1, inter_threads=2)
    assert two.translator.num_translators == 2
    lines = validation[0][:100]
    one = translate_lines(exported[1], tokenizer, lines, beam=4, max_tokens=256)
    assert translate_lines(two, tokenizer, lines, beam=4, max_tokens=256) == one


@pytest.mark.parametrize("cores, default, shared", [(1, 1, 1), (2, 2, 1), (5, 5, 2)])
def test_default_threads_are_one_per_batch_and_one_batch_per_core(exported, monkeypatch, cores, default, shared):
    """On a machine of 1, 2 or 5 usable cores (available_cpus answering as it would there), by hand: by default
    ``default`` batches of 1 thread each (one per core); inter_threads=2 alone, 2 batches sharing the cores
    (``shared`` = cores // 2 threads each, never 0); threads=2 alone, 2 threads on one batch at a time."""
    monkeypatch.setattr(ctranslate2_engine, "available_cpus", lambda: cores)
    layouts = {(): (1, default), (("inter_threads", 2),): (shared, 2), (("threads", 2),): (2, 1)}
    for given, (threads, inter_threads) in layouts.items():
        model = CTranslate2Model(exported[0], **dict(given))
        assert (model.threads, model.inter_threads, model.translator.num_translators) == (
            threads, inter_threads, inter_threads), given
    for bad in ("threads", "inter_threads"):
        with pytest.raises(SystemExit, match=f"{bad}=-1: give a whole number >= 0"):
            CTranslate2Model(exported[0], **{bad: -1})


def test_scoring_and_prefixes_match_native(trained, exported, validation):
    """score_reference: CTranslate2's score_batch gives each token the native log-probability; prefix: its
    target_prefix starts every output with the prefix, and beam 4 continues it as the native search does."""
    from transformer_nmt.inference.scoring import token_log_probs
    from transformer_nmt.inference.translate import translate_hypotheses

    _, model, tokenizer = trained
    sources, references = validation[0][:12], validation[1][:12]
    native = token_log_probs(model, tokenizer, sources, references, 4096)
    ct2 = token_log_probs(exported[1], tokenizer, sources, references, 4096)
    assert [len(x) for x in ct2] == [len(x) for x in native]
    assert all(a == pytest.approx(b, abs=2e-3) for x, y in zip(native, ct2) for a, b in zip(x, y))
    prefixes = [" ".join(reference.split()[:2]) for reference in references]
    for beam in (1, 4):
        ours = translate_hypotheses(model, tokenizer, sources, beam=beam, prefixes=prefixes)[1]
        theirs = translate_hypotheses(exported[1], tokenizer, sources, beam=beam, prefixes=prefixes)[1]
        for prefix, h in zip(prefixes, theirs):
            assert h[0].tokens[: len(tokenizer.encode(prefix))] == tokenizer.encode(prefix)
        same = sum(a[0].tokens == b[0].tokens for a, b in zip(ours, theirs))
        assert same >= 0.8 * len(sources)


def test_export_refuses_a_model_without_positions_naming_the_option():
    from transformer_nmt.inference.export import transformer_spec

    tokenizer = tiny_tokenizer()
    model = Transformer(TransformerConfig(vocab_size=tokenizer.vocab_size, d_model=32, n_heads=4, positions="none",
                                          n_encoder_layers=1, n_decoder_layers=1, d_ff=32, max_positions=64))
    with pytest.raises(ValueError, match=r"model.positions=none: CTranslate2's Transformer always adds positions"):
        transformer_spec(model, tokenizer)


def test_export_refuses_a_model_with_head_gates_until_they_are_folded(tmp_path):
    """Gates are hooks, not weights: exporting a gated model would drop them, so it is refused; folded, the export
    gives the gated model's log-probabilities."""
    from transformer_nmt.analysis.head_gates import fold_gates, set_gates
    from transformer_nmt.inference.export import transformer_spec

    tokenizer = tiny_tokenizer()
    model = Transformer(TransformerConfig(vocab_size=tokenizer.vocab_size, d_model=32, n_heads=4, d_ff=32,
                                          n_encoder_layers=1, n_decoder_layers=1, max_positions=64)).eval()
    set_gates(model, {("cross", 0, 1)})
    with pytest.raises(ValueError, match=r"forward hooks on decoder_layers.0.cross_attn.out_proj .*fold_gates"):
        transformer_spec(model, tokenizer)
    fold_gates(model)
    transformer_spec(model, tokenizer)  # no hooks left
