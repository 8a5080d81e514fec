"""benchmark/lab/decode_tune.py's ``pick``: which of a sweep's launch variants gpu_decode_call.sh's
matrix-best / correctness-best steps take per head dim, from the sweep's rows (no GPU: the rows are
written here the way run_shape writes them)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
from benchmark.lab import decode_tune as T  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FAST = {"prefetch_pages": True}
PIECES = {"d_pieces": 2, "maxnreg": 168, "programs_per_sm": 3}


def rows_for(d: int, times: dict, shapes=("b1", "b16")) -> list[dict]:
    """Rows of one head dim: ``times`` maps a launch (as JSON, "{}" the default) to its µs per shape
    (None: not timed, as a wrong or failed variant is reported)."""
    out = []
    for i, shape in enumerate(shapes):
        for launch_json, per_shape in times.items():
            launch = json.loads(launch_json)
            row = {"shape": f"d{d} {shape}", "d": d, "variant": f"product {launch_json}", "launch": launch,
                   "forced_splits": None}
            us = per_shape[i]
            if us is None:
                row["error"] = "wrong result"
            else:
                row["us"] = us
            out.append(row)
    return out


def j(launch: dict) -> str:
    return json.dumps(launch, sort_keys=True)


def test_the_fastest_variant_per_head_dim_by_geometric_mean():
    rows = rows_for(256, {"{}": [100, 200], j(FAST): [90, 180], j(PIECES): [80, 170]})
    rows += rows_for(128, {"{}": [50, 60], j(FAST): [45, 55], j(PIECES): [60, 40]})  # pieces lose b1 at d128
    assert T.pick(rows) == {"256": PIECES, "128": FAST}


def test_a_tie_or_a_lost_shape_keeps_the_default():
    below = T.PICK_BELOW
    # a geometric mean just over the bar: not a win; just under it: a win
    assert T.pick(rows_for(256, {"{}": [100, 100], j(FAST): [100 * below + 0.01] * 2})) == {}
    assert T.pick(rows_for(256, {"{}": [100, 100], j(FAST): [100 * below - 0.01] * 2})) == {"256": FAST}
    assert T.pick(rows_for(256, {"{}": [100, 100], j(FAST): [100 * below * below + 0.5, 100]})) == {}  # one shape carrying it
    # faster on average, but one shape slower than PICK_WORST allows (exactly at it: allowed)
    worst = T.PICK_WORST
    assert T.pick(rows_for(256, {"{}": [100, 100], j(FAST): [100 * worst + 0.01, 50]})) == {}
    assert T.pick(rows_for(256, {"{}": [100, 100], j(FAST): [100 * worst, 50]})) == {"256": FAST}


def test_a_variant_not_timed_on_every_shape_is_not_picked():
    rows = rows_for(256, {"{}": [100, 100], j(FAST): [50, None], j(PIECES): [95, 95]})
    assert T.pick(rows) == {"256": PIECES}
    # a shape the sweep never reached for the variant (budget): the same
    rows = [r for r in rows_for(256, {"{}": [100, 100], j(FAST): [50, 50]}) if r["shape"] != "d256 b16"
            or r["variant"] == "product {}"]
    assert T.pick(rows) == {}


def test_shapes_without_a_timed_default_do_not_count():
    rows = rows_for(256, {"{}": [100, None], j(FAST): [90, 500]})
    assert T.pick(rows) == {"256": FAST}
    assert T.pick(rows_for(256, {"{}": [None, None], j(FAST): [90, 90]})) == {}


def test_lab_kernels_and_forced_split_counts_are_not_launches_to_pick():
    rows = rows_for(256, {"{}": [100, 100], j({"kernel": "transposed", "block_n": 32}): [50, 50]})
    assert T.pick(rows) == {}
    rows = rows_for(256, {"{}": [100, 100]})
    rows += [{**r, "variant": "splits=8", "forced_splits": 8, "us": 50} for r in rows]
    assert T.pick(rows) == {}


def test_the_command_line_prints_the_winners_as_json(tmp_path):
    path = tmp_path / "decode_tune-candidate.json"
    path.write_text(json.dumps({"meta": {}, "rows": rows_for(512, {"{}": [100, 100], j(PIECES): [80, 90]})}))
    p = subprocess.run([sys.executable, str(ROOT / "benchmark" / "lab" / "decode_tune.py"), "--pick", str(path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == {"512": PIECES}
