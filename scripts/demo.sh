#!/usr/bin/env bash
# The main job: set up .venv, then fit SITE on a built-in task with the default bundled model and
# compare zero-shot, 10-shot ICL and SITE (each accuracy with its 95% interval), with one model load
# (`sitelens run`). The run is kept in runs/MODEL/TASK: run again, it is reused, not redone.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/sitelens run --task antonym --limit 50 "$@"
