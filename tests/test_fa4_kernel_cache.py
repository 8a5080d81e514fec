"""CPU tests of the FA4 kernel cache: key normalisation and per-configuration resolution, with a
fake backend standing in for FA4 (no cutlass, no GPU)."""

from __future__ import annotations

import math
import re
import subprocess
import sys

import pytest
import torch

from sglang_fa4.kernels import fa4, varlen
from sglang_fa4.kernels.fa4.b36 import LAYOUT_SM90, LAYOUT_SM100, FA4LayoutError, Resolved, layout_for_arch
from sglang_fa4.kernels.fa4.config import seqlen_class
from sglang_fa4.kernels.inputs import FA4FeatureError, FA4InputError, normalize_window
from sglang_fa4.kernels.fa4.cache import KernelCache
from sglang_fa4.testing import cu_seqlens

STATIC = object()  # stands in for FA4's AuxData(None, None)


class FakeBackend:
    """Builds the argument list the way FA4 b36 does and 'launches' a recording kernel."""

    requires_cuda = False

    def __init__(self, arch: int = 90):
        self._arch = arch
        self.compiles = []
        self.launches = []
        self.public_calls = []
        self.sched_calls = 0
        self.corrupt = None  # callable(args) -> args, to simulate an FA4 layout change

    def arch(self):
        return self._arch

    def kernel(self, *args):
        self.launches.append(args)
        args[LAYOUT_SM90.out].fill_(float(len(self.launches)))

    def _sched(self, cu, total_q):
        self.sched_calls += 1
        n = cu.shape[0]
        extra = (torch.zeros(n, dtype=torch.int32),) if self._arch // 10 == 10 else ()
        return (torch.arange(n, dtype=torch.int32), None, *extra)

    def compile_and_run(self, call):
        self.compiles.append(call)
        lay = layout_for_arch(self._arch)
        # FA4 resolves (None, 0) into causal with no window itself
        causal, left, right = normalize_window((call.window_left, call.window_right))
        args = [None] * lay.nargs
        args[lay.q], args[lay.k], args[lay.v], args[lay.out] = call.q, call.k, call.v, call.out
        args[lay.softmax_scale] = (
            1.0 / math.sqrt(call.q.shape[-1]) if call.softmax_scale is None else call.softmax_scale
        )
        args[lay.cu_seqlens_q] = args[lay.cu_seqlens_k] = call.cu_seqlens
        args[lay.window_left], args[lay.window_right] = left, right
        args[lay.sink] = call.sinks
        args[lay.sched[0] - 1] = STATIC
        sched = None
        if call.cu_seqlens.shape[0] - 1 > 256:
            sched = self._sched
            for i, t in zip(lay.sched, sched(call.cu_seqlens, call.q.shape[0])):
                args[i] = t
        if lay.max_seqlen is not None:
            args[lay.max_seqlen] = call.q.shape[0] if call.max_seqlen is None else call.max_seqlen
        if self.corrupt is not None:
            args = self.corrupt(args)
        self.kernel(*args)
        return Resolved(fn=self.kernel, args=args, fa4_compiled=True, sched=sched)

    def public(self, call):
        self.public_calls.append(call)
        return torch.full((call.q.shape[0], call.q.shape[1], call.v.shape[2]), -1.0, dtype=call.q.dtype)


def qkv(total=64, heads=4, d=64, dtype=torch.bfloat16, hk=None):
    hk = heads if hk is None else hk
    return (
        torch.randn(total, heads, d, dtype=dtype),
        torch.randn(total, hk, d, dtype=dtype),
        torch.randn(total, hk, d, dtype=dtype),
    )


@pytest.fixture
def fake():
    return FakeBackend(90)


@pytest.fixture
def cache(fake):
    return KernelCache(fake)


