#!/usr/bin/env bash
# One prepared GPU session (issue 27): the device checks, then the streaming benchmark to n = 65536.
#
# Run on a machine with CUDA, from the repository root, with a Python that has torch and
# transformers (the project itself is used from the tree through PYTHONPATH):
#
#     OUT=/tmp/gpu benchmarks/gpu_session.sh
#
# Writes under $OUT: device.txt (the card), pytest_gpu.log (tests marked gpu), and
# bench_jacobian_cuda_f32.json / bench_f32.log (bench_jacobian.py --device cuda: the streaming
# path's default certified call and its per-product cost at every n, the autograd baseline where
# its n x n matrices fit half the card). Each benchmark job is written as soon as it ends, so a run
# cut short keeps what it measured. Environment: PYTHON (default python3), DEVICE (default cuda),
# NS (lengths), BENCH_TIMEOUT and JOB_TIMEOUT (seconds).
set -uo pipefail
OUT=${OUT:-/tmp/gpu_session}
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no nvidia-smi"
    $PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
} | tee "$OUT/device.txt"
t0=$(date +%s)
$PY -m pytest -q -p no:cacheprovider -m gpu tests/meanfield/test_gpu.py tests/meanfield/test_gpu_streaming.py \
    >"$OUT/pytest_gpu.log" 2>&1
echo "pytest -m gpu: exit $? in $(($(date +%s) - t0)) s; $(tail -n 1 "$OUT/pytest_gpu.log")"
t0=$(date +%s)
timeout "${BENCH_TIMEOUT:-480}" $PY benchmarks/bench_jacobian.py --device "$DEVICE" --dtype float32 \
    --no-workload --methods streaming-probe,streaming,power --n "${NS:-1024,4096,16384,65536}" \
    --dense-n "" --repeats 1 --job-timeout "${JOB_TIMEOUT:-300}" \
    --out "$OUT/bench_jacobian_cuda_f32.json" >"$OUT/bench_f32.log" 2>&1
echo "bench_jacobian: exit $? in $(($(date +%s) - t0)) s"
tail -n 25 "$OUT/bench_f32.log"
