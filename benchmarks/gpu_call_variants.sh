#!/usr/bin/env bash
# The variants' GPU check: HF families, configs/explain/warmup, the changed varlen/ranges/softcap paths;
# then the variants benchmark and the HF long-context check. Results under $OUT.
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1 FLASHATTN_LITE_AUTOTUNE=0
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,memory.used --format=csv,noheader
timeout 250 python -m pytest -q -n 8 --tb=line tests/test_hf.py tests/test_configs.py tests/test_explain.py \
  tests/test_warmup.py tests/test_compile.py \
  "tests/test_attention_variants.py" -k "not test_variant_forward_backward or softcap or all" > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; grep -E "FAILED|ERROR|passed|failed" "$OUT/tests.log" | tail -25
timeout 150 python benchmarks/variants.py --out "$OUT" --quick --time-budget 120 > "$OUT/variants.log" 2>&1
echo "variants rc=$?"; tail -25 "$OUT/variants.log"
timeout 150 python benchmarks/hf_long_context.py --out "$OUT" > "$OUT/hf_long.log" 2>&1
echo "hf_long rc=$?"; tail -30 "$OUT/hf_long.log"
