"""Our models in other toolkits' formats and back: ``marian`` (transformers' MarianMTModel directories)."""
