"""The training app: configs compose and are validated, and `experiment=smoke` runs end to end.

The tiny corpus and the composed configs that the training tests share live in tiny_corpus.py.
"""

import itertools
import json
import math
import os
import subprocess
import sys
import time
from datetime import datetime

import pytest
import sacrebleu
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tiny_corpus import REPO, compose_train, tiny_config, write_tiny_corpus

from transformer_nmt.conf import CONF_DIR
from transformer_nmt.hardware import CPU_BF16_ENV
from transformer_nmt.training.app import ConfigError, batch_seed, train, validate_config
from transformer_nmt.training.config import register_configs
from transformer_nmt.training.precision import precision_dependent

# --- configs ----------------------------------------------------------------------------------


def test_base_and_big_are_the_papers_models():
    base = compose_train("model=base").model
    assert (base.n_encoder_layers, base.n_decoder_layers, base.d_model, base.n_heads, base.d_ff, base.dropout) == (
        6, 6, 512, 8, 2048, 0.1)
    big = compose_train("model=big").model
    assert (big.n_encoder_layers, big.d_model, big.n_heads, big.d_ff, big.dropout) == (6, 1024, 16, 4096, 0.3)
    train = compose_train().train
    assert (train.label_smoothing, list(train.betas), train.eps, train.warmup_steps) == (0.1, [0.9, 0.98], 1e-9, 4000)


@pytest.mark.parametrize("experiment", ["smoke", "multi30k_cpu", "wmt14_base", "ablation_heads"])
@pytest.mark.parametrize("trainer", ["cpu", "gpu", "ddp", "multinode"])
def test_every_experiment_and_trainer_composes_and_validates(experiment, trainer):
    cfg = compose_train(f"experiment={experiment}", f"trainer={trainer}")
    validate_config(cfg)
    assert cfg.name.startswith(experiment)


MULTI30K_CPU = {  # conf/experiment/multi30k_cpu.yaml's settings by the precision auto picks (docs/quality.md)
    "bf16-mixed": {"data.max_tokens": 4096, "train.warmup_steps": 1000, "train.lr_factor": 1.5, "model.dropout": 0.3,
                   "checkpoint.recent.every_n_train_steps": 125, "checkpoint.recent.keep": 10},
    "32-true": {"data.max_tokens": 1024, "train.warmup_steps": 300, "train.lr_factor": 0.5, "model.dropout": 0.1,
                "checkpoint.recent.every_n_train_steps": 250, "checkpoint.recent.keep": 5},
}


def test_the_cpu_recipe_sizes_batch_and_schedule_by_precision(cpu_bf16):
    expected = MULTI30K_CPU[{"native": "bf16-mixed", "emulated": "32-true"}[cpu_bf16]]
    cfg = compose_train("experiment=multi30k_cpu")
    validate_config(cfg)
    assert precision_dependent(cfg) == dict(sorted(expected.items()))
    assert {key: OmegaConf.select(cfg, key) for key in expected} == expected
    assert cfg.model.positions == "rotary"  # at either precision (docs/quality.md, runs E, H and I)
    overridden = compose_train("experiment=multi30k_cpu", "data.max_tokens=2048", "trainer.precision=bf16-mixed")
    assert overridden.data.max_tokens == 2048  # the command line wins over the recipe's choice
    assert overridden.train.warmup_steps == MULTI30K_CPU["bf16-mixed"]["train.warmup_steps"]  # explicit precision


def test_paper_recipe():
    cfg = compose_train("experiment=wmt14_base")
    assert cfg.model.d_model == 512 and cfg.train.lr_factor == 1.0 and cfg.train.warmup_steps == 4000
    assert cfg.data.max_tokens == 25000 and cfg.trainer.max_steps == 100000 and cfg.trainer.precision == "auto"


ABLATIONS = {  # Table 3's rows over ablation_base, each with its seeds: the sweep that -m experiment=NAME runs
    "ablation_base": {"seed": [1, 2, 3, 4, 5]},
    "ablation_heads": {"seed": [1, 2], "model.n_heads": [1, 2, 4, 8, 16]},
    "ablation_dk": {"seed": [1, 2], "model.d_k": [8, 16]},
    "ablation_layers": {"seed": [1, 2], "ablation.n_layers": [1, 3]},
    "ablation_width": {"seed": [1, 2], "model.d_model": [64, 256]},
    "ablation_ff": {"seed": [1, 2], "model.d_ff": [256, 1024]},
    "ablation_dropout": {"seed": [1, 2], "model.dropout": [0.0, 0.2]},
    "ablation_smoothing": {"seed": [1, 2], "train.label_smoothing": [0.0, 0.2]},
    "ablation_positions": {"seed": [1, 2], "model.positions": ["learned"]},
    "ablation_scaling": {"seed": [1], "model.d_model": [128, 256], "ablation.n_layers": [2, 3],
                         "model.d_ff": [512, 1024]},
}


