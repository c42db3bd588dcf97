"""Paired significance for the registered metrics: sacreBLEU's paired bootstrap (Koehn 2004, as sacreBLEU runs it
after Moses and MultEval), for a sacreBLEU metric by sacreBLEU itself and for a metric that is a mean of sentence
values (COMET) by the same procedure on those values.

The procedure, both ways: ``resamples`` draws of the sentence indices with replacement, the same draws for every
system (one generator seeded from SACREBLEU_SEED, default 12345, for each system, as sacreBLEU seeds it); the
statistic is the absolute difference of the corpus values, and p counts the resampled differences, less their mean,
that exceed the observed one: (count + 1) / (resamples + 1). A two-sided test: which way is better does not enter.
"""

from __future__ import annotations

import os

import numpy as np

SEED_ENV, DEFAULT_SEED = "SACREBLEU_SEED", "12345"  # sacreBLEU's variable and default


def seed() -> int | None:
    """The generator's seed as sacreBLEU reads it: SACREBLEU_SEED, "none" for none; 0 counts as none there too."""
    value = os.environ.get(SEED_ENV, DEFAULT_SEED)
    return None if value.lower() == "none" else int(value) or None


def paired_bootstrap_of_means(baseline: list[float], systems: list[list[float]], resamples: int) -> list[float]:
    """The p-value of each system's mean sentence value against the baseline's, sentence i paired with sentence i."""
    base = np.asarray(baseline, dtype=np.float64)
    p_values = []
    for values in systems:
        system = np.asarray(values, dtype=np.float64)
        if system.shape != base.shape:
            raise ValueError(f"paired test: {len(system)} sentence values against the baseline's {len(base)}")
        indices = np.random.default_rng(seed()).choice(len(base), size=(resamples, len(base)), replace=True)
        observed = abs(base.mean() - system.mean())
        differences = np.abs(system[indices].mean(1) - base[indices].mean(1))
        p_values.append((int(np.sum(differences - differences.mean() > observed)) + 1) / (resamples + 1))
    return p_values


def sacrebleu_paired_bootstrap(metric, baseline: list[str], systems: list[list[str]], references: list[str],
                               resamples: int) -> list[float]:
    """sacreBLEU's own PairedTest (test_type "bs") of ``metric`` (a sacrebleu.metrics object): each system's p."""
    from sacrebleu.significance import PairedTest

    named = [("baseline", baseline), *((f"system{i}", hyps) for i, hyps in enumerate(systems))]
    _, scores = PairedTest(named, {"metric": metric}, [references], test_type="bs", n_samples=resamples)()
    (results,) = (column for key, column in scores.items() if key != "System")  # keyed by the score's name: "BLEU"
    return [result.p_value for result in results[1:]]
