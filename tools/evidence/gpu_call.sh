#!/usr/bin/env bash
# The kernel and sweep measurements on a GPU machine that has no network (carrying the wheels in
# .whl): a queue of steps run in order under one deadline, so that one call of at most 600 s does
# as much as fits and says what it left:
#
#     bash tools/evidence/gpu_call.sh STEP_OR_PART...     # files to $OUT
#     DEADLINE_S=570 bash tools/evidence/gpu_call.sh pytest triage regimes
#
# Each step runs under the smaller of its own limit and the time left before DEADLINE_S (575 s by
# default, counted from the start); a step with less than MIN_STEP_S (40 s) left is skipped. What
# comes back is two files, whatever ran: steps.txt (each step: exit status and seconds, or
# "skipped") and evidence.tgz (every step's files, packed again after each step, because a call
# returns at most 8 files).
#
# Steps (their limits) and what each writes in evidence.tgz:
#   env                     env.txt: the device, core count, torch and numpy
#   pytest (170)            pytest.txt: `pytest -m gpu tests/gpu`
#   kernels-f16 (90)        kernels-f16.{txt,json}: bench/kernels.py --iters 30 (ours vs cuDNN, flash)
#   kernels-bf16 (70)       kernels-bf16.{txt,json}: the same, bf16, without the fixed-split columns
#   sweep (160)             sweep.{log,json}: bench/sweep.py, 2,000 configs, warm then cold cache
#   mma-space (80)          mma-space.txt: a 2,000-config sweep pinned to the mma path's space
#   prefill (110)           prefill.txt: tools/tune_mma.py --prefill, 64- and 128-key tiles
#   ncu (80)                ncu.txt: Nsight Compute on our prefill and flash's
#   regimes (300)           regimes/: tools/evidence/regimes.py, 2,000 configs of each regime but
#                           normal; regimes.txt
#   regime-defects (300)    regime-defects.txt: gpu_evidence.py regime-defects for the switches
#                           of REGIME_DEFECTS (comma-separated; default every numeric switch),
#                           300 configs a sweep
#   triage:SWITCH (90; hang and missing_barrier 240: each run of a timeout cluster costs its
#                           limit, 5 s more, and a new process)
#                           triage.txt, triage.jsonl: a sweep with the switch compiled in (300
#                           configs; 150 for a fault switch), then `attnsweep triage --json`
#                           (two clusters shrunk, TRIAGE_SECONDS (20) each), one JSON line per switch
#                           (tools/evidence/triage_table.py makes tables of them)
#   confined (200)          confined.txt: tools/evidence/confined_cuda.py (the confinement on this host:
#                           what the confined process sees, three configs confined and not, a faulting and a
#                           hanging kernel), then pytest tests/unit/isolation
#   sweep-confined (330)    sweep-confined.{log,json}: bench/sweep.py --confined, 2,000 configs: the warm
#                           sweep, then the same with every kernel confined, and the ratio
#   triage-exclusive (120) triage.txt, triage.jsonl: as triage:, for a bug no switch has, planted for
#                           the step in the call's copy of attention.hip and taken out after: the
#                           KV-cache length (current_seq_len, inclusive) read as exclusive, in the split
#                           range every kernel family computes
#   worker-triage:SWITCH (200)
#                           worker-triage.txt, worker-triage.jsonl, worker-N.log: the same
#                           switch through the service instead of the CLI: Redis (carried in .redis:
#                           Debian's redis-server and the libraries it links, beside the system's
#                           C library), a SQLite database, a Celery gpu worker (4 processes) and
#                           `attnsweep submit` of 150 configs; the worker that ends the sweep
#                           triages it (two clusters, 20 s each), as the service does
# Parts, each a list of steps:
#   defaults       env pytest kernels-f16 kernels-bf16 sweep mma-space
#   tune           env prefill ncu
#   regimes        env regimes regime-defects
#   triage         env, triage: of each numeric defect switch
#   triage-faults  env, triage: of each fault switch
#
# .tools/bwrap, where the machine has no bubblewrap: Debian's /usr/bin/bwrap (it links libselinux,
# libcap and libpcre2, which Ubuntu has); carried with .whl.
# .whl holds the cp312 wheels the machine lacks (tests/gpu/README.md), made here with:
#   .venv/bin/pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
#     -d .whl SQLAlchemy==2.1.9 greenlet==3.5.6 alembic==1.20.1 Mako==1.4.3 pydantic==2.14.4 \
#     pydantic_core==2.50.5 pydantic-settings==2.16.3 annotated-types==0.8.0 typing-inspection==0.4.5 \
#     typing_extensions==4.16.0 python-dotenv==1.2.4 filelock==4.3.2 prometheus_client==0.26.0 \
#     fastapi==0.165.0 starlette==1.10.0 celery==5.7.0 kombu==5.7.0 vine==5.1.0 billiard==4.3.2 \
#     amqp==5.4.2 redis==8.2.0 click-didyoumean==0.3.1 click-plugins==1.1.1.2 click-repl==0.4.1 \
#     python-dateutil==2.9.0.post0 pytest-timeout==2.4.0 hypothesis==6.170.27 sortedcontainers==2.4.0 \
#     attrs==26.1.0 ml_dtypes==0.7.0 tzlocal==5.4.5 prompt_toolkit==3.0.53 wcwidth==0.9.5 \
#     opentelemetry-api==1.45.3
set -u
O=${OUT:?set OUT to the folder whose files come back}
DEADLINE_S=${DEADLINE_S:-575}
MIN_STEP_S=${MIN_STEP_S:-40}