# ---- key normalisation ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "window, expected",
    [
        ((None, None), (False, None, None)),
        ((-1, -1), (False, None, None)),
        ((64, 64), (False, 64, 64)),
        ((64, -1), (False, 64, None)),
        ((-1, 0), (True, None, None)),
        ((None, 0), (True, None, None)),
        ((0, 0), (False, 0, 0)),
        ((5, None), (False, 5, None)),
    ],
)
def test_normalize_window(window, expected):
    assert normalize_window(window) == expected


@pytest.mark.parametrize("bad", [(1.5, 2), ("a", None), (True, 1), 5, (1, 2, 3)])
def test_normalize_window_rejects(bad):
    with pytest.raises(FA4InputError, match="window_size"):
        normalize_window(bad)


@pytest.mark.parametrize("arch", [80, 90, 120])
def test_seqlen_class_single_on_sm90_family(arch):
    assert {seqlen_class(arch, m, 10_000) for m in (1, 64, 128, 129, 192, 193, 4096, None)} == {"any"}


def test_seqlen_class_sm100():
    assert seqlen_class(100, 1, 9999) == seqlen_class(100, 128, 9999) == "q_stage1-static"
    assert seqlen_class(100, 129, 9999) == seqlen_class(100, 256, 9999) == "q_stage2-static"
    assert seqlen_class(100, 257, 9999) == seqlen_class(100, 100_000, 9999) == "q_stage2"
    assert seqlen_class(103, None, 100) == "q_stage1"  # no host bound: never static
    assert seqlen_class(110, None, 1000) == "q_stage2"
    # GQA: FA4 packs the q heads of a kv head into the rows (pack_gqa), so the bound is in packed rows
    assert seqlen_class(100, 64, 9999, 2) == "q_stage1-static" and seqlen_class(100, 65, 9999, 2) == "q_stage2-static"
    assert seqlen_class(100, 96, 9999, 2) == "q_stage2-static" and seqlen_class(100, 96, 9999, 3) == "q_stage2"
    assert seqlen_class(100, 129, 9999, 2) == "q_stage2"


def test_layouts_match_b36_argument_lists():
    assert LAYOUT_SM90.nargs == 18 and LAYOUT_SM90.max_seqlen is None
    assert LAYOUT_SM100.nargs == 25 and LAYOUT_SM100.max_seqlen == 24
    assert layout_for_arch(90) is layout_for_arch(80) is layout_for_arch(120) is LAYOUT_SM90
    assert layout_for_arch(100) is layout_for_arch(103) is LAYOUT_SM100


# ---- resolution -----------------------------------------------------------------------------


def test_first_call_resolves_then_launches_directly(cache, fake):
    q, k, v = qkv()
    out = cache(q, k, v, cu_seqlens([20, 44]), 44, None, (None, None), None, None)
    assert len(fake.compiles) == 1 and cache.compile_count() == 1
    assert out.shape == (64, 4, 64) and torch.all(out == 1)
    q2, k2, v2 = qkv()
    given = torch.empty(64, 4, 64, dtype=torch.bfloat16)
    res = cache(q2, k2, v2, cu_seqlens([60, 4]), 60, None, (None, None), None, given)
    assert res is given and torch.all(given == 2)
    assert len(fake.compiles) == 1  # another max_seqlen, same class: no new compile
    args = fake.launches[-1]
    assert args[0] is q2 and args[1] is k2 and args[2] is v2 and args[3] is given
    assert args[6] is args[7] and args[6].tolist() == [0, 60, 64]
    assert args[5] == 1.0 / math.sqrt(64) and args[4] is None and args[15] is STATIC
    assert args[16] is None and args[17] is None
    ev = cache.compile_events()[0]
    assert ev.index == 1 and ev.fa4_compiled and not ev.during_capture
    cfg = ev.config
    assert (cfg.arch, cfg.dtype, cfg.head_dim, cfg.head_dim_v, cfg.seqlen_class) == (90, "bfloat16", 64, 64, "any")
    assert cache.configs_seen() == [cfg]


