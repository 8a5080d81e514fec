"""The fused paged-KV gather (kernels/fp8_paged_kv/gather.py): its Triton kernel, run by Triton's CPU
interpreter in a child process (uint8 data: exact), against the torch gather + V^T pack it replaced
(bitwise wherever that pair wrote) and the torch reference pack (every V^T column the FP8 kernel
can read), on random pools in shuffled pages, page sizes 1/16/64, GQA head counts, exact sizes and
the capture-time host bound; plus the host-side pieces on the CPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sglang_fa4.kernels.fp8_paged_kv import gather as G
from sglang_fa4.kernels.fp8_sm90.layout import vt_column_offset

ROOT = Path(__file__).resolve().parents[1]

CHILD = Path(__file__).resolve().parent / "sglang_scripts" / "fp8_paged_gather_interpreted.py"


def test_fused_gather_matches_the_torch_gather_and_pack_in_the_interpreter():
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, str(CHILD)], env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stderr[-3000:]


def test_bounds_exact_and_host():
    table = torch.zeros(3, 5, dtype=torch.int32)
    assert G.bounds(table, 16, None) == (3 * 5 * 16, 80)
    assert G.bounds(table, 16, (100, 60)) == (100, 60)
    assert G.bounds(table, 16, (0, 0)) == (1, 1)  # never an empty buffer
    with pytest.raises(G.PagedKVError, match="does not fit"):
        G.bounds(table, 16, (100, 81))


def test_grid_covers_a_key_tile_past_every_sequence():
    # the grid's coverage per sequence reaches a widest key tile past its keys and the alignment slack
    for n in (1, 63, 64, 4095, 4096):
        assert G.grid_blocks(n) * G.BLOCK_T >= n + G.MAX_KEY_TILE + 48
    assert vt_column_offset(17, 2) == 64  # layout the kernel's formula restates: 16-aligned + 16 per sequence


def test_the_cpu_harness_gather_is_the_torch_path_with_the_reference_pack():
    """What the CPU harnesses install for the gather (sglang_fa4.testing.paged_kv_torch): the torch
    gather and the reference V^T pack, read back exactly by the reference unpack."""
    from sglang_fa4.kernels.fp8_sm90.vt_pack import pack_vt_reference, unpack_vt_reference
    from sglang_fa4.testing import paged_kv_torch

    g = torch.Generator().manual_seed(0)
    k_cache = torch.randint(0, 256, (6, 16, 2, 64), generator=g, dtype=torch.uint8).view(torch.float8_e4m3fn)
    v_cache = torch.randint(0, 256, (6, 16, 2, 64), generator=g, dtype=torch.uint8).view(torch.float8_e4m3fn)
    table = torch.tensor([[3, 1, 0], [5, 2, 4]], dtype=torch.int32)
    seqlens = torch.tensor([20, 40], dtype=torch.int32)
    k, vt, cu, m = paged_kv_torch.gather(k_cache, v_cache, table, seqlens, G.exact_sizes(seqlens))
    k_ref, v_ref = paged_kv_torch.gather_paged_kv_reference(k_cache, v_cache, table, seqlens)
    assert cu.tolist() == [0, 20, 60] and m == 40 and torch.equal(k, k_ref)
    assert torch.equal(vt, pack_vt_reference(v_ref, cu)) and torch.equal(unpack_vt_reference(vt, cu), v_ref)


def test_bad_metadata_is_refused():
    """The pool and metadata checks the route's plan makes (check_paged), each on its own."""
    cache = torch.zeros(4, 16, 2, 64, dtype=torch.uint8)
    seqlens = torch.tensor([5], dtype=torch.int32)
    table = torch.zeros(1, 3, dtype=torch.int32)
    assert G.check_paged(cache, cache, table, seqlens) == (4, 16, 2, 64)
    for args, match in (
        ((cache, cache, torch.zeros(1, 6, dtype=torch.int32)[:, ::2], seqlens), "rows must be contiguous"),
        ((cache.float(), cache, table, seqlens), "float8_e4m3fn"),
        ((cache, cache[:, :, :1].contiguous(), table, seqlens), "must have one shape"),
        ((cache, cache, table.long(), seqlens), "page_table must be int32"),
        ((cache, cache, table, seqlens.long()), "cache_seqlens must be a 1-D int32"),
        ((cache, cache, table, torch.tensor([5, 6], dtype=torch.int32)), "2 entries, page_table 1 rows"),
        ((cache.transpose(1, 2), cache.transpose(1, 2), table, seqlens), "must be contiguous"),
        ((cache[0], cache[0], table, seqlens), r"\(pages, page_size, kv_heads, head_dim\)"),
        ((cache, cache, table, torch.tensor([5], dtype=torch.int32, device="meta")), "one device"),
    ):
        with pytest.raises(G.PagedKVError, match=match):
            G.check_paged(*args)


