#!/usr/bin/env bash
# The kernel measurements in two runs on the GPU machine (carrying the wheels in .whl), the second
# made while the first one's machine is still warm so the kernel cache carries over:
#
#     bash bench/gpu_call.sh measure    # kernels f16/bf16, prefill; files go to $OUT
#     bash bench/gpu_call.sh check      # pytest -m gpu, the sweeps
#     bash bench/gpu_call.sh switches   # the untimed switches alone: timing, and pytest with them on
#     bash bench/gpu_call.sh defaults   # the committed defaults in one call: benchmark, suite, sweeps
#     bash bench/gpu_call.sh qsmem      # prefill with Q's fragments in shared memory (ptxas: no spill)
#
# `defaults` is the one call that checks what is committed, with no switch set (570 s in limits;
# eight files, as many as a run on the GPU machine returns):
#   kernels-f16.{txt,json}, kernels-bf16.{txt,json}   as in `measure`
#   env-and-pytest.txt        the device, `pytest -m gpu tests/gpu`
#   sweep.log, sweep.json     bench/sweep.py, 2,000 configs, warm and then cold compile cache
#   mma-space.txt             as in `check`
# `qsmem` (qsmem.txt, 300 s in limits): tune_mma --prefill at D = 128 and 64 with Q's fragments in
# registers (the default below D = 256) and in shared memory (ATTNSWEEP_MMA_Q_SMEM_FROM), each with
# and without ATTNSWEEP_MMA_EXP2: in shared memory the D = 128 kernel with 128-key tiles uses 242
# registers and no spill, 255 and 72 spilled bytes with EXP2 in registers (ptxas -v, sm_90).
#
# `switches` is for little GPU time: it decides the defaults of
# ATTNSWEEP_MMA_PREFILL_TILE_N and ATTNSWEEP_MMA_EXP2 (and ATTN_MMA_LAZY_RESCALE) in one call of 415 s:
#   prefill.txt               tune_mma as in `measure`, less LAZY_RESCALE alone, D = 256 and Nsight Compute
#   kernels-f16-switches.txt  bench/kernels.py --no-fixed with TILE_N=128 and EXP2=1 (decode and prefill)
#   pytest-switches.txt       `pytest -m gpu tests/gpu` with TILE_N=128 and EXP2=1
#
# Each step has its own time limit, so a stuck one leaves the others; each part's limits add up
# to under the tool's 600 s a call (measure 575 s, check 580 s). In order of what matters most:
#   kernels-f16.{txt,json}    bench/kernels.py --iters 30 --dtypes f16 (ours vs cuDNN and flash)
#   kernels-bf16.{txt,json}   the same, bf16, without the fixed-split columns
#   prefill.txt               bench/tune_mma.py --prefill, 64- and 128-key tiles at D = 32, 64, 128
#                             (32 and 64 at 256), both again at D = 64 and 128 with
#                             -DATTN_MMA_EXP2=1, -DATTN_MMA_LAZY_RESCALE=1 and the two, then Nsight Compute on our prefill (64 and 128
#                             keys) and flash's
#   kernels-f16-prefill-tile128.txt   bench/kernels.py --no-fixed with ATTNSWEEP_MMA_PREFILL_TILE_N=128
#   env-and-pytest.txt        the device, `pytest -m gpu tests/gpu`, all of it again with
#                             ATTNSWEEP_MMA_PREFILL_TILE_N=128, its mma tests with ATTNSWEEP_MMA_EXP2=1
#   sweep.log                 bench/sweep.py, 2,000 configs, warm compile cache
#   mma-space.txt             bench/gpu_evidence.py's sweep pinned to the mma path's space
#
# .whl holds the cp312 wheels the machine lacks (tests/gpu/README.md), made here with:
#   .venv/bin/pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
#     -d .whl SQLAlchemy==2.1.9 greenlet==3.5.6 alembic==1.20.1 Mako==1.4.3 pydantic==2.14.4 \
#     pydantic_core==2.50.5 pydantic-settings==2.16.3 annotated-types==0.8.0 typing-inspection==0.4.5 \
#     typing_extensions==4.16.0 python-dotenv==1.2.4 filelock==4.3.2 prometheus_client==0.26.0 \
#     fastapi==0.165.0 starlette==1.10.0 celery==5.7.0 kombu==5.7.0 vine==5.1.0 billiard==4.3.2 \
#     amqp==5.4.2 redis==8.2.0 click-didyoumean==0.3.1 click-plugins==1.1.1.2 click-repl==0.4.1 \
#     python-dateutil==2.9.0.post0 pytest-timeout==2.4.0 hypothesis==6.170.27 sortedcontainers==2.4.0 \
#     attrs==26.1.0 ml_dtypes==0.7.0
set -u
O=${OUT:?set OUT to the folder whose files come back}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 ATTNSWEEP_KERNEL_CACHE=/tmp/kc PATH=$PATH:/usr/local/cuda/bin

