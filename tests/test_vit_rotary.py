"""The fused ViT rotary (kernels/vit/rotary.py) against SGLang's own native rotary, its cached-handle
launch (kernels/triton_handles.py), and its hook on the real SGLang 0.5.20 / 0.5.23 (CPU: Triton's
interpreter, TRITON_INTERPRET=1, in a child process)."""

import pytest
import torch

from sglang_harness import run_file, run_with_sglang
from sglang_fa4.kernels import compile_events
from sglang_fa4.kernels import triton_handles
from sglang_fa4.kernels.vit import rotary as vit_rotary

# Qwen2.5-VL (d=80, bf16 tables, q/k views into one qkv projection) and Qwen3-VL (d=72, fp32 or bf16
# tables), fp16 q/k (the interpreter rounds fp32 -> fp16 to nearest, as the GPU does; its
# fp32 -> bf16 conversion truncates, so bf16 outputs are checked to one bf16 step there)


@pytest.mark.parametrize("version", ["0.5.23"])
def test_fused_rotary_matches_sglang_native_in_the_interpreter(version):
    out = run_file(version, "vit_rotary_numerics.py", env={"TRITON_INTERPRET": "1"}, timeout=600)
    for name, row in out.items():
        assert row["shape_ok"] and row["inputs_unchanged"] and row["finite"], (name, row)
        if "fp16" in name:
            assert row["bitwise"], (name, row)  # same fp32 products, one rounding: SGLang's bits
        assert row["worst_in_steps"] <= 1.0, (name, row)




def test_hook_routes_sglang_graph_rotary_to_the_fused_kernel(sglang_version):
    res = run_file(sglang_version, "vit_rotary_hook.py", env={"TRITON_INTERPRET": "1", "SGLANG_VIT_ENABLE_CUDA_GRAPH": "1"},
                          timeout=600)
    assert res["wrapped"] and res["compiled_rotary_sees_wrapper"], res
    assert res["calls_before_warm"] == 0, res  # never a kernel the warmup did not resolve
    assert res["calls_after_warm"] == 1 and res["equal_to_native"], res
    assert res["calls_other_shape"] == 0, res  # unsqueeze_dim=2, 4-D: SGLang's own
    assert res["calls_compiling"] == 0, res  # torch.compile traces the original


def test_hook_off_without_warmup(sglang_version):
    res = run_with_sglang(sglang_version, """
import sglang.srt.plugins as plugins
plugins.load_plugins()
from sglang.srt.layers.attention import vision
emit({"wrapped": hasattr(vision.apply_rotary_pos_emb_native_eager, "__wrapped__")})
""", env={"SGLANG_FA4_WARMUP": "0"})
    assert not res["wrapped"]


@pytest.mark.parametrize("case", ["3d_cos", "odd_d", "dtype_mix", "fp32_q", "tokens", "last_stride", "head_stride"])
def test_supported_rejects_and_apply_raises(case):
    q, k = torch.randn(4, 2, 8).half(), torch.randn(4, 2, 8).half()
    cos, sin = torch.randn(4, 8).half(), torch.randn(4, 8).half()
    if case == "3d_cos":
        cos = cos.unsqueeze(1)
    elif case == "odd_d":
        q, k, cos, sin = q[..., :7], k[..., :7], cos[:, :7], sin[:, :7]
    elif case == "dtype_mix":
        k = k.bfloat16()
    elif case == "fp32_q":
        q, k = q.float(), k.float()
    elif case == "tokens":
        cos, sin = cos[:3], sin[:3]
    elif case == "last_stride":
        q = torch.randn(4, 2, 16).half()[..., ::2]
    elif case == "head_stride":  # heads not packed within a token (the kernel's head stride is d)
        q = torch.randn(4, 2, 16).half()[..., :8]
    assert not vit_rotary.supported(q, k, cos, sin)
    with pytest.raises(ValueError, match="vit_rotary: needs"):
        vit_rotary.apply_rotary(q, k, cos, sin)


def test_is_warm_keys_on_what_the_kernel_specializes(monkeypatch):
    """A call is warm only with the head dim, head counts, dtypes, token-stride kinds and input
    alignment of a call warm() made: anything else would compile (inside a capture, even)."""
    q, k = torch.randn(4, 2, 8).half(), torch.randn(4, 2, 8).half()  # token stride 16
    cos, sin = torch.randn(4, 8).half(), torch.randn(4, 8).half()
    monkeypatch.setattr(vit_rotary, "_warmed", {vit_rotary.launch_key(q, k, cos, sin)})
    assert vit_rotary.is_warm(q, k, cos, sin)
    view = torch.randn(4, 6 * 8).half()[:, :16].view(4, 2, 8)  # a qkv view: token stride 48, a multiple of 16 too
    assert vit_rotary.is_warm(view, k, cos, sin)
    odd = torch.randn(4, 3 * 8).half()[:, :16].view(4, 2, 8)  # token stride 24: another specialization
    assert not vit_rotary.is_warm(odd, k, cos, sin)
    assert not vit_rotary.is_warm(q, k, cos.float(), sin)  # fp32 tables: another kernel
    assert not vit_rotary.is_warm(q[:, :1], k[:, :1], cos, sin)  # one head
    shifted = torch.randn(4 * 16 + 4).half()[4:].view(4, 2, 8)  # 8 bytes off a 16-byte boundary
    assert not vit_rotary.is_warm(shifted, k, cos, sin)


# ---- the cached handle, with a stand-in for Triton's JIT function -------------------------------


