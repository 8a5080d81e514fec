"""CPU tests of the SM90 FP8 attention's host side: the P/V key permutation, the V^T buffer layout
(torch reference against an independent computation), variant keys and windows, argument checks
and their messages, descale handling, and the quantize reference maths."""

from __future__ import annotations

import pytest
import torch

from sglang_fa4.kernels.fp8_sm90 import layout
from sglang_fa4.kernels.fp8_sm90.launch import Fp8AttentionError, check_inputs, descale_tensor
from sglang_fa4.kernels.vit.fp8_quantize import E4M3_MAX, quantize_qkv_reference
from sglang_fa4.kernels.fp8_sm90.vt_pack import pack_vt_reference
from sglang_fa4.testing import cu_seqlens, offsets

FP8 = torch.float8_e4m3fn


# ---- the key permutation --------------------------------------------------------------------


def test_key_perm_matches_accumulator_and_operand_layouts():
    # Accumulator of m64nNk32: thread q of a quad holds, per 8-column block j, columns 8j+2q, 8j+2q+1.
    # Register A operand (k=32): thread q holds keys 4q..4q+3 in one register (and 16+4q.. in another).
    # The kernel packs the accumulator blocks (2h, 2h+1) of a 16-key group into the register the MMA
    # reads as keys 16h + 4q + i: slot 4q+i must therefore hold key 8*(i//2) + 2q + i%2.
    for q in range(4):
        held = [8 * j + 2 * q + e for j in range(2) for e in range(2)]  # in packing order
        assert [layout.KEY_PERM[4 * q + i] for i in range(4)] == held
    assert sorted(layout.KEY_PERM) == list(range(16))
    with pytest.raises(ValueError, match="slot"):
        layout.key_perm(16)


