"""The data path: raw parallel corpora, the shared SentencePiece vocabulary, token-bucket batches and the
LightningDataModule that ties them together with caches."""