def _value(text: str):
    try:
        return int(text)
    except ValueError:
        return float(text) if text[0].isdigit() else text


@pytest.mark.parametrize("experiment", sorted(ABLATIONS))
def test_ablation_sweeps_are_in_the_experiment_and_every_point_validates(experiment):
    """`-m experiment=NAME` alone runs the grid (hydra.sweeper.params), seeds included; every point is the base
    (ablation_base) but for the swept keys; d_k = d_model / h unless model.d_k is swept."""
    grid = ABLATIONS[experiment]
    register_configs()
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        params = compose("train", overrides=[f"experiment={experiment}"], return_hydra_config=True).hydra.sweeper.params
    assert {key: [_value(v) for v in str(values).split(",")] for key, values in params.items()} == grid
    base = compose_train("experiment=ablation_base")
    for point in itertools.product(*(values for key, values in grid.items() if key != "seed")):
        swept = dict(zip([key for key in grid if key != "seed"], point))
        cfg = compose_train(f"experiment={experiment}", *(f"{k}={v}" for k, v in swept.items()))
        validate_config(cfg)
        assert cfg.name == experiment and cfg.data.seed is None  # the run's seed orders the batches
        assert cfg.model.n_encoder_layers == cfg.model.n_decoder_layers
        assert cfg.train.val_bleu_max_sentences is None and cfg.trainer.precision == "auto"
        assert cfg.trainer.check_val_every_n_epoch == cfg.trainer.max_epochs  # validated once, at the end
        changed = {key for key, value in swept.items() if OmegaConf.select(base, key) != value}
        if "ablation.n_layers" in changed:  # one knob for both stacks
            changed |= {"model.n_encoder_layers", "model.n_decoder_layers"}
        for section in ("model", "train", "trainer", "data"):
            differ = {f"{section}.{k}" for k in cfg[section] if cfg[section][k] != base[section][k]}
            assert differ == {key for key in changed if key.startswith(section + ".")}, (section, differ)


def test_the_run_seed_orders_the_batches_unless_data_seed_is_set():
    assert batch_seed(compose_train("experiment=ablation_base", "seed=7")) == 7
    assert batch_seed(compose_train("experiment=ablation_base", "seed=7", "data.seed=3")) == 3


@pytest.mark.parametrize("override, message", [
    ("model.n_heads=3", r"model.d_model \(64\) must be divisible by model.n_heads \(3\)"),
    ("trainer.precision=fp8", "trainer.precision='fp8' is not supported"),
    ("trainer.precision=16-mixed", "16-mixed needs a GPU"),
    ("+model.vocab_size=100", "set data.vocab_size instead"),
    # +KEY=VALUE adds a key past the schema (Hydra lifts the struct flag for it): validate_config names it
    ("+model.heads=8", r"Key 'heads' not in 'ModelConfig' \(full key: model.heads\)"),
    ("+train.learning_rate=0.1", r"Key 'learning_rate' not in 'TrainConfig' \(full key: train.learning_rate\)"),
    ("+checkpoint.recent.every=3",
     r"Key 'every' not in 'RecentCheckpointConfig' \(full key: checkpoint.recent.every\)"),
    ("+run_tests=false", r"Key 'run_tests' not in 'TrainAppConfig'"),
    ("+trainer.callbacks=[]", r"trainer.callbacks: the run's callbacks are the callbacks group"),  # its old home
    ("train.warmup_steps=0", r"train.warmup_steps=0: the inverse square root schedule peaks at step warmup_steps"),
    ("init_keep=[step]", r"init_keep=\['step'\] needs init_from=CKPT"),
])
def test_bad_configs_fail_with_the_key_named(override, message):
    cfg = compose_train("experiment=smoke", override)
    with pytest.raises(ConfigError, match=message):
        validate_config(cfg)


def test_a_constant_schedule_may_start_without_warm_up():
    """docs/training.md's fine-tune schedule: train.lr from the first step (the module's own rule, checked early)."""
    validate_config(compose_train("experiment=smoke", "train.lr=1e-4", "train.warmup_steps=0",
                                  "train.lr_schedule=constant"))


