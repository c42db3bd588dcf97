"""trainer.precision=auto: bf16-mixed where the hardware computes in bf16, 32-true elsewhere, with the reason."""

import pytest
import torch

import transformer_nmt.hardware as hardware
import transformer_nmt.training.precision as precision
from transformer_nmt.hardware import CPU_BF16_ENV, cpu_flags
from transformer_nmt.training.precision import resolve_precision


@pytest.fixture(autouse=True)
def no_override(monkeypatch):
    """These tests set the CPU's flags themselves: an override in the environment (CI's guard) must not answer."""
    monkeypatch.delenv(CPU_BF16_ENV, raising=False)


@pytest.fixture
def cuda(monkeypatch):
    """A pretend CUDA device; the test sets whether it supports bf16."""
    def pretend(bf16: bool):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Pretend GPU")
    return pretend


@pytest.mark.parametrize("flags, expected", [
    ({"avx2", "fma"}, "32-true"),
    ({"avx2", "avx512f", "avx512_bf16"}, "bf16-mixed"),
    ({"avx2", "amx_bf16", "amx_tile"}, "bf16-mixed"),
    (set(), "32-true"),
])
def test_auto_on_cpu_follows_native_bf16(monkeypatch, flags, expected):
    monkeypatch.setattr(hardware, "cpu_flags", lambda: flags)
    chosen, why = resolve_precision("auto", "cpu")
    assert chosen == expected
    assert why.startswith("auto: the CPU has") and ("no native bf16" in why) == (expected == "32-true")


@pytest.mark.parametrize("bf16, expected", [(True, "bf16-mixed"), (False, "16-mixed")])
@pytest.mark.parametrize("accelerator", ["gpu", "cuda", "auto"])
def test_auto_on_cuda_follows_the_devices_bf16_support(monkeypatch, cuda, bf16, expected, accelerator):
    cuda(bf16)
    monkeypatch.setattr(hardware, "cpu_flags", lambda: {"avx512_bf16"})  # the CPU does not decide on a GPU run
    chosen, why = resolve_precision("auto", accelerator)
    assert chosen == expected and ("Pretend GPU supports bf16" in why) == bf16


def test_accelerator_auto_without_cuda_asks_the_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(hardware, "cpu_flags", lambda: {"amx_bf16"})
    assert resolve_precision("auto", "auto")[0] == "bf16-mixed"


@pytest.mark.parametrize("explicit", ["32-true", "bf16-mixed", "16-mixed"])
def test_an_explicit_precision_is_kept(monkeypatch, explicit):
    monkeypatch.setattr(hardware, "cpu_flags", lambda: set())
    assert resolve_precision(explicit, "cpu") == (explicit, "set in trainer.precision")


def test_cpu_flags_reads_the_flags_line(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: X\nflags\t\t: fpu sse2 avx2 amx_bf16\n\nprocessor\t: 1\n")
    assert cpu_flags(cpuinfo) == {"fpu", "sse2", "avx2", "amx_bf16"}
    assert cpu_flags(tmp_path / "missing") == set()


@pytest.mark.parametrize("answer, flags, expected", [
    ("native", set(), "bf16-mixed"), ("emulated", {"avx2", "avx512_bf16", "amx_bf16"}, "32-true")])
def test_the_environment_answers_for_the_cpu_whatever_its_flags(monkeypatch, answer, flags, expected):
    monkeypatch.setattr(hardware, "cpu_flags", lambda: flags)
    monkeypatch.setenv(CPU_BF16_ENV, answer)
    chosen, why = resolve_precision("auto", "cpu")
    assert chosen == expected and why.endswith(f"({CPU_BF16_ENV}={answer})" + ("" if answer == "native" else
                                                 ", where bf16 autocast is emulated and slower than fp32"))
    assert resolve_precision("32-true", "cpu")[0] == "32-true"  # an explicit precision is never overridden


def test_an_unknown_answer_names_the_variable_and_its_values(monkeypatch):
    monkeypatch.setenv(CPU_BF16_ENV, "yes")
    with pytest.raises(ValueError, match=f"{CPU_BF16_ENV}='yes': use one of \\('native', 'emulated'\\)"):
        resolve_precision("auto", "cpu")


@pytest.mark.parametrize("major, expected", [(7, "16-mixed"), (8, "bf16-mixed"), (9, "bf16-mixed")])
def test_auto_on_a_pre_ampere_gpu_does_not_train_in_emulated_bf16(monkeypatch, major, expected):
    """torch.cuda.is_bf16_supported() itself runs: on a V100 (compute capability 7.0) it answers True by default,
    because bf16 tensors can be created there (emulated); auto must ask for native support."""
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: type("Props", (), {"major": major})())
    monkeypatch.setattr(torch.cuda, "_check_bf16_tensor_supported", lambda device: True)  # emulation works
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Tesla V100" if major == 7 else "A100")
    assert torch.cuda.is_bf16_supported()  # the default counts emulation: what auto must not rely on
    chosen, why = resolve_precision("auto", "gpu")
    assert chosen == expected
    assert ("no native bf16" in why) == (major == 7)


def recipe(precision: str, accelerator: str = "cpu"):
    """A config whose batch and warm-up follow the precision, as conf/experiment/multi30k_cpu.yaml's do."""
    from omegaconf import OmegaConf
    return OmegaConf.create({
        "trainer": {"precision": precision, "accelerator": accelerator},
        "data": {"max_tokens": "${by_precision:{32-true: 1024, bf16-mixed: 4096}}", "eval_max_tokens": 4096},
        "train": {"warmup_steps": "${by_precision:{32-true: 300, bf16-mixed: 800}}", "lr_factor": 0.5}})


@pytest.mark.parametrize("answer, expected", [("native", (4096, 800)), ("emulated", (1024, 300))])
def test_by_precision_follows_what_auto_picks_on_this_cpu(monkeypatch, answer, expected):
    monkeypatch.setenv(CPU_BF16_ENV, answer)
    cfg = recipe("auto")
    assert (cfg.data.max_tokens, cfg.train.warmup_steps) == expected
    assert precision.precision_dependent(cfg) == {"data.max_tokens": expected[0], "train.warmup_steps": expected[1]}


@pytest.mark.parametrize("explicit, expected", [("32", 1024), ("32-true", 1024), ("bf16-mixed", 4096)])
def test_by_precision_follows_an_explicit_precision(monkeypatch, explicit, expected):
    monkeypatch.setenv(CPU_BF16_ENV, "emulated")  # an explicit precision is kept whatever the CPU
    assert recipe(explicit).data.max_tokens == expected


def test_by_precision_without_a_value_for_the_precision_names_the_key(monkeypatch, cuda):
    from omegaconf.errors import InterpolationResolutionError
    cuda(False)  # a pre-Ampere GPU: auto picks 16-mixed, which the recipe has no value for
    with pytest.raises(InterpolationResolutionError, match=r"no value for 16-mixed(.|\n)*full_key: data.max_tokens"):
        recipe("auto", accelerator="gpu").data.max_tokens


def test_reported_cpu_flags_keep_the_reported_ones_in_their_order(tmp_path, monkeypatch):
    assert hardware.reported_cpu_flags(["avx512f", "amx_bf16", "avx2"]) == ["avx2", "amx_bf16"]
    monkeypatch.setattr(hardware, "cpu_flags", lambda: {"avx512_bf16", "avx2", "sse4_2"})
    assert hardware.reported_cpu_flags() == ["avx2", "avx512_bf16"]  # this CPU's by default