@pytest.mark.parametrize("lens", [[5, 0, 33, 1], [1000, 3000], [16, 17, 15, 1, 0, 64], [0]])
def test_vt_regions_are_aligned_disjoint_and_cover_the_buffer(lens):
    c = offsets(lens)
    cols, stride = layout.vt_columns(c[-1], len(lens))
    assert cols % 16 == 0 and stride % 16 == 0
    starts = [layout.vt_column_offset(c[b], b) for b in range(len(lens))]
    ends = [layout.vt_region_end(c[b + 1], b, len(lens), cols) for b in range(len(lens))]
    assert starts[0] == 0 and ends[-1] == cols
    for b, n in enumerate(lens):
        # TMA: a box's innermost start coordinate (here: a key column) must be 16-byte aligned
        assert starts[b] % 16 == 0
        # room for the permuted keys of a partial last group, and contiguous regions
        assert ends[b] - starts[b] >= -(-n // 16) * 16
        if b + 1 < len(lens):
            assert ends[b] == starts[b + 1]


def test_vt_reference_layout():
    lens = [5, 0, 33, 1]
    v = torch.randint(0, 120, (sum(lens), 2, 64), dtype=torch.uint8)
    c = cu_seqlens(lens)
    vt = pack_vt_reference(v, c)
    cols, stride = layout.vt_columns(sum(lens), len(lens))
    assert vt.shape == (2, 64, cols) and vt.stride(1) == stride
    assert (vt != 255).all()  # every column written (255 = the reference's poison, an E4M3 NaN)
    for b, n in enumerate(lens):
        base = layout.vt_column_offset(int(c[b]), b)
        end = layout.vt_region_end(int(c[b + 1]), b, len(lens), cols)
        for r in range(end - base):
            key = 16 * (r // 16) + layout.KEY_PERM[r % 16]
            want = v[int(c[b]) + key] if key < n else torch.zeros(2, 64, dtype=torch.uint8)
            assert torch.equal(vt[:, :, base + r], want), (b, r)


def test_permuted_vt_gives_the_same_pv_product():
    # The contraction over keys does not care about their order when P and V^T agree.
    torch.manual_seed(0)
    p = torch.rand(4, 32)
    v = torch.randn(32, 8)
    c = cu_seqlens([32])
    vt = pack_vt_reference(v[:, None, :], c)[0, :, :32].float()  # (d, slots)
    perm = [16 * (s // 16) + layout.KEY_PERM[s % 16] for s in range(32)]
    p_slots = p[:, perm]  # what the kernel's packed registers feed the MMA
    torch.testing.assert_close(p_slots @ vt.T, p @ v)


# ---- variants and windows -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "causal,window,want",
    [
        (False, (None, None), (False, False)),
        (True, (None, None), (True, False)),
        (False, (None, 0), (True, False)),
        (False, (-1, 0), (True, False)),
        (False, (64, 0), (False, True)),
        (False, (64, 64), (False, True)),
        (False, (None, 5), (False, True)),
    ],
)
def test_window_normalization(causal, window, want):
    c, l, left, right = layout.normalize_window(causal, window)
    assert (c, l) == want
    if want == (False, False):
        assert left == right == layout.WINDOW_UNBOUNDED


@pytest.mark.parametrize("window", [None, (None, None), (-1, -1), (-5, None), (None, -1)])
def test_one_window_convention_every_route(window):
    """Unbounded is None, or SGLang's negative -1, on every route: the FP8 kernel reads a window
    through the same fa4_config.window_bounds as FA4's and the short-window route."""
    from sglang_fa4.kernels.inputs import normalize_window

    assert layout.normalize_window(False, window) == (False, False, layout.WINDOW_UNBOUNDED, layout.WINDOW_UNBOUNDED)
    assert normalize_window(window) == (False, None, None)


@pytest.mark.parametrize("window", [(64.0, 0), (True, None), ("64", 0), (1, 2, 3)])
def test_a_window_side_is_an_int_or_none_on_every_route(window):
    from sglang_fa4.kernels.inputs import FA4InputError, normalize_window

    with pytest.raises(FA4InputError, match="window_size"):
        layout.normalize_window(False, window)
    with pytest.raises(FA4InputError, match="window_size"):
        normalize_window(window)


def test_causal_with_right_window_is_an_error():
    with pytest.raises(ValueError, match="causal=True with a right window"):
        layout.normalize_window(True, (None, 3))


def test_variants():
    assert layout.variant_for(128, False) == layout.Fp8Variant(128, False, False)
    assert layout.variant_for(64, False, (32, 0)) == layout.Fp8Variant(64, False, True)
    with pytest.raises(ValueError, match="head dim 80 is not supported"):
        layout.variant_for(80, False)
    allv = layout.all_variants()
    assert len(allv) == len(set(allv)) == 3 * len(layout.SUPPORTED_HEAD_DIMS)


@pytest.mark.parametrize("d,want", [(64, 64), (72, 96), (80, 96), (96, 96), (100, 128), (128, 128), (160, 192),
                                    (192, 192), (200, 256), (256, 256)])
def test_padded_head_dim(d, want):
    assert layout.padded_head_dim(d) == want


def test_padded_head_dim_too_large():
    with pytest.raises(ValueError, match="up to 256"):
        layout.padded_head_dim(257)


def test_grid_check():
    assert layout.grid_check(None, 10) == 10
    assert layout.grid_check(0, 10) == 1
    with pytest.raises(TypeError, match="Python int"):
        layout.grid_check(torch.tensor(5), 10)


# ---- argument checks -----------------------------------------------------------------------------


def make(t=16, hq=4, hkv=2, d=128, dtype=FP8):
    q = torch.zeros(t, hq, d).to(dtype)
    k = torch.zeros(t, hkv, d).to(dtype)
    return q, k, k.clone()


# A ViT budget graph's full-attention layout (vit_budget_layouts): the real segments, padding
# segments, then empty slots up to a fixed capacity (~70), max_seqlen = the budget.
BUDGET_LAYOUTS = [
    ([42196] + [0] * 69, 42196),  # a 4K Qwen2.5-VL picture in its own budget
    ([1000, 300, 4, 6000, 17] + [0] * 65, 8192),
    ([0, 700], 700),  # Qwen2.5-VL's eager full cu_seqlens starts [0, 0, ...]
    ([64] * 660, 64),
    ([1], 1),
]


@pytest.mark.parametrize("lens,max_seqlen", BUDGET_LAYOUTS)
def test_linear_tile_grid_covers_every_q_tile_once(lens, max_seqlen):
    """The FP8 forward's CTAs number the q tiles of all sequences in one list (layout.locate_tile,
    the twin of KernelEntry.locate_tile's binary search): each (sequence, m block) with rows exactly
    once, every other CTA past its sequence's rows (it exits), and the grid sized by tokens +
    sequences, never by sequences x max_seqlen."""
    c = offsets(lens)
    total = c[-1]
    grid = layout.tile_grid(total, len(lens))
    want = {(b, m) for b, n in enumerate(lens) for m in range(-(-n // layout.TILE_M))}
    got = [layout.locate_tile(c, t) for t in range(grid)]
    assert all(m >= 0 for _b, m in got)
    work = [(b, m) for b, m in got if m * layout.TILE_M < lens[b]]
    assert sorted(work) == sorted(want) and len(work) == len(want)
    assert grid <= -(-total // layout.TILE_M) + len(lens)
    # a cu_seqlens view that does not start at 0 (an offset into a longer tensor) numbers the same
    assert [layout.locate_tile([x + 1000 for x in c], t) for t in range(grid)] == got


def test_budget_graph_grid_no_longer_scales_with_slots_times_budget():
    # vit_fp8-run1.md's 4K graph row: 70 slots x 330 m blocks = 23100 CTAs per head before
    assert layout.tile_grid(42196, 70) == 329 + 70


def test_check_inputs_accepts_valid():
    q, k, v = make()
    assert check_inputs(q, k, v, cu_seqlens([16]), cu_seqlens([16])) == (1, 4, 2, 128, 16)


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda a: a.update(q=a["q"].to(torch.bfloat16)), "q must be torch.float8_e4m3fn"),
        (lambda a: a.update(k=a["k"][:, :, :64]), "q and k head dims differ"),
        (lambda a: a.update(q=torch.zeros(16, 4, 80).to(FP8), k=torch.zeros(16, 2, 80).to(FP8),
                            v=torch.zeros(16, 2, 80).to(FP8)), "head dim 80 is not supported"),
        (lambda a: a.update(q=torch.zeros(16, 3, 128).to(FP8)), r"q heads \(3\) must be a multiple"),
        (lambda a: a.update(cu_q=cu_seqlens([16]).long()), "cu_seqlens_q must be int32"),
        (lambda a: a.update(cu_k=cu_seqlens([8, 8])), "same length"),
        (lambda a: a.update(v=a["v"][:8]), "v must have k's shape"),
        (lambda a: a.update(out=torch.zeros(16, 4, 128)), "out must be bfloat16"),
        # a packed qkv view whose token stride is not a multiple of 16 bytes (TMA needs that)
        (lambda a: a.update(q=torch.zeros(16 * 520).to(FP8).as_strided((16, 4, 128), (520, 128, 1))),
         "multiples of 16 bytes"),
    ],
)
def test_check_inputs_errors_name_the_problem(mutate, match):
    q, k, v = make()
    a = {"q": q, "k": k, "v": v, "cu_q": cu_seqlens([16]), "cu_k": cu_seqlens([16]), "out": None}
    mutate(a)
    with pytest.raises(Fp8AttentionError, match=match):
        check_inputs(a["q"], a["k"], a["v"], a["cu_q"], a["cu_k"], a["out"])


def test_descale_tensor_broadcasts_and_checks():
    d = descale_tensor(2.0, torch.tensor([3.0]), torch.full((2, 4), 5.0), 2, 4, "cpu")
    assert d.shape == (3, 2, 4) and d.is_contiguous()
    assert torch.equal(d[0], torch.full((2, 4), 2.0)) and torch.equal(d[1], torch.full((2, 4), 3.0))
    assert torch.equal(descale_tensor(None, None, None, 1, 1, "cpu"), torch.ones(3, 1, 1))
    with pytest.raises(Fp8AttentionError, match=r"k_descale must be a scalar or \(batch, num_kv_heads\)"):
        descale_tensor(None, torch.ones(3, 4), None, 2, 4, "cpu")
    with pytest.raises(Fp8AttentionError, match="q_descale must be float32"):
        descale_tensor(torch.ones(2, 4, dtype=torch.float64), None, None, 2, 4, "cpu")


def test_fp8_varlen_attention_refuses_cpu_tensors():
    from sglang_fa4.kernels.fp8_sm90.launch import fp8_varlen_attention

    q, k, v = make()
    with pytest.raises(Fp8AttentionError, match="needs CUDA tensors"):
        fp8_varlen_attention(q, k, v, cu_seqlens([16]), cu_seqlens([16]), 16, 16)


# ---- quantize reference maths ------------------------------------------------------------------


def test_quantize_reference_scales_and_padding():
    torch.manual_seed(0)
    lens = [7, 0, 40]
    c = cu_seqlens(lens)
    q = torch.randn(47, 4, 80).bfloat16()
    k = torch.randn(47, 2, 80).bfloat16() * 3
    v = torch.randn(47, 2, 80).bfloat16()
    r = quantize_qkv_reference(q, k, v, c, c)
    assert r.q.shape == (47, 4, 96) and r.k.shape == (47, 2, 96) and r.head_dim == 80
    assert r.q.dtype == r.k.dtype == FP8 and r.vt.dtype == torch.uint8
    # padded columns are exactly zero
    assert r.q.float()[:, :, 80:].abs().max() == 0 and r.k.float()[:, :, 80:].abs().max() == 0
    for b, (s, e) in enumerate([(0, 7), (7, 7), (7, 47)]):
        for h in range(2):
            if e == s:
                assert r.descale[:, b, h].tolist() == [1.0, 1.0, 1.0]  # empty: 1, never 0 or NaN
                continue
            # q descale covers the kv head's group of q heads (2 per kv head here)
            assert r.descale[0, b, h] == pytest.approx(q[s:e, 2 * h : 2 * h + 2].float().abs().max() / E4M3_MAX)
            assert r.descale[1, b, h] == pytest.approx(k[s:e, h].float().abs().max() / E4M3_MAX)
            # the block's amax lands on +-448 exactly, and dequantizing is within E4M3 rounding
            deq = r.k[s:e, h, :80].float() * r.descale[1, b, h]
            assert r.k[s:e, h].float().abs().max() == E4M3_MAX
            torch.testing.assert_close(deq, k[s:e, h].float(), rtol=2**-3, atol=r.descale[1, b, h] * 2**-9)


def test_quantize_reference_all_zeros_is_finite():
    c = cu_seqlens([5])
    z = torch.zeros(5, 2, 64)
    r = quantize_qkv_reference(z, z, z, c, c)
    assert torch.equal(r.descale, torch.ones(3, 1, 2))
    assert r.q.float().abs().max() == 0 and r.vt.max() == 0


def test_quantize_reference_rejects_bad_input():
    c = cu_seqlens([5])
    with pytest.raises(ValueError, match="k and v shapes differ"):
        quantize_qkv_reference(torch.zeros(5, 2, 64), torch.zeros(5, 2, 64), torch.zeros(5, 1, 64), c, c)


def test_pack_vt_triton_kernel_matches_reference_in_the_interpreter(tmp_path):
    """The Triton V^T pack kernel, run by Triton's CPU interpreter (uint8 only: exact)."""
    pytest.importorskip("triton")
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    code = (
        "import torch\n"
        "from sglang_fa4.kernels.fp8_sm90.vt_pack import pack_vt, pack_vt_reference\n"
        "c = torch.tensor([0, 5, 5, 40, 41], dtype=torch.int32)\n"
        "v = (torch.randn(41, 2, 96) * 10).to(torch.float8_e4m3fn)\n"
        "assert torch.equal(pack_vt(v, c, 35), pack_vt_reference(v.view(torch.uint8), c))\n"
        "print('ok')\n"
    )
    env = {**__import__("os").environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(root)}
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr[-3000:]


def test_pow2_at_least_matches_tritons_next_power_of_2():
    """The integer-maths stand-in for triton.next_power_of_2 (no constexpr host cost per call)."""
    from sglang_fa4.kernels.fp8_sm90.layout import pow2_at_least

    assert [pow2_at_least(n) for n in (1, 2, 3, 64, 72, 80, 96, 128, 129)] == [1, 2, 4, 64, 128, 128, 128, 128, 256]


def test_wide_head_dim_configuration():
    # Q (TILE_M x d) + stages x (K + V^T: 2 x TILE_N x d bytes) + barriers/ones within shared memory
    for d in layout.SUPPORTED_HEAD_DIMS:
        stages = layout.head_dim_stages(d)
        assert stages >= 2
        assert layout.TILE_M * d + stages * 2 * layout.TILE_N * d + 4096 <= layout.SM90_SMEM_BYTES
    assert layout.head_dim_stages(128) == 4 and layout.TWO_LEVEL_MAX_HEAD_DIM == 128


def test_key_tile_stages_fit_shared_memory():
    """Stages for a key tile other than TILE_N (the d=128 wide tile is 192 keys): as many as fit
    beside Q and 4 KiB, at most 4; a tile whose two stages do not fit is refused, not shrunk."""
    assert layout.tile_stages(128, 192) == 4 and layout.tile_stages(128, 224) == 3
    for d in layout.SUPPORTED_HEAD_DIMS:
        for n in (128, 160, 192, 224, 256):
            try:
                stages = layout.tile_stages(d, n)
            except ValueError:
                assert layout.TILE_M * d + 2 * 2 * n * d + 4096 > layout.SM90_SMEM_BYTES
                continue
            assert 2 <= stages <= 4
            assert layout.TILE_M * d + stages * 2 * n * d + 4096 <= layout.SM90_SMEM_BYTES


# ---- the quantize kernels' rounding (sm_90 PTX, cross-compiled on the CPU) ---------------------

_QUANT_POINTERS = {"q": "*bf16", "k": "*bf16", "v": "*bf16", "q8": "*fp8e4nv", "k8": "*fp8e4nv", "vt": "*u8",
                   "desc": "*fp32", "part": "*fp32", "cuq": "*i32", "cuk": "*i32"}


def _sm90_ptx(fn, consts):
    from triton_ptx import sm90_ptx

    sig = {p.name: _QUANT_POINTERS.get(p.name.removesuffix("_ptr"), "i32") for p in fn.params}
    return sm90_ptx(fn, sig, consts)


def test_quantize_kernels_divide_with_ieee_rounding():
    """descale = amax / 448 and 1 / descale: the per-sequence and the chunked quantize kernel round
    both to nearest (div.rn), as the torch reference does; Triton's plain ``/`` is div.full.f32, which
    put 22 of the 36 descales of a 3-sequence, 4-head layout 1 ulp off the reference on the H200
    (and q / k bytes with them)."""
    import re

    from sglang_fa4.kernels.vit import fp8_quantize as Q
    from sglang_fa4.kernels.vit import fp8_quantize_chunked as C

    if Q.triton is None:
        pytest.skip("no triton")
    per_seq = _sm90_ptx(Q._quantize_kernel, {"D": 80, "DP": 96, "DP_POW2": 128, "ALIGN": 16, "BLOCK_T": 64})
    chunked = _sm90_ptx(C._quant_pass, {"D": 80, "DP": 96, "DP2": 128, "ALIGN": 16, "CHUNK": C.CHUNK,
                                        "BLOCK_T": C.BLOCK_T, "BLOCK_B": C.BLOCK_B})
    for ptx in (per_seq, chunked):
        divs = set(re.findall(r"\b(?:div|rcp)\.[a-z0-9.]*f32\b", ptx))
        assert divs == {"div.rn.f32"}, divs
