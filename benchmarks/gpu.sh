#!/usr/bin/env bash
# The GPU figures of BENCHMARKS.md in one run. Needs only torch, numpy, xarray, pyyaml and pytest (no Ray, no MLflow);
# JSON files + the log land in $OUT.
#   OUT=/tmp/gpu bash benchmarks/gpu.sh 2>&1 | tee /tmp/gpu/log.txt
#   PARTS=compile OUT=/tmp/gpu bash benchmarks/gpu.sh     # only section 7d (eager / compiled / captured)
# PARTS: base = the gpu-marked tests, the training-step benchmarks in fp32 and bf16 at L = 2048 and 8192 tokens, the
# SetConv scaling (section 7a-c; 164 s on an H200); compile = the same step rows eager vs torch.compile
# (reduce-overhead: CUDA graphs of the compiled parts) vs the whole step captured as one CUDA graph, the EDM
# sampler call, and a 16-member rollout alone vs batched (section 7d; its time is printed at the end).
set -uo pipefail
out=${OUT:-/tmp/wxray-gpu}
parts=${PARTS:-base compile}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
$py -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
bench() { echo "== $*"; timeout "${LIMIT:-240}" $py "$@" 2>&1 | grep -v 'USDT\|profiler_st' || echo "FAILED: $*"; }
sparse=(benchmarks/bench_sparse.py --device cuda)
edm=(benchmarks/bench_edm.py --device cuda --bf16)
start=$SECONDS
if [[ " $parts " == *" base "* ]]; then
  timeout 180 $py -m pytest -q -p no:cacheprovider -m gpu $(grep -rl "mark.gpu" tests) || echo "FAILED: gpu tests"
  bench "${sparse[@]}" --batch 8 --steps 20 --json "$out/sparse_fp32.json"
  bench "${sparse[@]}" --batch 8 --steps 20 --bf16 --profile --json "$out/sparse_bf16.json"
  bench "${sparse[@]}" --batch 32 --steps 10 --bf16 --json "$out/sparse_bf16_b32.json"
  bench "${sparse[@]}" --batch 8 --steps 10 --bf16 --img 128 256 --json "$out/sparse_bf16_L8192.json"
  bench "${sparse[@]}" --batch 8 --steps 5 --img 128 256 --json "$out/sparse_fp32_L8192.json"
  bench "${edm[@]}" --batch 32 --steps 10 --json "$out/edm_bf16_b32.json"
  bench "${edm[@]}" --batch 8 --steps 8 --img 128 256 --json "$out/edm_bf16_L8192.json"
  bench benchmarks/bench_setconv.py --device cuda --obs 1000 10000 100000 1000000 --grids 64x128 128x256
  echo "== base: $((SECONDS - start)) s"
fi
if [[ " $parts " == *" compile "* ]]; then
  [[ " $parts " == *" base "* ]] || timeout 120 $py -m pytest -q -p no:cacheprovider -m gpu \
    tests/platform/test_step_graph.py || echo "FAILED: step-graph gpu tests"
  modes=(--modes eager reduce-overhead captured)
  LIMIT=420 bench "${sparse[@]}" --batch 8 --steps 20 --bf16 --variants sparse "${modes[@]}" \
    --json "$out/sparse_bf16_modes.json"
  LIMIT=420 bench "${sparse[@]}" --batch 8 --steps 10 --bf16 --img 128 256 --variants sparse "${modes[@]}" \
    --json "$out/sparse_bf16_L8192_modes.json"
  LIMIT=420 bench "${edm[@]}" --batch 8 --steps 10 "${modes[@]}" --json "$out/edm_bf16_b8_modes.json"
  LIMIT=420 bench benchmarks/bench_rollout.py --device cuda --dim 256 --img 64 128 --bf16 \
    --modes eager reduce-overhead --json "$out/rollout_bf16.json"
  echo "== compile: $((SECONDS - start)) s in all"
fi
