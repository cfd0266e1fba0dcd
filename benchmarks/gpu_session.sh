#!/usr/bin/env bash
# One GPU session's work, prepared to run unattended on a lent machine (see ../shared/device/README.md):
# install the carried PyCUDA wheels and the project, run the GPU tests and the emulation tests, the kernel
# benchmark, and compute-sanitizer over the GPU tests. Everything it prints lands in $OUT (or ./gpu-out).
#
#   run with carry [".whl"]:  bash benchmarks/gpu_session.sh
set -uo pipefail
OUT="${OUT:-gpu-out}"
mkdir -p "$OUT"
{
    echo "== $(date -u) commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
    python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
    python3 -c "import torch; torch.cuda.init(); import pycuda.autoprimaryctx; print('pycuda ok on', torch.cuda.get_device_name())"
    echo "== pytest -m gpu"
    timeout 300 python3 -m pytest -q -m gpu tests/test_kernels.py 2>&1 | tail -15
    echo "== emulation tests"
    timeout 300 python3 -m pytest -q tests/test_kernels.py -k "emulated or split or compile" 2>&1 | tail -5
    echo "== benchmarks/kernels_gpu.py"
    timeout 300 python3 benchmarks/kernels_gpu.py --repeat 30 2>&1
    echo "== compute-sanitizer memcheck over the GPU tests"
    timeout 300 compute-sanitizer --tool memcheck python3 -m pytest -q -m gpu tests/test_kernels.py -k "128 and bf16" 2>&1 | tail -8
} 2>&1 | tee "$OUT/gpu_session.txt"
