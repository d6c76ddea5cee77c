#!/usr/bin/env bash
# One time-boxed GPU job: GPU tests, then the named benchmarks, results under $OUT. For machines with
# a per-job time limit; without one, `python -m pytest -q -n 8 tests` runs the whole suite at once.
#   TESTS="tests/test_attention.py" BENCH="benchmarks/attention_speed.py" bash benchmarks/gpu_check.sh
#   TESTS= BENCH="benchmarks/softmax_speed.py benchmarks/decode_speed.py benchmarks/memory.py" bash benchmarks/gpu_check.sh
# The whole script stays within TOTAL seconds (default 540, under a 10-minute job limit):
# - Tests (default: all of tests/) run with FLASHATTN_LITE_AUTOTUNE=0 (first fitting config; they check
#   results, not speed) on WORKERS pytest workers (default 6: 16 ran the GPU out of memory on the
#   float64 references), killed after TEST_TIMEOUT seconds (default 300 with BENCH, else TOTAL - 30).
#   DIST (default worksteal) is pytest-xdist's --dist: each worker starts on its own slice of the tests
#   and idle workers take over the unstarted half of the longest queue, so a run of slow tests (the
#   fuzz tests sit together) does not leave one worker busy while the others idle, as "load" did.
#   The fuzz tests draw a few cases each here (tests/test_fuzz.py); a larger budget is a job of its
#   own: TESTS=tests/test_fuzz.py FLASHATTN_LITE_FUZZ_EXAMPLES=30 bash benchmarks/gpu_check.sh
#   Each test's PASSED/FAILED line goes to $OUT/tests.log as it ends (-v), so a killed run still says
#   what failed; FAILED/ERROR lines are printed. TESTS="" skips the tests.
#   Each test's duration goes to $OUT/test_times.txt as it ends (the slowest are printed).
#   Tracebacks print only when pytest ends: re-run the named failures with benchmarks/gpu_retest.sh.
# - Each BENCH script (memory.py, attention_speed.py, softmax_speed.py, decode_speed.py) runs with
#   --quick (attention_speed.py with --rounds 3 too) and --time-budget: the time left, split evenly
#   over the scripts not yet run (a script that finishes early leaves its time to the later ones, so
#   put the longest, memory.py, last), less 45 s for start-up and the point in flight; `timeout`
#   kills it at its share. Each prints a line per point and rewrites its JSON + CSV in $OUT after
#   every point, so a cut-off run keeps what it measured. BENCH_ARGS are added to every script
#   (options all of them take).
# - PART=1 or PART=2 (with TESTS unset) runs one half of tests/, for the whole suite in two jobs
#   (it needs ~620 s with 14 workers on an H200, more than one 10-minute job):
#     PART=1 TOTAL=560 WORKERS=14 bash benchmarks/gpu_check.sh   # attention, compile, fuzz, HF, invariance,
#                                                                #   nn, sdpa (PART_1 below; ~350 s)
#     PART=2 TOTAL=400 WORKERS=14 bash benchmarks/gpu_check.sh   # every other file (~270 s)
#   A test file added to tests/ lands in PART=2 unless PART_1 below names it.
# - Everything is written to a work folder and packed into one file, $OUT/results.tgz, when the script
#   exits (also when a step was cut short): one file to copy back from the machine.
set -uo pipefail
FINAL_OUT=${OUT:-gpu_out}
TOTAL=${TOTAL:-540}
OUT=$(mktemp -d)
mkdir -p "$FINAL_OUT"
trap 'tar czf "$FINAL_OUT/results.tgz" -C "$OUT" . && rm -rf "$OUT"' EXIT
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
PART_1="test_attention.py test_attention_bwd_gluon.py test_attention_bwd_gluon_varlen.py
  test_attention_bwd_gluon_window.py test_attention_bwd_hopper.py test_attention_bwd_short.py test_attention_gluon.py
  test_attention_gluon_variants.py test_attention_gluon_varlen.py test_attention_gluon_window.py test_attention_hopper.py
  test_attention_out.py test_attention_variants.py test_compile.py test_fuzz.py test_hf.py test_invariance.py test_nn.py
  test_sdpa.py"
if [ -z "${TESTS+set}" ] && [ -n "${PART:-}" ]; then
  TESTS=""
  for f in tests/test_*.py; do
    case " $(echo $PART_1) " in *" $(basename "$f") "*) in_1=1 ;; *) in_1=2 ;; esac
    [ "$in_1" = "$PART" ] && TESTS="$TESTS $f"
  done
  [ -n "$TESTS" ] || { echo "PART must be 1 or 2, got '$PART'"; exit 2; }
fi
status=0
if [ -n "${TESTS-tests}" ]; then
  test_timeout=${TEST_TIMEOUT:-$([ -n "${BENCH:-}" ] && echo 300 || echo $((TOTAL - 30)))}
  FLASHATTN_LITE_AUTOTUNE=0 FLASHATTN_LITE_TEST_TIMES="$OUT/test_times.txt" timeout "$test_timeout" python -m pytest -v --tb=line -n "${WORKERS:-6}" --dist "${DIST:-worksteal}" ${TESTS:-tests} \
    > "$OUT/tests.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && status=1
  [ $rc -eq 124 ] && echo "tests: killed by timeout after ${test_timeout}s (see $OUT/tests.log)"
  grep -E "(^|\] )(FAILED|ERROR) |^/.*:[0-9]+: " "$OUT/tests.log" | sort -u | head -40
  tail -2 "$OUT/tests.log"
  [ -f "$OUT/test_times.txt" ] && echo "slowest tests (s):" && sort -rn "$OUT/test_times.txt" | head -8
fi
set -- ${BENCH:-}
while [ $# -gt 0 ]; do
  bench=$1
  share=$(( (TOTAL - SECONDS) / $# ))
  budget=$(( share - 45 ))
  log="$OUT/$(basename "$bench" .py).log"
  echo "== $bench (--time-budget ${budget}s, killed at ${share}s; ${SECONDS}s used so far)"
  if [ $budget -lt 20 ]; then
    echo "   not run: no time left"; status=1; shift; continue
  fi
  extra=""  # the attention table: each point's methods timed in turn over three rounds
  [ "$(basename "$bench")" = attention_speed.py ] && extra="--rounds 3"
  timeout "$share" python "$bench" --out "$OUT" --quick --time-budget "$budget" $extra ${BENCH_ARGS:-} > "$log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && status=1
  [ $rc -eq 124 ] && echo "   killed by timeout after ${share}s: the points measured are in $log and $OUT/*.json"
  tail -60 "$log"
  shift
done
exit $status
