"""Lexically constrained decoding: every given phrase appears in the output (``translate constraints=FILE``).

The search is Post & Vilar's (2018, "Fast Lexically Constrained Decoding with Dynamic Beam Allocation", NAACL): a
beam of k hypotheses whose slots are shared out by constraint progress. Each step, every live hypothesis proposes
(a) the k best continuations of the whole beam, (b) its own best token and (c) the tokens that advance its
constraints (the next token of the phrase it is inside, else the first token of each phrase it has not produced). A
phrase is whole words: once its last token is out, a token that would continue that word is forbidden
(``word_continuations``), so "Fahrrad" is not met by "Fahrrades". The candidates are put in banks by how many
constraint tokens they have produced (0 to C, the phrases' total length) and the k slots are divided evenly among
the banks (the remainder to the banks furthest on); a bank with too few candidates hands its slots on, furthest
banks first. So a hypothesis that has just paid for a constraint token with a low score is not crowded out by
unconstrained ones, and one that has met every constraint competes on score alone. A hypothesis may end (eos) only
once it has produced every phrase: until then eos has probability 0. At the length limit every hypothesis ends; one
that has not met its constraints is returned only if none has (the length did not allow them).

Why DBA and not Hu et al.'s (2019) vectorised DBA with a trie: Hu et al. make the same allocation run as tensor
operations on a GPU for large batches; here the bookkeeping is a few candidates per sentence per step on the
host, next to a batched model step, which keeps the rule readable and checkable line by line against the paper
for the demonstration model and the test set this project decodes on CPUs. Progress tracking: a phrase counts
as produced once its tokens appear consecutively (also when the model produces it unprompted); a broken phrase
is unwound (its progress lost, as in the paper). Phrases are token ids in the model's SentencePiece vocabulary;
``read_constraints`` reads them from a file (one line per input line, phrases separated by tabs) with errors
naming the file and line.

Only the sentences that have constraints go through this search: ``constrained_beam`` hands the others to the
plain beam, so their outputs are what they are without constraints. Scores and log-probabilities are as the
plain beam's (sums of the processed log-probabilities, divided by the length penalty).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor

from transformer_nmt.generation.processors import Step, active_processors, apply_processors
from transformer_nmt.generation.search import (
    Hypothesis,
    force_tokens,
    length_penalty,
    max_output_lengths,
    next_log_probs,
    prefix_limits,
)


@dataclass(frozen=True)
class Progress:
    """How far one hypothesis is through its sentence's phrases: ``met`` per phrase, and ``active`` (phrase,
    tokens of it produced) while it is inside one."""

    phrases: tuple[tuple[int, ...], ...]
    met: tuple[bool, ...]
    active: tuple[int, int] | None = None
    closing: bool = False  # its last token ended a phrase: the next may not continue that word

    @classmethod
    def start(cls, phrases: list[list[int]]) -> Progress:
        return cls(tuple(tuple(p) for p in phrases), (False,) * len(phrases))

    @property
    def done(self) -> bool:
        return all(self.met)

    @property
    def produced(self) -> int:
        """Constraint tokens produced: the bank of the hypothesis."""
        return sum(len(p) for p, m in zip(self.phrases, self.met) if m) + (self.active[1] if self.active else 0)

    def wanted(self) -> list[int]:
        """The tokens that advance it: the next of the phrase it is inside, else the first of each unmet one."""
        if self.active is not None:
            phrase, pos = self.active
            return [self.phrases[phrase][pos]]
        return sorted({p[0] for p, m in zip(self.phrases, self.met) if not m})

    def advance(self, token: int) -> Progress:
        if self.active is not None:
            phrase, pos = self.active
            if token == self.phrases[phrase][pos]:
                return self._produced(phrase, pos + 1)
            # broken: the phrase's progress is lost; the token may start a phrase of its own
        for phrase, (tokens, met) in enumerate(zip(self.phrases, self.met)):
            if not met and tokens[0] == token:
                return self._produced(phrase, 1)
        return Progress(self.phrases, self.met) if self.active is not None or self.closing else self

    def _produced(self, phrase: int, pos: int) -> Progress:
        if pos < len(self.phrases[phrase]):
            return Progress(self.phrases, self.met, (phrase, pos))
        met = self.met[:phrase] + (True,) + self.met[phrase + 1:]
        return Progress(self.phrases, met, closing=True)


def allocate(banks: dict[int, list], k: int, n_banks: int) -> list:
    """Post & Vilar's allocation: ``banks`` (bank -> its candidates, best first) share ``k`` slots, k // n_banks
    each and the remainder to the banks furthest on; the slots a bank cannot fill go to the others, furthest
    first. Returns the chosen candidates."""
    base, extra = divmod(k, n_banks)
    quota = {b: base + (1 if b >= n_banks - extra else 0) for b in range(n_banks)}
    chosen = {b: cands[: quota.get(b, 0)] for b, cands in banks.items()}
    left = k - sum(len(c) for c in chosen.values())
    for b in sorted(banks, reverse=True):
        if left <= 0:
            break
        more = banks[b][len(chosen[b]): len(chosen[b]) + left]
        chosen[b] = chosen[b] + more
        left -= len(more)
    return [c for b in sorted(chosen, reverse=True) for c in chosen[b]]


@dataclass
class Live:
    """One live hypothesis: its tokens, summed log-probability, constraint progress and row in the model's batch."""

    tokens: list[int]
    score: float
    progress: Progress
    row: int


