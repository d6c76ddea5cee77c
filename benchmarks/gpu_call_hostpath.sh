#!/usr/bin/env bash
# GPU check of the host path and integrations: tests (named PASSED/FAILED lines in $OUT/tests.log),
# the HF long-context check, decode's per-call host time against SDPA, and the first-call benchmark.
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,memory.used --format=csv,noheader
FLASHATTN_LITE_AUTOTUNE=0 timeout 230 python -m pytest -v -n 8 --tb=short -p no:cacheprovider tests/test_hf.py \
  tests/test_configs.py tests/test_explain.py tests/test_warmup.py tests/test_invariance.py tests/test_nonfinite.py \
  tests/test_decode.py tests/test_launcher.py tests/test_attention_variants.py \
  -k "not test_variant_forward_backward and not test_varlen_matches" > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; grep -E "(FAILED|ERROR) " "$OUT/tests.log" | sort -u | head -20; tail -1 "$OUT/tests.log"
timeout 120 python benchmarks/hf_long_context.py --out "$OUT" > "$OUT/hf_long.log" 2>&1
echo "hf_long rc=$?"; tail -6 "$OUT/hf_long.log"
timeout 60 python benchmarks/decode_speed.py --batch 1 8 --lengths 4k 32k --block-sizes --time-budget 45 --out "$OUT" > "$OUT/decode.log" 2>&1
echo "decode rc=$?"; tail -14 "$OUT/decode.log"
timeout 170 python benchmarks/first_call.py --quick --time-budget 150 --out "$OUT" > "$OUT/first_call.log" 2>&1
echo "first_call rc=$?"; tail -25 "$OUT/first_call.log"