def test_auto_precision_trains_in_what_the_cpu_answers(tmp_path, cpu_bf16, caplog):
    """Run under both answers on any machine (the cpu_bf16 fixture): native bf16 trains in bf16-mixed, emulated
    in 32-true, and the start-up summary says which and why."""
    expected = {"native": "bf16-mixed", "emulated": "32-true"}[cpu_bf16]
    corpus = write_tiny_corpus(tmp_path / "corpus", n_train=24, n_eval=4)
    cfg = tiny_config(corpus, "trainer.precision=auto", "trainer.max_steps=1", "trainer.limit_val_batches=0")
    cfg.train.warmup_steps = "${by_precision:{32-true: 3, bf16-mixed: 5}}"  # as a recipe sizes it by precision
    with caplog.at_level("INFO", logger="transformer_nmt.training.app"):
        trainer = train(cfg, tmp_path / "run")
    assert trainer.global_step == 1 and trainer.precision == expected
    warmup = {"bf16-mixed": 5, "32-true": 3}[expected]
    assert trainer.lightning_module.optim["warmup_steps"] == warmup
    assert f"recipe      for {expected}: train.warmup_steps {warmup}" in caplog.text
    assert f"precision {expected} (auto: the CPU has {'native' if cpu_bf16 == 'native' else 'no native'} bf16 " \
           f"({CPU_BF16_ENV}={cpu_bf16})" in caplog.text
    kernel = {"native": "plain (auto: plain on CPU in bfloat16", "emulated": "fused (auto: fused (torch's SDPA) on cpu "
                                                                              "in float32"}[cpu_bf16]
    assert f"attention   {kernel}" in caplog.text  # model.attention=auto follows the precision


def test_missing_data_file_is_named(tmp_path):
    cfg = tiny_config(tmp_path, f"data.train={tmp_path}/nowhere/train")
    with pytest.raises(Exception, match="nowhere/train"):
        train(cfg, tmp_path / "run")


# --- the app, end to end ----------------------------------------------------------------------


def test_validate_at_end_scores_the_final_weights_when_max_steps_cuts_the_epoch_short(tmp_path):
    """The tiny corpus makes 10 batches an epoch: 3 steps never reach the epoch's validation; validate_at_end
    adds one, so results.json and the hypotheses are those of the final weights."""
    corpus = write_tiny_corpus(tmp_path / "corpus")
    trainer = train(tiny_config(corpus, "trainer.max_steps=3", "validate_at_end=true", "seed=5"), tmp_path / "run")
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert trainer.global_step == 3 and results["seed"] == 5 and results["val_ppl"] > 1
    record = results["provenance"]  # what made it: provenance.collect, the resolved config among it
    assert {"git", "versions", "cpu_flags", "torch_threads", "load_average", "argv"} <= set(record)
    assert (record["config"]["seed"] == 5 and record["config"]["trainer"]["max_steps"] == 3
            and record["torch_threads"] == 1)
    hypotheses = (tmp_path / "run" / "val_hypotheses.txt").read_text(encoding="utf-8").splitlines()
    references = (tmp_path / "run" / "val_references.txt").read_text(encoding="utf-8").splitlines()
    assert len(hypotheses) == len(references) == 8  # train.val_bleu_max_sentences of tiny_overrides
    assert sacrebleu.corpus_bleu(hypotheses, [references]).score == pytest.approx(results["val_bleu"], abs=1e-3)