class FakeParam:
    def __init__(self, num, constexpr=False, dns=False):
        self.num, self.is_constexpr, self.do_not_specialize = num, constexpr, dns


class FakeCompiled:
    def __init__(self, log):
        self.log, self.function, self.packed_metadata = log, "fn", "packed"

    def run(self, *a):
        self.log.append(("fast", a[:3], a[9:]))

    def launch_metadata(self, *a):
        return None


class FakeJit:
    """Signature (X: pointer, n: int do_not_specialize, stride: int, BLOCK: constexpr)."""

    params = [FakeParam(0), FakeParam(1, dns=True), FakeParam(2), FakeParam(3, constexpr=True)]

    def __init__(self):
        self.log = []

    def __getitem__(self, grid):
        def call(*args, **options):
            self.log.append(("jit", grid, args))
            return FakeCompiled(self.log)
        return call


@pytest.fixture
def fake_handles(monkeypatch):
    import sys
    import types

    jit = FakeJit()
    handles = triton_handles.KernelHandles("fake", lambda: jit)
    monkeypatch.setattr(triton_handles, "interpreting", lambda: False)
    # the stream and knobs the fast path reads (no GPU here)
    handles._stream_of = lambda device: 7
    handles._knobs = types.SimpleNamespace(runtime=types.SimpleNamespace(launch_enter_hook=None, launch_exit_hook=None))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setitem(sys.modules, "triton", types.SimpleNamespace(knobs=types.SimpleNamespace(
        compilation=types.SimpleNamespace(listener=None))))
    monkeypatch.setitem(sys.modules, "triton.runtime", types.ModuleType("triton.runtime"))
    return handles, jit


def test_handle_resolves_once_per_specialization(fake_handles):
    handles, jit = fake_handles
    events = []
    remove = compile_events.add_listener(lambda _source, event: events.append(event), "triton")
    try:
        x = torch.zeros(64, dtype=torch.float16)
        handles.launch((3,), (x, 100, 32, 16), 0, num_warps=4)  # resolves through the JIT
        handles.launch((5,), (x, 37, 64, 16), 0, num_warps=4)  # new token count, stride still % 16
        handles.launch((5,), (x[8:], 37, 64, 16), 0, num_warps=4)  # 16 B aligned view
        assert [e[0] for e in jit.log] == ["jit", "fast", "fast"]
        assert jit.log[1] == ("fast", (5, 1, 1), (x, 37, 64, 16))
        assert len(events) == 1 and events[0].kernel == "fake"
        handles.launch((5,), (x[1:], 37, 64, 16), 0, num_warps=4)  # misaligned pointer: new key
        handles.launch((5,), (x, 37, 24, 16), 0, num_warps=4)  # stride not % 16: new key
        handles.launch((5,), (x, 37, 1, 16), 0, num_warps=4)  # stride 1: new key
        handles.launch((5,), (x, 37, 64, 32), 0, num_warps=4)  # constexpr: new key
        handles.launch((5,), (x, 37, 64, 16), 0, num_warps=8)  # launch option: new key
        assert [e[0] for e in jit.log[3:]] == ["jit"] * 5
        assert len(events) == 6 and handles.resolved() == 6
        handles.launch((5,), (x, 2**40, 64, 16), 0, num_warps=4)  # i64: Triton's dispatch each time
        assert jit.log[-1][0] == "jit" and handles.resolved() == 6
    finally:
        remove()




def test_torch_compile_traces_sglang_rotary_through_the_hook(sglang_version):
    res = run_file(sglang_version, "vit_rotary_traced.py", env={"SGLANG_VIT_ENABLE_CUDA_GRAPH": "1"}, timeout=600)
    assert res == {"equal": True, "fused_calls": 0}


def test_caller_memo_skips_the_key_and_never_resolves_twice(fake_handles, monkeypatch):
    """A caller's memo (issue #18: host time) launches its handle without computing Triton's key; a
    new memo whose key is known reuses that handle (no resolve, no compile event)."""
    handles, jit = fake_handles
    events = []
    remove = compile_events.add_listener(lambda _source, event: events.append(event), "triton")
    keys = []
    real_key = handles._key
    monkeypatch.setattr(handles, "_key", lambda *a: keys.append(1) or real_key(*a))
    try:
        x = torch.zeros(64, dtype=torch.float16)
        handles.launch((3,), (x, 100, 32, 16), 0, ("m", 32), num_warps=4)  # resolves, remembered
        handles.launch((4,), (x, 7, 32, 16), 0, ("m", 32), num_warps=4)  # memo hit: no key
        assert [e[0] for e in jit.log] == ["jit", "fast"] and len(keys) == 1
        assert jit.log[1] == ("fast", (4, 1, 1), (x, 7, 32, 16))
        handles.launch((5,), (x, 9, 48, 16), 0, ("m", 48), num_warps=4)  # new memo, same Triton key
        assert [e[0] for e in jit.log] == ["jit", "fast", "fast"] and len(keys) == 2
        handles.launch((5,), (x, 9, 48, 16), 0, ("m", 48), num_warps=4)
        assert len(keys) == 2 and len(events) == 1 and handles.resolved() == 1
        monkeypatch.setattr(triton_handles, "MEMO_LIMIT", 2)
        handles.launch((5,), (x, 9, 64, 16), 0, ("m", 64), num_warps=4)  # a third memo: the table starts over
        assert set(handles._memo) == {("m", 64)}
        handles.clear()
        assert not handles._memo
    finally:
        remove()