NUMERIC="no_neginf_guard floor_blocks_per_split no_zero_sum_guard causal_off_by_one combine_no_max_shift"
FAULTS="missing_barrier oob_store_small oob_store hang"
STEPS=()
for arg in "$@"; do
    case $arg in
        defaults) STEPS+=(env pytest kernels-f16 kernels-bf16 sweep mma-space) ;;
        tune) STEPS+=(env prefill ncu) ;;
        regimes) STEPS+=(env regimes regime-defects) ;;
        triage) STEPS+=(env); for d in $NUMERIC; do STEPS+=("triage:$d"); done ;;
        triage-faults) STEPS+=(env); for d in $FAULTS; do STEPS+=("triage:$d"); done ;;
        env|pytest|kernels-f16|kernels-bf16|sweep|mma-space|prefill|ncu|regimes|regime-defects|confined|sweep-confined|triage:*|triage-exclusive|worker-triage:*)
            STEPS+=("$arg") ;;
        *) echo "unknown step or part $arg (the header lists them)" >&2; exit 2 ;;
    esac
done
[ ${#STEPS[@]} -gt 0 ] || { echo "name at least one step or part" >&2; exit 2; }

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 ATTNSWEEP_KERNEL_CACHE=/tmp/kc PATH=$PATH:/usr/local/cuda/bin
chmod -R a+rX /tmp/site "$PWD"   # the confined process runs as the sandbox's own uid
# The sandbox starts bwrap with a fixed PATH: a carried copy is named by its path.
command -v bwrap >/dev/null || export ATTNSWEEP_BWRAP=$PWD/.tools/bwrap
W=/tmp/evidence
rm -rf "$W" && mkdir -p "$W"

# limit STEP: the step's own limit in seconds
limit() {
    case $1 in
        env) echo 30 ;; pytest) echo 170 ;; kernels-f16) echo 90 ;; kernels-bf16) echo 70 ;;
        sweep) echo 160 ;; mma-space) echo 80 ;; prefill) echo 110 ;; ncu) echo 80 ;;
        regimes) echo 300 ;; regime-defects) echo 300 ;; triage:hang|triage:missing_barrier) echo 240 ;; triage:*) echo 90 ;;
        worker-triage:*) echo 200 ;; confined) echo 200 ;; sweep-confined) echo 330 ;; triage-exclusive) echo 120 ;;
    esac
}

# triage_line SWITCH FILE: one JSON line, {"defect": SWITCH, "triage": FILE's `attnsweep triage --json`}
triage_line() {
    python3 -c "import json,sys; print(json.dumps({'defect': sys.argv[1], 'triage': json.load(open(sys.argv[2]))}))" "$1" "$2"
}