def test_template_does_not_pin_first_call_tensors(cache):
    q, k, v = qkv()
    cache(q, k, v, cu_seqlens([64]), 64, None, (None, None), None, None)
    (launcher,) = cache._launchers.values()
    assert all(a is None or a is STATIC for a in launcher.template)


def test_new_dtype_head_dim_or_gqa_recompiles(cache, fake):
    cache(*qkv(d=64), cu_seqlens([64]), 64, None, (None, None), None, None)
    cache(*qkv(d=80), cu_seqlens([64]), 64, None, (None, None), None, None)
    cache(*qkv(d=80, dtype=torch.float16), cu_seqlens([64]), 64, None, (None, None), None, None)
    cache(*qkv(d=80, heads=8, hk=2), cu_seqlens([64]), 64, None, (None, None), None, None)
    cache(*qkv(d=80, heads=16, hk=4), cu_seqlens([64]), 64, None, (None, None), None, None)  # same ratio
    cache(*qkv(d=80, heads=12), cu_seqlens([64]), 64, None, (None, None), None, None)  # heads not in key
    assert cache.compile_count() == 4
    assert [c.qhead_per_kvhead for c in cache.configs_seen()] == [1, 1, 1, 4]


def test_many_segments_is_its_own_configuration(cache, fake):
    q, k, v = qkv(total=600)
    cache(q, k, v, cu_seqlens([2] * 300), 2, None, (None, None), None, None)
    cache(q, k, v, cu_seqlens([300, 300]), 300, None, (None, None), None, None)
    assert cache.compile_count() == 2
    assert [c.many_segments for c in cache.configs_seen()] == [True, False]
    calls = fake.sched_calls
    cache(q, k, v, cu_seqlens([1] * 600), 1, None, (None, None), None, None)
    assert cache.compile_count() == 2 and fake.sched_calls == calls + 1
    args = fake.launches[-1]
    assert args[16].shape == (601,) and args[17] is None
    # back to few segments: no stale scheduler aids
    cache(q, k, v, cu_seqlens([100, 500]), 500, None, (None, None), None, None)
    assert fake.launches[-1][16] is None


def test_sm100_max_seqlen_classes_and_runtime_value():
    fake = FakeBackend(100)
    cache = KernelCache(fake)
    q, k, v = qkv(total=512)
    cache(q, k, v, cu_seqlens([64, 448]), 64, None, (None, None), None, None)
    cache(q, k, v, cu_seqlens([100, 412]), 100, None, (None, None), None, None)
    assert cache.compile_count() == 1 and fake.launches[-1][24] == 100
    cache(q, k, v, cu_seqlens([200, 312]), 200, None, (None, None), None, None)
    cache(q, k, v, cu_seqlens([512]), 512, None, (None, None), None, None)
    cache(q, k, v, cu_seqlens([512]), 4096, None, (None, None), None, None)
    assert cache.compile_count() == 3 and fake.launches[-1][24] == 4096
    cache(q, k, v, cu_seqlens([512]), None, None, (None, None), None, None)  # no bound: total_q
    assert cache.compile_count() == 3 and fake.launches[-1][24] == 512
    qs, ks, vs = qkv(total=100)
    cache(qs, ks, vs, cu_seqlens([100]), None, None, (None, None), None, None)
    assert cache.compile_count() == 4 and fake.launches[-1][24] == 100
    assert [c.seqlen_class for c in cache.configs_seen()] == [
        "q_stage1-static", "q_stage2-static", "q_stage2", "q_stage1"
    ]
    cache(q, k, v, cu_seqlens([1] * 300 + [212]), 212, None, (None, None), None, None)
    args = fake.launches[-1]
    assert args[21] is not None and args[23] is not None


