#!/usr/bin/env bash
# The scaling benchmark (benchmarks/scaling.py) on one CUDA GPU: the seven model shapes in bfloat16 at
# prompt lengths 256, 1024 and 4096, every stage, into benchmarks/results/scaling_gpu.*; it starts no
# model after BUDGET_S seconds (default 390: under 8 minutes on an H200-class GPU); a rerun resumes.
#
#   bash benchmarks/gpu.sh                  # on the GPU machine, from the repository root
#   bash benchmarks/gpu.sh --dry-run        # anywhere: the same run on the CPU with shrunken shapes
#   bash benchmarks/gpu.sh --fetch-wheels   # where pip reaches PyPI: what an offline GPU machine lacks,
#                                           #   into .whl/ (carry .whl there)
#
# Python: $PYTHON (default: .venv/bin/python if it sees a GPU, else python3) with a CUDA torch; missing
# dependencies come from .whl/ (installed --no-deps into /tmp/site) or `pip install -e .`.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
BUDGET_S=${BUDGET_S:-390}
# What a CUDA image with only torch/transformers (Python 3.12) lacks of sitelens's import closure.
WHEELS="transformer-lens==3.9.0 better-abc==0.0.3 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 plotly==7.1.0 fancy-einsum==0.0.3
typeguard==4.6.1 beartype==0.23.1"

if [[ "${1:-}" == "--fetch-wheels" ]]; then
  mkdir -p .whl
  grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
  # shellcheck disable=SC2086
  exec python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl $WHEELS
fi
if [[ "${1:-}" == "--dry-run" ]]; then
  PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
  exec nice -n 10 "$PY" benchmarks/scaling.py --tiny --device cpu --dtype bfloat16 --group model \
    --models all --lengths 64,128 --threads 1 --tag scaling_gpu_dry --no-png
fi
PY=${PYTHON:-python3}
if [[ -z "${PYTHON:-}" && -x .venv/bin/python ]] \
  && .venv/bin/python -c "import torch,sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
  PY=.venv/bin/python
fi
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu.sh: no CUDA device visible to ' + sys.executable + ' (torch ' + torch.__version__ + ')')"
if ! "$PY" -c "import transformer_lens, plotly, pandas, psutil" 2>/dev/null; then
  if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  else
    "$PY" -m pip install -q -e .
  fi
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # sitelens from this tree
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
start=$(date +%s)
# The 8B model right after the smallest (a check that the run works), then the rest by size.
"$PY" benchmarks/scaling.py --device cuda --dtype bfloat16 --group model --threads 4 \
  --models smollm2-135m,llama-3.1-8b,qwen2.5-0.5b,smollm2-360m,llama-3.2-1b,gemma-3-1b,smollm2-1.7b \
  --lengths 256,1024,4096 --budget-s "$BUDGET_S" --cell-timeout "$BUDGET_S" --margin-gib 4 --tag scaling_gpu
echo "gpu.sh: $(( $(date +%s) - start )) s; commit benchmarks/results/scaling_gpu.{csv,md,html,png}"
