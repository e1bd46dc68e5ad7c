#!/bin/bash
# kiln's GPU check (issue 50) on a lent H100/H200, in one call of at most 8 minutes. The machine has
# torch, Triton and transformers; kiln runs from this checkout (PYTHONPATH, not installed):
#   - the machine and versions; kiln's runtime built once, for every run after it;
#   - tests/gpu (at most 90 s), then `kiln bench-launch` (host cost per Triton launch, at most
#     60 s), beside the first run, holding the GPU timing lock;
#   - `kiln bench --suite gpu --device cuda --dtype bf16 --batch 8`: kiln against Inductor, then both
#     with CUDA graphs (reduce-overhead); each case's two compilers in one process, their calls timed
#     by CUDA events in interleaved rounds, median of 30 after 3 warm-ups, cold caches per case;
#   - AMP training (bf16 autocast, float32 weights) of bert at batch 8, kiln against Inductor;
#   - a profile of GPT-2 and BERT, kiln beside Inductor (gpu_profile.txt), then of BERT's AMP step
#     (after it in gpu_profile.txt), if time is left;
#   - the two bf16 runs at batch 1, if time is left (BATCH1=0: never).
# Two lanes: bf16, bf16 with CUDA graphs, then its batch 1; beside them the GPU tests, AMP training,
# then bf16 batch 1. JOBS cases at once per run (2 for that last one, beside the main lane's second
# run, which comes first), their GPU timings one at a time (one lock for all runs and the tests:
# benchmarks/timing_lock.py). A run still going near the deadline is stopped (SIGTERM: kiln bench
# kills its cases), and its JSON is rewritten after each case: a run cut short keeps what it measured.
# Into $OUT, 8 files at most: NAME.json per run, gpu_profile.txt, gpu_check.md (every run's tables), gpu_check.log
# (setup, the tests, each run's output and the last lines of each case's own log).
#
# Usage (device machine, repository root): bash benchmarks/tools/gpu_check.sh [deadline_s]
#   deadline_s (default 420): seconds after the start by which everything has ended; give the call
#   a limit of deadline_s + 60.
# Environment: BATCH1=0 leaves out the batch-1 runs; PROFILE=0 the profiles (PROFILE_MODELS: gpt2,bert;
# PROFILE_TRAIN_MODELS: bert, the AMP step's, empty for none);
# MODELS (e.g. gpt2): the inference runs' models instead of the suite's; TRAIN_MODELS= (empty) no
# AMP training; RAGGED=1 adds benchmarks/tools/ragged_product.py after bench-launch; JOBS (4), ITERS (30), WARMUP (3), THREADS (2:
# the CPU threads of each case, where its float32 and float64 references run); PYTHON (python3).
# GPU_CHECK_DRY=1 prints every command with its time limit and runs none. DEVICE=cpu SUITE=unit
# TRAIN_MODELS=mlp try the script's own logic on a CPU machine (tests/gpu then skips itself).
set -u
START=$(date +%s)
DEADLINE=${1:-420}
OUT=${OUT:-/tmp/gpu_out}
DRY=${GPU_CHECK_DRY:-0} DEVICE=${DEVICE:-cuda} SUITE=${SUITE:-gpu} TRAIN_MODELS=${TRAIN_MODELS-bert}
TESTS=${TESTS:-tests/gpu} JOBS=${JOBS:-4} ITERS=${ITERS:-30} WARMUP=${WARMUP:-3} THREADS=${THREADS:-2}
BATCH1=${BATCH1:-1} PROFILE=${PROFILE:-1} MODELS=${MODELS:-} RAGGED=${RAGGED:-0} PROFILE_MODELS=${PROFILE_MODELS:-gpt2,bert} PROFILE_TRAIN_MODELS=${PROFILE_TRAIN_MODELS-bert} PY=${PYTHON:-python3}
STOP_BEFORE=30  # a run is stopped this long before the deadline: 20 s to die, 10 to gather the files
RUNS="bf16-b8 bf16-b8-ro amp-train-b8 bf16-b1 bf16-b1-ro"
# The inference runs' models: the suite's, or those MODELS names.
if [ -n "$MODELS" ]; then PICK=(--models "$MODELS"); else PICK=(--suite "$SUITE"); fi
mkdir -p "$OUT"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
LOG=$OUT/gpu_check.log MD=$OUT/gpu_check.md
: > "$LOG"

say() { echo "$*" | tee -a "$LOG"; }
left() { echo $(( DEADLINE - ($(date +%s) - START) )); }
# run LOGFILE CMD...: say the command (shell-quoted), then run it with its output in LOGFILE, unless dry.
run() {
  local log=$1; shift
  say "+ $(printf '%q ' "$@")"
  [ "$DRY" = 1 ] && return 0
  "$@" >> "$log" 2>&1
}

