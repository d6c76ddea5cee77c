#!/usr/bin/env bash
# GPU: re-run named tests with full tracebacks, the first-call benchmark, and the > 2^31 tests.
#   TESTS="tests/a.py::test_x ..." bash benchmarks/gpu_retest.sh
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
if [ -n "${TESTS:-}" ]; then
  timeout 200 python -m pytest -q -p no:cacheprovider --tb=short ${TESTS} > "$OUT/retest.log" 2>&1
  echo "retest rc=$?"; grep -E "^E |Error|^FAILED|passed|failed" "$OUT/retest.log" | head -40
fi
timeout 170 python benchmarks/first_call.py --quick --time-budget 150 --out "$OUT" > "$OUT/first_call.log" 2>&1
echo "first_call rc=$?"; head -3 "$OUT/first_call.log"
timeout 150 python -m pytest -q -p no:cacheprovider -m huge --tb=short tests/test_huge.py > "$OUT/huge.log" 2>&1
echo "huge rc=$?"; grep -E "^E |passed|failed|SKIP" "$OUT/huge.log" | head -20
