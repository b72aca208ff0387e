#!/usr/bin/env bash
# Second CI job: the whole suite on TransformerLens 3.9 with the HookedTransformer backend, in its
# own venv .venv-tl39 (scripts/setup.sh with SITELENS_VENV / SITELENS_TL_SPEC; idempotent). The
# main job (scripts/test.sh, .venv) runs it on TransformerLens 4 with the TransformerBridge, what a
# new install gets; here SITELENS_BACKEND=hooked restricts the two-backend fixtures to the hooked
# backend, so the tests that skip on TL 4 for want of HookedTransformer run here, and the ones that
# skip here for want of the bridge ran there. Pytest arguments replace the suite's
# (`bash scripts/test_tl39.sh tests/test_atlas.py`).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-tl39
t0=$(date +%s)
SITELENS_VENV=$VENV SITELENS_TL_SPEC="transformer-lens>=3.9,<4" bash scripts/setup.sh
. scripts/chromium.sh  # the browser tier's Chromium
"$VENV/bin/python" -c "import importlib.metadata as m; print('transformer-lens', m.version('transformer-lens'), \
'torch', m.version('torch'))"
export SITELENS_BACKEND=hooked
set +e
. scripts/pytest_args.sh
if [ -n "${SITELENS_SKIP_BROWSER:-}" ]; then
  "$VENV/bin/python" -m pytest "${PYTEST_ARGS[@]}" -m "not browser" "$@"
else
  "$VENV/bin/python" -m pytest "${PYTEST_ARGS[@]}" "$@"
fi
rc=$?
set -e
echo "test_tl39: $(( $(date +%s) - t0 ))s"
exit $rc
