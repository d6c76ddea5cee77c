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
# A PATCHES entry "a.patch+b.patch" is one copy with both applied (named "a+b").
# BENCH: instead of checkout_ab.py, a command run in each copy in the same order (bash -c, PYTHONPATH
# set, $RESULT its own folder under $OUT, its output in $OUT/bench-<copy>-<k>.log), e.g.
#   PATCHES="benchmarks/experiments/a.patch benchmarks/experiments/a.patch+benchmarks/experiments/b.patch" \
#     BENCH='python benchmarks/ring_compute.py --out $RESULT --lengths 32k --window 4095' bash benchmarks/experiment_ab.sh
set -uo pipefail
OUT=${OUT:-ab_out}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,memory.used,temperature.gpu,power.draw --format=csv,noheader
work=$(mktemp -d)
copy() { mkdir -p "$1" && cp -r flashattn_lite tests benchmarks examples pyproject.toml "$1"/; }
copy "$work/main"
names=(main)
for entry in ${PATCHES:?name the patch files}; do
  name=""
  for patch in ${entry//+/ }; do name="${name:+$name+}$(basename "$patch" .patch)"; done
  copy "$work/$name"
  for patch in ${entry//+/ }; do
    (cd "$work/$name" && patch -s -p1 < "$OLDPWD/$patch") || { echo "$patch does not apply"; exit 1; }
  done
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
if [ -n "${BENCH:-}" ]; then
  k=0
  for n in "${names[@]}" "${rev[@]}"; do
    k=$((k + 1))
    export RESULT="$OUT/bench-$n-$k"
    mkdir -p "$RESULT"
    (cd "$work/$n" && PYTHONPATH=. timeout "${AB_TIMEOUT:-330}" bash -c "$BENCH" > "$OUT/bench-$n-$k.log" 2>&1)
    echo "== $n (run $k, rc $?)"
    grep -v "^USDT" "$OUT/bench-$n-$k.log" | tail -"${BENCH_TAIL:-4}"
  done
  nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv,noheader
  exit 0
fi
(cd "$work" && timeout "${AB_TIMEOUT:-330}" python "$repo/benchmarks/checkout_ab.py" --pass "${PASS:-forward}" \
  --out "$OUT/gluon_checkout-$stamp.json" "${dirs[@]}" "${names[@]}" "${rev[@]}")
echo "A/B rc $?"
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv,noheader
