"""benchmarks/benchmark_joeynmt_race.py's parts that need no JoeyNMT: its replay of JoeyNMT's token batch sampler
(exact counts on a worked example; the batch size it picks holds the target tokens, 8 fewer do not) and the JoeyNMT
configuration it writes for the recipe (the recipe's shape and schedule, the SentencePiece model's pieces as the
vocabulary, numbers that read back as numbers), composed for the precision ours trains in on any CPU."""

import random
import sys
from pathlib import Path

import sentencepiece
import yaml
from tiny_corpus import write_tiny_corpus

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
try:
    import benchmark_joeynmt_race as race
finally:
    sys.path.pop(0)


def test_the_replayed_sampler_counts_as_joeynmt_batches():
    # pairs (src, tgt) lengths (3, 2), (1, 2), (4, 5): at batch_size 8 the first two close a batch (max 4 x 2 = 8),
    # the third stays alone (6 x 1 < 8, kept): target tokens (2+1)+(2+1) = 6 and 5+1 = 6
    assert race.joey_mean_target_tokens([0, 1, 2], [3, 1, 4], [2, 2, 5], 8) == 6
    # at 4: (3,2) alone (4 >= 4), (1,2) alone (3 < 4, then (4,5): max 6 x 2 >= 4 closes it with both): 3 and 9
    assert race.joey_mean_target_tokens([0, 1, 2], [3, 1, 4], [2, 2, 5], 4) == 6
    assert race.joey_mean_target_tokens([2, 1, 0], [3, 1, 4], [2, 2, 5], 100) == 12  # one batch of everything


def test_the_chosen_batch_size_holds_the_target_tokens():
    rng = random.Random(3)
    src = [rng.randint(3, 40) for _ in range(3000)]
    tgt = [rng.randint(3, 40) for _ in range(3000)]
    size = race.joey_batch_size(src, tgt, 900.0)
    order = list(range(3000))
    random.Random(0).shuffle(order)
    assert race.joey_mean_target_tokens(order, src, tgt, size) >= 900.0
    assert race.joey_mean_target_tokens(order, src, tgt, size - 9) < 900.0


def test_both_sides_get_the_recipe_of_the_precision_ours_trains_in():
    """The recipe's ${by_precision:} values follow --precision, not this CPU's auto (on a bf16 CPU, auto would give
    the fp32 race the bf16 recipe's 4,096-token batches)."""
    fp32, bf16 = race.race_recipe("32-true"), race.race_recipe("bf16-mixed")
    assert (fp32.data.max_tokens, fp32.model.dropout, fp32.train.warmup_steps) == (1024, 0.1, 300)
    assert (bf16.data.max_tokens, bf16.model.dropout, bf16.train.warmup_steps) == (4096, 0.3, 1000)


def test_the_joeynmt_config_is_the_recipes_shape_and_schedule(tmp_path):
    cfg = race.race_recipe("32-true")
    corpus = write_tiny_corpus(tmp_path / "corpus")
    sentencepiece.SentencePieceTrainer.train(input=str(corpus / "train.en"), model_prefix=str(tmp_path / "spm"),
                                             vocab_size=64, pad_id=0, unk_id=1, bos_id=2, eos_id=3,
                                             minloglevel=2)
    spm = tmp_path / "spm.model"
    config = race.joey_config(cfg, spm, tmp_path / "data", tmp_path, steps=7, threads=2)
    written = yaml.safe_load(race.write_joey_config(config, tmp_path / "joey.yaml", 7).read_text())
    encoder, decoder = written["model"]["encoder"], written["model"]["decoder"]
    assert (encoder["num_layers"], decoder["num_layers"], encoder["num_heads"], encoder["hidden_size"],
            encoder["ff_size"], encoder["dropout"]) == (3, 3, 4, 256, 1024, 0.1)
    assert written["model"]["tied_embeddings"] and written["model"]["tied_softmax"]
    assert (encoder["activation"], encoder["layer_norm"]) == ("relu", "post")  # the recipe's (norm_first false)
    # ours trains with JoeyNMT's dropout placements, which it cannot turn off
    assert race.same_dropouts(cfg) == ["model.attention_dropout=0.1", "model.activation_dropout=0.1"]
    training = written["training"]
    assert training["updates"] == 7 and training["adam_betas"] == [0.9, 0.98] and training["label_smoothing"] == 0.1
    assert training["learning_rate"] == cfg.train.lr_factor * 256 ** -0.5 * cfg.train.warmup_steps ** -0.5
    assert isinstance(training["learning_rate_min"], float)  # not the string "1e-08"
    assert training["validation_freq"] > 7  # no validation inside the timed steps
    pieces = (tmp_path / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert len(pieces) == 64 - 4 and not {"<unk>", "<pad>", "<s>", "</s>"} & set(pieces)  # JoeyNMT adds its 4
