#!/usr/bin/env bash
# The kernel and sweep measurements on a GPU machine that has no network (carrying the wheels in
# .whl), in two parts; each part's step limits add up to under 600 s, and a stuck step leaves
# the others:
#
#     bash tools/evidence/gpu_call.sh defaults   # benchmark, GPU suite, sweeps; files go to $OUT
#     bash tools/evidence/gpu_call.sh tune       # prefill tile settings and Nsight Compute
#     bash tools/evidence/gpu_call.sh regimes    # per-regime calibration, defects with regimes
#     bash tools/evidence/gpu_call.sh triage     # each numeric defect switch swept and triaged
#     bash tools/evidence/gpu_call.sh triage-faults   # the same for the fault switches
#
# `defaults` checks what is committed, with no kernel setting overridden (570 s in limits):
#   env-and-pytest.txt        the device, `pytest -m gpu tests/gpu`
#   kernels-f16.{txt,json}    bench/kernels.py --iters 30 --dtypes f16 (ours vs cuDNN and flash)
#   kernels-bf16.{txt,json}   the same, bf16, without the fixed-split columns
#   sweep.log, sweep.json     bench/sweep.py, 2,000 configs, warm and then cold compile cache
#   mma-space.txt             tools/evidence/gpu_evidence.py's sweep pinned to the mma path's space
# `tune` (300 s in limits):
#   env-tune.txt              the device
#   prefill.txt               tools/tune_mma.py --prefill, 64- and 128-key tiles at D = 32, 64,
#                             128 (32 and 64 at 256), then Nsight Compute on our prefill and flash's
#
# `regimes` (550 s in limits):
#   regimes/                  tools/evidence/regimes.py, 2,000 configs of each regime but normal
#   regime-defects.txt        gpu_evidence.py regime-defects for no_zero_sum_guard and
#                             combine_no_max_shift, 300 configs a sweep (its files stay)
# `triage` (525 s in limits), `triage-faults` (540 s):
#   triage.txt, triage.jsonl  per defect switch: a sweep with it compiled in (300 configs; 150 for
#                             a fault switch), then `attnsweep triage --json` (a JSON line each)
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

PART=${1:?defaults, tune, regimes, triage or triage-faults}
case $PART in defaults|tune|regimes|triage|triage-faults) ;;
    *) echo "unknown part $PART: defaults, tune, regimes, triage or triage-faults" >&2; exit 2;; esac

{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv
  nproc; python3 -c "import torch, numpy; print('torch', torch.__version__, 'numpy', numpy.__version__)"; } \
    > "$O/env-$PART.txt" 2>&1

if [ "$PART" = defaults ]; then
mv "$O/env-defaults.txt" "$O/env-and-pytest.txt"
timeout 170 python3 -m pytest -q -m gpu tests/gpu -p no:cacheprovider >> "$O/env-and-pytest.txt" 2>&1
timeout 90 python3 bench/kernels.py --iters 30 --dtypes f16 --out /tmp/k16 > "$O/kernels-f16.txt" 2>&1
cp /tmp/k16/kernels.json "$O/kernels-f16.json" 2>/dev/null
timeout 70 python3 bench/kernels.py --iters 30 --dtypes bf16 --no-fixed --out /tmp/kbf > "$O/kernels-bf16.txt" 2>&1
cp /tmp/kbf/kernels.json "$O/kernels-bf16.json" 2>/dev/null
timeout 160 python3 bench/sweep.py --backend cuda --samples 2000 --jobs 16 --cache-dir /tmp/swc \
    --out /tmp/sweep.json > "$O/sweep.log" 2>&1
cp /tmp/sweep.json "$O/sweep.json" 2>/dev/null
# the sweep pinned to the mma path's space (layouts, head dims 8-256)
timeout 80 python3 tools/evidence/gpu_evidence.py --jobs 16 --steps sweep --sweep 2000 --seed 2034 \
    --sweep-arg=--dtypes=f16,bf16 --sweep-arg=--range=trans_q=0 --sweep-arg=--range=trans_k=0 \
    --sweep-arg=--range=trans_v=0 --sweep-arg=--range=head_dim_qk=8:256 --sweep-arg=--range=head_dim_v=8:256 \
    --out /tmp/mma > "$O/mma-space.txt" 2>&1
fi

if [ "$PART" = tune ]; then
timeout 75 python3 tools/tune_mma.py --prefill --prefill-dims 32,64,128 --dtypes f16,bf16 \
    --settings 64:64:1,64:128:1 --iters 20 --out /tmp/tp > "$O/prefill.txt" 2>&1
timeout 35 python3 tools/tune_mma.py --prefill --prefill-dims 256 --settings 64:32:1,64:64:1 --iters 20 \
    --out /tmp/tp256 >> "$O/prefill.txt" 2>&1
NCU="--clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis
     --section WarpStateStats --section Occupancy --section LaunchStats --launch-skip 2 --launch-count 1"
# shellcheck disable=SC2086
timeout 40 ncu $NCU --kernel-name regex:attn_splitkv_fwd python3 tools/profile_shape.py prefill >> "$O/prefill.txt" 2>&1
# shellcheck disable=SC2086
timeout 40 ncu $NCU --kernel-name regex:flash_fwd_kernel python3 tools/profile_shape.py prefill --torch flash \
    >> "$O/prefill.txt" 2>&1
fi
if [ "$PART" = regimes ]; then
timeout 300 python3 tools/evidence/regimes.py --backend cuda --samples 2000 --jobs 16 \
    --regimes sink,outliers,large_logits,uniform,cancellation --out "$O/regimes" > "$O/regimes.txt" 2>&1
timeout 250 python3 tools/evidence/gpu_evidence.py --steps regime-defects --defect-samples 300 --jobs 16 \
    --regime-defects no_zero_sum_guard,combine_no_max_shift --out /tmp/rd > "$O/regime-defects.txt" 2>&1
fi

# triage_defect SWITCH SAMPLES RUN_LIMIT: a sweep with the switch compiled in, then its triage
# (two clusters shrunk, 20 s each), one JSON line in triage.jsonl.
triage_defect() {
    rm -f /tmp/t.db*
    echo "== $1" >> "$O/triage.txt"
    ATTNSWEEP_CONFIG_TIME_GRACE_S=2 timeout "$3" python3 -m cli run --backend cuda --samples "$2" --seed 7 \
        --jobs 16 --defect "$1" --time-limit 5 --no-triage --db /tmp/t.db >> "$O/triage.txt" 2>&1
    ATTNSWEEP_TRIAGE_CLUSTERS=2 ATTNSWEEP_TRIAGE_SHRINK_SECONDS=20 timeout 50 python3 -m cli triage 1 \
        --db /tmp/t.db --json > /tmp/t.json 2>> "$O/triage.txt"
    python3 -c "import json,sys; print(json.dumps({'defect': sys.argv[1], 'triage': json.load(open('/tmp/t.json'))}))" \
        "$1" >> "$O/triage.jsonl" 2>> "$O/triage.txt"
}
if [ "$PART" = triage ]; then
for d in no_neginf_guard floor_blocks_per_split no_zero_sum_guard causal_off_by_one combine_no_max_shift; do
    triage_defect "$d" 300 55
done
fi
if [ "$PART" = triage-faults ]; then
# A fault costs a process (oob_store) and a hang the time limit, per failing config.
for d in missing_barrier oob_store_small oob_store hang; do
    triage_defect "$d" 150 85
done
fi
ls -la "$O"
