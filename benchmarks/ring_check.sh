#!/usr/bin/env bash
# One device call on a machine of two or more GPUs (device kind nvidia-h200-x2): ring attention's NCCL
# tests, then the ring benchmark; results under $OUT (ring-*.json, the logs).
#   bash benchmarks/ring_check.sh
#   LENGTHS=32k,128k,256k SINGLE_MAX=128k ITERS=2 bash benchmarks/ring_check.sh
#   TEST_TIMEOUT=0 BENCH_ARGS="--window 4095 --sinks" bash benchmarks/ring_check.sh   # options, no tests
# NVLink multicast stays off (the shared host's GPUs can hang on it): the three variables below are
# exported, and torchrun and the tests' worker processes inherit them.
set -uo pipefail
OUT=${OUT:-ring_out}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1 FLASHATTN_LITE_AUTOTUNE=0
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=index,name,clocks.sm,memory.used --format=csv | tee "$OUT/gpu.txt"
nvidia-smi topo -m | head -4 | tee -a "$OUT/gpu.txt"
status=0
if [ "${TEST_TIMEOUT:-240}" != 0 ]; then
  echo "== NCCL tests"
  timeout "${TEST_TIMEOUT:-240}" python -m pytest -q -rA -p no:cacheprovider tests/test_distributed.py -k nccl \
    > "$OUT/nccl_tests.log" 2>&1 || status=1
  grep -E "PASSED|FAILED|ERROR|passed|failed" "$OUT/nccl_tests.log" | tail -12
  [ $status -ne 0 ] && tail -60 "$OUT/nccl_tests.log"
  echo "== examples/ring_attention.py"
  timeout 120 python examples/ring_attention.py 2>&1 | grep -E "^rank|Error" || status=1
fi
echo "== ring benchmark"
timeout "${BENCH_TIMEOUT:-330}" python benchmarks/ring.py --lengths "${LENGTHS:-32k,128k,256k}" \
  --single-max "${SINGLE_MAX:-128k}" --iters "${ITERS:-2}" --warmup "${WARMUP:-1}" --out "$OUT" \
  --time-budget "${BENCH_BUDGET:-300}" ${BENCH_ARGS:-} > "$OUT/ring.log" 2>&1 || status=1
tail -25 "$OUT/ring.log"
exit $status
