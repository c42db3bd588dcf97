"""pyproject.toml's warning filters silence Lightning's warnings that the suite's own tiny runs cause on purpose,
each by its message: each message is one Lightning still emits (a filter for a message it no longer says would
hide nothing, and its replacement would show), and a warning of any other message still shows."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import lightning
import pytest


def lightning_source() -> str:
    """Lightning's Python source, adjacent string literals split over lines joined ("a," / " b" -> "a, b")."""
    text = "\n".join(path.read_text(encoding="utf-8") for path in Path(lightning.__file__).parent.rglob("*.py"))
    return re.sub(r'"\s*\n\s*f?"', "", text)


def test_each_filter_names_a_warning_lightning_emits(pytestconfig):
    source = lightning_source()
    filters = pytestconfig.getini("filterwarnings")  # pyproject.toml's
    assert len(filters) == 5
    for line in filters:
        action, message, category = line.split(":")
        assert (action, category) == ("ignore", "UserWarning"), line
        # The message as Lightning's source writes it: an f-string's fields stand where the pattern has ".*".
        assert re.search(message, source), f"Lightning no longer says {message!r}: remove or update the filter"


def test_another_warning_still_shows():
    with pytest.warns(UserWarning, match="a real problem"):
        warnings.warn("a real problem", UserWarning)
    with warnings.catch_warnings(record=True) as caught:
        warnings.warn("Checkpoint directory /x exists and is not empty.", UserWarning)
    assert caught == []  # the filter is in force in the suite's processes
