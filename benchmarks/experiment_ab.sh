#!/usr/bin/env bash
# One device call for a kernel experiment kept as a patch (benchmarks/experiments/): copies of this
# checkout with and without each patch, the patched copies' GPU tests, then an A/B of the kernels
# through checkout_ab.py (old, new..., then the reverse order: the GPU's clock drifts over a run).
#   PATCHES="benchmarks/experiments/fwd-defer-store-wait.patch" TESTS="tests/test_attention_gluon_persistent.py" \
#     PASS=forward bash benchmarks/experiment_ab.sh
# PATCHES: one or more patch files (each gets its own copy, named after the file); TESTS: the test
# files run in each patched copy (FLASHATTN_LITE_AUTOTUNE=0, WORKERS pytest workers, default 8,
# killed after TEST_TIMEOUT s, default 180; TESTS is split on spaces, so a -k expression goes in
# PYTEST_ADDOPTS, e.g. PYTEST_ADDOPTS="-k 'value or padded'"); PASS: forward, backward or backward256
# (gluon_checkout.py);
# AB_TIMEOUT: seconds for the whole A/B (default 330). Results (the A/B JSON, the test logs) in $OUT.
# A PATCHES entry "a.patch+b.patch" is one copy with both applied (named "a+b"; "a__b" in file names).
# The device returns few files: the logs end up in one file, ab-logs-<stamp>.log, and BENCH's JSON
# results in one, bench_ab-<stamp>.json ({"runs": [{"copy", "run", "result"}]}).
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
      python -m pytest -v --tb=line -n "${WORKERS:-8}" ${TESTS} > "$OUT/tests-${name//+/__}.log" 2>&1)
    echo "$name tests (rc $?): $(tail -1 "$OUT/tests-${name//+/__}.log")"
    # -v names each failure as it happens, so a run cut off by TEST_TIMEOUT still says which failed
    grep -oE "(FAILED|ERROR) tests/[^ ]+" "$OUT/tests-${name//+/__}.log" | sort -u | head -10
  fi
done
dirs=()  # relative to $work: the JSON records the copies' names, not temporary paths
for n in "${names[@]}"; do dirs+=("$n=$n"); done
repo=$PWD
rev=()
for ((i=${#names[@]}-1; i>=0; i--)); do rev+=("${names[i]}"); done
stamp=$(date +%Y%m%d-%H%M)
pack() {  # the logs into one file, BENCH's JSON into one
  for f in "$OUT"/tests-*.log "$OUT"/bench-*.log; do
    [ -f "$f" ] && { echo "==== $(basename "$f")"; cat "$f"; rm "$f"; }
  done > "$OUT/ab-logs-$stamp.log"
  python - "$OUT" "$stamp" <<'PY'
import json, shutil, sys
from pathlib import Path
out, stamp = Path(sys.argv[1]), sys.argv[2]
runs = []
for d in sorted((d for d in out.glob("bench-*") if d.is_dir()), key=lambda d: int(d.name.rsplit("-", 1)[1])):
    for f in sorted(d.glob("*.json")):
        runs.append({"copy": d.name[len("bench-"):].rsplit("-", 1)[0].replace("__", "+"),
                     "run": int(d.name.rsplit("-", 1)[1]), "result": json.loads(f.read_text())})
    shutil.rmtree(d)
if runs:
    (out / f"bench_ab-{stamp}.json").write_text(json.dumps({"runs": runs}, indent=1))
PY
}
if [ -n "${BENCH:-}" ]; then
  k=0
  for n in "${names[@]}" "${rev[@]}"; do
    k=$((k + 1))
    export RESULT="$OUT/bench-${n//+/__}-$k"
    mkdir -p "$RESULT"
    (cd "$work/$n" && PYTHONPATH=. timeout "${AB_TIMEOUT:-330}" bash -c "$BENCH" > "$RESULT.log" 2>&1)
    echo "== $n (run $k, rc $?)"
    grep -v "^USDT" "$RESULT.log" | tail -"${BENCH_TAIL:-4}"
  done
  nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv,noheader
  pack
  exit 0
fi
(cd "$work" && timeout "${AB_TIMEOUT:-330}" python "$repo/benchmarks/checkout_ab.py" --pass "${PASS:-forward}" \
  --out "$OUT/gluon_checkout-$stamp.json" "${dirs[@]}" "${names[@]}" "${rev[@]}")
echo "A/B rc $?"
pack
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv,noheader
