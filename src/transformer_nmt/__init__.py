"""An encoder-decoder Transformer for machine translation ("Attention Is All You Need", Vaswani et al. 2017).

The layers, bottom up (a module imports only from its own layer or those below):

    hardware.py, options.py     the machine's CPU flags and cores; key=value options over a dataclass
    durable.py                  files and directories published atomically and durably (mkstemp, fsync, rename)
    records.py                  settings dataclasses rebuilt from what a checkpoint or export records (checked)
    provenance.py               what made a results file (commit, versions, machine, command, config)
    model/                      attention, the Transformer, dropout, decoding, ensembles, sampling (plain torch)
    data/                       corpus, tokenizer, batching, the datamodule
    checkpoint.py               the checkpoint format: atomic writes, reading one into a model and tokenizer
    training/                   Lightning: the module, callbacks, launch, fingerprints, precision, the run
    inference/                  translate, evaluate, average, export, CTranslate2, alignment, ensembles, scoring
                                (no Lightning)
    interchange/                MarianMT (transformers) directories to and from our checkpoints (no Lightning;
                                transformers imported inside its functions)
    analysis/                   attention maps, head importance, the explorer, alignment AER; the studies
                                (Table 3's summary and plan, the Multi30k reproduction)
    conf/                       the Hydra configs (train.yaml, prepare.yaml and their groups)

The commands are the thin modules at the top: ``python -m transformer_nmt.train``, ``.prepare``,
``.translate``, ``.evaluate``, ``.average``, ``.export``, ``.import_marian``, ``.analyze_heads``, ``.explore``.
"""

__version__ = "0.1.0"