@torch.no_grad()
def dba_search(model, src: Tensor, constraints: list[list[list[int]]], *, bos_id: int, eos_id: int,
               beam_size: int, alpha: float, max_len_offset: int, n_best: int = 1, penalty: str = "gnmt",
               prefix: Tensor | None = None, processors=(), word_continuations: Tensor | None = None
               ) -> list[list[Hypothesis]]:
    """src (B, S), per sentence its phrases (token id lists, at least one) -> per sentence its ``n_best``
    hypotheses that contain every phrase, best first; where the length limit allowed none, the best of those
    that ran out of length. ``word_continuations`` (V,): the tokens that continue a word (``word_continuations``);
    given, none of them may follow a phrase's last token, so each phrase ends where a word ends."""
    k, device, B = beam_size, src.device, src.shape[0]
    limits = prefix_limits(max_output_lengths(model, src, max_len_offset), prefix, model.config.max_positions).tolist()
    memory = model.encode(src)  # (B, S, d_model)
    cache = model.new_cache()
    beams = {i: [Live([], 0.0, Progress.start(constraints[i]), i)] for i in range(B)}
    finished: dict[int, list[tuple[float, list[int]]]] = {i: [] for i in range(B)}  # (score, tokens), met all
    unmet_at_limit: dict[int, list[tuple[float, list[int]]]] = {i: [] for i in range(B)}  # the length ran out
    results: dict[int, list[Hypothesis]] = {}
    last = torch.full((B, 1), bos_id, dtype=torch.long, device=device)
    sentence_of = torch.arange(B, device=device)  # (rows,) each row's sentence
    for step in range(max(limits)):
        log_probs = model_log_probs = next_log_probs(model, last, memory, src, cache, bos_id)  # (rows, V)
        live = [h for i in sorted(beams) for h in beams[i]]  # in row order
        if processors:
            tokens = torch.tensor([h.tokens for h in live], dtype=torch.long, device=device).view(len(live), step)
            log_probs = apply_processors(processors, log_probs, Step(tokens, sentence_of, step))
        if prefix is not None and step < prefix.shape[1]:
            log_probs = force_tokens(log_probs, prefix[sentence_of, step], model_log_probs)
        unmet = torch.tensor([not h.progress.done for h in live], device=device)
        log_probs[:, eos_id] = log_probs[:, eos_id].masked_fill(unmet, float("-inf"))  # eos once every phrase is in
        if word_continuations is not None:  # a phrase just ended: its word ends with it
            closing = torch.tensor([h.progress.closing for h in live], device=device).unsqueeze(1)  # (rows, 1)
            log_probs = log_probs.masked_fill(closing & word_continuations.to(device), float("-inf"))
        new_beams, origins, next_tokens = {}, [], []
        for i in sorted(beams):
            hyps = beams[i]
            rows = torch.tensor([h.row for h in hyps], device=device)
            totals = torch.tensor([h.score for h in hyps], device=device).unsqueeze(1) + log_probs[rows]  # (w, V)
            vocab = totals.shape[1]
            flat = totals.view(-1).topk(min(k, totals.numel())).indices.tolist()
            pairs = {(f // vocab, f % vocab) for f in flat}
            pairs |= {(j, t) for j, t in enumerate(totals.argmax(dim=1).tolist())}
            pairs |= {(j, t) for j, h in enumerate(hyps) for t in h.progress.wanted()}
            pairs = sorted(pairs)
            values = totals[[j for j, _ in pairs], [t for _, t in pairs]].tolist()
            at_limit = step + 1 >= limits[i]
            banks: dict[int, list] = {}
            for (j, t), value in sorted(zip(pairs, values), key=lambda c: -c[1]):
                if value == float("-inf"):
                    continue
                progress = hyps[j].progress.advance(t) if t != eos_id else hyps[j].progress
                if t == eos_id or at_limit:  # |Y|: the tokens and the eos; at the limit, the tokens
                    tokens = hyps[j].tokens + ([] if t == eos_id else [t])
                    ends = finished if t == eos_id or progress.done else unmet_at_limit  # eos: only once all met
                    ends[i].append((value / length_penalty(step + 1, alpha, penalty), tokens))
                    continue
                banks.setdefault(progress.produced, []).append((value, j, t, progress))
            finished[i] = sorted(finished[i], key=lambda f: -f[0])[:k]
            n_banks = sum(len(p) for p in hyps[0].progress.phrases) + 1  # 0 to C constraint tokens produced
            chosen = allocate(banks, k, n_banks) if banks else []
            reachable = max((value for value, *_ in chosen), default=float("-inf"))
            bound = reachable / length_penalty(limits[i], alpha, penalty)
            if at_limit or not chosen or (len(finished[i]) >= n_best and finished[i][n_best - 1][0] >= bound):
                ends = finished[i] or sorted(unmet_at_limit[i], key=lambda f: -f[0])  # the length allowed none
                results[i] = [Hypothesis(tokens, score, score * length_penalty(
                    len(tokens) if len(tokens) >= limits[i] else len(tokens) + 1, alpha, penalty))
                    for score, tokens in ends[:n_best]]
                continue
            new_beams[i] = []
            for value, j, t, progress in chosen:
                new_beams[i].append(Live(hyps[j].tokens + [t], value, progress, len(origins)))
                origins.append(hyps[j].row)
                next_tokens.append(t)
        if not new_beams:
            break
        beams = new_beams
        index = torch.tensor(origins, dtype=torch.long, device=device)  # (rows',) each new row's origin
        memory, src, sentence_of = memory[index], src[index], sentence_of[index]
        cache.reorder(index)
        last = torch.tensor(next_tokens, dtype=torch.long, device=device).unsqueeze(1)  # (rows', 1)
    return [results.get(i, []) for i in range(B)]


def constrained_beam(model, batch, decode, plain) -> list[list[Hypothesis]]:
    """The beam strategy with ``batch.constraints``: sentences without phrases through ``plain`` (the beam
    strategy, unchanged), the others through ``dba_search``; results in the batch's order."""
    constraints = batch.constraints
    have = [i for i, c in enumerate(constraints) if c]
    others = [i for i, c in enumerate(constraints) if not c]
    results: list[list[Hypothesis]] = [[] for _ in constraints]

    def rows_of(index: list[int]):
        pick = torch.tensor(index, dtype=torch.long, device=batch.src.device)
        return replace(batch, src=batch.src[pick], line_ids=[batch.line_ids[i] for i in index],
                       prefix=None if batch.prefix is None else batch.prefix[pick], constraints=None)

    if others:
        for i, hyps in zip(others, plain(model, rows_of(others), decode)):
            results[i] = hyps
    sub = rows_of(have)
    found = dba_search(model, sub.src, [constraints[i] for i in have], bos_id=batch.bos_id, eos_id=batch.eos_id,
                       beam_size=decode.beam, alpha=decode.alpha, max_len_offset=decode.max_len_offset,
                       n_best=decode.n_best, penalty=decode.length_penalty, prefix=sub.prefix,
                       processors=active_processors(decode), word_continuations=batch.word_continuations)
    for i, hyps in zip(have, found):
        results[i] = hyps
    return results


def word_continuations(tokenizer) -> Tensor:
    """(V,) bool: the pieces that continue the word before them (SentencePiece: no word-boundary mark, and a letter,
    a digit or a hyphen first: a hyphen makes a compound, one word), which may not follow a phrase's last token;
    other punctuation and new words may."""
    return torch.tensor([piece[:1].isalnum() or piece[:1] in WORD_JOINERS
                         for piece in map(tokenizer.id_to_piece, range(tokenizer.vocab_size))])


WORD_JOINERS = "-\u2010\u2011"  # hyphen-minus, hyphen, non-breaking hyphen


def read_constraints(path: str, lines: list[str], tokenizer, n_lines: int, max_tokens: int) -> list[list[list[int]]]:
    """Per input line its phrases as target token ids, from the constraint file's ``lines`` (already read from
    ``path``): one line per input line, phrases separated by tabs, a blank line: none. A ValueError naming the
    file and line for a count that differs from the input's, an empty phrase (two tabs in a row, a tab at an
    end, a phrase of spaces) and phrases longer in all than ``max_tokens`` tokens (what the output may hold)."""
    if len(lines) != n_lines:
        raise ValueError(f"constraints={path} has {len(lines)} lines but the input {n_lines}: give one per input "
                         f"line (a blank line: no constraint)")
    result = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            result.append([])
            continue
        phrases = line.split("\t")
        for p, phrase in enumerate(phrases, start=1):
            if not phrase.strip():
                raise ValueError(f"{path}:{number}: phrase {p} is empty (phrases are separated by one tab, with "
                                 f"none at the ends)")
        ids = [tokenizer.encode(phrase.strip(), target=True) for phrase in phrases]
        for p, phrase_ids in enumerate(ids, start=1):
            if not phrase_ids:
                raise ValueError(f"{path}:{number}: phrase {p} ({phrases[p - 1]!r}) has no token in the vocabulary")
        total = sum(len(p) for p in ids)
        if total > max_tokens:
            raise ValueError(f"{path}:{number}: the phrases take {total} tokens, more than the {max_tokens} the "
                             f"output may hold (max_positions - 1)")
        result.append(ids)
    return result
