#!/usr/bin/env bash
# Alternate the step benchmark of f003660 (before) and of main (after), same arguments, same machine.
set -e
OUT=$1; mkdir -p $OUT
ARGS="--tokens 1024 4096 --no-compile --kernels plain --precisions bf16-mixed 32-true --threads 2 --rounds 3"
for i in 1 2 3; do
  (cd /tmp/old && PYTHONPATH=/tmp/old/src python scripts/benchmark_step.py $ARGS > $OUT/before_$i.txt 2>&1)
  (cd /work/main && PYTHONPATH=/work/main/src python scripts/benchmark_step.py $ARGS > $OUT/after_$i.txt 2>&1)
done
