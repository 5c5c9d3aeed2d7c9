#!/usr/bin/env bash
# Kernel plug-ins on a GPU machine without network (tools/evidence/plugins_gpu.py says what it
# measures): one call of about 9 minutes, everything it needs carried in .whl:
#
#     bash tools/evidence/plugins_gpu.sh          # files to $OUT: plugins.md, plugins.json, logs.tgz, env.txt
#
# .whl holds, besides the project's wheels of gpu_call.sh's header: xformers-0.0.35 (its Triton
# split-K kernel; the C++ extensions it carries do not load under the machine's torch, and the
# plug-in does not need them), the Triton example built as a wheel
# (`.venv/bin/pip wheel --no-deps -w .whl examples/triton_splitkv`) and Debian's bubblewrap
# package (`apt-get download bubblewrap` in .whl): the example packages and the C-ABI library
# did not ship, so they run confined, and the machine has no bubblewrap of its own.
set -u
O=${OUT:?set OUT to the folder whose files come back}
DEADLINE_S=${DEADLINE_S:-480}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 ATTNSWEEP_KERNEL_CACHE=/tmp/kc PATH=$PATH:/usr/local/cuda/bin
if ! command -v bwrap >/dev/null; then
    dpkg -x .whl/bubblewrap_*.deb /tmp/bw && export ATTNSWEEP_BWRAP=/tmp/bw/usr/bin/bwrap
fi
mkdir -p /tmp/plugins
chmod -R a+rX /tmp/site "$PWD"   # the confined process runs as the sandbox's own uid
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__)"
  python3 -c "import isolation.sandbox as s, settings; print('confinement mode:', s.check(settings.get_settings().bwrap or 'bwrap'))"
  mkdir -p /tmp/cabi && make -s -C examples/c_abi cuda OUT=/tmp/cabi ARCH=sm_90 && chmod -R a+rX /tmp/cabi && echo "c_abi cuda: built"
} > "$O/env.txt" 2>&1
timeout $((DEADLINE_S + 60)) python3 tools/evidence/plugins_gpu.py --out /tmp/plugins --deadline-s "$DEADLINE_S" \
    > /tmp/plugins/driver.txt 2>&1 || echo "plugins_gpu.py exit $?" >> "$O/env.txt"
cp /tmp/plugins/plugins.md /tmp/plugins/plugins.json "$O/" 2>/dev/null
tar czf "$O/logs.tgz" -C /tmp/plugins logs driver.txt 2>/dev/null
