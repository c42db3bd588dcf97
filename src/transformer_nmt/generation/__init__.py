"""Turning a model's next-token distributions into translations: the decoding settings (``DecodeConfig``), greedy
search and beam search over the attention cache (search.py), sampling (sampling.py), ensembles decoded as one
model (ensemble.py), forced prefixes, and the strategy registry that picks a search from the settings
(strategies.py). Plain torch over model/; the special token ids are passed in, never read from data/."""
