"""Batches of sentences by token count, for decoding (translate) and for scoring references (scoring): plain
Python over lengths, shared by both so that neither imports the other."""


def token_batches(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Group indices, longest first, so that batch size x longest source <= max_tokens (one sentence at least)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches, current = [], []
    for i in order:
        if current and (len(current) + 1) * lengths[current[0]] > max_tokens:
            batches.append(current)
            current = []
        current.append(i)
    return batches + ([current] if current else [])
