"""The shared fp32 reference (sglang_fa4/testing.py) against torch's SDPA with explicit masks: every
convention it promises (GQA, bottom-right causal and windows, SGLang's -1, sinks, empty segments,
all-masked rows) and the layout builders' edge cases. Every kernel test that compares against the
reference leans on these."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from sglang_fa4.testing import attention_fp32, cu_seqlens, lengths, offsets, rel_err


def _sdpa_segment(q, k, v, keep, scale, sink=None):
    """One segment through F.scaled_dot_product_attention: (n, h, d) tensors, keep (nq, nk) bool.
    A sink is an extra key whose logit is the sink (zero key, additive bias) and whose value is 0."""
    g = q.shape[1] // k.shape[1]
    qh, kh, vh = q.transpose(0, 1), k.repeat_interleave(g, 1).transpose(0, 1), v.repeat_interleave(g, 1).transpose(0, 1)
    bias = torch.zeros(q.shape[1], *keep.shape).masked_fill(~keep, float("-inf"))
    if sink is not None:
        kh = torch.cat([kh, torch.zeros_like(kh[:, :1])], 1)
        vh = torch.cat([vh, torch.zeros_like(vh[:, :1])], 1)
        bias = torch.cat([bias, sink[:, None, None].expand(-1, keep.shape[0], 1)], -1)
    out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=bias, scale=scale)
    return out.nan_to_num(0.0).transpose(0, 1)


def _keep(nq, nk, causal=False, left=None, right=None):
    rel = torch.arange(nk)[None, :] - (torch.arange(nq) + nk - nq)[:, None]
    keep = torch.ones(nq, nk, dtype=torch.bool)
    if causal:
        keep &= rel <= 0
    if left is not None and left >= 0:
        keep &= rel >= -left
    if right is not None and right >= 0:
        keep &= rel <= right
    return keep


def _qkv(tq, tk, hq, hkv, d, dv=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(tq, hq, d, generator=g), torch.randn(tk, hkv, d, generator=g),
            torch.randn(tk, hkv, dv or d, generator=g))


def test_layout_builders():
    assert offsets([3, 0, 2]) == [0, 3, 3, 5] and offsets([]) == [0]
    cu = cu_seqlens([3, 0, 2])
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 3, 3, 5]
    assert cu_seqlens([4], dtype=torch.int64).dtype == torch.int64
    assert lengths(cu) == [3, 0, 2] and lengths([0, 5]) == [5]
    with pytest.raises(ValueError, match=">= 0"):
        offsets([2, -1])


def test_rel_err():
    ref = torch.tensor([3.0, 4.0])
    assert rel_err(ref, ref) == 0.0
    assert rel_err(torch.tensor([3.0, 4.5]), ref) == pytest.approx(0.1)
    assert math.isnan(rel_err(torch.tensor([float("inf"), 4.0]), ref))


@pytest.mark.parametrize("hq,hkv,dv", [(4, 4, 8), (4, 2, 8), (6, 1, 16)])
def test_self_attention_segments_and_gqa(hq, hkv, dv):
    lens = [5, 0, 1, 7]
    q, k, v = _qkv(13, 13, hq, hkv, 8, dv)
    got = attention_fp32(q, k, v, cu_seqlens(lens), scale=0.3)
    want = torch.cat([_sdpa_segment(q[a:b], k[a:b], v[a:b], _keep(b - a, b - a), 0.3)
                      for a, b in zip(offsets(lens), offsets(lens)[1:]) if b > a])
    assert got.dtype == torch.float32 and got.shape == (13, hq, dv)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_default_scale_is_inverse_sqrt_head_dim():
    q, k, v = _qkv(6, 6, 2, 2, 16)
    torch.testing.assert_close(attention_fp32(q, k, v, [0, 6]), attention_fp32(q, k, v, [0, 6], scale=0.25))


@pytest.mark.parametrize("lens_q,lens_k", [([3, 4], [3, 4]), ([2, 5], [6, 5]), ([4], [2])])
def test_causal_is_aligned_bottom_right(lens_q, lens_k):
    q, k, v = _qkv(sum(lens_q), sum(lens_k), 2, 1, 8)
    got = attention_fp32(q, k, v, offsets(lens_q), offsets(lens_k), causal=True, scale=0.5)
    cq, ck = offsets(lens_q), offsets(lens_k)
    want = torch.cat([_sdpa_segment(q[cq[i]:cq[i + 1]], k[ck[i]:ck[i + 1]], v[ck[i]:ck[i + 1]],
                                    _keep(lens_q[i], lens_k[i], causal=True), 0.5) for i in range(len(lens_q))])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    if lens_q[-1] > lens_k[-1]:  # queries before the first key see nothing: zero rows
        assert got[cq[-1] - 1 - lens_k[-1]].abs().max() == 0


@pytest.mark.parametrize("window", [(2, 0), (0, 3), (1, 1), (-1, 2), (3, None)])
def test_sliding_window_bounds(window):
    q, k, v = _qkv(9, 9, 2, 2, 8)
    got = attention_fp32(q, k, v, [0, 9], window=window)
    want = _sdpa_segment(q, k, v, _keep(9, 9, left=window[0], right=window[1]), 8 ** -0.5)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # a bounded window changes the answer (the mask is applied at all)
    assert rel_err(got, attention_fp32(q, k, v, [0, 9])) > 1e-3


@pytest.mark.parametrize("left", [None, 2])
def test_key_ranges_widen_causal_rows_within_the_left_bound(left):
    """SGLang's Gemma-4 image rows: a row also sees its range [begin, end] (inclusive, within its
    segment's keys) past the causal bound; the left window still applies; (-1, -1) adds nothing."""
    lq, lk = [6, 4], [9, 4]
    q, k, v = _qkv(sum(lq), sum(lk), 4, 2, 8)
    ranges = torch.full((10, 2), -1, dtype=torch.int32)
    ranges[1:4] = torch.tensor([4, 7])  # sequence 0 (prefix 3): positions 4-6 lie in an image 4..7
    ranges[6:8] = torch.tensor([0, 1])  # sequence 1: an image at its start
    got = attention_fp32(q, k, v, offsets(lq), offsets(lk), causal=True, window=(left, 0), key_ranges=ranges)
    cq, ck = offsets(lq), offsets(lk)
    parts = []
    for i in range(2):
        keep = _keep(lq[i], lk[i], causal=True)
        j = torch.arange(lk[i])[None, :]
        r = ranges[cq[i]:cq[i + 1]].long()
        keep |= (j >= r[:, :1]) & (j <= r[:, 1:])
        if left is not None:
            pos = torch.arange(lq[i])[:, None] + lk[i] - lq[i]
            keep &= j >= pos - left
        parts.append(_sdpa_segment(q[cq[i]:cq[i + 1]], k[ck[i]:ck[i + 1]], v[ck[i]:ck[i + 1]], keep, 8 ** -0.5))
    torch.testing.assert_close(got, torch.cat(parts), rtol=1e-5, atol=1e-5)
    plain = attention_fp32(q, k, v, offsets(lq), offsets(lk), causal=True, window=(left, 0))
    assert rel_err(got[1:3], plain[1:3]) > 1e-3 and torch.equal(got[4:6], plain[4:6])