def test_window_and_sinks_reach_the_kernel(cache, fake):
    q, k, v = qkv(heads=4)
    sinks = torch.randn(4, dtype=torch.float32)
    cache(q, k, v, cu_seqlens([64]), 64, 0.125, (64, 64), sinks, None)
    args = fake.launches[-1]
    assert (args[11], args[12], args[13], args[5]) == (64, 64, sinks, 0.125)
    cache(q, k, v, cu_seqlens([64]), 64, None, (32, 16), sinks, None)
    assert cache.compile_count() == 1  # window sizes are runtime values
    args = fake.launches[-1]
    assert (args[11], args[12]) == (32, 16) and args[13] is sinks
    cfg = cache.configs_seen()[0]
    assert cfg.window_left and cfg.window_right and cfg.sink_dtype == "float32"
    # SGLang's (-1, -1) is "no window": a different configuration, no window args
    cache(q, k, v, cu_seqlens([64]), 64, None, (-1, -1), None, None)
    assert cache.compile_count() == 2 and fake.launches[-1][11:14] == (None, None, None)
    # one-sided and causal
    cache(q, k, v, cu_seqlens([64]), 64, None, (64, -1), None, None)
    assert fake.launches[-1][11:13] == (64, None)
    cache(q, k, v, cu_seqlens([64]), 64, None, (-1, 0), None, None)
    assert cache.configs_seen()[-1].causal and fake.compiles[-1].window_right == 0
    assert fake.launches[-1][11:13] == (None, None)
    # sinks of another dtype: another configuration
    cache(q, k, v, cu_seqlens([64]), 64, None, (64, 64), sinks.bfloat16(), None)
    assert cache.configs_seen()[-1].sink_dtype == "bfloat16"


def test_sinks_are_made_contiguous_and_detached(cache, fake):
    q, k, v = qkv(heads=4)
    sinks = torch.randn(8, dtype=torch.float32, requires_grad=True)[::2]
    with torch.no_grad():
        cache(q, k, v, cu_seqlens([64]), 64, None, (None, None), sinks, None)
    passed = fake.launches[-1][13]
    assert passed.is_contiguous() and not passed.requires_grad
    assert torch.equal(passed, sinks.detach())


@pytest.mark.parametrize("arch", [80, 120])
def test_sinks_unsupported_on_sm80_and_sm120(arch):
    cache = KernelCache(FakeBackend(arch))
    q, k, v = qkv(heads=4)
    with pytest.raises(FA4FeatureError, match="sinks"):
        cache(q, k, v, cu_seqlens([64]), 64, None, (64, 64), torch.zeros(4), None)
    cache(q, k, v, cu_seqlens([64]), 64, None, (64, 64), None, None)  # windows alone are fine


def test_noncontiguous_inputs_are_aligned_like_fa4(cache, fake):
    packed = torch.randn(64, 3, 4, 64, dtype=torch.bfloat16)
    q, k, v = packed.unbind(1)
    cache(q, k, v, cu_seqlens([64]), 64, None, (None, None), None, None)
    args = fake.launches[-1]
    assert args[0].data_ptr() == q.data_ptr()  # aligned strided view: passed as is
    odd = torch.randn(64, 4, 65, dtype=torch.bfloat16)[:, :, 1:]  # 2-byte offset
    cache(odd, k, v, cu_seqlens([64]), 64, None, (None, None), None, None)
    assert fake.launches[-1][0].is_contiguous() and torch.equal(fake.launches[-1][0], odd)


def test_broadcast_inputs_key_separately(cache):
    q, k, v = qkv(heads=4)
    kb = k[:, :1].expand(64, 4, 64)
    cache(q, k, v, cu_seqlens([64]), 64, None, (None, None), None, None)
    cache(q, kb, v, cu_seqlens([64]), 64, None, (None, None), None, None)
    assert cache.compile_count() == 2 and cache.configs_seen()[1].broadcast is not None


def test_grad_inputs_take_the_public_path(cache, fake):
    q, k, v = qkv()
    q.requires_grad_(True)
    out = cache(q, k, v, cu_seqlens([64]), 64, None, (-1, 0), None, None)
    assert torch.all(out == -1) and cache.compile_count() == 0
    assert (fake.public_calls[0].window_left, fake.public_calls[0].window_right) == (None, 0)
    with torch.no_grad():
        cache(q, k, v, cu_seqlens([64]), 64, None, (None, None), None, None)
    assert cache.compile_count() == 1 and not fake.launches[-1][0].requires_grad