PART=${1:?measure, check, switches, defaults or qsmem}
case $PART in measure|check|switches|defaults|qsmem) ;;
    *) echo "unknown part $PART: measure, check, switches, defaults or qsmem" >&2; exit 2;; esac

# bench/gpu_evidence.py's sweep pinned to the mma path's space (layouts, head dims 8-256), seed $1
mma_space_sweep() {
    timeout 80 python3 bench/gpu_evidence.py --jobs 16 --steps sweep --sweep 2000 --seed "$1" \
        --sweep-arg=--dtypes=f16,bf16 --sweep-arg=--range=trans_q=0 --sweep-arg=--range=trans_k=0 \
        --sweep-arg=--range=trans_v=0 --sweep-arg=--range=head_dim_qk=8:256 --sweep-arg=--range=head_dim_v=8:256 \
        --out /tmp/mma > "$O/mma-space.txt" 2>&1
}

{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv
  nproc; python3 -c "import torch, numpy; print('torch', torch.__version__, 'numpy', numpy.__version__)"; } \
    > "$O/env-$PART.txt" 2>&1

if [ "$PART" = measure ] || [ "$PART" = defaults ]; then
timeout 90 python3 bench/kernels.py --iters 30 --dtypes f16 --out /tmp/k16 > "$O/kernels-f16.txt" 2>&1
cp /tmp/k16/kernels.json "$O/kernels-f16.json" 2>/dev/null
timeout 70 python3 bench/kernels.py --iters 30 --dtypes bf16 --no-fixed --out /tmp/kbf > "$O/kernels-bf16.txt" 2>&1
cp /tmp/kbf/kernels.json "$O/kernels-bf16.json" 2>/dev/null

fi

if [ "$PART" = measure ] || [ "$PART" = switches ]; then
timeout 75 python3 bench/tune_mma.py --prefill --prefill-dims 32,64,128 --dtypes f16,bf16 \
    --settings 64:64:1,64:128:1 --iters 20 --out /tmp/tp > "$O/prefill.txt" 2>&1
DEFINES=(-DATTN_MMA_EXP2=1 -DATTN_MMA_LAZY_RESCALE=1 "-DATTN_MMA_EXP2=1 -DATTN_MMA_LAZY_RESCALE=1")
[ "$PART" = switches ] && DEFINES=(-DATTN_MMA_EXP2=1 "-DATTN_MMA_EXP2=1 -DATTN_MMA_LAZY_RESCALE=1")
for defs in "${DEFINES[@]}"; do
    # shellcheck disable=SC2046
    timeout 45 python3 bench/tune_mma.py --prefill --prefill-dims 64,128 --settings 64:64:1,64:128:1 --iters 20 \
        $(printf -- '--define=%s ' $defs) --out /tmp/tpx >> "$O/prefill.txt" 2>&1
done
NCU="--clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis
     --section WarpStateStats --section Occupancy --section LaunchStats --launch-skip 2 --launch-count 1"
fi

if [ "$PART" = measure ]; then
timeout 35 python3 bench/tune_mma.py --prefill --prefill-dims 256 --settings 64:32:1,64:64:1 --iters 20 \
    --out /tmp/tp256 >> "$O/prefill.txt" 2>&1
