#!/usr/bin/env bash
# Sweep throughput before and after on one GPU machine in one call: the old tree's bench/sweep.py,
# this tree's with --repeat (the same configs again, from the data cache the first run filled),
# then tools/evidence/compare_trees.py (the same configs through `attnsweep run` on both trees,
# outcome by outcome). The old tree is a plain copy of an earlier revision, made beforehand:
#
#     mkdir -p .old-tree && git archive b93db43 | tar -x -C .old-tree
#     bash tools/evidence/throughput_gpu.sh            # carry .whl and .old-tree; files to $OUT
#
# Under DEADLINE_S (550 s by default) in all; a step with less than 40 s left is skipped. Writes
# to $OUT: steps.txt (each step's exit status and seconds), old.log/old.json, new.log/new.json,
# compare.txt, env.txt. SAMPLES (2000), JOBS (16), DATA_CACHE_BYTES (24 GiB: the default sweep's
# inputs and trimmed references are more than that, so the bound is exercised), BACKEND (cuda)
# and PYTHON (python3) may be set: `BACKEND=cpu SAMPLES=6 JOBS=2` checks the script anywhere.
set -u
O=${OUT:?set OUT to the folder whose files come back}
OLD=${OLD_TREE:-.old-tree}
DEADLINE_S=${DEADLINE_S:-550}
SAMPLES=${SAMPLES:-2000}
BACKEND=${BACKEND:-cuda}
PY=${PYTHON:-python3}
JOBS=${JOBS:-16}
DATA_CACHE_BYTES=${DATA_CACHE_BYTES:-25769803776}
[ -f "$OLD/bench/sweep.py" ] || { echo "no old tree at $OLD (see the header)" >&2; exit 2; }
START=$(date +%s)

$PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    >/dev/null 2>&1
# Each tree imports its own packages (its folder first on sys.path); both share one compile
# cache, since the kernels' sources are the same.
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 ATTNSWEEP_KERNEL_CACHE=/tmp/kc PATH=$PATH:/usr/local/cuda/bin
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; $PY -c 'import numpy; print(numpy.__version__)'
  free -g; df -h /tmp; } > "$O/env.txt" 2>&1

left() { echo $((DEADLINE_S - ($(date +%s) - START))); }
step() {  # step NAME MAX_S COMMAND...: runs under the smaller of MAX_S and the time left
    local name=$1 max=$2 t; shift 2
    t=$(left); [ "$t" -gt "$max" ] && t=$max
    if [ "$t" -lt 40 ]; then echo "$name skipped" >> "$O/steps.txt"; return; fi
    local t0=$(date +%s)
    timeout "$t" "$@"
    echo "$name exit $? in $(( $(date +%s) - t0 )) s" >> "$O/steps.txt"
}

step old 170 bash -c "cd '$OLD' && $PY bench/sweep.py --backend $BACKEND --samples $SAMPLES --jobs $JOBS --skip-cold \
    --cache-dir /tmp/kc --out /tmp/old.json > '$O/old.log' 2>&1"
cp /tmp/old.json "$O/old.json" 2>/dev/null
step new 200 bash -c "$PY bench/sweep.py --backend $BACKEND --samples $SAMPLES --jobs $JOBS --skip-cold --repeat \
    --cache-dir /tmp/kc --data-cache /tmp/dc --data-cache-bytes $DATA_CACHE_BYTES --out /tmp/new.json > '$O/new.log' 2>&1"
cp /tmp/new.json "$O/new.json" 2>/dev/null
du -sh /tmp/dc >> "$O/env.txt" 2>&1
rm -rf /tmp/dc
# Outcomes, config by config, over the bench's configs (seed 7): `attnsweep run` on both trees,
# the new one with a data cache of its own, empty at the start.
step compare 200 env ATTNSWEEP_DATA_CACHE=/tmp/dc-compare ATTNSWEEP_DATA_CACHE_BYTES=$DATA_CACHE_BYTES \
    $PY tools/evidence/compare_trees.py --old "$OLD" --backend "$BACKEND" --samples "$SAMPLES" --seed 7 --jobs "$JOBS" \
    --out /tmp/compare > "$O/compare.txt" 2>&1
rm -rf /tmp/dc-compare   # a later call on the same machine needs the disk
cat "$O/steps.txt"
