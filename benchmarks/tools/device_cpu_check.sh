#!/bin/bash
# Issue 20's CPU measurements on a lent GPU machine's host CPU (16 cores, often an Intel Xeon), in
# the few minutes a lease gives: the gemm suite, the hf suite against Inductor-freeze at 2 and 1
# threads and with KILN_GEMM_CANDIDATES=mkl,kiln, each job pinned to its own physical cores
# (benchmarks/tools/pinned_bench.py); beside them, on two cores each, the GPU tests and kiln's GEMM in other
# register blockings (benchmarks/tools/gemm_blocking_sweep.py).
# Usage (device machine, repository root): bash benchmarks/tools/device_cpu_check.sh [launch_until_s] [deadline_s] [max_jobs]
# SUITES picks the job groups in order (default "gemm profile hf2 mk2 hf1"), MODELS the hf models (longest
# first by default); SWEEP=0 leaves out the blocking sweep, whose memory traffic the jobs would share;
# GPU=0 the GPU tests and timing.
# The first run (2026-11-27; `git show results-history:docs/results.md`) had 7 jobs at once and
# per-model ratios that moved by tens of percent; max_jobs (default 4) trades suites measured for
# quieter neighbours.
OUT=${OUT:-/tmp/device_out}; R=$OUT/r; mkdir -p $R
LAUNCH_UNTIL=${1:-380}; DEADLINE=${2:-520}; MAX_JOBS=${3:-4}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 KILN_RUNTIME_CACHE_DIR=/tmp/kiln_rt
inc=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['include'])")
# The image's Python may lack its headers (kiln's extension and Inductor's C++ need Python.h).
[ -f "$inc/Python.h" ] || { [ -d .devhdr/python3.12 ] && export CPATH=$PWD/.devhdr/python3.12 && echo "Python.h from .devhdr"; }
{ lscpu; echo; free -g; g++ --version | head -1; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import sys,torch,transformers,triton; print(sys.version.split()[0], torch.__version__, transformers.__version__, triton.__version__, 'mkl', torch.backends.mkl.is_available(), 'mkldnn', torch.backends.mkldnn.is_available())"
} > $R/machine.txt 2>&1
grep -E 'Model name|^CPU\(s\)|Thread|Socket|Flags' $R/machine.txt | cut -c1-400; tail -3 $R/machine.txt
t0=$(date +%s)
python3 -c "from kiln.native import libkiln, python_door; python_door.build_in_background(); libkiln.library(); python_door.module()" \
  && echo "kiln runtime built in $(( $(date +%s) - t0 )) s" || echo "KILN RUNTIME BUILD FAILED"
cores=($(python3 benchmarks/tools/pinned_bench.py --cores)); n=${#cores[@]}
sweep_cores=${cores[0]},${cores[1]}; gpu_cores=${cores[n-2]},${cores[n-1]}  # the jobs get the others
[ "${GPU:-1}" != 0 ] && ( taskset -c $gpu_cores timeout 200 python3 -m pytest -q tests/gpu -p no:cacheprovider -x > $R/gpu_tests.log 2>&1
  taskset -c $gpu_cores timeout 150 python3 -m benchmarks bench --models bert --device cuda --autocast bf16 --batch 8 \
    --modes kiln,kiln-reduce-overhead --iters 30 --json $R/gpu_bench.json > $R/gpu_bench.log 2>&1 ) &
MODELS=${MODELS:-"swinv2 mobilevit gpt2 vit bert t5 convnext llama resnet50 distilbert mobilenetv1"}
B="--iters 10 --warmup 2 --timeout 400"
# Both compilers in each job's process, their compiled calls interleaved: a ratio that the
# neighbours' noise reaches far less than one between two jobs' times.
A="--modes kiln --against inductor-freeze"
jobs=()
for suite in ${SUITES:-gemm profile hf2 mk2 hf1}; do
  case $suite in
    gemm) jobs+=("gemm|2||--suite gemm --dtypes float32 --iters 10 --warmup 2");;
    profile) jobs+=("profile-bert|2||--models bert --modes kiln --profile $B");;
    hf2) for m in $MODELS; do jobs+=("hf2-$m|2||--models $m $A $B"); done;;
    mk2) for m in $MODELS; do jobs+=("mk2-$m|2|KILN_GEMM_CANDIDATES=mkl,kiln|--models $m $A $B"); done;;
    hf1) for m in $MODELS; do jobs+=("hf1-$m|1||--models $m $A $B"); done;;
    *) echo "SUITES: unknown group '$suite' (accepted: gemm profile hf2 mk2 hf1)"; exit 2;;
  esac
done
# kiln's GEMM in other register blockings against MKL's, on 2 cores of their own (a plain script, not a bench job).
exclude=$gpu_cores
if [ "${SWEEP:-1}" != 0 ]; then
  exclude=$sweep_cores,$gpu_cores
  ( taskset -c $sweep_cores timeout 240 python3 benchmarks/tools/gemm_blocking_sweep.py --threads 2 > $R/gemm_blocking.txt 2>&1 ) &
fi
python3 benchmarks/tools/pinned_bench.py --out $R --exclude $exclude --max-jobs $MAX_JOBS --launch-until $LAUNCH_UNTIL --deadline $DEADLINE "${jobs[@]}" 2>&1 | tee $R/schedule.txt
# The jobs' results archived before waiting for the work beside them: a call cut short by its own
# time limit still brings them back (only 8 files come back from a lease, not one per job).
tar czf $OUT/results.tgz -C $R .
wait
tail -5 $R/gpu_tests.log; tail -12 $R/gpu_bench.log
tar czf $OUT/results.tgz -C $R . && ls -la $OUT
