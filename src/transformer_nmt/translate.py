"""Translate text with a checkpoint: one output line per input line, always.

    echo "A man is riding a bike." | python -m transformer_nmt.translate ckpt=RUN/checkpoints/last.ckpt
    python -m transformer_nmt.translate ckpt=model.ckpt input=in.en output=out.de beam=4 alpha=0.6

Options: ``beam`` (4; 1 = greedy), ``alpha`` (0.6, GNMT length penalty), ``max_len_offset`` (50: at most
source length + 50 tokens out), ``max_tokens`` (4096 source tokens per batch, padding counted),
``n_best`` (1; with n > 1 each input line gives n lines ``LINE_NUMBER<TAB>SCORE<TAB>TRANSLATION``),
``device`` (cpu, cuda, ...).

Nothing is dropped or reordered: an empty (or blank) line gives an empty line; a line longer than
the model's ``max_positions`` is cut to fit, with a warning naming the line, and still translated.
"""

from __future__ import annotations

import gzip
import sys
import warnings
from contextlib import nullcontext
from pathlib import Path

import torch
from omegaconf import OmegaConf

from transformer_nmt.checkpoint import load_checkpoint
from transformer_nmt.decoding import beam_search, greedy_decode
from transformer_nmt.model import Transformer
from transformer_nmt.tokenizer import Tokenizer

OPTIONS = {"ckpt": None, "input": None, "output": None, "beam": 4, "alpha": 0.6, "max_len_offset": 50,
           "max_tokens": 4096, "n_best": 1, "device": "cpu"}


def encode_sources(tokenizer: Tokenizer, lines: list[str], max_positions: int) -> list[list[int] | None]:
    """Source ids + eos per line; None for a blank line. Over-long lines are cut, with a warning."""
    sources: list[list[int] | None] = []
    for number, ids in enumerate(tokenizer.encode_batch([line.strip() for line in lines]), start=1):
        if not lines[number - 1].strip():
            sources.append(None)
            continue
        if len(ids) + 1 > max_positions:
            warnings.warn(f"input line {number}: {len(ids) + 1} tokens exceed max_positions ({max_positions}); "
                          f"translating its first {max_positions - 1} tokens", stacklevel=2)
            ids = ids[: max_positions - 1]
        sources.append(ids + [tokenizer.eos_id])
    return sources


def token_batches(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Group indices, longest first, so that batch size x longest source <= max_tokens (one sentence at least)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches, current = [], []
    for i in order:
        if current and (len(current) + 1) * lengths[current[0]] > max_tokens:
            batches.append(current)
            current = []
        current.append(i)
    return batches + ([current] if current else [])


@torch.no_grad()
def translate_lines(model: Transformer, tokenizer: Tokenizer, lines: list[str], beam: int = 4, alpha: float = 0.6,
                    max_len_offset: int = 50, max_tokens: int = 4096, n_best: int = 1
                    ) -> list[list[tuple[str, float]]]:
    """Translate ``lines``; for each, its ``n_best`` (translation, score) pairs, best first, in input order.
    Greedy decoding (``beam`` 1) scores 0.0."""
    if beam < 1 or not 1 <= n_best <= beam:
        raise ValueError(f"need beam >= 1 and 1 <= n_best <= beam, got beam={beam}, n_best={n_best}")
    device = model.positions.device
    sources = encode_sources(tokenizer, lines, model.config.max_positions)
    results: list[list[tuple[str, float]]] = [[("", 0.0)] * n_best for _ in lines]
    todo = [i for i, ids in enumerate(sources) if ids is not None]
    for batch in token_batches([len(sources[i]) for i in todo], max_tokens):
        rows = [todo[j] for j in batch]
        longest = max(len(sources[i]) for i in rows)
        src = torch.full((len(rows), longest), model.config.pad_id, dtype=torch.long)
        for r, i in enumerate(rows):
            src[r, : len(sources[i])] = torch.tensor(sources[i])
        src = src.to(device)
        if beam == 1:
            outputs = [[(ids, 0.0)] for ids in greedy_decode(model, src, max_len_offset=max_len_offset,
                                                              bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id)]
        else:
            outputs = [[(h.tokens, h.score) for h in hyps] for hyps in beam_search(
                model, src, beam, alpha, max_len_offset, n_best, tokenizer.bos_id, tokenizer.eos_id)]
        for i, hyps in zip(rows, outputs):
            results[i] = [(tokenizer.decode(ids), score) for ids, score in hyps]
    return results


def parse_options(argv: list[str], defaults: dict) -> dict:
    """key=value command-line options over ``defaults``; an unknown key is an error naming it."""
    given = OmegaConf.to_container(OmegaConf.from_cli(argv))
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise SystemExit(f"unknown option(s) {unknown}; known: {', '.join(defaults)}")
    options = {**defaults, **given}
    if not options.get("ckpt"):
        raise SystemExit("missing ckpt=PATH (a checkpoint written by python -m transformer_nmt.train)")
    return options


def read_lines(path: str | Path | None) -> list[str]:
    """Lines of a UTF-8 file (``.gz`` too) or of stdin, split on "\n" only: universal newlines or
    str.splitlines would also split on a lone "\r" or Unicode separators and change the line count. A final
    line without newline is kept; invalid UTF-8 is an error naming the file and line."""
    name = "<stdin>" if path is None else str(path)
    if path is None:
        raw = sys.stdin.buffer.read()
    elif not Path(path).is_file():
        raise SystemExit(f"file {path} does not exist")
    else:
        raw = gzip.open(path, "rb").read() if name.endswith(".gz") else Path(path).read_bytes()
    lines = raw.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # the newline that ends the last line
    decoded = []
    for number, line in enumerate(lines, start=1):
        try:
            decoded.append(line.decode("utf-8").removesuffix("\r"))
        except UnicodeDecodeError as error:
            raise SystemExit(f"{name}:{number}: not valid UTF-8 ({error.reason} at byte {error.start})") from None
    return decoded


def main(argv: list[str] | None = None) -> None:
    options = parse_options(sys.argv[1:] if argv is None else argv, OPTIONS)
    model, tokenizer, _ = load_checkpoint(options["ckpt"], map_location=options["device"])
    lines = read_lines(options["input"])
    results = translate_lines(model, tokenizer, lines, options["beam"], options["alpha"],
                              options["max_len_offset"], options["max_tokens"], options["n_best"])
    out_path = options["output"]
    with (open(out_path, "w", encoding="utf-8") if out_path else nullcontext(sys.stdout)) as out:
        for number, hyps in enumerate(results, start=1):
            if options["n_best"] == 1:
                out.write(hyps[0][0] + "\n")
            else:
                out.writelines(f"{number}\t{score:.4f}\t{text}\n" for text, score in hyps)


if __name__ == "__main__":
    main()
