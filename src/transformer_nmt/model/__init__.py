"""The network: hand-written multi-head attention, the encoder-decoder Transformer, dropout, decoding searches
and the model's FLOP count. Plain torch: nothing here knows of Lightning, Hydra or files."""
