#!/usr/bin/env bash
# GPU check: train the paper's base model (model=base) on Multi30k in bf16 for about 5 minutes, then print
# throughput (tokens/s), model FLOPs utilisation against 989 TFLOP/s dense bf16 (H100/H200 SXM), peak GPU
# memory and validation BLEU (greedy, whole validation set).
#
#   scripts/gpu_check.sh [RUN_DIR] [extra Hydra overrides, e.g. model.attention=fused data.max_tokens=12000]
#
# Environment: TRAIN_SECONDS (default 300), PEAK_TFLOPS (default 989), GPU_CHECK_ALLOW_CPU=1 to dry-run the
# script on a CPU (with e.g. trainer=cpu model=tiny trainer.precision=32-true as overrides; MFU is then moot).
set -euo pipefail
cd "$(dirname "$0")/.."

RUN_DIR=${1:-outputs/gpu_check/$(date +%Y-%m-%d_%H-%M-%S)}
shift || true
TRAIN_SECONDS=${TRAIN_SECONDS:-300}
PEAK_TFLOPS=${PEAK_TFLOPS:-989}
MAX_TIME=$(printf "00:%02d:%02d:%02d" $((TRAIN_SECONDS / 3600)) $((TRAIN_SECONDS % 3600 / 60)) $((TRAIN_SECONDS % 60)))
export PYTHONUNBUFFERED=1

if [[ "${GPU_CHECK_ALLOW_CPU:-0}" != 1 ]]; then
  python - <<'EOF'
import sys, torch
if not torch.cuda.is_available():
    sys.exit("gpu_check.sh: no CUDA GPU visible (torch.cuda.is_available() is False); this check needs one")
print(f"GPU: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}")
EOF
fi

# Batches of up to 25,000 padded tokens per side (the paper's batch size, on one GPU; Multi30k then has ~18
# batches per epoch); warmup shortened to 1,000 steps so that a 5-minute run gets past it; validation (greedy
# BLEU on all 1,014 sentences, then last.ckpt and the best checkpoint, ~0.8 GB each, are written) every 750
# optimizer steps, its time left out of tokens/s; attention maps only at the first validation (144 maps).
python -m transformer_nmt.train \
  name=gpu_check model=base data=multi30k trainer=gpu \
  trainer.precision=bf16-mixed "trainer.max_time=\"${MAX_TIME}\"" trainer.max_epochs=-1 trainer.max_steps=-1 \
  trainer.check_val_every_n_epoch=null trainer.val_check_interval=750 \
  trainer.log_every_n_steps=10 trainer.enable_progress_bar=false \
  data.max_tokens=25000 data.num_workers=4 \
  train.warmup_steps=1000 train.val_bleu_max_sentences=null \
  attention_maps.every_n_validations=1000 checkpoint.save_top_k=1 run_test=false \
  "hydra.run.dir=${RUN_DIR}" "$@"

RUN_DIR="$RUN_DIR" PEAK_TFLOPS="$PEAK_TFLOPS" python - <<'EOF'
"""Read the run's TensorBoard scalars and report throughput, MFU, memory and BLEU."""
import os
import statistics
from pathlib import Path

from omegaconf import OmegaConf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

run_dir = Path(os.environ["RUN_DIR"])
events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
events.Reload()
tags = set(events.Tags()["scalars"])


def values(tag):
    return [(e.step, e.value) for e in events.Scalars(tag)] if tag in tags else []


def steady(tag):
    """Logged values after the first 20% of steps (compilation, allocator and cache warm-up)."""
    points = values(tag)
    if not points:
        return []
    cut = points[-1][0] * 0.2
    return [v for s, v in points if s >= cut] or [v for _, v in points]


hparams = OmegaConf.load(run_dir / "tensorboard" / "hparams.yaml")
m = hparams.model_config
d, d_ff, V, L_enc, L_dec = m.d_model, m.d_ff, m.vocab_size, m.n_encoder_layers, m.n_decoder_layers
# Multiply-accumulates per token of the forward pass (matmuls only; attention scores and weighted sums,
# ~2 * length * d per token and layer, are left out: under 3% at Multi30k's ~15-token sentences).
macs_src = L_enc * (4 * d * d + 2 * d * d_ff) + L_dec * 2 * d * d  # encoder layers; cross-attention K, V
macs_tgt = L_dec * (4 * d * d + 2 * d * d + 2 * d * d_ff) + d * V  # self-attn, cross Q/O, FFN; output layer
flops_src, flops_tgt = 3 * 2 * macs_src, 3 * 2 * macs_tgt  # forward + backward (2x forward)

src_rate, tgt_rate = steady("train/src_tokens_per_sec"), steady("train/tgt_tokens_per_sec")
if not src_rate:
    raise SystemExit(f"no throughput logged in {run_dir}/tensorboard: did the run train at all?")
src_tps, tgt_tps = statistics.median(src_rate), statistics.median(tgt_rate)
achieved = flops_src * src_tps + flops_tgt * tgt_tps
peak_flops = float(os.environ["PEAK_TFLOPS"]) * 1e12
memory = [v for _, v in values("train/peak_memory_gib")]
bleu = values("val/bleu")
steps = values("train/loss")[-1][0] if values("train/loss") else 0
tokens_per_step = statistics.median(steady("train/tgt_tokens_per_step"))

print()
config = OmegaConf.load(run_dir / "config.yaml")
print(f"gpu_check: d_model {d}, {L_enc}+{L_dec} layers, d_ff {d_ff}, vocab {V}, precision {config.trainer.precision}: "
      f"{steps} optimizer steps of ~{tokens_per_step:,.0f} target tokens")
print(f"  throughput       {tgt_tps:,.0f} target tokens/s, {src_tps:,.0f} source tokens/s (median, last 80% of steps)")
print(f"  model FLOPs      {flops_src / 1e6:.0f} MFLOP per source token, {flops_tgt / 1e6:.0f} MFLOP per target token")
print(f"  MFU              {100 * achieved / peak_flops:.1f}% "
      f"({achieved / 1e12:.0f} TFLOP/s of {peak_flops / 1e12:.0f} dense bf16)")
print(f"  peak GPU memory  {max(memory):.1f} GiB (torch.cuda.max_memory_allocated)" if memory else
      "  peak GPU memory  not logged (not a CUDA run)")
if bleu:
    best_step, best = max(bleu, key=lambda p: p[1])
    print(f"  val BLEU         {bleu[-1][1]:.2f} at step {bleu[-1][0]} (best {best:.2f} at step {best_step}; greedy)")
else:
    print("  val BLEU         no validation ran")
print(f"  run dir          {run_dir}")
EOF
