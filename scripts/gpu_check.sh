#!/usr/bin/env bash
# The GPU check (scripts/gpu_check.py says what it measures): within 8 minutes on one H100/H200 it runs the
# CUDA-marked tests, times the base model at 25k tokens per batch with each attention kernel (tokens/s, MFU,
# peak memory), checks that the loss falls, prints a table and writes OUT_DIR/gpu_check.json.
#
#   scripts/gpu_check.sh [OUT_DIR]                  # default: $OUT if set, else outputs/gpu_check/<time>
#   GPU_CHECK_ALLOW_CPU=1 scripts/gpu_check.sh DIR  # dry run on a CPU with tiny sizes
#   scripts/gpu_check.sh --fetch-wheels [DIR] [PYTHON_VERSION]   # here, with a registry: the wheels to carry
#
# A lent GPU machine runs the project under its own image (python 3.12, torch 2.11, Lightning, sacreBLEU,
# SentencePiece, TensorBoard) with no registry in reach. What the image lacks (hydra-core, omegaconf, datasets
# and their missing needs) is installed from wheels carried with the working tree, GPU_CHECK_WHEELS (default
# .whl/, ignored by git: `echo /.whl/ >> .git/info/exclude`), with pip --no-index; the project itself is
# installed editable with --no-deps. Make the folder beforehand with --fetch-wheels (default: .whl for 3.12).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
WHEELS=${GPU_CHECK_WHEELS:-.whl}
# What the GPU image lacks, at the versions this project is tested with (antlr4 is published as source only).
CARRIED="hydra-core==1.3.8 omegaconf==2.3.1 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19"
ANTLR="antlr4-python3-runtime==4.9.3"

if [[ "${1:-}" == --fetch-wheels ]]; then
  dir=${2:-.whl}; version=${3:-3.12}
  mkdir -p "$dir"
  # shellcheck disable=SC2086
  $PYTHON -m pip download -q --no-deps --only-binary=:all: --python-version "$version" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any -d "$dir" $CARRIED
  $PYTHON -m pip wheel -q --no-deps -w "$dir" "$ANTLR"   # pure Python: one wheel serves every version
  ls "$dir"
  exit 0
fi

OUT_DIR=${1:-${OUT:-outputs/gpu_check/$(date +%Y-%m-%d_%H-%M-%S)}}
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1

missing=$($PYTHON -c "import importlib.util as u; print(*[m for m in ('hydra', 'omegaconf', 'datasets') if not u.find_spec(m)])")
if [[ -n "$missing" ]]; then
  echo "[gpu_check] installing from $WHEELS (missing here: $missing)"
  compgen -G "$WHEELS/*.whl" >/dev/null || { echo "gpu_check: missing $missing and no wheels in $WHEELS/ (see --fetch-wheels)" >&2; exit 2; }
  SITE=${GPU_CHECK_SITE:-/tmp/gpu_check_site}
  $PYTHON -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
if ! $PYTHON -c "import transformer_nmt, sys; sys.exit(not transformer_nmt.__file__.startswith('$PWD/src'))" 2>/dev/null; then
  $PYTHON -m pip install -q --no-index --no-deps --no-build-isolation -e .
fi
$PYTHON -c "import hydra, omegaconf, datasets, transformer_nmt.train" || { echo "gpu_check: the installation is incomplete" >&2; exit 2; }
$PYTHON -c "import torch; print(f'[gpu_check] torch {torch.__version__}')"
exec $PYTHON scripts/gpu_check.py "$OUT_DIR"
