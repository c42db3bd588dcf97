"""What defines a run, so that ``ckpt_path=auto`` resumes only the run this command started, and what shapes its
results, so that a sweep run again skips only the runs that are this command's.

The run fingerprint (``run_fingerprint``) is the whole resolved config, flattened to dotted keys (``model.dropout``,
``train.lr_factor``, ``trainer.limit_train_batches``, ``callbacks.NAME._target_``), minus what does not change
what trains: ``NOT_TRAINING``, the options whose declared role (options.Role, in their schemas' field metadata)
is not ``TRAINING`` (training/roles.py derives every list below from the roles: none is kept here), and the
callbacks of conf/callbacks/default.yaml while they are those. A new option must declare its role (its class
fails to import otherwise); a trainer setting or an added callback (a gradient accumulation scheduler, say)
counts without being listed. Some values are resolved:
``trainer.precision`` as the run trains in it (``auto`` resolved on this machine: a requeue onto a GPU without bf16
would switch to fp16); ``tokens_per_step``, the product ``data.max_tokens`` x ``trainer.accumulate_grad_batches``
x ``world_size`` (processes: devices x nodes), compared instead of its factors (``FACTORS``, recorded beside it for
the messages): a 16-GPU run requeued on 8 GPUs resumes with accumulation doubled, not with half its batch; the
training files by the sha256 of their contents (``data.train_sha256``: new pairs under the same path are another
run); ``init_from`` by its checkpoint's sha256 (``init_from.sha256``), with ``model.*`` the architecture that
checkpoint holds (the command sets only ``INIT_RUN_SETTINGS``). Left out, among ``NOT_TRAINING``: the length of
the run and how often it validates and logs, checkpointing, attention maps, the search, names and directories, and
``MAY_CHANGE``: how many processes load the data, where caches live, the validation and test sets, how evaluation
batches and how many sentences it decodes for BLEU, and how the same arithmetic is computed (the attention kernel,
fused Adam). A fingerprint written before this derivation (no ``fingerprint_format``) is compared on the keys it
holds.

Every checkpoint carries the fingerprint of the run that wrote it (``callbacks.RecordFingerprint``). Resuming the run
dir's own checkpoint (``ckpt_path=auto`` or ``last``) with another fingerprint is refused (``check_resume``):
inside one SLURM allocation, or after a relaunch with another learning rate, the directory holds another run,
and continuing its weights and schedule under new settings trains neither run. ``force_resume=true`` resumes
anyway; an explicit ``ckpt_path=FILE`` (fine-tuning from another run) is never checked.

A finished run's results depend on more: the results fingerprint (``results_fingerprint``, kept in its
results.json) adds the trainer settings but those of ``TRAINER_NOT_RESULTS`` (the steps, epochs and time limit,
validation intervals and batch limits: any key of the free ``trainer`` group counts unless listed there), the
evaluation settings of ``MAY_CHANGE``, and ``RESULT_KEYS`` (``run_test``, ``validate_at_end``, the monitored metric
and early stopping's patience). A sweep run again compares it
(``check_finished_run``): the same, the run is skipped; only ``EXTENDS`` changed and each to a longer run (more
steps, epochs or time), the run resumes from its last checkpoint; anything else is refused, naming each key.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import re
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from omegaconf import DictConfig, OmegaConf

from transformer_nmt.checkpoint import CKPT_FINGERPRINT, CKPT_MODEL_CONFIG, CKPT_OVERRIDES, read_checkpoint
from transformer_nmt.data.config import DataConfig
from transformer_nmt.data.corpus import CorpusError, file_fingerprint, split_inputs
from transformer_nmt.file_digest import content_digest
from transformer_nmt.options import Role
from transformer_nmt.training import roles
from transformer_nmt.training.precision import resolve_precision, uses_cuda

log = logging.getLogger(__name__)

RESULTS_FINGERPRINT = "fingerprint"  # results.json's key: the results fingerprint of the finished run
GROUPS = ("model", "data", "train")  # what a fingerprint of format 1 held (with seed): a fact of that format
PRECISION = "trainer.precision"  # as resolved: trainer.precision=auto is bf16-mixed on one machine, 32-true on another
PRODUCT = "tokens_per_step"  # data.max_tokens x trainer.accumulate_grad_batches x world_size
FACTORS = ("data.max_tokens", "trainer.accumulate_grad_batches", "world_size")
ADDED = (PRODUCT, "world_size", PRECISION)  # keys of 2026-12 (issue 28): a fingerprint written before lacks them
# The classification, derived from the roles the options declare in their schemas (training/roles.py): no option
# is listed here. EVALUATION: the evaluation-only options of the groups that define training; MAY_CHANGE: those and
# the options that compute the same training otherwise (kernels, processes, caches); RETIRED: keys older configs
# held that define nothing (data._target_, the datamodule's class until 2026-12), ignored on both sides.
EVALUATION, MAY_CHANGE, RETIRED = roles.evaluation(), roles.may_change(), roles.retired()
# The trainer settings that leave a finished run's results alone (run management), or that the run fingerprint
# already holds in resolved form (precision; accumulation in tokens_per_step). Every other trainer key counts.
TRAINER_NOT_RESULTS = roles.trainer_keys(Role.RUN, Role.MAY_CHANGE) + tuple(
    key.removeprefix("trainer.") for key in (PRECISION, FACTORS[1]))
RESULT_KEYS = roles.result_keys()  # the evaluation-only options outside those groups: run_test, checkpoint.monitor...
EXTENDS = roles.extends()  # Role.LENGTH: a larger value trains longer
FORMAT, FINGERPRINT_FORMAT = "fingerprint_format", 2  # 2 (2026-12-03): the whole config minus NOT_TRAINING
TRAIN_DIGEST = "data.train_sha256"  # the training files' contents (_split_digest)
# The validation and test files' contents, in the results fingerprint (not the run's: a resume may not change them
# silently either way, but a finished run scored on other val or test files has other results); results files
# written before 2026-12-04 lack them and are compared without them.
EVAL_DIGESTS = {"data.val_sha256": "val", "data.test_sha256": "test"}
INIT_DIGEST = "init_from.sha256"  # init_from's checkpoint (its bytes), in place of its path
# The settings that a fine-tune (init_from) takes from the command rather than from its checkpoint (app.build_module):
# the model fields declared run_setting
INIT_RUN_SETTINGS = roles.run_settings()
# What a resumed run may change without training something else: the keys (and the groups below them) left out of
# the run fingerprint, each declared with a role other than Role.TRAINING. Every other key of the resolved config
# counts, a new option (which must declare its role), a Trainer argument or an added callback included.
NOT_TRAINING = roles.not_training()
# The callbacks of conf/callbacks/default.yaml, read from it: they observe, save, log or stop (their settings are
# checkpoint.* and attention_maps.* options). One of these names with another class, or any other entry, counts.
DEFAULT_CALLBACKS = roles.default_callbacks()
# Where a default callback's class lived before (a config.yaml written then names it there): the same callback.
FORMER_TARGETS = {"transformer_nmt.training.launch.SlurmRequeue": "transformer_nmt.training.slurm.SlurmRequeue"}


# What a fingerprint written before an option existed means by its absence: the option's default, read from the
# schemas (a new option defaults to what every run did before it, so a run that lacks one ran with it, and adding a
# field to TransformerConfig, TrainConfig or DataConfig needs no edit here): every field of the groups that define
# training and the run's own options that do (seed, init_keep).
DEFAULTED = roles.training_defaults()

class ResumeError(ValueError):
    """A checkpoint that this command must not resume; the message names each differing key and the fix."""


def _flatten(value: Any, prefix: str, out: dict) -> dict:
    if isinstance(value, dict):
        for key, item in value.items():
            _flatten(item, f"{prefix}.{key}", out)
    else:
        out[prefix] = value
    return out


def configured_world_size(cfg: DictConfig, environ=os.environ) -> int:
    """The processes a run of ``cfg`` trains on, before a Trainer exists: ``WORLD_SIZE`` where a launcher set it
    (torchrun, Lightning's own for its child processes), else ``trainer.devices`` as Lightning resolves it for the
    accelerator (``auto``, ``-1``: every visible GPU) times ``trainer.num_nodes``."""
    if environ.get("WORLD_SIZE"):
        return int(environ["WORLD_SIZE"])
    # Lightning's device count, imported here: naming a run dir, a sweep's launch and --help never load Lightning
    from lightning.pytorch.accelerators import CPUAccelerator, CUDAAccelerator

    trainer = cfg.get("trainer") or {}
    accelerator = CUDAAccelerator if uses_cuda(str(trainer.get("accelerator", "auto"))) else CPUAccelerator
    devices = trainer.get("devices", "auto")
    devices = OmegaConf.to_container(devices) if OmegaConf.is_config(devices) else devices
    count = (accelerator.auto_device_count() if devices == "auto"
             else len(accelerator.get_parallel_devices(accelerator.parse_devices(devices))))
    return count * int(trainer.get("num_nodes", 1) or 1)


def resolved_precision(cfg: DictConfig) -> tuple[str, str]:
    """(trainer.precision with ``auto`` resolved for trainer.accelerator, as Lightning names it: ``32`` is
    ``32-true``; why)."""
    trainer = cfg.get("trainer") or {}
    precision, why = resolve_precision(str(trainer.get("precision", "auto")), str(trainer.get("accelerator", "auto")))
    return ("32-true" if precision == "32" else precision), why


def _not_training(key: str) -> bool:
    """Whether ``key`` (dotted) is one of ``NOT_TRAINING``, or below one."""
    return any(key == entry or key.startswith(entry + ".") for entry in NOT_TRAINING)


def _callbacks_as_configured(cfg: DictConfig) -> dict[str, Any]:
    """The ``callbacks`` entries, a default entry kept out only while it is the default callback (its name with its
    ``_target_``, or null: off): the same name with another class counts, as any added entry does."""
    out: dict[str, Any] = {}
    callbacks = cfg.get("callbacks") or {}
    for name in callbacks:
        node = callbacks[name]
        target = None if node is None else FORMER_TARGETS.get(node.get("_target_"), node.get("_target_"))
        if name in DEFAULT_CALLBACKS and (node is None or target == DEFAULT_CALLBACKS[name]):
            continue
        _flatten(OmegaConf.to_container(node, resolve=True) if node is not None else None, f"callbacks.{name}", out)
    return out


def _split_digest(cfg: DictConfig, split: str = "train") -> str | None:
    """A sha256 over ``split``'s files' sizes and contents (``corpus.file_fingerprint``, memoized in the user's
    cache, as the data set-up's own keys are), so that new pairs under the same path are another run; None where
    there are no such files to read (not configured, or missing: the data set-up then stops and says why) or
    they come from the hub (their id is in the config). A file that exists but cannot be read is an error, here as
    in the data set-up: every rank must compute the same fingerprint. The run fingerprint holds train's; the
    results fingerprint val's and test's too (``EVAL_DIGESTS``)."""
    try:
        known = {f.name for f in dataclasses.fields(DataConfig)}  # not a retired key an older config holds
        data = DataConfig(**{k: v for k, v in OmegaConf.to_container(cfg.data, resolve=True).items() if k in known})
        if not getattr(data, split):
            return None
        specs = list(data.pair_specs().values()) or [data.corpus_spec()]  # data.pairs: every pair's files
        inputs = list(dict.fromkeys(path for spec in specs for path in split_inputs(spec, split)))
    except (CorpusError, TypeError, ValueError):
        return None
    if any(i.startswith("hub:") for i in inputs):
        return None
    listed = file_fingerprint(sorted(inputs))
    return hashlib.sha256(json.dumps([[size, digest] for _, size, digest in listed]).encode()).hexdigest()


def _init_settings(cfg: DictConfig, found: dict[str, Any], recorded_run: dict[str, Any] | None = None) -> None:
    """With ``init_from``: its checkpoint's identity (the sha256 of its bytes) in place of its path, and, in place
    of the command's ``model.*``, the architecture that trains: the checkpoint's own (``model.*`` but
    ``INIT_RUN_SETTINGS``, which the command sets). Where init_from's file is gone (the parent's ``recent/``
    window removed it) and ``recorded_run`` is given (the fingerprint the run's own checkpoint or results.json
    recorded: a resume, a sweep run again), the parent as that record names it (``recorded_init``): the run's own
    checkpoint holds all it needs."""
    path = Path(str(cfg.init_from))
    if not path.is_file():
        inherited = recorded_init(recorded_run)
        if inherited:
            for key in [k for k in found if k.startswith("model.") and k[len("model."):] not in INIT_RUN_SETTINGS]:
                del found[key]
            found.update({k: v for k, v in inherited.items() if k[len("model."):] not in INIT_RUN_SETTINGS})
        else:
            found[INIT_DIGEST] = "missing"  # the run's set-up refuses it, naming the file
        return
    found[INIT_DIGEST] = content_digest(path)
    recorded = read_checkpoint(path, mmap=True).get(CKPT_MODEL_CONFIG)
    if isinstance(recorded, dict):
        for key in [k for k in found if k.startswith("model.") and k[len("model."):] not in INIT_RUN_SETTINGS]:
            del found[key]
        for key, value in recorded.items():
            if key not in INIT_RUN_SETTINGS:
                found[f"model.{key}"] = value


def recorded_init(fingerprint: dict[str, Any] | None) -> dict[str, Any]:
    """What a recorded run fingerprint says of its parent (``init_from``): its digest and the architecture it held
    (``model.*``); {} where it records none (not a fine-tune, or its parent was missing already)."""
    if not isinstance(fingerprint, dict) or fingerprint.get(INIT_DIGEST) in (None, "missing"):
        return {}
    return {key: value for key, value in fingerprint.items() if key == INIT_DIGEST or key.startswith("model.")}


def run_fingerprint(cfg: DictConfig, trainer=None, recorded_run: dict[str, Any] | None = None) -> dict[str, Any]:
    """{dotted key: resolved value} of what defines the run (see the module doc): every key of the resolved config
    but ``NOT_TRAINING`` and the default callbacks, with the precision, the world size and the tokens per step
    resolved, the training files' contents and init_from's checkpoint by their digests. ``trainer``: the run's
    Trainer (or what has its ``world_size`` and ``precision``), whose values are the truth; without one they come
    from ``cfg`` and the environment. ``recorded_run``: the fingerprint this run recorded (its checkpoint's, its
    results.json's), which stands for init_from's checkpoint where that file is gone (``_init_settings``)."""
    world_size = trainer.world_size if trainer is not None else configured_world_size(cfg)
    precision = str(trainer.precision) if trainer is not None else resolved_precision(cfg)[0]
    accumulate = OmegaConf.select(cfg, "trainer.accumulate_grad_batches", default=1)
    found: dict[str, Any] = {}
    for key in cfg:
        if key == "callbacks":
            found.update(_callbacks_as_configured(cfg))
        elif key != "hydra" and key not in NOT_TRAINING:  # left out before it is resolved (name=${hydra:...})
            node = cfg[key]
            _flatten(OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node, key, found)
    found.update({FORMAT: FINGERPRINT_FORMAT, "world_size": world_size, PRECISION: precision,
                  "trainer.accumulate_grad_batches": accumulate})
    found[TRAIN_DIGEST] = _split_digest(cfg)
    if cfg.get("init_from"):
        _init_settings(cfg, found, recorded_run)
    found[PRODUCT] = found["data.max_tokens"] * accumulate * world_size
    return {key: value for key, value in sorted(found.items())
            if key in (PRECISION, "trainer.accumulate_grad_batches", INIT_DIGEST) or not _not_training(key)}


def results_fingerprint(cfg: DictConfig, trainer=None, recorded_run: dict[str, Any] | None = None) -> dict[str, Any]:
    """``run_fingerprint`` and what else shapes a finished run's results (module doc): results.json keeps it."""
    found = run_fingerprint(cfg, trainer, recorded_run)
    trainer_group = OmegaConf.to_container(cfg.get("trainer") or {}, resolve=True)
    found.update({f"trainer.{key}": value for key, value in trainer_group.items() if key not in TRAINER_NOT_RESULTS})
    for key in EVALUATION + RESULT_KEYS:
        value = OmegaConf.select(cfg, key)
        found[key] = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    for key, split in EVAL_DIGESTS.items():
        found[key] = _split_digest(cfg, split)
    return dict(sorted(found.items()))


def fingerprint_digest(cfg: DictConfig) -> str:
    """A short hash of ``run_fingerprint(cfg)``: names a ``torchrun --standalone`` run dir (run_dir.job_identity)."""
    encoded = json.dumps(run_fingerprint(cfg), sort_keys=True, default=str).encode()
    return hashlib.sha256(encoded).hexdigest()[:10]


def _override(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _ignored(saved: dict[str, Any], current: dict[str, Any]) -> set[str]:
    """The keys not compared: ``RETIRED``; the factors of tokens_per_step where both sides hold the product; the
    keys added since an older ``saved`` fingerprint was written that it lacks (it is then compared as it was:
    data.max_tokens and accumulation, without the world size; a finished run's config without an option of
    ``RESULT_KEYS``, which did not exist then)."""
    ignored = set(RETIRED) | {key for key in ADDED + RESULT_KEYS + tuple(EVAL_DIGESTS) if key not in saved}
    if PRODUCT in saved and PRODUCT in current:
        ignored |= set(FACTORS)
    if FORMAT not in saved:  # written before format 2: what it held (the groups, seed, ADDED), compared as then
        ignored |= {key for key in current if key not in saved and key.split(".")[0] not in (*GROUPS, "seed")}
        ignored |= {TRAIN_DIGEST, INIT_DIGEST}
        if INIT_DIGEST in current:  # a fine-tune: it recorded the command's model.*, not the architecture trained
            ignored |= {key for key in saved.keys() | current.keys()
                        if key.startswith("model.") and key[len("model."):] not in INIT_RUN_SETTINGS}
    return ignored


def differences(saved: dict[str, Any], current: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """{key: (saved value, current value)} for each key whose value differs ("absent" where one lacks it), but the
    keys ``_ignored`` says are not compared; a ``DEFAULTED`` key an older fingerprint lacks has its value there."""
    absent, ignored = "absent", _ignored(saved, current)
    saved, current = ({**DEFAULTED, **fingerprint} for fingerprint in (saved, current))
    return {key: (saved.get(key, absent), current.get(key, absent)) for key in sorted(saved.keys() | current.keys())
            if key not in ignored and saved.get(key, absent) != current.get(key, absent)}


def _limit(key: str, value: Any) -> float:
    """An ``EXTENDS`` value as a number to compare (infinite: no limit)."""
    if value in (None, "absent") or (key != "trainer.max_time" and value == -1):
        return math.inf
    if key != "trainer.max_time":
        return float(value)
    if isinstance(value, dict):
        return timedelta(**value).total_seconds()
    match = re.fullmatch(r"(\d+):(\d\d):(\d\d):(\d\d)", str(value).strip())  # Lightning's DD:HH:MM:SS
    if not match:
        return math.nan  # not comparable: not an extension
    days, hours, minutes, seconds = map(int, match.groups())
    return timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds).total_seconds()


def only_extends(changed: dict[str, tuple[Any, Any]]) -> bool:
    """Whether ``changed`` (``differences``) changes only ``EXTENDS`` keys, each to a longer run."""
    return bool(changed) and all(key in EXTENDS and _limit(key, new) > _limit(key, old)
                                 for key, (old, new) in changed.items())


def check_resume(cfg: DictConfig, path: Path | None, sweep_overrides: list[str] | None = None,
                 trainer=None, own_checkpoint: bool | None = None) -> None:
    """Refuse to resume ``path``, the run dir's own checkpoint, when it was written by a run with another
    fingerprint than ``cfg``'s (``trainer``: the run's, whose world size and precision count), or, in a sweep
    (``sweep_overrides``: this job's), by a job with other overrides; ``force_resume=true`` and explicit
    checkpoint paths are not checked. ``own_checkpoint``: whether ``path`` is the run dir's own (default: as
    ``cfg.ckpt_path`` is ``auto`` or ``last``; a requeued job's resume, ``resume.requeued_resume``, is too)."""
    if own_checkpoint is None:
        own_checkpoint = cfg.ckpt_path in ("auto", "last")
    if path is None or not own_checkpoint or cfg.get("force_resume"):
        return
    checkpoint = read_checkpoint(path, mmap=True)
    if sweep_overrides is not None:
        step = checkpoint.get("global_step")
        check_same_job(checkpoint.get(CKPT_OVERRIDES), sweep_overrides, f"{path} (step {step})",
                       f"delete {path.parent.parent} to train this job from the start, or pass force_resume=true to "
                       f"resume it anyway")
    saved = checkpoint.get(CKPT_FINGERPRINT)
    if saved is None:
        log.warning("%s predates run fingerprints: its settings cannot be compared with this command's", path)
        return
    how = (f"ckpt_path={cfg.ckpt_path}" if cfg.ckpt_path in ("auto", "last") else
           f"the requeued job (its ckpt_path={cfg.ckpt_path} was for its first launch)")
    check_same_run(cfg, saved, f"{how} found {path} (step {checkpoint.get('global_step')}), "
                               f"written by a run", "Resuming it would continue that run's weights and schedule",
                   trainer=trainer)


def saved_results_fingerprint(results: dict, config_file: Path) -> dict[str, Any]:
    """A finished run's results fingerprint: its results.json's, or for a run written before results.json held one,
    the one its ``config_file`` (the resolved config) gives, with the precision results.json reports and without
    what the config cannot tell (the world size, hence tokens_per_step: its factors are compared instead)."""
    if isinstance(results.get(RESULTS_FINGERPRINT), dict):
        return results[RESULTS_FINGERPRINT]
    old = read_written_config(config_file)
    saved = results_fingerprint(old, SimpleNamespace(world_size=1, precision=results.get("precision")))
    saved.pop(PRODUCT), saved.pop("world_size")
    if "precision" not in results:
        saved.pop(PRECISION)
    for key in RESULT_KEYS:  # options younger than the run
        if OmegaConf.select(old, key, default=_ABSENT) is _ABSENT:
            saved.pop(key)
    return saved


_ABSENT = object()


def read_written_config(path: Path) -> DictConfig:
    """A run's config.yaml (written resolved by the run: ``OmegaConf.to_yaml(cfg, resolve=True)``) as a config,
    read as data: an interpolation in it (``${oc.env:VAR}`` would copy an environment variable into the fingerprint,
    its messages and what is written from it) is refused, naming the file and the key, instead of resolved."""
    import yaml

    data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    stack = [("", data)]
    while stack:
        where, node = stack.pop()
        if isinstance(node, dict):
            stack.extend((f"{where}.{key}" if where else str(key), value) for key, value in node.items())
        elif isinstance(node, list):
            stack.extend((f"{where}[{i}]", value) for i, value in enumerate(node))
        elif isinstance(node, str) and "${" in node:
            raise ResumeError(f"{path}: {where}={node!r:.80} is an interpolation; a run writes its config resolved, "
                              f"so this file was not written by one (it is not resolved: it would read what it names)")
    return OmegaConf.create(data if isinstance(data, dict) else {})


def check_finished_run(cfg: DictConfig, run_dir: Path, results: dict, overrides: list[str]) -> bool:
    """A sweep's finished run (``run_dir``: its results.json holds ``results``) found by this job (``cfg``,
    ``overrides``): False where it ran with this command's settings (skip it); True where this command only
    extends it (more steps, epochs or time: resume it from its last checkpoint); else ``ResumeError`` naming
    each differing key (old -> new), since skipping it would report another run's results as this command's.
    ``force_resume`` does not apply: a finished run is not resumed with other settings."""
    check_same_job(results.get("overrides"), overrides, f"the sweep's run in {run_dir} finished; it",
                   f"delete {run_dir / 'results.json'} to train this job")
    saved = saved_results_fingerprint(results, run_dir / "config.yaml")
    current = results_fingerprint(cfg, recorded_run=saved)
    changed = differences(saved, current)
    if not changed:
        return False
    if only_extends(changed):
        log.info("the sweep's run in %s finished; this command only extends it:\n%s\nit resumes from its last "
                 "checkpoint", run_dir, _lines(changed, saved, current))
        return True
    raise ResumeError(
        f"the sweep's run in {run_dir} finished, but it ran with other settings than this command's:\n"
        f"{_lines(changed, saved, current)}\nSkipping it would report its results as this command's (only more "
        f"steps, epochs or time would resume it). To train it with this command's settings, delete "
        f"{run_dir / 'results.json'}; to keep it, run this command under a new sweep_id=NAME.")


def _job_overrides(overrides: list[str]) -> list[str]:
    """The overrides but those of ``EXTENDS`` keys (whose values the fingerprints compare)."""
    return [o for o in overrides if o.split("=", 1)[0].lstrip("+~") not in EXTENDS]


def check_same_job(saved: list[str] | None, overrides: list[str], found: str, fix: str) -> None:
    """In a sweep run again, job N's directory must hold job N: raise ``ResumeError`` when ``saved``, the
    overrides it ran with (None: not recorded), differ from this job's ``overrides``, which happens when the
    sweep's values were reordered, added or removed (run dirs are numbered in sweep order). Overrides of the
    steps, epochs and time limit (``EXTENDS``) are not compared here: the fingerprints judge them."""
    if saved is None or _job_overrides(list(saved)) == _job_overrides(list(overrides)):
        return
    raise ResumeError(
        f"{found} ran with the overrides\n  {' '.join(saved)}\nbut this sweep gives that job the overrides\n  "
        f"{' '.join(overrides)}\nThe sweep's values or their order changed, so the directory holds another run. Run "
        f"the changed sweep under a new sweep_id=NAME, or the old command again; or {fix}.")


def check_same_run(cfg: DictConfig, saved: dict[str, Any], found: str, consequence: str, trainer=None) -> None:
    """Raise ``ResumeError`` when ``saved`` differs from ``cfg``'s fingerprint: one line per key, and the fixes."""
    current = run_fingerprint(cfg, trainer, recorded_run=saved)
    changed = differences(saved, current)
    if not changed or cfg.get("force_resume"):
        return
    derived = (PRODUCT, "world_size", TRAIN_DIGEST, INIT_DIGEST, FORMAT)
    from_init = INIT_DIGEST in current  # model.* of a fine-tune: its checkpoint's, not options
    as_it_was = " ".join(f"~{key}" if old == "absent" else f"{key}={_override(old)}"
                         for key, (old, new) in changed.items() if key not in derived
                         and not (from_init and key.startswith("model.") and key[6:] not in INIT_RUN_SETTINGS))
    restore = [what for key, what in ((TRAIN_DIGEST, "the training files as they were"),
                                      (INIT_DIGEST, "init_from's checkpoint as it was")) if key in changed]
    keep = _keep_product(saved, current) if PRODUCT in changed else ""
    raise ResumeError(
        f"{found} with other settings than this command's:\n{_lines(changed, saved, current, cfg)}\n{consequence} "
        f"under the new settings. To resume it as it was, "
        f"{'restore ' + ' and '.join(restore) + (', and ' if as_it_was or keep else '') if restore else ''}"
        f"{'pass ' + ' '.join(filter(None, [as_it_was, keep])) if as_it_was or keep else ''}; to start "
        f"a new run, give it its own directory (run_id=NAME or hydra.run.dir=DIR; in a sweep, sweep_id=NAME); to "
        f"resume it with the new settings anyway, pass force_resume=true.")


def _keep_product(saved: dict[str, Any], current: dict[str, Any]) -> str:
    """The accumulation that gives the saved tokens per step on this world size and data.max_tokens, or the rule."""
    per_micro_batch = current["data.max_tokens"] * current["world_size"]
    if saved[PRODUCT] % per_micro_batch == 0:
        return f"trainer.accumulate_grad_batches={saved[PRODUCT] // per_micro_batch}"
    return (f"settings whose data.max_tokens x trainer.accumulate_grad_batches x world size is "
            f"{saved[PRODUCT]:,}")


def _describe(key: str, fingerprint: dict[str, Any], side: str) -> str:
    """``VALUE there`` / ``VALUE now``; tokens_per_step with its factors."""
    text = f"{_override(fingerprint.get(key, 'absent'))} {side}"
    if key == PRODUCT and key in fingerprint:
        text += (f" (data.max_tokens {fingerprint.get('data.max_tokens')} x accumulate "
                 f"{fingerprint.get('trainer.accumulate_grad_batches')} x {fingerprint.get('world_size')} processes)")
    return text


def _lines(changed: dict[str, tuple[Any, Any]], saved: dict[str, Any], current: dict[str, Any],
           cfg: DictConfig | None = None) -> str:
    """One line per differing key: ``  KEY: OLD there, NEW now``; the precision with how it was resolved now."""
    lines = []
    for key in changed:
        line = f"  {key}: {_describe(key, saved, 'there')}, {_describe(key, current, 'now')}"
        if key == PRECISION and cfg is not None:
            line += f" (trainer.precision={cfg.trainer.get('precision', 'auto')}: {resolved_precision(cfg)[1]})"
        lines.append(line)
    return "\n".join(lines)
