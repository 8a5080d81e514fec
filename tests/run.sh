#!/usr/bin/env bash
# The test command (README): build or reuse the test environment, then run pytest on tests/.
# Extra arguments go to pytest. pytest's exit status is propagated as is (5, "no tests ran", fails).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash tests/setup_env.sh
exec .venv/bin/python -m pytest -q tests "$@"