def test_warm_resolves_the_route_kernel_once(monkeypatch):
    calls = []
    monkeypatch.setattr(G, "gather_paged_kv_vt", lambda *a: calls.append(a))
    assert G.warm(G.GatherShape(128, 4, 16), "cpu") == 0  # nothing compiled on the CPU
    k_cache, v_cache, table, seqlens, sizes = calls[0]
    assert k_cache.shape[1:] == (16, 4, 128) and table.dtype == torch.int32 and table.is_contiguous()
    assert sizes == (int(seqlens.sum()), int(seqlens.max())) and int(seqlens.max()) > 16  # several pages
    assert G.GatherShape(128, 4, 16).describe() == "fp8 paged KV gather d=128 kv_heads=4 page=16"


def test_bytes_moved_is_one_read_and_one_write_of_k_and_v():
    # decode batch 64 x 4k context, 4 kv heads, d=128, page 16: 2 x 134 MB read + 2 x 134 MB written
    assert G.bytes_moved([4096] * 64, 4, 128, 16) == 4 * 64 * 4096 * 4 * 128 + 4 * 64 * 256
    assert G.bytes_moved([1, 17], 1, 64, 16) == 4 * 18 * 64 + 4 * 3


@pytest.mark.parametrize("d,page", [(128, 16), (256, 1), (192, 64)])
def test_kernel_compiles_for_sm90_with_16_byte_accesses(d, page):
    """Cross-compiled for sm_90 (no GPU needed) with the specialization a real launch gets
    (16-byte-aligned pointers, strides that are multiples of 16; page size 1 as a constant): the K/V
    loads and the K / V^T stores are 16-byte vectors, no byte-wise global access (the bandwidth the
    kernel is for)."""
    import re

    from triton_ptx import sm90_ptx

    fn = G._make_kernel()
    names = [p.name for p in fn.params]
    sig = {n: ("*u8" if n in ("K_CACHE", "V_CACHE", "K_OUT", "VT_OUT") else "*i32" if n.isupper() else "i32")
           for n in names}
    consts = {"D": d, "D_POW2": 1 << (d - 1).bit_length(), "ALIGN": 16, "BLOCK_T": G.BLOCK_T, "BLOCK_B": G.BLOCK_B}
    if page == 1:
        consts["page_size"] = 1
    aligned = [n for n in names if n.isupper() or n in ("vt_stride_h", "vt_stride_d", "tok_stride")
               or (n == "page_size" and page != 1)]
    ptx = sm90_ptx(fn, sig, consts, aligned)
    ops = re.findall(r"\b(ld|st)\.global(\.v\d)?\.b(\d+)", ptx)
    assert not [o for o in ops if o[2] == "8"], "byte-wise global loads/stores"
    assert sum(1 for o in ops if o == ("st", ".v4", "32")) >= 2 and sum(1 for o in ops if o == ("ld", ".v4", "32")) >= 2


def test_route_report_has_the_gather_before_after():
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_fp8_kv_route", ROOT / "benchmark" / "release" / "check_fp8_kv_route.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    nbytes = G.bytes_moved([4096] * 64, 4, 128, 16)
    row = {"shape": "decode b64 ctx4k", "page_size": 16, "gather_pack_ms": 0.49, "gather_fused_ms": 0.2,
           "gather_fused_speedup": 2.45, "gather_bytes": nbytes, "gather_floor_ms": 0.13, "gather_fused_gbps": 2684.4,
           "fa4_fp8_routed_torch_gather_ms": 0.6, "fa4_fp8_routed_ms": 0.3, "fp8_kernel_only_packed_ms": 0.094}
    md = mod.markdown({"command": "x", "env": {"copy_gbps": 4100.0}, "correctness": [], "speed": [row], "notes": []})
    assert "floor = bytes at the measured device copy rate (4100.000 GB/s)" in md
    assert ("| decode b64 ctx4k | 16 | 0.490 | 0.200 | 2.450x | 537 | 0.130 | 2684 | 0.600 | 0.300 | 0.094 |"
            in md), md
