#!/usr/bin/env bash
# The test command (README): build or reuse the test environment, then run pytest on tests/, one
# worker per core (at most 4; pytest-xdist, a module's tests on one worker: --dist loadfile).
# Extra arguments go to pytest (-n 0: one process). pytest's exit status is propagated as is (5,
# "no tests ran", fails).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash tests/setup_env.sh
exec .venv/bin/python -m pytest -q -n auto --maxprocesses 4 --dist loadfile tests "$@"
