"""The fused paged-KV gather's Triton kernel in Triton's CPU interpreter (TRITON_INTERPRET=1) against
the torch gather + V^T pack it replaced and the torch reference pack; prints "ok". Run as a plain
child process (no SGLang) by tests/test_fp8_paged_gather.py."""

import torch
from sglang_fa4.kernels.fp8_paged_kv import gather as G
from sglang_fa4.kernels.fp8_sm90.layout import vt_column_offset, vt_region_end
from sglang_fa4.testing import page_table
from sglang_fa4.kernels.fp8_sm90.vt_pack import allocate_vt, pack_vt, pack_vt_reference, _BLOCK_R, VT_ALIGN

FP8 = torch.float8_e4m3fn
POISON = 0xAB


def pool(lens, P, hkv, d, seed, width=None):
    g = torch.Generator().manual_seed(seed)
    need = [-(-n // P) for n in lens]
    total_pages = sum(need) + 3
    k = torch.randint(0, 256, (total_pages, P, hkv, d), generator=g, dtype=torch.uint8).view(FP8)
    v = torch.randint(0, 256, (total_pages, P, hkv, d), generator=g, dtype=torch.uint8).view(FP8)
    table = page_table(need, torch.randperm(total_pages, generator=g), width)
    return k, v, table, torch.tensor(lens, dtype=torch.int32)


def check(lens, P, hkv, d, exact, seed, width=None):
    k_cache, v_cache, table, seqlens = pool(lens, P, hkv, d, seed, width)
    batch = len(lens)
    sizes = G.exact_sizes(seqlens) if exact else None
    rows, per_seq = G.bounds(table, P, sizes)
    # before: torch gather, then the Triton V^T pack, into a poisoned buffer
    k0, v0, cu0, m0 = G.gather_paged_kv(k_cache, v_cache, table, seqlens, sizes)
    vt0 = allocate_vt(v0, batch)
    vt0.fill_(POISON)
    pack_vt(v0, cu0, m0, out=vt0)
    # after: the fused kernel, into poisoned buffers
    k1, vt1, cu1 = G.allocate(rows, batch, hkv, d, "cpu")
    k1.fill_(POISON); vt1.fill_(POISON); cu1.fill_(-7)
    G.launch(k_cache, v_cache, table, seqlens, k1, vt1, cu1, per_seq)
    assert m0 == per_seq and vt1.shape == vt0.shape and k1.shape == k0.shape
    assert torch.equal(cu1, cu0), (cu1, cu0)
    total = int(cu0[-1])
    assert torch.equal(k1[:total], k0[:total])
    ref = pack_vt_reference(v0, cu0)  # every column of every region, zeros past the keys
    cols = vt0.shape[2]
    cu = cu0.tolist()
    old_cover = -(-(m0 + 3 * VT_ALIGN) // _BLOCK_R) * _BLOCK_R
    new_cover = G.grid_blocks(per_seq) * G.BLOCK_T
    gap = 0
    for b in range(batch):
        base, end = vt_column_offset(cu[b], b), vt_region_end(cu[b + 1], b, batch, cols)
        old_end, new_end = min(end, base + old_cover), min(end, base + new_cover)
        # bitwise what the torch gather + pack wrote, and the reference where the kernel writes
        assert torch.equal(vt1[:, :, base:old_end], vt0[:, :, base:old_end]), ("old", b)
        assert torch.equal(vt1[:, :, base:new_end], ref[:, :, base:new_end]), ("ref", b)
        assert bool((vt1[:, :, new_end:end] == POISON).all()), ("unwritten past the grid", b)
        # every column the FP8 kernel can read for sequence b: keys up to a whole widest key tile
        seen = min(cols, base + -(-(cu[b + 1] - cu[b]) // G.MAX_KEY_TILE) * G.MAX_KEY_TILE)
        assert torch.equal(vt1[:, :, base:seen], ref[:, :, base:seen]), ("readable", b)
        gap += int((vt0[:, :, base:seen] == POISON).all(dim=(0, 1)).sum())
    return gap


out = []
for P in (1, 16, 64):
    for lens, hkv, d in (([37], 4, 128), ([5, 300, 0, 1, 64], 2, 96), ([129, 128, 16], 1, 64)):
        for exact in (True, False):
            out.append(check(lens, P, hkv, d, exact, seed=P + d + exact))
assert out == [0] * len(out), out
# a prefix sum over more than one BLOCK_B chunk of lengths
assert check([3, 0, 7, 1] * 33 + [5], 16, 1, 64, True, seed=5) == 0
# the capture-time bound with the last sequence at it: the old pack stopped short of a 192-key tile
# past its keys (columns the d=128 decode kernel reads); the fused kernel writes them
gap = check([1] * 7 + [64], 16, 1, 64, False, seed=9, width=4)
assert gap >= 64, gap
print("ok")
