"""How a swappable part of the model (a position scheme, an activation, a norm) states its form in each export
format, so that an exporter writes what the part declares, and refuses, naming the option, what declares nothing.

Each registration (``PositionScheme`` in positions.py, ``Activation`` in feed_forward.py, ``Norm`` in norms.py)
has a field per exporter, ``ctranslate2`` (inference/export.py) and ``marian`` (interchange/marian.py): the form
there (a value that exporter reads, listed in the field's comment), ``NoForm(why)`` where the format cannot hold
the part, or None (the default) where the part's author has not said: both refused by ``form_of``, never guessed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

EXPORTERS = {"ctranslate2": "CTranslate2", "marian": "MarianMT"}  # the registrations' field -> the format's name


@dataclass(frozen=True)
class NoForm:
    """The format has no form for this part; ``why`` (the exporter's refusal quotes it after ``model.KEY=NAME:``)."""

    why: str


def form_of(key: str, name: str, registry: dict[str, Any], exporter: str) -> Any:
    """The form in ``exporter``'s format (``ctranslate2`` or ``marian``) that ``registry[name]``, the part chosen by
    ``model.KEY=NAME``, states; a ValueError naming the option where it states ``NoForm`` or nothing."""
    entry = registry.get(name)
    form = getattr(entry, exporter, None)
    if isinstance(form, NoForm):
        raise ValueError(f"model.{key}={name}: {form.why}")
    if form is None:
        where = type(entry).__name__ if entry is not None else "a registration"
        raise ValueError(f"model.{key}={name}: its {where} states no {EXPORTERS[exporter]} form, so it cannot be "
                         f"exported to {EXPORTERS[exporter]} (give its {exporter}= field a form, or NoForm(why); "
                         f"model/export_forms.py)")
    return form
