"""Metrics as registered objects: each declares its name, whether higher is better, whether it needs the sources and
its signature (base.py); catalog.py lists the modules that define them and serves evaluate, validation in training,
checkpoint selection and the studies. Built in: sacreBLEU's BLEU (cased, lowercased), chrF, chrF++ and TER
(sacrebleu_metrics.py), the Multi30k literature's BLEU (multi30k.py), and COMET from a local model directory
(comet.py, needs the optional transformers)."""
