"""Decoding speed: greedy and beam-4 translation of the 1,000 Multi30k test sentences, before (the
per-sentence search this project had, copied below) and after (decoding.py), side by side in one run.

    python scripts/benchmark_decode.py ckpt=RUN/checkpoints/averaged.ckpt [max_tokens=4096] [limit=1000] [beam=4] [rounds=1]

With ``ckpt=random`` (the default) a random tiny model is built with tests/tiny_checkpoint.py (speed only: its output is
noise). One thread; sentences are batched by tokens as ``translate`` does; every batch is decoded by each
engine in turn (the order rotates from batch to batch; ``rounds`` passes over the batches), and "x before"
is the median over batches of before-time / engine-time. An engine is a named function from a list of source lines to translations:
add rows by appending to ``engines()``. "same as before" counts outputs identical to the engine's baseline.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from transformer_nmt.checkpoint import load_checkpoint
from transformer_nmt.decoding import beam_search, forbid_special, greedy_decode, length_penalty, max_output_lengths
from transformer_nmt.evaluate import score
from transformer_nmt.model import Transformer
from transformer_nmt.tokenizer import Tokenizer
from transformer_nmt.translate import encode_sources, parse_options, read_lines, token_batches

ROOT = Path(__file__).resolve().parent.parent
OPTIONS = {"ckpt": "random", "src": None, "ref": None, "max_tokens": 4096, "limit": 1000, "beam": 4, "rounds": 1}


# --- before: the search as it was (commit b8dae0a), one Python loop over sentences per step ------------------
@torch.no_grad()
def before_greedy(model: Transformer, src: Tensor, bos_id: int, eos_id: int, max_len_offset: int = 50):
    limits = max_output_lengths(model, src, max_len_offset)
    memory, cache = model.encode(src), model.new_cache()
    rows = torch.arange(src.shape[0])
    last = torch.full((src.shape[0], 1), bos_id, dtype=torch.long)
    outputs = [[] for _ in range(src.shape[0])]
    for step in range(int(limits.max())):
        next_tokens = forbid_special(model.decode(last, memory, src, cache=cache)[:, -1], bos_id, model).argmax(-1)
        done = (next_tokens == eos_id) | (step + 1 >= limits[rows])
        for row, token in zip(rows.tolist(), next_tokens.tolist()):
            if token != eos_id:
                outputs[row].append(token)
        if done.all():
            break
        if done.any():
            keep = (~done).nonzero().squeeze(1)
            rows, memory, src, next_tokens = rows[keep], memory[keep], src[keep], next_tokens[keep]
            cache.reorder(keep)
        last = next_tokens.unsqueeze(1)
    return outputs


@torch.no_grad()
def before_beam(model: Transformer, src: Tensor, k: int, bos_id: int, eos_id: int, alpha: float = 0.6,
                max_len_offset: int = 50):
    B = src.shape[0]
    limits = max_output_lengths(model, src, max_len_offset)
    src = src.repeat_interleave(k, dim=0)
    memory, cache = model.encode(src), model.new_cache()
    sentences = torch.arange(B)
    beam_scores = torch.full((B, k), float("-inf"))
    beam_scores[:, 0] = 0.0
    prefixes = torch.empty(B * k, 0, dtype=torch.long)
    last = torch.full((B * k, 1), bos_id, dtype=torch.long)
    finished = [[] for _ in range(B)]
    for step in range(int(limits.max())):
        b = sentences.numel()
        logits = forbid_special(model.decode(last, memory, src, cache=cache)[:, -1], bos_id, model)
        log_probs = torch.log_softmax(logits.float(), dim=-1)
        vocab = log_probs.shape[-1]
        top_scores, top_ids = (beam_scores.view(b * k, 1) + log_probs).view(b, k * vocab).topk(2 * k, dim=1)
        origins, tokens = top_ids // vocab, top_ids % vocab
        new_beams = (torch.arange(b) * k).unsqueeze(1).repeat(1, k)
        new_tokens = torch.full((b, k), eos_id, dtype=torch.long)
        new_scores = torch.full((b, k), float("-inf"))
        still_searching = []
        for i, sentence in enumerate(sentences.tolist()):
            at_limit = step + 1 >= int(limits[sentence])
            kept = 0
            for rank, (s, origin, token) in enumerate(
                    zip(top_scores[i].tolist(), origins[i].tolist(), tokens[i].tolist())):
                if s == float("-inf"):
                    break
                if token == eos_id and rank >= k:
                    continue
                if token == eos_id or at_limit:
                    generated = prefixes[i * k + origin].tolist() + ([] if token == eos_id else [token])
                    if len(finished[sentence]) < k:
                        finished[sentence].append((generated, s / length_penalty(step + 1, alpha)))
                elif kept < k:
                    new_beams[i, kept], new_tokens[i, kept], new_scores[i, kept] = i * k + origin, token, s
                    kept += 1
            if len(finished[sentence]) < k and not at_limit:
                still_searching.append(i)
        if not still_searching:
            break
        live = torch.tensor(still_searching)
        origin_rows = new_beams[live].view(-1)
        cache.reorder(origin_rows)
        memory, src = memory[origin_rows], src[origin_rows]
        prefixes = torch.cat([prefixes[origin_rows], new_tokens[live].view(-1, 1)], dim=1)
        last = new_tokens[live].view(-1, 1)
        beam_scores = new_scores[live]
        sentences = sentences[live]
    return [max(hyps, key=lambda h: h[1])[0] for hyps in finished]


# --- engines: name -> (baseline name or None, function lines -> translations) --------------------------------
Engine = Callable[[list[str]], list[str]]


def ours(model: Transformer, tokenizer: Tokenizer, search: Callable[[Tensor], list[list[int]]]) -> Engine:
    """Lines -> translations with ``search(src (B, S)) -> ids per sentence`` over one padded batch."""
    def translate(lines: list[str]) -> list[str]:
        sources = encode_sources(tokenizer, lines, model.config.max_positions)
        src = torch.full((len(lines), max(map(len, sources))), model.config.pad_id, dtype=torch.long)
        for row, ids in enumerate(sources):
            src[row, : len(ids)] = torch.tensor(ids)
        return [tokenizer.decode(ids) for ids in search(src)]
    return translate


def engines(model: Transformer, tokenizer: Tokenizer, k: int) -> dict[str, tuple[str | None, Engine]]:
    bos, eos = tokenizer.bos_id, tokenizer.eos_id

    def beam(stop):
        return lambda src: [hyps[0].tokens for hyps in beam_search(model, src, k, stop=stop)]
    return {
        "greedy, before": (None, ours(model, tokenizer, lambda src: before_greedy(model, src, bos, eos))),
        "greedy, after": ("greedy, before", ours(model, tokenizer, lambda src: greedy_decode(model, src))),
        f"beam {k}, before": (None, ours(model, tokenizer, lambda src: before_beam(model, src, k, bos, eos))),
        f"beam {k}, after, stop=k_finished": (f"beam {k}, before", ours(model, tokenizer, beam("k_finished"))),
        f"beam {k}, after, stop=bound (default)": (f"beam {k}, before", ours(model, tokenizer, beam("bound"))),
    }


def model_and_tokenizer(ckpt: str) -> tuple[Transformer, Tokenizer, dict]:
    if ckpt:
        return load_checkpoint(ckpt, map_location="cpu")
    print("no ckpt=: a random tiny model (tests/tiny_checkpoint.py); its translations are noise\n")
    sys.path.insert(0, str(ROOT / "tests"))
    from tiny_checkpoint import tiny_tokenizer, write_checkpoint
    path = Path(tempfile.mkdtemp()) / "tiny.ckpt"
    write_checkpoint(path, tiny_tokenizer(), max_positions=128)
    return load_checkpoint(path, map_location="cpu")


def main(argv: list[str]) -> None:
    options = parse_options(argv, OPTIONS)
    torch.set_num_threads(1)
    model, tokenizer, meta = model_and_tokenizer(options["ckpt"] if options["ckpt"] != "random" else "")
    model.eval()
    data = meta.get("data_config") or {}
    src_lang, tgt_lang = data.get("src_lang", "en"), data.get("tgt_lang", "de")
    test = ROOT / "data" / "multi30k" / "test_2016_flickr"
    sources = read_lines(options["src"] or f"{test}.{src_lang}.gz")[: options["limit"]]
    references = read_lines(options["ref"] or f"{test}.{tgt_lang}.gz")[: options["limit"]]
    lengths = [len(ids) for ids in encode_sources(tokenizer, sources, model.config.max_positions)]
    batches = token_batches(lengths, options["max_tokens"])

    table = engines(model, tokenizer, options["beam"])
    names = list(table)
    seconds = {name: [] for name in names}
    outputs = {name: [""] * len(sources) for name in names}
    for n, batch in enumerate(batches * options["rounds"]):
        lines = [sources[i] for i in batch]
        for name in names[n % len(names):] + names[: n % len(names)]:  # rotate the order
            started = time.perf_counter()
            translations = table[name][1](lines)
            seconds[name].append(time.perf_counter() - started)
            for i, text in zip(batch, translations):
                outputs[name][i] = text
        print(f"batch {n + 1}/{len(batches) * options['rounds']} ({len(batch)} sentences)", file=sys.stderr)

    print(f"{len(sources)} sentences, {options['rounds']} x {len(batches)} batches of <= {options['max_tokens']} source tokens, "
          f"1 thread, torch {torch.__version__}, model d_model {model.config.d_model}, "
          f"{model.config.n_encoder_layers}+{model.config.n_decoder_layers} layers, vocab {model.config.vocab_size}\n")
    print("| engine | sentences/s | target tokens/s | x before | same as before | BLEU | length ratio | BP |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in names:
        baseline, total = table[name][0], sum(seconds[name]) / options["rounds"]  # seconds per pass
        tokens = sum(len(ids) for ids in tokenizer.encode_batch(outputs[name]))
        speedup = same = "-"
        if baseline:
            speedup = f"{statistics.median(b / a for a, b in zip(seconds[name], seconds[baseline])):.2f}x"
            same = f"{sum(a == b for a, b in zip(outputs[name], outputs[baseline]))}/{len(sources)}"
        metrics = score(outputs[name], references)
        print(f"| {name} | {len(sources) / total:.1f} | {tokens / total:,.0f} | {speedup} | {same} | "
              f"{metrics['bleu']:.2f} | {metrics['length_ratio']:.3f} | {metrics['bp']:.3f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
