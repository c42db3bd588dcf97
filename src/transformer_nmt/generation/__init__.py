"""Turning a model's next-token distributions into translations: the decoding settings (``DecodeConfig``), greedy
search and beam search over the attention cache (search.py), sampling (sampling.py), ensembles decoded as one
model (ensemble.py), forced prefixes, the per-step processors every search calls (processors.py; n-gram blocking:
ngram_blocking.py), lexically constrained beam search (constrained.py), and the strategy registry that the
``strategy`` setting names (strategies.py). Plain torch over model/; the special token ids are passed in, never
read from data/."""
