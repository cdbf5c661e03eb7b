#!/usr/bin/env bash
# The GPU figures of BENCHMARKS.md in one run (~3 min on an H200): the gpu-marked tests, the training-step
# benchmarks in fp32 and bf16 autocast at L = 2048 and 8192 tokens, and the SetConv scaling. Needs only torch,
# numpy, xarray, pyyaml and pytest (no Ray, no MLflow). Seven JSON files + the log land in $OUT.
#   OUT=/tmp/gpu bash benchmarks/gpu.sh 2>&1 | tee /tmp/gpu/log.txt
set -uo pipefail
out=${OUT:-/tmp/wxray-gpu}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
$py -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
bench() { echo "== $*"; timeout 240 $py "$@" 2>&1 | grep -v 'USDT\|profiler_st' || echo "FAILED: $*"; }
timeout 180 $py -m pytest -q -p no:cacheprovider -m gpu $(grep -rl "mark.gpu" tests) || echo "FAILED: gpu tests"
sparse=(benchmarks/bench_sparse.py --device cuda)
bench "${sparse[@]}" --batch 8 --steps 20 --json "$out/sparse_fp32.json"
bench "${sparse[@]}" --batch 8 --steps 20 --bf16 --profile --json "$out/sparse_bf16.json"
bench "${sparse[@]}" --batch 32 --steps 10 --bf16 --json "$out/sparse_bf16_b32.json"
bench "${sparse[@]}" --batch 8 --steps 10 --bf16 --img 128 256 --json "$out/sparse_bf16_L8192.json"
bench "${sparse[@]}" --batch 8 --steps 5 --img 128 256 --json "$out/sparse_fp32_L8192.json"
bench benchmarks/bench_edm.py --device cuda --batch 32 --steps 10 --bf16 --json "$out/edm_bf16_b32.json"
bench benchmarks/bench_edm.py --device cuda --batch 8 --steps 8 --bf16 --img 128 256 --json "$out/edm_bf16_L8192.json"
bench benchmarks/bench_setconv.py --device cuda --obs 1000 10000 100000 1000000 --grids 64x128 128x256
