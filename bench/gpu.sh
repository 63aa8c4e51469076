#!/usr/bin/env bash
# One call on a lent GPU machine: bench/gpu_train.py (GPT-2 small, JAX, mixed bfloat16, ours
# vs keras-hub vs plain Keras, tokens/s and MFU, fused attention checked). The machine has
# JAX and PyTorch but no TensorFlow, Keras or network: Keras and keras-hub travel as wheels
# in .whl/ (git-ignored), made here once with
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 -d .whl \
#     keras==3.15.1 namex==0.1.0 optree==0.20.0 keras-hub==0.32.0
# Arguments go to bench/gpu_train.py (`bench/gpu.sh --tiny` checks the script on a CPU).
# Results: $OUT/gpu_train.json on the device machine, else bench/results/gpu_train.json.
set -euo pipefail
cd "$(dirname "$0")/.."
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/keras_attn_site .whl/*.whl
    export PYTHONPATH=/tmp/keras_attn_site
fi
# export/ and serving/ are installed as keras_attn_export and keras_attn_serving.
mkdir -p /tmp/keras_attn_names
ln -sfn "$PWD/export" /tmp/keras_attn_names/keras_attn_export
ln -sfn "$PWD/serving" /tmp/keras_attn_names/keras_attn_serving
export PYTHONPATH="$PWD:/tmp/keras_attn_names${PYTHONPATH:+:$PYTHONPATH}"
export KERAS_BACKEND=jax PYTHONUNBUFFERED=1
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version \
    --format=csv,noheader
python3 bench/gpu_train.py --out "${OUT:-bench/results}/gpu_train.json" "$@"
