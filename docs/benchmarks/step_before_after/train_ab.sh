#!/usr/bin/env bash
set -e
ARGS="experiment=multi30k_cpu trainer.max_steps=60 trainer.limit_val_batches=0 run_test=false attention_maps.every_n_validations=0 checkpoint.recent.keep=0 trainer.enable_progress_bar=false"
for i in 1 2 3; do
  (cd /tmp/old && PYTHONPATH=/tmp/old/src python -m transformer_nmt.train $ARGS hydra.run.dir=/tmp/ab/before_$i > /tmp/ab_before_$i.log 2>&1)
  (cd /work/main && PYTHONPATH=/work/main/src python -m transformer_nmt.train $ARGS hydra.run.dir=/tmp/ab/after_$i > /tmp/ab_after_$i.log 2>&1)
done
