#!/usr/bin/env bash
# The one command to run first on a GPU machine (from the repository root):
#
#   bash benchmarks/device.sh OUTDIR
#
# Installs the wheels carried in .whl/ (tokamax and the packages it needs,
# for the comparison rows), prints the versions, then runs the kernel
# benchmark and writes OUTDIR/kernels.json and OUTDIR/kernels.log.
set -o pipefail
out=${1:?usage: bash benchmarks/device.sh OUTDIR}
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi -L
python3 -c "import jax, flax; print('jax', jax.__version__, 'flax', flax.__version__, jax.devices())"
timeout "${BENCH_TIMEOUT:-480}" python3 benchmarks/kernels.py --rounds "${ROUNDS:-10}" \
  --json "$out/kernels.json" 2>&1 | tee "$out/kernels.log"