def test_sinks_join_each_rows_denominator():
    q, k, v = _qkv(7, 7, 3, 3, 8)
    sinks = torch.tensor([0.5, -1.0, 2.0])
    got = attention_fp32(q, k, v, [0, 3, 7], sinks=sinks)
    want = torch.cat([_sdpa_segment(q[a:b], k[a:b], v[a:b], _keep(b - a, b - a), 8 ** -0.5, sinks)
                      for a, b in ((0, 3), (3, 7))])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert rel_err(got, attention_fp32(q, k, v, [0, 3, 7])) > 1e-2


def test_rows_outside_segments_take_the_fill():
    q, k, v = _qkv(6, 6, 1, 1, 4)
    got = attention_fp32(q, k, v, [0, 2, 4], fill=float("nan"))
    assert torch.isnan(got[4:]).all() and torch.isfinite(got[:4]).all()


def test_bad_shapes_are_refused():
    q, k, v = _qkv(4, 4, 3, 2, 8)
    with pytest.raises(ValueError, match="multiple of kv heads"):
        attention_fp32(q, k, v, [0, 4])
    with pytest.raises(ValueError, match="segments"):
        attention_fp32(q[:, :2], k, v, [0, 4], [0, 2, 4])
    with pytest.raises(ValueError, match=r"\(tokens, heads, dim\)"):
        attention_fp32(q[0], k, v, [0, 4])


def test_float64_and_the_log_sum_exp():
    """dtype=float64 computes in float64 (agreeing with a hand-written float64 softmax to 1e-12,
    which float32 does not); return_lse gives each row's log denominator, sinks included, -inf for
    a row without keys."""
    q, k, v = _qkv(5, 6, 2, 1, 8)
    sinks = torch.tensor([0.3, -0.7])
    cq, ck = [0, 3, 3, 5], [0, 4, 4, 6]  # a segment with no queries and no keys between the two
    out, lse = attention_fp32(q, k, v, cq, ck, causal=True, sinks=sinks, dtype=torch.float64, return_lse=True)
    assert out.dtype == lse.dtype == torch.float64 and lse.shape == (2, 5)
    for (q0, q1), (k0, k1) in (((0, 3), (0, 4)), ((3, 5), (4, 6))):
        nq, nk = q1 - q0, k1 - k0
        for h in range(2):
            for i in range(nq):
                s = [float(q[q0 + i, h].double() @ k[k0 + j, 0].double()) * 8 ** -0.5 for j in range(nk)
                     if j <= i + nk - nq]
                denom = sum(math.exp(x) for x in s) + math.exp(float(sinks[h]))
                assert float(lse[h, q0 + i]) == pytest.approx(math.log(denom), abs=1e-12)
                want = sum(math.exp(x) * v[k0 + j, 0].double() for j, x in enumerate(s)) / denom
                torch.testing.assert_close(out[q0 + i, h], want, rtol=0, atol=1e-12)
    assert rel_err(attention_fp32(q, k, v, cq, ck, causal=True, sinks=sinks), out) > 1e-12  # fp32 is not it
    _, lse = attention_fp32(q, k, v, [0, 2, 5], [0, 0, 6], return_lse=True)
    assert torch.isneginf(lse[:, :2]).all() and torch.isfinite(lse[:, 2:]).all()
    assert attention_fp32(q, k, v, [0, 5]).dtype == torch.float32  # float32 unless asked


def test_page_table_gives_each_sequence_the_next_pages_of_the_allocation():
    from sglang_fa4.testing import page_table

    perm = torch.tensor([5, 2, 7, 0, 3, 1, 6, 4])
    table = page_table([2, 0, 3], perm)  # width: the most pages (3) plus one
    assert table.dtype == torch.int32 and table.tolist() == [[5, 2, 0, 0], [0, 0, 0, 0], [7, 0, 3, 0]]
    assert page_table([1, 1], perm, width=2, fill=-1).tolist() == [[5, -1], [2, -1]]
