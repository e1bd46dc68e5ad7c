#!/bin/bash
# kiln's checks on a lent GPU machine (torch, triton and transformers are already there): the
# GPU tests, the OpInfo subset on CUDA tensors, the host cost of a Triton launch (`kiln
# bench-launch`) and a timing of HuggingFace models.
# Usage (on the device machine, from the repository root): bash tools/gpu_check.sh [opinfo_s] [timing args...]
OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT"
OPINFO_S=${1:-150}; shift
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 KILN_CACHE_DIR=/tmp/kiln_cache
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import sys,torch,triton,transformers;print(sys.version.split()[0],torch.__version__,triton.__version__,transformers.__version__)"
timeout 150 python3 -m pytest -q tests/gpu -p no:cacheprovider --maxfail=15 2>&1 | tee $OUT/gpu_tests.log | tail -60
if [ "$OPINFO_S" != 0 ]; then
  timeout $OPINFO_S env KILN_TEST_DEVICE=cuda python3 -m pytest -q tests/ops/test_opinfo_triton.py -n 12 -p no:cacheprovider 2>&1 | tee $OUT/opinfo_cuda.log | grep -E "FAILED|ERROR|passed|failed" | tail -40
fi
timeout 120 python3 -m kiln.cli bench-launch --rounds 5 2>&1 | tee $OUT/bench_launch.log | tail -8
timeout 240 python3 tools/gpu_timing.py "$@" 2>&1 | tee $OUT/timing.log | tail -40