def test_empty_input_zeroes_out_without_compiling(cache):
    """No tokens (one empty segment, max_seqlen 0): FA4's own early exit; cu_seqlens of one entry
    (no segment at all) is refused (tests/test_fa4_input_checks.py)."""
    q, k, v = qkv(total=0)
    out = torch.full((0, 4, 64), 3.0, dtype=torch.bfloat16)
    assert cache(q, k, v, cu_seqlens([0]), 0, None, (None, None), None, out) is out
    assert cache.compile_count() == 0


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda a: {**a, "q": a["q"].float(), "k": a["k"].float(), "v": a["v"].float()}, "bfloat16 or all float16"),
        (lambda a: {**a, "k": a["k"].half()}, "bfloat16 or all float16"),
        (lambda a: {**a, "q": a["q"][None]}, r"\(total_tokens, heads, head_dim\)"),
        (lambda a: {**a, "v": a["v"][:10]}, "share tokens and heads"),
        (lambda a: {**a, "k": a["k"][..., :32], "v": a["v"][..., :32]}, "head_dim"),
        (lambda a: {**a, "q": torch.randn(64, 3, 64, dtype=torch.bfloat16)}, "multiple"),
        (lambda a: {**a, "cu": a["cu"].long()}, "int32"),
        (lambda a: {**a, "max_seqlen": torch.tensor(64)}, "host int"),
        (lambda a: {**a, "max_seqlen": 64.0}, "int or None"),
        (lambda a: {**a, "sinks": torch.zeros(3)}, r"\(heads,\)"),
        (lambda a: {**a, "sinks": torch.zeros(4, dtype=torch.float64)}, "float32, bfloat16"),
        (lambda a: {**a, "out": torch.empty(64, 4, 32, dtype=torch.bfloat16)}, "out must be"),
        (lambda a: {**a, "out": torch.empty(64, 4, 64, dtype=torch.float16)}, "out must be"),
        (lambda a: {**a, "out": torch.empty(64, 4, 128, dtype=torch.bfloat16)[..., ::2]}, "contiguous last dim"),
        (lambda a: {**a, "window": (1.0, 2)}, "window_size"),
    ],
)
def test_clear_errors(cache, mutate, match):
    q, k, v = qkv(heads=4)
    a = mutate(dict(q=q, k=k, v=v, cu=cu_seqlens([64]), max_seqlen=64, sinks=None, out=None, window=(None, None)))
    with pytest.raises(FA4InputError, match=match):
        cache(a["q"], a["k"], a["v"], a["cu"], a["max_seqlen"], None, a["window"], a["sinks"], a["out"])
    assert cache.compile_count() == 0


def test_cuda_required_with_real_backend_flag():
    fake = FakeBackend(90)
    fake.requires_cuda = True
    with pytest.raises(FA4InputError, match="CUDA"):
        KernelCache(fake)(*qkv(), cu_seqlens([64]), 64, None, (None, None), None, None)


