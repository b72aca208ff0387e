#!/usr/bin/env bash
# Set up .venv, then run ruff and the whole test suite (unit + integration on the bundled models).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check sitelens tests benchmarks
exec .venv/bin/python -m pytest -q "$@"
