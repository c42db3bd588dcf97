"""Toy languages for multilingual tests: English words over the letters a-f; German, French and Czech spell each
English sentence letter for letter in six letters of their own (g-l, m-r, s-x), so an output's language is read off
its letters."""

import random
from pathlib import Path

ALPHABETS = {"en": "abcdef", "de": "ghijkl", "fr": "mnopqr", "cs": "stuvwx"}
PAIRS = ["en-de", "en-fr", "en-cs"]


def write_toy_languages(directory: Path, n_train: int = 400, n_eval: int = 12, sizes: dict | None = None) -> Path:
    """PREFIX.{en,de,fr,cs} for train, val and test, line-aligned; ``sizes`` ({pair: n}): instead, each pair's own
    corpora under directory/PAIR/ (PREFIX.{src,tgt}), its training split n lines; returns ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    for split, count in (("train", n_train), ("val", n_eval), ("test", n_eval)):
        english = [" ".join("".join(rng.choice(ALPHABETS["en"]) for _ in range(rng.randint(2, 3)))
                            for _ in range(rng.randint(2, 5))) for _ in range(count)]
        lines = {lang: [s.translate(str.maketrans(ALPHABETS["en"], letters)) for s in english]
                 for lang, letters in ALPHABETS.items()}
        for pair in (sizes or [None]):
            where = directory / pair if pair else directory
            where.mkdir(exist_ok=True)
            for lang in pair.split("-") if pair else ALPHABETS:
                n = sizes[pair] if pair and split == "train" else count
                (where / f"{split}.{lang}").write_text("".join(line + "\n" for line in lines[lang][:n]))
    return directory