@pytest.mark.parametrize(
    "corrupt, match",
    [
        (lambda a: a[:-1], "expected 18 arguments"),
        (lambda a: [a[1], a[0], *a[2:]], "argument 0 is not q"),
        (lambda a: [*a[:11], 7, *a[12:]], "window_left"),
        (lambda a: [*a[:4], torch.zeros(1), *a[5:]], "lse"),
        (lambda a: [*a[:14], torch.zeros(1), *a[15:]], "tensor this cache does not know"),
    ],
)
def test_layout_drift_falls_back_to_the_public_api(corrupt, match, caplog, monkeypatch):
    """Another flash-attn-4 whose kernel call is not the recorded layout: one warning naming what
    differs, then FA4's public API for that configuration (right results, never an error per call)."""
    from sglang_fa4.kernels.fa4 import cache as fa4_kernel_cache

    monkeypatch.setattr(fa4_kernel_cache, "_layout_fallback_warned", False)
    fake = FakeBackend(90)
    fake.corrupt = corrupt
    cache = KernelCache(fake)
    q, k, v = qkv()
    with caplog.at_level("WARNING", logger="sglang_fa4"):
        first = cache(q, k, v, cu_seqlens([64]), 64, None, (None, None), None, None)
        out = torch.empty_like(q)
        second = cache(q, k, v, cu_seqlens([64]), 64, None, (None, None), None, out)
    assert torch.equal(first, torch.full_like(q, -1.0)) and second is out and torch.equal(out, first)
    assert len(fake.compiles) == 1 and len(fake.public_calls) == 2  # recorded once, public after
    assert cache.compile_count() == 1  # resolved once: the JIT monitor and the warmup see it
    (config,) = cache.public_configs()
    assert config.head_dim == 64
    warnings = [r.getMessage() for r in caplog.records if "public API" in r.getMessage()]
    assert len(warnings) == 1 and re.search(match, warnings[0]), warnings


def test_fa4_assertions_become_input_errors():
    class Rejecting(FakeBackend):
        def compile_and_run(self, call):
            raise AssertionError("head_dim not supported")

    with pytest.raises(FA4InputError, match="head_dim not supported"):
        KernelCache(Rejecting())(*qkv(), cu_seqlens([64]), 64, None, (None, None), None, None)


def test_listeners_and_module_api():
    fake = FakeBackend(90)
    previous = fa4.install_kernel_cache(KernelCache(fake))
    try:
        seen = []
        remove = fa4.kernel_cache().add_compile_listener(seen.append)
        q, k, v = qkv()
        varlen.fa4_varlen_attention(q, k, v, cu_seqlens([64]), 64, window_size=(8, 8))
        varlen.fa4_varlen_attention(q, k, v, cu_seqlens([32, 32]), 32, window_size=(16, 4))
        remove()
        varlen.fa4_varlen_attention(q, k, v, cu_seqlens([64]), 64)
        assert fa4.kernel_cache().compile_count() == 2 and len(seen) == 1
        assert seen[0] == fa4.kernel_cache().compile_events()[0]
        assert [c.window_left for c in fa4.kernel_cache().configs_seen()] == [True, False]
        assert seen[0].as_dict()["config"]["head_dim"] == 64
    finally:
        fa4.install_kernel_cache(previous)


def test_sm100_hd256_runs_fa4_every_call_without_caching():
    fake = FakeBackend(100)
    cache = KernelCache(fake)
    q, k, v = qkv(d=256)
    cache(q, k, v, cu_seqlens([64]), 64, None, (None, None), None, None)
    cache(q, k, v, cu_seqlens([64]), 64, None, (None, None), None, None)
    assert len(fake.compiles) == 2 and cache.compile_count() == 0


