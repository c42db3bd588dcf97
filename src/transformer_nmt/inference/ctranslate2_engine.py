"""Run a CTranslate2 export (``transformer_nmt.export``) with the decoding rules of ``generation/search.py``.

``CTranslate2Model.translate_ids`` takes the source ids ``translate`` prepares and returns what the native
searches return, so ``translate_lines`` keeps every guarantee (line accounting, empty and over-long lines,
``n_best``) whatever the engine. CTranslate2's beam search expands and finishes hypotheses as ours does
(2k candidates a step; an eos among the k best finishes a hypothesis, the k best others stay alive), and it
stops a sentence with k finished: ours with ``stop="k_finished"``, not our default ``stop="bound"``, which
searches on while a live beam can still win (that is not bridged: CTranslate2 has no such rule). Three
other things differ, and are bridged here:
- the length limit is per call, ours per sentence (source length + ``max_len_offset``). Greedy: one call with
  the largest limit translates every sentence, and each output is cut at its sentence's own limit: the first
  ``limit`` tokens are what a search stopped at ``limit`` gives (a token does not depend on the limit), so this
  is exact, and faster than a call per limit (many small batches). Beam: the limit changes the search
  (every live candidate finishes on the last step), so sentences are translated in groups of equal limit, one
  call per group, all posted at once (``asynchronous``): with ``inter_threads`` > 1 the groups run in parallel.
- CTranslate2 normalises by length ** alpha (our ``length_penalty=power``), ours by default by GNMT's
  ((5 + length) / 6) ** alpha. Both apply the penalty only to finished hypotheses, so the search is the same: we
  ask for all k finished ones with the eos kept (the length ours counts), undo CTranslate2's penalty and rank
  them by ours. (When the step that
  completes k finishes several, ours keeps them in rank order, CTranslate2 by its score: rarely, the sets
  differ.)
- it refuses eos on the first step unless min_decoding_length is 0; an empty translation is allowed here.

What it cannot honour it refuses, naming the option (``check_request``): sampling, lexical constraints
(``constraints=``) and every decoding processor of generation/processors.py (``no_repeat_ngram=``; CTranslate2
has a ``no_repeat_ngram_size`` of its own, but its equality with ours is not checked here, so it is not passed).

Each beam hypothesis also carries its log-probability (the sum CTranslate2 normalised, restored), as the native
searches' do (greedy: 0.0, as its score: asking CTranslate2 for greedy scores would cost a log-softmax a step); a
``prefix`` per source goes to CTranslate2's ``target_prefix`` (greedy output limits then count the prefix, as ours
do), and ``score_ids`` scores given translations with ``score_batch``.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

import torch
from torch.nn.utils.rnn import pad_sequence

from transformer_nmt.data.tokenizer import Tokenizer
from transformer_nmt.generation.config import DecodeConfig, decode_settings
from transformer_nmt.generation.processors import active_options
from transformer_nmt.generation.search import Hypothesis, length_penalty, max_output_lengths
from transformer_nmt.generation.strategies import strategy_name
from transformer_nmt.hardware import available_cpus
from transformer_nmt.inference.export import EXPORT_INFO, SENTENCEPIECE_MODEL, check_export, import_ctranslate2
from transformer_nmt.model.transformer import TransformerConfig
from transformer_nmt.records import RecordError, from_record


class CTranslate2Model:
    """A CTranslate2 model directory written by ``transformer_nmt.export``, loaded for translation.

    ``compute_type``: CTranslate2's (``default`` = as exported; ``int8``, ``int8_float32``, ``float32``, ...
    quantize at load time). ``threads``: intra-op threads; ``inter_threads``: batches translated at once, each
    on ``threads`` threads (a call is cut into batches of ``max_tokens`` source tokens; beam search posts a call
    per length limit). 0 for both (the default): one thread per batch and as many batches at once as this
    process may use cores, which measured faster than ``threads`` = cores for both searches (docs/benchmarks.md,
    "Decoding speed and CTranslate2"; measured on 2 cores only). ``threads`` N alone: N
    threads, 1 batch; ``inter_threads`` M alone: M batches sharing the cores (cores // M threads each)."""

    def __init__(self, model_dir: str | os.PathLike, device: str = DecodeConfig.device,
                 compute_type: str = DecodeConfig.compute_type, threads: int = DecodeConfig.threads,
                 inter_threads: int = DecodeConfig.inter_threads):
        ctranslate2 = import_ctranslate2()
        model_dir = Path(model_dir)
        if not (model_dir / EXPORT_INFO).is_file() or not ctranslate2.contains_model(str(model_dir)):
            raise SystemExit(f"model_dir={model_dir} is not a model directory written by python -m "
                             f"transformer_nmt.export (no model.bin or {EXPORT_INFO})")
        problem = check_export(model_dir)
        if problem is not None:
            raise SystemExit(f"model_dir={model_dir} is not a complete export ({problem}): a writer or a copy was cut "
                             f"short; export the checkpoint again (python -m transformer_nmt.export)")
        self.info_path = model_dir / EXPORT_INFO
        self.info = json.loads(self.info_path.read_text(encoding="utf-8"))
        try:  # read as settings, never instantiated (records.from_record)
            self.config = from_record(TransformerConfig, self.info.get("model_config"),
                                      f"export {model_dir / EXPORT_INFO}", "model_config", self.info.get("version"))
        except RecordError as error:
            raise SystemExit(str(error)) from None
        try:
            self.tokenizer = Tokenizer.load(model_dir / SENTENCEPIECE_MODEL)
        except (OSError, RuntimeError, ValueError) as error:
            raise SystemExit(f"model_dir={model_dir}: {SENTENCEPIECE_MODEL} is not a usable SentencePiece model "
                             f"({str(error).strip().splitlines()[0][:200]})") from None
        self.pieces = [self.tokenizer.id_to_piece(i) for i in range(self.tokenizer.vocab_size)]
        self.ids = {piece: i for i, piece in enumerate(self.pieces)}
        for name, value in (("threads", threads), ("inter_threads", inter_threads)):
            if not isinstance(value, int) or value < 0:
                raise SystemExit(f"{name}={value!r}: give a whole number >= 0 (0: the default layout)")
        if not inter_threads:
            inter_threads = 1 if threads else available_cpus()
        threads = threads or max(1, available_cpus() // inter_threads)  # inter_threads alone: the cores shared
        self.threads, self.inter_threads = threads, inter_threads
        try:
            self.translator = ctranslate2.Translator(str(model_dir), device=device, compute_type=compute_type,
                                                     intra_threads=threads, inter_threads=inter_threads)
        except ValueError as error:  # e.g. a compute type this CPU does not support
            raise SystemExit(f"compute_type={compute_type!r} on {device}: {error}") from None

    searches_itself = True  # translate hands it whole inputs, not batches for generation/strategies

    def check_request(self, decode: DecodeConfig, has_constraints: bool = False) -> None:
        """A ValueError naming each option this engine cannot honour: sampling, constraints, processors."""
        refused = active_options(decode)
        if decode.sampling or decode.strategy == "sample":
            refused.insert(0, "sampling=true" if decode.sampling else "strategy=sample")
        if has_constraints:
            refused.append("constraints=")
        if refused:
            raise ValueError(f"{' '.join(refused)} needs engine=native (engine=ctranslate2 cannot honour it)")

    def translate_ids(self, sources: list[list[int]], decode: DecodeConfig | None = None, **changes
                      ) -> list[list[tuple[list[int], float]]]:
        """Source ids (each ending in eos) -> per source its ``n_best`` (token ids, score), best first;
        as ``greedy_decode`` (score 0.0) when ``beam`` is 1, else as ``beam_search``. The search: ``decode``
        with ``changes`` (``decode_settings``)."""
        return [[(h.tokens, h.score) for h in hyps] for hyps in self.translate_hypotheses(sources, decode, **changes)]

    def translate_hypotheses(self, sources: list[list[int]], decode: DecodeConfig | None = None,
                             prefixes: list[list[int]] | None = None, **changes) -> list[list[Hypothesis]]:
        """As ``translate_ids``, each hypothesis a ``Hypothesis`` with its log-probability; ``prefixes``: per
        source the target ids its output starts with."""
        decode = decode_settings(decode, **changes)
        if strategy_name(decode) == "greedy":  # strategy=greedy at the default beam: CTranslate2's beam 1
            decode = decode_settings(decode, beam=1)
        beam, alpha, max_len_offset, max_tokens, n_best = (decode.beam, decode.alpha, decode.max_len_offset,
                                                           decode.max_tokens, decode.n_best)
        if not sources:
            return []
        padded = pad_sequence([torch.tensor(ids) for ids in sources], batch_first=True,
                              padding_value=self.config.pad_id)  # (N, S)
        limits = max_output_lengths(self, padded, max_len_offset).tolist()  # the native rule, per sentence
        if prefixes is not None:  # raised to the prefix's length, as decoding.prefix_limits does
            limits = [min(max(limit, len(p)), self.config.max_positions - 1) for limit, p in zip(limits, prefixes)]
        if beam == 1:  # greedy: the first `limit` tokens are the output of a search stopped at `limit`
            outputs = self._translate(sources, range(len(sources)), max(limits), beam, alpha, max_tokens, prefixes)
            return [[Hypothesis(h.tokens[:limit], 0.0)
                     for h in self._hypotheses(output, beam, alpha, n_best, decode.length_penalty)]
                    for output, limit in zip(outputs, limits)]
        groups: dict[int, list[int]] = defaultdict(list)
        for i, limit in enumerate(limits):
            groups[limit].append(i)
        pending = [(rows, self._translate(sources, rows, limit, beam, alpha, max_tokens, prefixes))
                   for limit, rows in groups.items()]  # all posted before any is awaited
        results: list[list[Hypothesis]] = [[] for _ in sources]
        for rows, outputs in pending:
            for i, output in zip(rows, outputs):
                results[i] = self._hypotheses(output.result(), beam, alpha, n_best, decode.length_penalty)
        return results

    def _translate(self, sources: list[list[int]], rows, limit: int, beam: int, alpha: float, max_tokens: int,
                   prefixes: list[list[int]] | None = None):
        """``translate_batch`` for ``sources[i]``, i in ``rows``, at most ``limit`` tokens out, all ``beam``
        hypotheses with the eos kept; greedy: the outputs, beam: (posted, not waited for) async results."""
        prefix = {} if prefixes is None else {"target_prefix": [[self.pieces[t] for t in prefixes[i]] or None
                                                                for i in rows]}
        return self.translator.translate_batch(
            [[self.pieces[t] for t in sources[i][:-1]] for i in rows],  # the model appends eos itself
            max_batch_size=max_tokens, batch_type="tokens", beam_size=beam,
            num_hypotheses=beam, length_penalty=alpha, return_end_token=True,
            return_scores=beam > 1,  # greedy scores 0.0: no log-softmax per step
            max_decoding_length=limit, min_decoding_length=0, max_input_length=0, asynchronous=beam > 1, **prefix)

    def _hypotheses(self, output, beam: int, alpha: float, n_best: int, penalty: str = "gnmt") -> list[Hypothesis]:
        eos = self.pieces[self.tokenizer.eos_id]
        hypotheses = []
        for tokens, score in zip(output.hypotheses, output.scores or [0.0] * len(output.hypotheses)):
            length = len(tokens)  # generated tokens, eos included, as our length penalty counts them
            ids = [self.ids[t] for t in (tokens[:-1] if tokens and tokens[-1] == eos else tokens)]
            total = score * length ** alpha  # CTranslate2 divided the summed log-probability by length ** alpha
            hypotheses.append(Hypothesis(ids, 0.0, 0.0) if beam == 1 else
                              Hypothesis(ids, total / length_penalty(length, alpha, penalty), total))
        return sorted(hypotheses, key=lambda h: h.score, reverse=True)[:n_best]

    def score_ids(self, sources: list[list[int]], targets: list[list[int]], max_tokens: int) -> list[list[float]]:
        """Per pair (source ids + eos, target ids + eos) the log-probability of each target token and the eos."""
        results = self.translator.score_batch(
            [[self.pieces[t] for t in s[:-1]] for s in sources], [[self.pieces[t] for t in t_[:-1]] for t_ in targets],
            max_batch_size=max_tokens, batch_type="tokens")
        return [list(r.log_probs) for r in results]
