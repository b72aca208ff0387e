#!/usr/bin/env bash
# The main job: set up .venv, then fit SITE on a built-in task with the default bundled model and
# compare zero-shot, 10-shot ICL and SITE.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/sitelens demo "$@"