# run_step STEP LIMIT: the step's commands, each under `timeout` within LIMIT seconds
run_step() {
    local t=$2
    case $1 in
    env)
        { date -u; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv
          nproc; python3 -c "import torch, numpy; print('torch', torch.__version__, 'numpy', numpy.__version__)"; } \
            > "$W/env.txt" 2>&1 ;;
    pytest)
        timeout "$t" python3 -m pytest -q -m gpu tests/gpu -p no:cacheprovider > "$W/pytest.txt" 2>&1 ;;
    kernels-f16)
        timeout "$t" python3 bench/kernels.py --iters 30 --dtypes f16 --out /tmp/k16 > "$W/kernels-f16.txt" 2>&1
        cp /tmp/k16/kernels.json "$W/kernels-f16.json" 2>/dev/null ;;
    kernels-bf16)
        timeout "$t" python3 bench/kernels.py --iters 30 --dtypes bf16 --no-fixed --out /tmp/kbf \
            > "$W/kernels-bf16.txt" 2>&1
        cp /tmp/kbf/kernels.json "$W/kernels-bf16.json" 2>/dev/null ;;
    sweep)
        timeout "$t" python3 bench/sweep.py --backend cuda --samples 2000 --jobs 16 --cache-dir /tmp/swc \
            --out /tmp/sweep.json > "$W/sweep.log" 2>&1
        cp /tmp/sweep.json "$W/sweep.json" 2>/dev/null ;;
    confined)
        { ls -ld / /root "$PWD" /tmp/site 2>&1; ldd "${ATTNSWEEP_BWRAP:-$(command -v bwrap)}"; id; } > "$W/confined.txt" 2>&1
        timeout $((t * 2 / 3)) python3 tools/evidence/confined_cuda.py >> "$W/confined.txt" 2>&1
        timeout $((t / 3)) python3 -m pytest -q tests/unit/isolation -p no:cacheprovider >> "$W/confined.txt" 2>&1 ;;
    sweep-confined)
        timeout "$t" python3 bench/sweep.py --backend cuda --samples 2000 --jobs 16 --skip-cold --confined \
            --cache-dir /tmp/swc --out /tmp/sweep-confined.json > "$W/sweep-confined.log" 2>&1
        cp /tmp/sweep-confined.json "$W/sweep-confined.json" 2>/dev/null ;;
    mma-space)
        timeout "$t" python3 tools/evidence/gpu_evidence.py --jobs 16 --steps sweep --sweep 2000 --seed 2034 \
            --sweep-arg=--dtypes=f16,bf16 --sweep-arg=--range=trans_q=0 --sweep-arg=--range=trans_k=0 \
            --sweep-arg=--range=trans_v=0 --sweep-arg=--range=head_dim_qk=8:256 \
            --sweep-arg=--range=head_dim_v=8:256 --out /tmp/mma > "$W/mma-space.txt" 2>&1 ;;
    prefill)
        timeout $((t * 2 / 3)) python3 tools/tune_mma.py --prefill --prefill-dims 32,64,128 --dtypes f16,bf16 \
            --settings 64:64:1,64:128:1 --iters 20 --out /tmp/tp > "$W/prefill.txt" 2>&1
        timeout $((t / 3)) python3 tools/tune_mma.py --prefill --prefill-dims 256 --settings 64:32:1,64:64:1 \
            --iters 20 --out /tmp/tp256 >> "$W/prefill.txt" 2>&1 ;;
    ncu)
        local ncu="--clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis
            --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats
            --launch-skip 2 --launch-count 1"
        # shellcheck disable=SC2086
        timeout $((t / 2)) ncu $ncu --kernel-name regex:attn_splitkv_fwd python3 tools/profile_shape.py prefill \
            > "$W/ncu.txt" 2>&1
        # shellcheck disable=SC2086
        timeout $((t / 2)) ncu $ncu --kernel-name regex:flash_fwd_kernel python3 tools/profile_shape.py prefill \
            --torch flash >> "$W/ncu.txt" 2>&1 ;;
    regimes)
        timeout "$t" python3 tools/evidence/regimes.py --backend cuda --samples 2000 --jobs 16 \
            --regimes sink,outliers,large_logits,uniform,cancellation --out "$W/regimes" > "$W/regimes.txt" 2>&1 ;;
    regime-defects)
        timeout "$t" python3 tools/evidence/gpu_evidence.py --steps regime-defects --defect-samples 300 --jobs 16 \
            --regime-defects "${REGIME_DEFECTS:-${NUMERIC// /,}}" --out /tmp/rd > "$W/regime-defects.txt" 2>&1 ;;
    triage:*)
        # A fault costs a process (oob_store) or the time limit (hang) per failing config: half the
        # configs, and a 5 s limit. A numeric switch keeps the default limit: under 5 s, 1 to 4
        # configs of each numeric switch's sweep on an H100 were timeouts, a cluster of their
        # own. The sweep takes at most half the step, its triage the rest: two clusters shrunk,
        # 20 s each, then classified.
        local d=${1#triage:} n=300 limit=() begin=$SECONDS
        case " $FAULTS " in *" $d "*) n=150 limit=(--time-limit 5) ;; esac
        rm -f /tmp/t.db* /tmp/t.json
        echo "== $d" >> "$W/triage.txt"
        ATTNSWEEP_CONFIG_TIME_GRACE_S=2 timeout $((t / 2)) python3 -m cli run --backend cuda --samples "$n" \
            --seed 7 --jobs 16 --defect "$d" "${limit[@]}" --no-triage --db /tmp/t.db >> "$W/triage.txt" 2>&1
        timeout $((t - (SECONDS - begin))) python3 -m cli triage 1 --db /tmp/t.db --max-clusters 2 \
            --max-seconds "${TRIAGE_SECONDS:-20}" \
            "${limit[@]}" --json > /tmp/t.json 2>> "$W/triage.txt"
        triage_line "$d" /tmp/t.json >> "$W/triage.jsonl" 2>> "$W/triage.txt" ;;
    triage-exclusive)
        local src=kernels/src/attention.hip begin=$SECONDS
        cp "$src" /tmp/attention.hip.orig
        sed -i 's/current_seq_len ? current_seq_len\[b\] : sk - 1;/current_seq_len ? current_seq_len[b] - 1 : sk - 1;/' "$src"
        rm -f /tmp/t.db* /tmp/t.json
        { echo "== exclusive_kv_len"; diff /tmp/attention.hip.orig "$src"; } >> "$W/triage.txt"
        timeout $((t / 2)) python3 -m cli run --backend cuda --samples 300 --seed 7 --jobs 16 --no-triage \
            --db /tmp/t.db >> "$W/triage.txt" 2>&1
        timeout $((t - (SECONDS - begin))) python3 -m cli triage 1 --db /tmp/t.db --max-clusters 2 \
            --max-seconds "${TRIAGE_SECONDS:-20}" --json > /tmp/t.json 2>> "$W/triage.txt"
        triage_line exclusive_kv_len /tmp/t.json >> "$W/triage.jsonl" 2>> "$W/triage.txt"
        cp /tmp/attention.hip.orig "$src" ;;
    worker-triage:*)
        # WT_QUEUE=cpu WT_BACKEND=cpu runs the same step on a machine without a GPU.
        local d=${1#worker-triage:} begin=$SECONDS n=${#DONE[@]}
        local db=/tmp/w.db port=6390 queue=${WT_QUEUE:-gpu} backend=${WT_BACKEND:-cuda}
        rm -f /tmp/w.db* /tmp/w.json
        echo "== $d" >> "$W/worker-triage.txt"
        LD_LIBRARY_PATH=$PWD/.redis/lib .redis/redis-server --port $port --save '' --appendonly no \
            --daemonize yes --logfile /tmp/redis.log >> "$W/worker-triage.txt" 2>&1
        (
            export ATTNSWEEP_DATABASE_URL=sqlite:///$db ATTNSWEEP_BROKER_URL=redis://127.0.0.1:$port/0 \
                ATTNSWEEP_TRIAGE_CLUSTERS=2 ATTNSWEEP_TRIAGE_SHRINK_SECONDS=20
            python3 -m cli db upgrade >> "$W/worker-triage.txt" 2>&1
            # Its own process group (setsid), so that stopping it stops its pool and nothing else.
            setsid python3 -m cli worker --queue "$queue" --concurrency 4 --loglevel INFO \
                > "$W/worker-$n.log" 2>&1 &
            local worker=$!
            python3 -m cli submit --samples 150 --seed 7 --backend "$backend" --defect "$d" \
                >> "$W/worker-triage.txt" 2>&1 || { kill -KILL -- -$worker; exit 1; }
            # The sweep's progress and its triage's status every 10 s, until the triage is stored;
            # the clusters are read only then (`attnsweep triage` would compute a pending one itself).
            timeout $((t - (SECONDS - begin) - 10)) python3 -c '
import sys, time
from store import clusters as stored
from store.db import session_scope
from store.models import Sweep
url = sys.argv[1]
while True:
    with session_scope(url) as s:
        sweep = s.get(Sweep, 1)
        status = stored.triage_status(s, 1)
        print(int(time.monotonic()), "sweep", sweep.status if sweep else None, "triage", status, flush=True)
    if status in ("done", "failed"):
        break
    time.sleep(10)' "$ATTNSWEEP_DATABASE_URL" >> "$W/worker-triage.txt" 2>&1 &&
                timeout 20 python3 -m cli triage 1 --json > /tmp/w.json 2>> "$W/worker-triage.txt"
            kill -TERM -- -$worker; sleep 3; kill -KILL -- -$worker 2>/dev/null
        )
        python3 -c "import redis; redis.Redis(port=$port).shutdown(nosave=True)" 2>/dev/null
        triage_line "$d" /tmp/w.json >> "$W/worker-triage.jsonl" 2>> "$W/worker-triage.txt" ;;
    esac
}

declare -A DONE=()
for step in "${STEPS[@]}"; do
    [ -n "${DONE[$step]:-}" ] && continue
    DONE[$step]=1
    left=$((DEADLINE_S - SECONDS))
    if [ "$left" -lt "$MIN_STEP_S" ]; then
        echo "$step skipped: ${left} s left of ${DEADLINE_S}" >> "$O/steps.txt"
        continue
    fi
    lim=$(limit "$step")
    [ "$lim" -gt "$left" ] && lim=$left
    start=$SECONDS
    run_step "$step" "$lim"
    echo "$step rc $? in $((SECONDS - start)) s (limit $lim s)" >> "$O/steps.txt"
    tar czf "$O/evidence.tgz" -C "$W" .
done
cat "$O/steps.txt"