# shellcheck disable=SC2086
timeout 40 ncu $NCU --kernel-name regex:attn_splitkv_fwd python3 bench/profile_shape.py prefill >> "$O/prefill.txt" 2>&1
# shellcheck disable=SC2086
ATTNSWEEP_MMA_PREFILL_TILE_N=128 timeout 40 ncu $NCU --kernel-name regex:attn_splitkv_fwd \
    python3 bench/profile_shape.py prefill >> "$O/prefill.txt" 2>&1
# shellcheck disable=SC2086
timeout 40 ncu $NCU --kernel-name regex:flash_fwd_kernel python3 bench/profile_shape.py prefill --torch flash \
    >> "$O/prefill.txt" 2>&1
ATTNSWEEP_MMA_PREFILL_TILE_N=128 timeout 50 python3 bench/kernels.py --iters 30 --dtypes f16 --no-fixed \
    --out /tmp/k128 > "$O/kernels-f16-prefill-tile128.txt" 2>&1
fi

if [ "$PART" = switches ]; then
ATTNSWEEP_MMA_PREFILL_TILE_N=128 ATTNSWEEP_MMA_EXP2=1 timeout 50 python3 bench/kernels.py --iters 30 --dtypes f16 \
    --no-fixed --out /tmp/ksw > "$O/kernels-f16-switches.txt" 2>&1
cp /tmp/ksw/kernels.json "$O/kernels-f16-switches.json" 2>/dev/null
ATTNSWEEP_MMA_PREFILL_TILE_N=128 ATTNSWEEP_MMA_EXP2=1 timeout 200 python3 -m pytest -q -m gpu tests/gpu \
    -p no:cacheprovider > "$O/pytest-switches.txt" 2>&1
fi

if [ "$PART" = check ]; then
mv "$O/env-check.txt" "$O/env-and-pytest.txt"
timeout 170 python3 -m pytest -q -m gpu tests/gpu -p no:cacheprovider >> "$O/env-and-pytest.txt" 2>&1
echo "--- ATTNSWEEP_MMA_PREFILL_TILE_N=128" >> "$O/env-and-pytest.txt"
ATTNSWEEP_MMA_PREFILL_TILE_N=128 timeout 170 python3 -m pytest -q -m gpu tests/gpu -p no:cacheprovider \
    >> "$O/env-and-pytest.txt" 2>&1
echo "--- ATTNSWEEP_MMA_EXP2=1, the mma tests" >> "$O/env-and-pytest.txt"
ATTNSWEEP_MMA_EXP2=1 timeout 60 python3 -m pytest -q -m gpu tests/gpu -p no:cacheprovider \
    -k "mma_path or random_configs_on_the_mma" >> "$O/env-and-pytest.txt" 2>&1

timeout 100 python3 bench/sweep.py --backend cuda --samples 2000 --jobs 16 --cache-dir /tmp/swc --skip-cold \
    --out /tmp/sweep.json > "$O/sweep.log" 2>&1
mma_space_sweep 2033
fi
if [ "$PART" = defaults ]; then
mv "$O/env-defaults.txt" "$O/env-and-pytest.txt"
timeout 170 python3 -m pytest -q -m gpu tests/gpu -p no:cacheprovider >> "$O/env-and-pytest.txt" 2>&1
timeout 160 python3 bench/sweep.py --backend cuda --samples 2000 --jobs 16 --cache-dir /tmp/swc \
    --out /tmp/sweep.json > "$O/sweep.log" 2>&1
cp /tmp/sweep.json "$O/sweep.json" 2>/dev/null
mma_space_sweep 2034
fi
if [ "$PART" = qsmem ]; then
for dq in 128:256 128:128 64:256 64:64; do
    for e in 0 1; do
        echo "--- D = ${dq%%:*}, ATTNSWEEP_MMA_Q_SMEM_FROM=${dq##*:} ATTNSWEEP_MMA_EXP2=$e" >> "$O/qsmem.txt"
        ATTNSWEEP_MMA_Q_SMEM_FROM=${dq##*:} ATTNSWEEP_MMA_EXP2=$e timeout 37 python3 bench/tune_mma.py --prefill \
            --prefill-dims "${dq%%:*}" --dtypes f16 --settings 64:128:1 --iters 20 --out /tmp/tq >> "$O/qsmem.txt" 2>&1
    done
done
fi
ls -la "$O"
