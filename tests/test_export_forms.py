"""Exports by registration: a position scheme, activation or norm that states no form for an export format is
refused by that exporter, naming the option, before anything is written; one that states a form is written as it
says (the exactness of the built-in ones: tests/test_ctranslate2.py, tests/test_marian.py)."""

import pytest
import torch
import torch.nn.functional as F
from tiny_checkpoint import tiny_tokenizer
from torch import nn

from transformer_nmt.interchange.marian import ConversionError, check_exportable
from transformer_nmt.model.export_forms import NoForm, form_of
from transformer_nmt.model.feed_forward import ACTIVATIONS, Activation
from transformer_nmt.model.norms import NORMS, Norm
from transformer_nmt.model.positions import POSITION_SCHEMES, PositionScheme
from transformer_nmt.model.transformer import Transformer, TransformerConfig

ctranslate2 = pytest.importorskip("ctranslate2")
from transformer_nmt.inference.export import export_model, transformer_spec  # noqa: E402


class ShiftedPositions(nn.Module):
    """A new absolute scheme, as a contributor might add one: a learned vector per position, held under a name
    (``offsets``) that is neither ``table`` nor ``weight``. (B, L, d_model) -> (B, L, d_model)."""

    def __init__(self, max_positions: int, d_model: int):
        super().__init__()
        self.offsets = nn.Parameter(torch.randn(max_positions, d_model) * 0.02)

    def forward(self, x, offset: int = 0):
        return x + self.offsets[offset:offset + x.shape[1]]


def tiny_model(tokenizer, **change) -> Transformer:
    return Transformer(TransformerConfig(vocab_size=tokenizer.vocab_size, d_model=32, n_heads=4, d_ff=32,
                                         n_encoder_layers=1, n_decoder_layers=1, max_positions=64, **change)).eval()


@pytest.fixture
def shifted(monkeypatch):
    """model.positions=shifted registered for the test alone, stating no export form."""
    monkeypatch.setitem(POSITION_SCHEMES, "shifted", PositionScheme(ShiftedPositions))


def test_a_new_position_module_without_forms_is_refused_by_both_exporters_naming_the_option(shifted, tmp_path):
    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer, positions="shifted")
    assert isinstance(model.positions, ShiftedPositions)  # the registration built it ...
    ids = torch.tensor([[5, 6, 7]])
    assert model.encode(ids).shape == (1, 3, 32)  # ... and the model runs with it
    with pytest.raises(ValueError, match=r"model\.positions=shifted: its PositionScheme states no CTranslate2 form"):
        transformer_spec(model, tokenizer)
    with pytest.raises(ValueError, match=r"model\.positions=shifted"):
        export_model(model, tokenizer, tmp_path / "ct2")
    assert not (tmp_path / "ct2").exists() and list(tmp_path.iterdir()) == []  # nothing written
    with pytest.raises(ConversionError, match=r"model\.positions=shifted: its PositionScheme states no MarianMT form"):
        check_exportable(model.config, tokenizer)


def test_a_scheme_that_claims_a_table_it_does_not_have_is_refused(monkeypatch):
    monkeypatch.setitem(POSITION_SCHEMES, "shifted", PositionScheme(ShiftedPositions, ctranslate2="table"))
    tokenizer = tiny_tokenizer()
    with pytest.raises(ValueError, match=r"model\.positions=shifted: its CTranslate2 form is a table, but its "
                                         r"module \(ShiftedPositions\) has no table"):
        transformer_spec(tiny_model(tokenizer, positions="shifted"), tokenizer)


def test_a_stated_table_is_what_the_export_writes(monkeypatch):
    """The same module with a ``table`` and ctranslate2="table" exports, its own vector per position."""
    class TablePositions(ShiftedPositions):
        @property
        def table(self):
            return self.offsets

    monkeypatch.setitem(POSITION_SCHEMES, "shifted", PositionScheme(TablePositions, ctranslate2="table"))
    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer, positions="shifted")
    spec = transformer_spec(model, tokenizer)
    for stack in (spec.encoder, spec.decoder):
        assert torch.equal(torch.from_numpy(stack.position_encodings.encodings), model.positions.offsets.detach())


def test_an_unknown_activation_is_refused_by_both_exporters_naming_the_option(monkeypatch):
    """An activation registered without forms (where export.py used to raise a bare KeyError)."""
    monkeypatch.setitem(ACTIVATIONS, "softplus", Activation(F.softplus))
    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer, activation="softplus")
    assert model(torch.tensor([[5, 6]]), torch.tensor([[2, 5]])).shape == (1, 2, tokenizer.vocab_size)
    with pytest.raises(ValueError, match=r"model\.activation=softplus: its Activation states no CTranslate2 form"):
        transformer_spec(model, tokenizer)
    with pytest.raises(ConversionError, match=r"model\.activation=softplus: its Activation states no MarianMT form"):
        check_exportable(model.config, tokenizer)


def test_a_norm_without_forms_and_a_stated_no_form_are_refused(monkeypatch):
    monkeypatch.setitem(NORMS, "layernorm_noaffine", Norm(lambda d, eps: nn.LayerNorm(d, eps, False), 1e-5))
    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer, norm="layernorm_noaffine")
    with pytest.raises(ValueError, match=r"model\.norm=layernorm_noaffine: its Norm states no CTranslate2 form"):
        transformer_spec(model, tokenizer)
    with pytest.raises(ValueError, match=r"^model\.positions=none: CTranslate2's Transformer always adds positions"):
        form_of("positions", "none", POSITION_SCHEMES, "ctranslate2")  # a NoForm's reason, quoted


def test_every_built_in_part_states_both_forms():
    """None of the shipped registrations leaves a format unstated: each is a form or a reason."""
    for registry in (POSITION_SCHEMES, ACTIVATIONS, NORMS):
        for name, entry in registry.items():
            for exporter in ("ctranslate2", "marian"):
                assert getattr(entry, exporter) is not None, (name, exporter)
                assert isinstance(getattr(entry, exporter), (str, NoForm)), (name, exporter)