if ls .whl/*.whl >/dev/null 2>&1; then
  run "$LOG" $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# Every cache under $WORK, never the home directory (kiln bench gives each case cold caches of its
# own); kiln's runtime built once below, in no case's compile time; one GPU timing lock for all.
export KILN_CACHE_DIR=$WORK/kiln TORCHINDUCTOR_CACHE_DIR=$WORK/inductor TRITON_CACHE_DIR=$WORK/triton \
  KILN_RUNTIME_CACHE_DIR=$WORK/kiln-runtime KILN_BENCH_TIMING_LOCK=$WORK/gpu-timing.lock
# Each GPU graph's precompile in the case logs ("N kernels precompiled in S s, W workers"): where
# kiln's first call spends its "load" part (KILN_TRITON_GEMM=never beside a default run shows
# what timing the product template against cuBLAS costs in compile time).
export KILN_LOGS=${KILN_LOGS:-triton}
# kiln's Triton compile workers: the cores shared among the cases that run at once (one per core
# in each case would start JOBS x cores processes, each importing torch).
# Inductor's compile processes as many (its default is one per core in every case: before
# 2026-12-04 its compile times had 4x kiln's workers on the 16-core H200 host).
export KILN_COMPILE_WORKERS=${KILN_COMPILE_WORKERS:-$(( $(nproc) / JOBS > 0 ? $(nproc) / JOBS : 1 ))}
export TORCHINDUCTOR_COMPILE_THREADS=${TORCHINDUCTOR_COMPILE_THREADS:-$KILN_COMPILE_WORKERS}

if [ "$DRY" != 1 ]; then
  inc=$($PY -c "import sysconfig; print(sysconfig.get_paths()['include'])")
  # The image's Python may lack its headers (kiln's extension and Inductor's C++ need Python.h).
  [ -f "$inc/Python.h" ] || { [ -d .devhdr/python3.12 ] && export CPATH=$PWD/.devhdr/python3.12 && say "Python.h from .devhdr"; }
  { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo "no nvidia-smi"
    $PY -c "import sys, torch, transformers; print('python', sys.version.split()[0], 'torch', torch.__version__,
'cuda', torch.version.cuda, 'transformers', transformers.__version__)"
    $PY -c "import triton; print('triton', triton.__version__)" || echo "no triton"
    echo "$(nproc) CPUs, $(free -g | awk '/Mem:/ {print $2}') GiB; kiln $(git log -1 --format='%h %s' 2>/dev/null | cut -c1-80)"
  } 2>&1 | tee -a "$LOG"
fi
t0=$(date +%s)
if run "$LOG" timeout 180 $PY -c "from kiln.native import libkiln, python_door; python_door.build_in_background(); libkiln.library(); python_door.module()"; then
  say "kiln's runtime built in $(( $(date +%s) - t0 )) s"
else
  say "KILN RUNTIME BUILD FAILED: $(tail -3 "$LOG")"
fi

# bench NAME CAP MIN JOBS ARGS...: one kiln bench run of at most CAP seconds, JOBS cases at once,
# stopped before the deadline, not started with fewer than MIN seconds left; JSON into $OUT,
# markdown, log and case logs into $WORK.
bench() {
  local name=$1 cap=$2 min=$3 jobs=$4; shift 4
  local budget=$(( $(left) - STOP_BEFORE ))
  (( budget > cap )) && budget=$cap
  if (( budget < min )); then say "$name: not run, $budget s left before the deadline (it needs $min)"; return 0; fi
  mkdir -p "$WORK/$name.cases"
  local t0=$(date +%s)
  run "$WORK/$name.log" timeout -k 20 "$budget" $PY -m benchmarks bench --device "$DEVICE" --threads "$THREADS" \
    --iters "$ITERS" --warmup "$WARMUP" --timeout "$budget" --jobs "$jobs" "$@" \
    --json "$OUT/$name.json" --markdown "$WORK/$name.md" --case-logs "$WORK/$name.cases"
  say "$name: exit $? after $(( $(date +%s) - t0 )) s (limit $budget s)"
}

# Beside the main lane: the GPU tests (holding the timing lock: no case times meanwhile), AMP training, batch 1.
beside() {
  local t=$(( $(left) - STOP_BEFORE )); (( t > 90 )) && t=90
  run "$WORK/tests.log" timeout -k 10 "$t" $PY -m benchmarks.timing_lock \
    $PY -m pytest -q "$TESTS" -p no:cacheprovider --maxfail=15
  say "tests: exit $?"
  # The host's cost per Triton launch, through Triton and direct (benchmarks/launch_cost.py).
  run "$WORK/launch.log" timeout -k 10 60 $PY -m benchmarks.timing_lock $PY -m benchmarks bench-launch --rounds 5
  say "bench-launch: exit $?"
  if [ "$RAGGED" = 1 ]; then
    run "$WORK/launch.log" timeout -k 10 60 $PY -m benchmarks.timing_lock $PY benchmarks/tools/ragged_product.py
    say "ragged_product: exit $?"
  fi
  [ -n "$TRAIN_MODELS" ] && bench amp-train-b8 240 60 "$JOBS" --models "$TRAIN_MODELS" --train --autocast bf16 --batch 8 --modes kiln --against inductor
  # Where GPT-2's and BERT's calls go, kiln beside Inductor (benchmarks/tools/gpu_profile.py: kernels
  # by GPU time, launches, waits), holding the timing lock; if 100 s are left (PROFILE=0: never).
  t=$(( $(left) - STOP_BEFORE )); (( t > 150 )) && t=150
  if [ "$PROFILE" != 1 ]; then :
  elif (( t >= 100 )); then
    run "$OUT/gpu_profile.txt" timeout -k 10 "$t" $PY -m benchmarks.timing_lock \
      $PY benchmarks/tools/gpu_profile.py --models "$PROFILE_MODELS" --modes kiln,inductor --top 60
    say "gpu_profile: exit $?"
  else say "gpu_profile: not run, $t s left before the deadline (it needs 100)"; fi
  # The AMP training step's profile (PROFILE_TRAIN_MODELS, bert; empty: never), if 100 s are left.
  t=$(( $(left) - STOP_BEFORE )); (( t > 150 )) && t=150
  if [ "$PROFILE" != 1 ] || [ -z "$PROFILE_TRAIN_MODELS" ]; then :
  elif (( t >= 100 )); then
    run "$OUT/gpu_profile.txt" timeout -k 10 "$t" $PY -m benchmarks.timing_lock \
      $PY benchmarks/tools/gpu_profile.py --models "$PROFILE_TRAIN_MODELS" --modes kiln,inductor --train --top 60
    say "gpu_profile --train: exit $?"
  else say "gpu_profile --train: not run, $t s left before the deadline (it needs 100)"; fi
  # (fewer at once: beside the main lane's second run, which comes first)
  [ "$BATCH1" = 1 ] && bench bf16-b1 240 90 2 "${PICK[@]}" --dtype bf16 --batch 1 --modes kiln --against inductor
}
beside &
bench bf16-b8 240 60 "$JOBS" "${PICK[@]}" --dtype bf16 --batch 8 --modes kiln --against inductor
bench bf16-b8-ro 240 60 "$JOBS" "${PICK[@]}" --dtype bf16 --batch 8 --modes kiln-reduce-overhead \
  --against inductor-reduce-overhead
[ "$BATCH1" = 1 ] && bench bf16-b1-ro 240 90 "$JOBS" "${PICK[@]}" --dtype bf16 --batch 1 --modes kiln-reduce-overhead \
  --against inductor-reduce-overhead
wait
[ "$DRY" = 1 ] && exit 0

# Gathered: every run's markdown into one file, every log into another; a summary on stdout.
: > "$MD"
for name in $RUNS; do [ -f "$WORK/$name.md" ] && { cat "$WORK/$name.md"; echo; } >> "$MD"; done
{ echo; echo "==== $TESTS"; cat "$WORK/tests.log" 2>/dev/null
  echo; echo "==== kiln bench-launch"; cat "$WORK/launch.log" 2>/dev/null
  for name in $RUNS; do
    [ -f "$WORK/$name.log" ] || continue
    echo; echo "==== $name"; cat "$WORK/$name.log"
    for f in "$WORK/$name.cases"/*.log; do
      [ -f "$f" ] && { echo "---- $name, case log $(basename "$f") (its last 150 lines)"; tail -150 "$f"; }
    done
  done
} >> "$LOG"
echo; echo "==== $TESTS"; tail -15 "$WORK/tests.log" 2>/dev/null
echo; echo "==== kiln bench-launch"; tail -30 "$WORK/launch.log" 2>/dev/null
echo; echo "==== gpu_profile (every kernel in gpu_profile.txt)"
grep -a -E "^== |^per call" "$OUT/gpu_profile.txt" 2>/dev/null
for name in $RUNS; do
  [ -f "$WORK/$name.log" ] || continue
  echo; echo "==== $name"
  # The text report's table of each case against its peer; a run stopped early has none: its
  # progress lines then, and always those of cases that failed (the JSON has every field).
  table=$(awk '/^Each case against its peer/ {on=1} on && /^$/ {exit} on' "$WORK/$name.log")
  if [ -n "$table" ]; then
    echo "$table"; grep -a '^\[[0-9]*/[0-9]*\]' "$WORK/$name.log" | grep -aE 'FAIL|ERROR|TIMEOUT|CRASH|wrong' || true
  else
    grep -a '^\[[0-9]*/[0-9]*\]' "$WORK/$name.log"
  fi
done
echo; ls -la "$OUT"; echo "ended after $(( $(date +%s) - START )) s (deadline $DEADLINE s)"
