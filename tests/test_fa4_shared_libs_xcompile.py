"""The shared-library store against the real flash-attn-4 b36 on a CPU (issue #18 item 6), through
tests/fa4_shared_libs_check.py in fresh processes:

* round trip: FA4 cross-compiles the ViT kernels for sm_90a (d80 full, > 256 segments with its
  tile-cumsum kernel, window + sinks), the store exports, links and keeps them (once exported by
  the DSL, once copied from FA4's own persistent cache); a fresh process loads each with tvm_ffi
  alone -- flash_attn, cutlass and quack never imported -- and the loaded function is FA4's kernel:
  called through its launcher with CPU tensors it refuses them with its own signature;
* the key: over a sweep of ViT calls (head dims, GQA ratios, segment counts around 256,
  max_seqlen, windows, sinks, dtypes, packed and broadcast q/k/v), calls of one sglang-fa4
  configuration always had one FA4 compile key (SM90 and SM100), but for the one field that
  reaches no SM90 kernel;
* every setting FA4 and quack read from the environment is part of the key.

Needs the pinned layers .cache/fa4-b36 and .cache/cutlass-dsl-4.8.1 (tests/setup_env.sh builds
them; tests/setup_pip_layer.sh fa4-b36 tests/requirements-fa4-b36.txt): skipped without them.
About 70 s (FA4 imported four times, three kernels cross-compiled once).
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from sglang_fa4.kernels.fa4 import b36 as fa4_b36

ROOT = Path(__file__).resolve().parents[1]
FA4 = ROOT / ".cache" / "fa4-b36"
DSL = ROOT / ".cache" / "cutlass-dsl-4.8.1"
#: variables FA4 or quack touch that cannot change a forward kernel: pytest's worker names (quack's
#: autotuner), and the GPU visibility quack's compile workers set for themselves (the kernel class
#: and the SM count are in the key)
NOT_KERNEL_SETTINGS = {"PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "CUDA_VISIBLE_DEVICES"}


@pytest.fixture(scope="module")
def pythonpath() -> str:
    for layer in (FA4, DSL):
        if not (layer / ".requirements.sha256").is_file():
            pytest.skip(f"no {layer.relative_to(ROOT)} (tests/setup_env.sh builds it)")
    return os.pathsep.join([str(FA4), str(DSL / "nvidia_cutlass_dsl" / "dsl_packages"), str(DSL), str(ROOT)])


def check(pythonpath: str, *args, arch: int = 90) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(fa4_b36.KEY_ENV_PREFIXES)}
    env.update(PYTHONPATH=pythonpath, FLASH_ATTENTION_ARCH=f"sm_{arch}", CUTE_DSL_ARCH=f"sm_{arch}a",
               FLASH_ATTENTION_NUM_SMS="132" if arch == 90 else "148")
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "fa4_shared_libs_check.py"), *map(str, args)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_real_kernels_round_trip_without_cutlass(pythonpath, tmp_path):
    fa4_cache = tmp_path / "fa4-cache"
    # a first start: FA4 compiles (and fills its own cache); the store exports with the DSL
    first = check(pythonpath, "store", "--root", tmp_path / "a", "--fa4-cache", fa4_cache)
    assert [c["fa4_compiled"] for c in first["configs"]] == [True] * 3
    assert all(c["stored"] for c in first["configs"])
    assert [sorted(c["functions"]) for c in first["configs"]] == [["forward"], ["forward", "tile_cumsum"], ["forward"]]
    assert first["configs"][1]["functions"]["tile_cumsum"] == "sglang_fa4_tile_cumsum"
    # a start whose FA4 loads from its cache: the store links FA4's own object files
    second = check(pythonpath, "store", "--root", tmp_path / "b", "--fa4-cache", fa4_cache)
    assert [c["fa4_compiled"] for c in second["configs"]] == [False] * 3
    assert all(set(c["functions"].values()) == {"func"} for c in second["configs"])
    for root in ("a", "b"):
        r = check(pythonpath, "load", "--root", tmp_path / root)
        assert r["heavy"] == [] and r["tvm_ffi"], r["heavy"]  # neither FA4 nor the DSL imported
        full, many, sinks = r["configs"]
        for c in r["configs"]:
            assert c["loaded"] and c["function_type"] == "tvm_ffi.core.Function", c
            # FA4's forward kernel took the launcher's 18 arguments and checked the first one
            assert c["refusal"].startswith("ValueError: Mismatched Tensor on argument #0"), c
            assert "expected device_type=cuda" in c["refusal"]
            assert "__call__(mQ: Tensor([n0, n1, n2], bfloat16), mK:" in c["refusal"]
            assert "aux_data: Tuple[None, None]" in c["refusal"]
        assert "mCuTotalMBlocks: None" in full["refusal"] and "learnable_sink: None" in full["refusal"]
        assert "mCuTotalMBlocks: Tensor([" in many["refusal"]
        assert many["sched_refusal"].startswith("ValueError: Mismatched Tensor on argument #0")
        assert "__call__(mCuBlocks: Tensor([n0], int32)" in many["sched_refusal"]
        assert "learnable_sink: Tensor([" in sinks["refusal"] and "window_size_left: int32" in sinks["refusal"]


def _fa4_key_fields() -> list[str]:
    """The names of the fields of ``_flash_attn_fwd``'s compile key, read from b36's source."""
    src = (FA4 / "flash_attn" / "cute" / "interface.py").read_text()
    start = src.index("    compile_key = (\n        mla_1cta,")
    call = ast.parse(src[start:src.index("\n    )\n", start) + 6].strip())
    return [ast.unparse(e) for e in call.body[0].value.elts]


def _parse_key(text: str) -> tuple:
    return ast.literal_eval(re.sub(r"<class '([^']*)'>", r"'\1'", text))


@pytest.mark.parametrize("arch", [90, 100])
def test_one_configuration_one_fa4_key(pythonpath, arch):
    r = check(pythonpath, "keys", arch=arch)
    assert r["arch"] == arch and r["heavy"] == ["cutlass", "flash_attn", "quack"]
    fields = _fa4_key_fields()
    groups = defaultdict(list)
    for row in r["rows"]:
        groups[json.dumps(row["config"], sort_keys=True)].append(row)
    assert len(r["rows"]) > 100 and len(groups) > 30  # the sweep is not trivial
    differing = defaultdict(set)
    for config, rows in groups.items():
        keys = [_parse_key(row["fa4_key"]) for row in rows]
        assert all(len(k) == len(fields) for k in keys)
        for i, name in enumerate(fields):
            if len({repr(k[i]) for k in keys}) > 1:
                differing[name].add(config)
    if fa4_b36.sm100_class(arch):
        assert dict(differing) == {}
    else:
        # is_static_persistent is in FA4's key for every class but is passed to the SM100 kernel
        # class only (sglang_fa4.kernels.fa4.config.seqlen_class): one SM90 kernel for both values
        assert set(differing) == {"is_static_persistent"}
        src = (FA4 / "flash_attn" / "cute" / "interface.py").read_text()
        takers = re.findall(r"fa_fwd = (\w+)\((?:(?!fa_fwd = ).)*?is_static_persistent=is_static_persistent", src, re.S)
        assert takers == ["FlashAttentionForwardSm100"]


def test_every_setting_fa4_reads_is_in_the_key(pythonpath):
    read = set()
    pattern = re.compile(r"""(?:environ\.get|getenv|environ\[)\(?\s*f?["']([A-Z][A-Z0-9_]*)""")
    for package in ("flash_attn/cute", "quack"):
        for path in (FA4 / package).rglob("*.py"):
            read |= set(pattern.findall(path.read_text()))
    assert {"FA_LOG_LEVEL", "FLASH_ATTENTION_ARCH", "CUTE_DSL_ARCH"} <= read  # the scan finds them
    uncovered = {n for n in read - NOT_KERNEL_SETTINGS if not n.startswith(fa4_b36.KEY_ENV_PREFIXES)}
    assert uncovered == set()
    # the ignored ones are cache locations only
    assert all(("CACHE" in n) for n in fa4_b36.KEY_ENV_IGNORED)
