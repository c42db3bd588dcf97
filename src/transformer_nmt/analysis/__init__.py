"""Looking inside a trained model: attention maps and their entropies, head importance and pruning, and
the attention explorer page."""
