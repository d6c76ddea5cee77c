#!/usr/bin/env bash
# One device call for a kernel experiment kept as a patch (benchmarks/experiments/): copies of this
# checkout with and without each patch, the patched copies' GPU tests, then an A/B of the kernels
# through checkout_ab.py (old, new..., then the reverse order: the GPU's clock drifts over a run).
#   PATCHES="benchmarks/experiments/fwd-defer-store-wait.patch" TESTS="tests/test_attention_gluon_persistent.py" \
#     PASS=forward bash benchmarks/experiment_ab.sh
# PATCHES: one or more patch files (each gets its own copy, named after the file); TESTS: the test
# files run in each patched copy (FLASHATTN_LITE_AUTOTUNE=0, WORKERS pytest workers, default 8,
# killed after TEST_TIMEOUT s, default 180); PASS: forward or backward (gluon_checkout.py);
# AB_TIMEOUT: seconds for the whole A/B (default 330). Results (the A/B JSON, the test logs) in $OUT.
set -uo pipefail
OUT=${OUT:-ab_out}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,memory.used,temperature.gpu,power.draw --format=csv,noheader
work=$(mktemp -d)
copy() { mkdir -p "$1" && cp -r flashattn_lite tests benchmarks pyproject.toml "$1"/; }
copy "$work/main"
names=(main)
for patch in ${PATCHES:?name the patch files}; do
  name=$(basename "$patch" .patch)
  copy "$work/$name"
  (cd "$work/$name" && patch -s -p1 < "$OLDPWD/$patch") || { echo "$patch does not apply"; exit 1; }
  names+=("$name")
  if [ -n "${TESTS:-}" ]; then
    (cd "$work/$name" && PYTHONPATH=. FLASHATTN_LITE_AUTOTUNE=0 timeout "${TEST_TIMEOUT:-180}" \
      python -m pytest -q -n "${WORKERS:-8}" ${TESTS} > "$OUT/tests-$name.log" 2>&1)
    echo "$name tests (rc $?): $(tail -1 "$OUT/tests-$name.log")"
    grep -E "^(FAILED|ERROR) " "$OUT/tests-$name.log" | head -10
  fi
done
dirs=()  # relative to $work: the JSON records the copies' names, not temporary paths
for n in "${names[@]}"; do dirs+=("$n=$n"); done
repo=$PWD
rev=()
for ((i=${#names[@]}-1; i>=0; i--)); do rev+=("${names[i]}"); done
stamp=$(date +%Y%m%d-%H%M)
(cd "$work" && timeout "${AB_TIMEOUT:-330}" python "$repo/benchmarks/checkout_ab.py" --pass "${PASS:-forward}" \
  --out "$OUT/gluon_checkout-$stamp.json" "${dirs[@]}" "${names[@]}" "${rev[@]}")
echo "A/B rc $?"
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv,noheader
