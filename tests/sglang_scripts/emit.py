"""What every script in tests/sglang_scripts/ shares: ``emit`` prints its one JSON result (the last
stdout line is what tests/sglang_harness.py reads back), ``params`` the JSON the test passed."""

from __future__ import annotations

import json
import sys


def emit(obj) -> None:
    print(json.dumps(obj, default=str), flush=True)


def params() -> dict:
    """The JSON the test passed to ``run_file(..., params=...)`` ({} when none)."""
    return json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