def test_importing_does_not_import_cutlass_or_flash_attn():
    code = (
        "import sys, sglang_fa4.kernels.varlen, sglang_fa4.kernels.fa4.cache, sglang_fa4.kernels.fa4.b36;"
        "bad = [m for m in ('cutlass', 'flash_attn', 'tvm_ffi') if m in sys.modules];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ---- the real backend, against a stand-in for flash_attn.cute.interface ----------------------

_FAKE_INTERFACE = '''
USE_BLOCKS_TO_BATCH = True

class JITCache(dict):
    pass

def _get_device_arch():
    return ARCH

def _compute_tile_cumsum(*, num_m_blocks=None, cu_seqlens=None, seqused=None,
                         num_splits_dynamic=None, virtual_batch_idx=None, tile_size=1, q_stage=1,
                         cluster_shape_m=1, qhead_per_kvhead=1, pack_gqa=False):
    # like FA4 b36: reads its cache through the module global
    _compute_tile_cumsum.compile_cache.setdefault(("cumsum", tile_size), "compiled")
    return torch.arange(cu_seqlens.shape[0], dtype=torch.int32), None

_compute_tile_cumsum.compile_cache = JITCache()

def _blocks_to_batch_size(total_q, num_batch, tile_m, qhead_per_kvhead, pack_gqa):
    return (total_q + num_batch * (tile_m - 1)) // tile_m + 1

def _compute_blocks_to_batch(cu_total_blocks, num_blocks, device):
    return torch.zeros(num_blocks, dtype=torch.int32)

def kernel(*args):
    KERNEL_CALLS.append(args)

def _flash_attn_fwd(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                    max_seqlen_k=None, softmax_scale=None, causal=False, window_size_left=None,
                    window_size_right=None, learnable_sink=None, num_splits=1, out=None):
    import math
    key = (q.dtype, q.shape[-1], window_size_left is not None, learnable_sink is not None)
    if key not in _flash_attn_fwd.compile_cache:
        _flash_attn_fwd.compile_cache[key] = kernel
    sched = [None, None]
    if cu_seqlens_q.shape[0] - 1 > 256:
        sched = list(_compute_tile_cumsum(cu_seqlens=cu_seqlens_q, tile_size=192, q_stage=1,
                                          cluster_shape_m=1, qhead_per_kvhead=1, pack_gqa=False))
    scale = 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else softmax_scale
    args = [q.detach(), k.detach(), v.detach(), out.detach(), None, scale, cu_seqlens_q,
            cu_seqlens_k, None, None, None, window_size_left, window_size_right, learnable_sink,
            None, AUX, *sched]
    _flash_attn_fwd.compile_cache[key](*args)
    return out, None, None, None, None

_flash_attn_fwd.compile_cache = JITCache()
'''


@pytest.fixture
def fake_interface(monkeypatch):
    import types

    from sglang_fa4.kernels.fa4 import b36 as fa4_b36
    mod = types.ModuleType("fake_fa4_interface")
    mod.__dict__.update(torch=torch, ARCH=90, KERNEL_CALLS=[], AUX=STATIC)
    exec(_FAKE_INTERFACE, mod.__dict__)
    monkeypatch.setattr(fa4_b36, "_interface", lambda: mod)
    monkeypatch.setitem(sys.modules, "flash_attn.cute.interface", mod)  # imported: its arch wins
    return mod


def test_fa4_backend_records_kernel_and_restores_fa4(fake_interface):
    from sglang_fa4.kernels.fa4.b36 import FA4Backend

    mod = fake_interface
    cache_obj, cumsum = mod._flash_attn_fwd.compile_cache, mod._compute_tile_cumsum
    cache = KernelCache(FA4Backend.__new__(FA4Backend))
    cache.backend.requires_cuda = False
    q, k, v = qkv(total=600)
    cache(q, k, v, cu_seqlens([300, 300]), 300, None, (None, None), None, None)
    cache(q, k, v, cu_seqlens([2] * 300), 2, None, (None, None), None, None)
    ev = cache.compile_events()
    assert [e.fa4_compiled for e in ev] == [True, False]  # FA4's cache already had the 2nd key
    assert mod._flash_attn_fwd.compile_cache is cache_obj and mod._compute_tile_cumsum is cumsum
    assert ("cumsum", 192) in cumsum.compile_cache
    n = len(mod.KERNEL_CALLS)
    cache(q, k, v, cu_seqlens([1] * 600), 1, None, (None, None), None, None)  # direct launch
    assert len(mod.KERNEL_CALLS) == n + 1 and cache.compile_count() == 2
    args = mod.KERNEL_CALLS[-1]
    assert args[0] is q and args[16].shape == (601,) and args[17] is None
    mod._flash_attn_fwd.compile_cache.clear()
    cache2 = KernelCache(cache.backend)
    cache2(q, k, v, cu_seqlens([600]), 600, None, (64, 64), torch.zeros(4), None)
    assert cache2.compile_events()[0].fa4_compiled
    assert mod.KERNEL_CALLS[-1][11:14][:2] == (64, 64)