def logged_seconds(line: str) -> float:
    """The clock time (seconds since the epoch) of a train.log line, from its ``[YYYY-MM-DD HH:MM:SS,mmm]`` stamp
    (local time, as Hydra's job logging writes it)."""
    return datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def test_smoke_experiment_runs_and_writes_everything_under_the_run_dir(tmp_path):
    """The acceptance command (on the bundled Multi30k): checkpoints, TensorBoard maps, config, log. Two
    settings on top: the CPU answers as one without native bf16 (so that precision=auto's choice is known:
    32-true; test_precision.py covers the answer read from the flags), and every step is a logging step (so that
    the logged per-step rates account for results.json's mean throughput)."""
    run_dir = tmp_path / "run"
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "transformer_nmt.train", "experiment=smoke",
                             f"hydra.run.dir={run_dir}", "trainer.enable_progress_bar=false",
                             "trainer.log_every_n_steps=1"],
                            cwd=REPO, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "OMP_NUM_THREADS": "1", CPU_BF16_ENV: "emulated"})
    seconds = time.perf_counter() - start
    assert result.returncode == 0, result.stderr[-4000:]
    print(f"experiment=smoke took {seconds:.1f} s")

    assert (run_dir / "config.yaml").is_file() and (run_dir / ".hydra" / "config.yaml").is_file()
    log = (run_dir / "train.log").read_text()
    # A quiet start-up (training/lightning_adapter.py quiet_start_up, conf/trainer/cpu.yaml): on the console and in
    # the log, no advertisement, no deprecation raised in Lightning's own code, no model summary of Lightning's
    # (FLOPs 0; a bf16 model sized as fp32), no "`weights_only` was not set" at each last.ckpt
    noise = ("Tip: For seamless cloud", "litlogger", "LeafSpec", "is not supported by the model summary",
             "Total FLOPs", "Total params", "`weights_only` was not set")
    heard = [n for n in noise if n in result.stdout + result.stderr + log]
    assert not heard, heard
    assert "parameters" in log and "padded tokens per side per optimizer step" in log
    # the smoke recipe keeps precision=auto: on a CPU without native bf16 it trains in fp32
    assert f"precision 32-true (auto: the CPU has no native bf16 ({CPU_BF16_ENV}=emulated)" in log
    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert "last.ckpt" in checkpoints and any(name.startswith("step") for name in checkpoints), checkpoints
    last = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["global_step"] == 40

    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"tensors": 0, "scalars": 0})
    events.Reload()
    images = [t for t in events.Tags()["tensors"] if t.startswith("attention/")]  # images as tf.summary.image
    cfg = compose_train("experiment=smoke").model
    assert len(images) == cfg.n_heads * (cfg.n_encoder_layers + 2 * cfg.n_decoder_layers)
    scalars = set(events.Tags()["scalars"])
    for tag in ("train/loss", "train/ppl", "train/lr", "train/grad_norm", "train/tgt_tokens_per_sec",
                "train/tgt_tokens_per_step", "val/loss", "val/ppl", "val/bleu", "test/bleu"):
        assert tag in scalars, tag

    results = json.loads((run_dir / "results.json").read_text())  # the run's summary (Table 3 columns)
    assert "experiment=smoke" in results["overrides"]
    assert (results["n_heads"], results["d_model"], results["d_k"], results["n_layers"], results["d_ff"]) == (
        cfg.n_heads, cfg.d_model, cfg.d_model // cfg.n_heads, cfg.n_encoder_layers, cfg.d_ff)
    assert results["steps"] == 40 and results["parameters"] > 0
    val_ppl = events.Scalars("val/ppl")[-1].value  # the last validation's
    assert math.isclose(results["val_ppl"], val_ppl, rel_tol=1e-3) and results["val_ppl"] > 1
    assert results["val_bleu"] == pytest.approx(events.Scalars("val/bleu")[-1].value, abs=1e-3)
    assert results["test_bleu"] == pytest.approx(events.Scalars("test/bleu")[-1].value, abs=1e-3)

    # Mean throughput: the target tokens of the timed steps over their seconds. Untimed are the fit's first step and
    # the first after each validation (at steps 19 and 39); each timed step's seconds are its logged tokens over its
    # logged rate. (TensorBoard also shows a rate at an untimed step: Lightning repeats the last one.)
    tokens = {e.step: e.value for e in events.Scalars("train/tgt_tokens_per_step")}
    rates = {e.step: e.value for e in events.Scalars("train/tgt_tokens_per_sec")}
    validated = [e.step for e in events.Scalars("val/bleu")]
    assert sorted(tokens) == list(range(40)) and validated == [19, 39]
    timed = sorted(set(tokens) - {0} - {step + 1 for step in validated})
    assert len(timed) == 38
    mean = sum(tokens[s] for s in timed) / sum(tokens[s] / rates[s] for s in timed)
    assert results["train_tgt_tokens_per_sec"] == pytest.approx(mean, rel=1e-5, abs=0.05)  # rounded to 0.1

    # Wall time: train()'s, on the clock of the files and events the run wrote. train() starts after Hydra wrote
    # .hydra/ and before it seeds ("Seed set to", its first log line); it is measured after the test logged its
    # BLEU to TensorBoard and before results.json is written. (Each bound is 0.05 s wide: the rounding to 0.1 s.)
    hydra_done = max(p.stat().st_mtime for p in (run_dir / ".hydra").iterdir())
    seeded = logged_seconds(next(line for line in log.splitlines() if "Seed set to" in line))
    tested = events.Scalars("test/bleu")[-1].wall_time
    written = (run_dir / "results.json").stat().st_mtime
    assert tested - seeded - 0.05 <= results["wall_seconds"] <= written - hydra_done + 0.05
    assert results["seed"] == 1234 and results["precision"] == "32-true"
    assert (results["d_v"], results["positions"], results["label_smoothing"]) == (
        cfg.d_model // cfg.n_heads, "sinusoidal", 0.1)
    # The validation's hypotheses, beside results.json: they score the BLEU the run reported (paired tests need them).
    hypotheses = (run_dir / "val_hypotheses.txt").read_text(encoding="utf-8").splitlines()
    references = (run_dir / "val_references.txt").read_text(encoding="utf-8").splitlines()
    assert len(hypotheses) == len(references) == compose_train("experiment=smoke").train.val_bleu_max_sentences
    assert sacrebleu.corpus_bleu(hypotheses, [references]).score == pytest.approx(results["val_bleu"], abs=1e-3)
