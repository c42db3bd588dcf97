"""Using a trained model: translate, evaluate, average checkpoints, export to CTranslate2, the CTranslate2
engine and word alignments. Nothing here imports Lightning or the training package."""
