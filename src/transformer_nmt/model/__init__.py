"""The network: hand-written multi-head attention, positions, feed-forwards, norms, the encoder-decoder
Transformer, dropout and the model's FLOP count. Plain torch: nothing here knows of Lightning, Hydra, files or the
searches that decode with it (generation/)."""
