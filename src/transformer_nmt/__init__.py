"""An encoder-decoder Transformer for machine translation ("Attention Is All You Need", Vaswani et al. 2017).

The layers, bottom up: a module imports only from its own layer or those below, and no modules import each other
in a circle, at the top or inside functions (tests/test_imports.py reads every import and holds the package to this
table, with no exception):

    __init__.py, conf/          the version; the Hydra configs (train.yaml, prepare.yaml and their groups)
    hardware.py, options.py     the machine's CPU flags and cores; key=value options over a dataclass
    durable.py, run_files.py    files and directories published atomically and durably (mkstemp, fsync, rename);
                                the names of what a run writes under its run directory
    file_digest.py              the sha256 of a file's bytes, memoized per version of the file (caches' keys)
    records.py                  settings dataclasses rebuilt from what a checkpoint or export records (checked)
    provenance.py               what made a results file (commit, versions, machine, command, config)
    metrics/                    registered metrics: sacreBLEU's, the Multi30k convention, COMET (transformers
                                imported inside its functions)
    model/                      attention, positions, feed-forwards, norms, the Transformer, dropout (plain torch)
    generation/                 decoding settings, greedy and beam search, sampling, ensembles, per-step
                                processors (n-gram blocking), constrained beam, the strategy registry (plain
                                torch; the special ids passed in)
    data/                       corpus, tokenizer, batching, the datamodule
    checkpoint.py               the checkpoint format: atomic writes, reading one into a model and tokenizer
    inference/                  translate, evaluate, average, export, CTranslate2, alignment, attention weights
                                and maps, ensembles, scoring, synthesize (no Lightning)
    interchange/                MarianMT (transformers) directories to and from our checkpoints (no Lightning;
                                transformers imported inside its functions)
    training/                   Lightning: the module, loss, schedules, callbacks, the run dir (name, lock, links),
                                resume, SLURM, fingerprints, precision, the run
    analysis/                   head gates and importance, the explorer, alignment AER; the studies
                                (Table 3's summary and plan, the Multi30k reproduction)
    train.py, prepare.py, translate.py, evaluate.py, average.py, export.py, import_marian.py, analyze_heads.py,
    explore.py, reproduce.py, table3.py, summarize_ablation.py, alignment_aer.py, synthesize.py
                                the commands (``python -m transformer_nmt.NAME``), thin modules over the layers below
"""

__version__ = "0.1.0"
