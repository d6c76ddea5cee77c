#!/usr/bin/env bash
# One device call, reused every session: GPU tests, then the named benchmarks, results under $OUT.
#   TESTS="tests/test_attention.py" BENCH="benchmarks/attention_speed.py" bash benchmarks/gpu_check.sh
# Tests run with FLASHATTN_LITE_AUTOTUNE=0 (first fitting config; they check results, not speed).
# TESTS="" skips the tests.
set -uo pipefail
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
status=0
if [ -n "${TESTS-tests}" ]; then
  FLASHATTN_LITE_AUTOTUNE=0 timeout "${TEST_TIMEOUT:-400}" python -m pytest -q -n "${WORKERS:-8}" ${TESTS:-tests} \
    > "$OUT/tests.log" 2>&1 || status=1
  grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -30
  tail -2 "$OUT/tests.log"
fi
for bench in ${BENCH:-}; do
  echo "== $bench"
  python $bench --out "$OUT" ${BENCH_ARGS:-} > "$OUT/$(basename "$bench" .py).log" 2>&1 || status=1
  tail -60 "$OUT/$(basename "$bench" .py).log"
done
exit $status
