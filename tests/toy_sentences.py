"""Random sentences over a toy vocabulary of English and German words: a corpus to train a small SentencePiece model
on in a second."""

WORDS = "the a dog cat runs sleeps on under green red big small house tree der die das Hund Katze läuft schläft".split()


def sentences(n=600, seed=0):
    import random

    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(n)]
