#!/usr/bin/env bash
# Build the documentation site (mkdocs-material + mkdocstrings) into site/, failing on any warning.
# Sets up .venv if needed (scripts/setup.sh), installs the `docs` extra once (a stamp keyed on
# pyproject.toml and this script, like setup.sh's), then runs `mkdocs build --strict -d site`.
# Extra arguments go to mkdocs build (e.g. `bash scripts/docs.sh -q`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PIP_DISABLE_PIP_VERSION_CHECK=1
stamp=.venv/.sitelens-docs-installed
want=$(cat pyproject.toml scripts/docs.sh | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  .venv/bin/pip install -q -e ".[docs]"
  echo "$want" > "$stamp"
fi
# Material for MkDocs prints a banner about MkDocs 2.0 on every build; it is not a build warning.
export NO_MKDOCS_2_WARNING=1
exec .venv/bin/mkdocs build --strict -d site "$@"
