"""ViT graphs over token budgets (sglang_fa4.integration.vit_budgets): the pure layout logic, and the real
SGLang 0.5.20 / 0.5.23 ViTCudaGraphRunner driven on a CPU with the plugin loaded.

In the runner tests CUDA graphs are faked so that replay is checkable: a fake graph's ``replay()``
re-runs the runner's own ``_create_graph`` body (the captured Python), reading the same static
buffers and the max_seqlen fixed at capture, exactly what a real graph replays. FA4 is a torch
reference varlen attention that fills only rows inside segments (others stay NaN, like
uninitialised memory) and raises if a segment is longer than the max_seqlen it was given.
"""

from itertools import accumulate

import pytest

from sglang_fa4 import plugin
from sglang_fa4.environ import EnvValueError, envs
from sglang_fa4.integration import vit_budgets as vb
from sglang_fa4.integration import vit_budget_layouts as budget_layouts
from sglang_harness import ROOT, run_with_sglang

# ---------------------------------------------------------------------------------------------
# pure
# ---------------------------------------------------------------------------------------------


def test_parse_budgets_and_env(monkeypatch):
    var = envs.SGLANG_FA4_VIT_GRAPH_BUDGETS
    assert var.parse(" 2048,1024,1024 ,") == (1024, 2048)
    for bad in ("", "abc", "1023", "0", "-4"):
        with pytest.raises(EnvValueError, match="SGLANG_FA4_VIT_GRAPH_BUDGETS=.*accepted: a comma list of integers, each >= 4 and a multiple of 4"):
            var.parse(bad)
    monkeypatch.delenv("SGLANG_FA4_VIT_GRAPH_BUDGETS", raising=False)
    assert budget_layouts.budgets_from_env() == (896, 1024, 1536, 2048, 3072, 4096, 5120, 6144, 8192)
    monkeypatch.setenv("SGLANG_FA4_VIT_GRAPH_BUDGETS", "64,256")
    assert budget_layouts.budgets_from_env() == (64, 256)
    monkeypatch.delenv("SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE", raising=False)
    assert vb.enabled() is True  # on by default: what SGLANG_VIT_ENABLE_CUDA_GRAPH=1 gets with fa4
    monkeypatch.setenv("SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE", "0")  # the opt-out
    assert vb.enabled() is False


def test_pick_budget():
    budgets = (1024, 256, 4096)
    assert budget_layouts.pick_budget(1, budgets) == 256
    assert budget_layouts.pick_budget(256, budgets) == 256
    assert budget_layouts.pick_budget(257, budgets) == 1024
    assert budget_layouts.pick_budget(4096, budgets) == 4096
    assert budget_layouts.pick_budget(4097, budgets) is None


def test_pad_layout_fixed_shape_and_pad_segments():
    cap = budget_layouts.segment_capacity(256)
    out = budget_layouts.pad_layout([0, 0, 100, 140], 256, cap, max_seqlen=256)
    assert len(out) == cap + 1
    assert out[:4] == [0, 0, 100, 140]
    # the 116 padding rows: segments of <= 64, then empty segments at the budget
    assert out[4:6] == [204, 256] and set(out[6:]) == {256}
    # every row 0..budget lies in exactly one segment; none longer than max_seqlen
    lens = [b - a for a, b in zip(out, out[1:])]
    assert sum(lens) == 256 and max(lens) <= 256
    # windowed: pad segments no longer than the window
    w = budget_layouts.pad_layout([0, 16, 20, 24], 64, budget_layouts.segment_capacity(64), max_seqlen=16)
    assert max(b - a for a, b in zip(w, w[1:])) <= 16 and w[-1] == 64 and w[3:6] == [24, 40, 56]


@pytest.mark.parametrize("cu,budget,max_seqlen", [
    ([0, 300], 256, 256),  # more tokens than the budget
    ([0, 20, 40], 64, 16),  # a segment longer than the fixed max_seqlen (window)
    ([0, 8, 4], 64, 64),  # not monotone
    ([1, 8], 64, 64),
])
def test_pad_layout_rejects(cu, budget, max_seqlen):
    with pytest.raises(budget_layouts.LayoutDoesNotFit):
        budget_layouts.pad_layout(cu, budget, budget_layouts.segment_capacity(budget), max_seqlen)


def test_pad_layout_capacity():
    # segments of CAPACITY_TOKENS_PER_SEGMENT tokens fill any budget, with Qwen2.5's empty lead
    step = budget_layouts.CAPACITY_TOKENS_PER_SEGMENT
    for budget in (64, 256, 1024):
        for tokens in range(0, budget + 1, step):
            cu = [0, 0] + list(range(step, tokens + 1, step))
            out = budget_layouts.pad_layout(cu, budget, budget_layouts.segment_capacity(budget), max_seqlen=16)
            assert len(out) == budget_layouts.segment_capacity(budget) + 1
    # more, smaller segments than the capacity: does not fit (that batch runs eagerly)
    with pytest.raises(budget_layouts.LayoutDoesNotFit):
        budget_layouts.pad_layout([0] + list(range(4, 257, 4)), 256, budget_layouts.segment_capacity(256), 64)
    # with windows, a slot per quarter window (never under MIN_SEGMENT_TOKENS)
    assert budget_layouts.segment_capacity(1024, 64) == 1024 // 16 + budget_layouts.SPARE_SEGMENTS
    assert budget_layouts.segment_capacity(1024, 8) == 1024 // budget_layouts.MIN_SEGMENT_TOKENS + budget_layouts.SPARE_SEGMENTS


def test_capacity_fits_real_qwen_window_layouts():
    from sglang_fa4.bench.layouts import QWEN25_VL, PICTURES

    for name, (width, height, frames) in PICTURES.items():
        seqlens = QWEN25_VL.window_seqlens([QWEN25_VL.grid_thw(width, height, frames)])
        tokens = sum(seqlens)
        budget = 1 << (tokens - 1).bit_length()
        cu = list(accumulate(seqlens, initial=0))
        cap = budget_layouts.segment_capacity(budget, 64)
        out = budget_layouts.pad_layout(cu, budget, cap, max_seqlen=64)
        # the real windows unchanged, then padding of <= 64-token segments covering every row up to
        # the budget, then empty segments: the fixed length, with slots to spare
        assert len(out) == cap + 1 and out[: len(cu)] == cu, name
        pads = [b - a for a, b in zip(out[len(cu) - 1:], out[len(cu):])]
        assert out[-1] == budget and all(0 <= p <= 64 for p in pads), name
        assert sum(pads) == budget - tokens, name
        assert len(seqlens) + -(-(budget - tokens) // 64) <= cap, name


def test_full_layout_capacity_and_padding(monkeypatch):
    monkeypatch.delenv("SGLANG_FA4_VIT_GRAPH_MAX_SEGMENTS", raising=False)
    cap = budget_layouts.full_capacity()
    assert cap == 64 + budget_layouts.FULL_PAD_CHUNKS + budget_layouts.SPARE_SEGMENTS
    # below the largest budget: a slot per 256 tokens, at least MIN_FULL_SLOTS, at most 64
    extra = budget_layouts.FULL_PAD_CHUNKS + budget_layouts.SPARE_SEGMENTS
    ladder = (1024, 2048, 4096, 8192, 32768)
    assert [budget_layouts.full_capacity(b, 32768) - extra for b in ladder] == [4, 8, 16, 32, 64]
    assert budget_layouts.full_slots(512, 8192) == budget_layouts.MIN_FULL_SLOTS == 4
    assert budget_layouts.full_slots(8192, 8192) == 64 and budget_layouts.full_slots(20000, 32768) == 64
    monkeypatch.setenv("SGLANG_FA4_VIT_GRAPH_TOKENS_PER_SEGMENT_SLOT", "0")  # every budget: 64
    assert budget_layouts.full_slots(1024, 8192) == 64
    monkeypatch.setenv("SGLANG_FA4_VIT_GRAPH_TOKENS_PER_SEGMENT_SLOT", "128")
    assert budget_layouts.full_slots(1024, 8192) == 8
    with pytest.raises(ValueError, match="tokens_per_slot must be >= 0"):
        budget_layouts.full_slots(1024, 8192, tokens_per_slot=-1)
    monkeypatch.setenv("SGLANG_FA4_VIT_GRAPH_TOKENS_PER_SEGMENT_SLOT", "-1")
    with pytest.raises(EnvValueError, match="SGLANG_FA4_VIT_GRAPH_TOKENS_PER_SEGMENT_SLOT"):
        budget_layouts.full_slots(1024, 8192)
    monkeypatch.delenv("SGLANG_FA4_VIT_GRAPH_TOKENS_PER_SEGMENT_SLOT")
    assert budget_layouts.budgets_holding(1500, (8192, 1024, 2048)) == [2048, 8192]
    assert budget_layouts.budgets_holding(9000, (8192, 1024)) == []
    monkeypatch.setenv("SGLANG_FA4_VIT_GRAPH_MAX_SEGMENTS", "3")
    assert budget_layouts.full_capacity() == 3 + budget_layouts.FULL_PAD_CHUNKS + budget_layouts.SPARE_SEGMENTS
    with pytest.raises(ValueError, match="max_segments must be >= 1"):
        budget_layouts.full_capacity(max_segments=0)
    monkeypatch.setenv("SGLANG_FA4_VIT_GRAPH_MAX_SEGMENTS", "0")
    with pytest.raises(EnvValueError, match="SGLANG_FA4_VIT_GRAPH_MAX_SEGMENTS='0'.*accepted: an integer >= 1"):
        budget_layouts.full_capacity()
    monkeypatch.setenv("SGLANG_FA4_VIT_GRAPH_MAX_SEGMENTS", "3")
    # Qwen2.5-VL's full layout (empty lead) of 3 images in a 16384 budget: the 5620 padding rows go
    # in at most FULL_PAD_CHUNKS segments, then empty ones; fixed length
    cu = [0, 0, 1024, 4000, 10764]
    out = budget_layouts.pad_layout(cu, 16384, cap, max_seqlen=16384, pad_segment=budget_layouts.full_pad_segment(16384, 10764))
    assert len(out) == cap + 1 and out[:5] == cu and out[-1] == 16384
    pads = [b - a for a, b in zip(out[4:], out[5:]) if b > a]
    assert sum(pads) == 16384 - 10764 and len(pads) <= budget_layouts.FULL_PAD_CHUNKS
    assert budget_layouts.full_pad_segment(1024, 1024) == 1 and budget_layouts.full_pad_segment(1024, 1021) == 1
    # more images than the capacity: does not fit (eager)
    many = list(range(0, 4 * (cap + 1), 4))
    with pytest.raises(budget_layouts.LayoutDoesNotFit):
        budget_layouts.pad_layout(many, 16384, cap, 16384, budget_layouts.full_pad_segment(16384, many[-1]))


def test_capture_layout_max_seqlen():
    cu = budget_layouts.capture_layout(1024, budget_layouts.segment_capacity(1024), 64)
    assert max(b - a for a, b in zip(cu, cu[1:])) == 64 and cu[-1] == 1024
    cu = budget_layouts.capture_layout(1024, budget_layouts.segment_capacity(1024), 1024)
    assert cu[:2] == [0, 1024]
    assert max(b - a for a, b in zip(cu, cu[1:])) == 1024


def test_plugin_plan_gates_on_env(monkeypatch):
    monkeypatch.delenv("SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE", raising=False)
    monkeypatch.setenv("SGLANG_VIT_ENABLE_CUDA_GRAPH", "1")
    for v in ("0.5.20", "0.5.23"):  # default, with SGLang's ViT graphs on: hooked
        assert "vit_graph_budgets" in plugin.make_plan(v).hooked
    monkeypatch.setenv("SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE", "0")  # the opt-out
    for v in ("0.5.20", "0.5.23"):
        assert "vit_graph_budgets" not in plugin.make_plan(v).hooked
    monkeypatch.delenv("SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE")
    monkeypatch.setenv("SGLANG_VIT_ENABLE_CUDA_GRAPH", "0")  # no ViT graphs: nothing to replace
    for v in ("0.5.20", "0.5.23"):
        assert "vit_graph_budgets" not in plugin.make_plan(v).hooked


# ---------------------------------------------------------------------------------------------
# the real runner
# ---------------------------------------------------------------------------------------------

# The real runner with CUDA graphs faked (see the module docstring) and FA4 a CPU reference.
FAKE_GRAPHS = r"""
import warnings, logging, io, random, types
warnings.simplefilter("ignore")
from contextlib import ExitStack, contextmanager
from unittest import mock
import torch, torch.nn as nn
import sglang.srt.plugins as plugins
plugins.load_plugins()
from sglang.srt.layers.attention import vision
from sglang.srt.multimodal import vit_cuda_graph_runner as vr
import sglang_fa4.kernels.dispatch
from sglang_fa4.integration import vit_budgets as vb
from sglang_fa4.integration import vit_budget_layouts as budget_layouts

log = io.StringIO()
logging.getLogger("sglang_fa4").addHandler(logging.StreamHandler(log))
logging.getLogger("sglang_fa4").setLevel(logging.INFO)  # the startup line is INFO
torch.manual_seed(0); random.seed(0)
STATE = {"capturing": False, "replaying": False, "captures": 0, "attn_calls": 0, "startup": False, "warming": set()}
from sglang_fa4.startup import jit_monitor


def ref_fa4(q, k, v, cu_seqlens, max_seqlen, **kw):
    # reference varlen attention: rows outside every segment stay NaN (uninitialised memory)
    STATE["attn_calls"] += 1
    STATE["warming"].add((STATE["startup"], jit_monitor._expected))
    cu = [int(c) for c in cu_seqlens.tolist()]
    out = torch.full_like(q, float("nan"))
    for a, b in zip(cu, cu[1:]):
        if b - a > max_seqlen:
            raise RuntimeError(f"segment {b - a} > max_seqlen {max_seqlen}")
        if b > a:
            s = torch.einsum("qhd,khd->hqk", q[a:b], k[a:b]) / q.shape[-1] ** 0.5
            out[a:b] = torch.einsum("hqk,khd->qhd", s.softmax(-1), v[a:b])
    return out
sglang_fa4.kernels.dispatch.fa4_varlen_attention = ref_fa4

class FakeGraph:
    def __init__(self): self.again = None
    def replay(self): self.again()

@contextmanager
def fake_graph(g, *a, **k):
    STATE["capturing"] = True
    if not STATE["replaying"]:
        STATE["captures"] += 1
    try: yield
    finally: STATE["capturing"] = False

hooked_create = vr.ViTCudaGraphRunner._create_graph
def recording_create(self, graph_key, *a, **k):
    hooked_create(self, graph_key, *a, **k)
    graph = self.block_graphs[graph_key]
    static = self.block_output[graph_key]  # the memory the capture wrote, rewritten by every replay
    def again():
        STATE["replaying"] = True
        try:
            with torch.no_grad():
                hooked_create(self, graph_key, *a, **k)
        finally:
            STATE["replaying"] = False
        static.copy_(self.block_output[graph_key])  # like a real graph: same address, new values
        self.block_output[graph_key] = static
        self.block_graphs[graph_key] = graph
    graph.again = again
"""

# A small Qwen2.5-VL-like (windows, full blocks, output permutation) and Qwen3-VL-like (deepstack
# mergers) tower with the real fa4 backend, random image mixes, the unpadded eager reference.
MODEL = FAKE_GRAPHS + r"""
H, D = 2, 8
C = H * D
class Attn(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv_backend_name = "fa4"; self.num_attention_heads_per_partition = H; self.head_size = D
        with mock.patch.object(vision, "_is_cuda", True):
            self.backend = vision.VisionFlash4Attention()

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = Attn(); self.norm1 = nn.LayerNorm(C); self.qkv = nn.Linear(C, 3 * C); self.proj = nn.Linear(C, C)
        self.mlp = nn.Sequential(nn.Linear(C, 2 * C), nn.GELU(), nn.Linear(2 * C, C))
    def forward(self, x, cu_seqlens=None, position_embeddings=None, output_ws=None,
                rotary_pos_emb_cos=None, rotary_pos_emb_sin=None):
        s = x.shape[0]
        cos, sin = position_embeddings if position_embeddings is not None else (rotary_pos_emb_cos, rotary_pos_emb_sin)
        q, k, v = self.qkv(self.norm1(x.reshape(s, C))).reshape(s, 3, H, D).unbind(1)
        q = q * cos[:, None] + q.flip(-1) * sin[:, None]; k = k * cos[:, None] + k.flip(-1) * sin[:, None]
        o = self.attn.backend.forward(q, k, v, cu_seqlens=cu_seqlens, bsz=1, seq_len=s)
        y = x.reshape(s, C) + self.proj(o.reshape(s, C))
        return (y + self.mlp(y)).reshape(x.shape)

class Merger(nn.Module):  # Qwen: groups 4 consecutive tokens
    def __init__(self, out=12):
        super().__init__(); self.lin = nn.Linear(4 * C, out)
    def forward(self, y):
        return self.lin(y.reshape(-1, 4 * C))

class ViT(nn.Module):
    def __init__(self, qwen3):
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(4)])
        if qwen3:
            self.deepstack_visual_indexes = [0, 2]
            self.deepstack_merger_list = nn.ModuleList([Merger(6), Merger(6)])
            self.rotary_pos_emb = mock.Mock(rotary_dim=D, spec=["rotary_dim"])  # Qwen3: get_rope(...)
        else:
            self.fullatt_block_indexes = [1, 3]; self.window_size = 8; self.patch_size = 2  # 16-token windows
            self.rotary_pos_emb = nn.Module(); self.rotary_pos_emb.register_buffer("inv_freq", torch.ones(D // 4))
        self.merger = Merger()
        self.device = torch.device("cpu"); self.dtype = torch.float32

def image_mix(qwen3):
    # random images (h, w even: token counts multiples of 4), Qwen2.5 windows of <= 16 tokens
    n = random.randint(1, 3)
    sizes = [2 * random.randint(1, 3) * 2 * random.randint(1, 3) for _ in range(n)]  # <= 108 tokens
    total = sum(sizes)
    full = [0] + [sum(sizes[:i + 1]) for i in range(n)]
    if qwen3:
        return total, full, None
    full = [0] + full
    win = [0]
    for s in sizes:
        left = s
        while left:
            w = min(left, 4 * random.randint(1, 4)); left -= w; win.append(win[-1] + w)
    return total, full, win

def reference(vit, x, full, win, tables, qwen3, perm):
    # eager, unpadded: the model's own loop over blocks
    fl = [torch.tensor(full, dtype=torch.int32), max(b - a for a, b in zip(full, full[1:]))]
    wl = None if win is None else [torch.tensor(win, dtype=torch.int32), max(b - a for a, b in zip(win, win[1:]))]
    kw = {"rotary_pos_emb_cos": tables[0], "rotary_pos_emb_sin": tables[1]} if qwen3 else {"position_embeddings": tables}
    y = x.unsqueeze(1); deep = []
    with torch.no_grad():
        for i, blk in enumerate(vit.blocks):
            y = blk(y, cu_seqlens=fl if (qwen3 or i in vit.fullatt_block_indexes) else wl, **kw)
            if qwen3 and i in vit.deepstack_visual_indexes:
                deep.append(vit.deepstack_merger_list[vit.deepstack_visual_indexes.index(i)](y))
        out = vit.merger(y)
        if deep: out = torch.cat([out] + deep, dim=1)
    return out if perm is None else out.index_select(0, perm)

def call_run(runner, x, full, win, tables, qwen3, perm):
    cu = torch.tensor(full, dtype=torch.int32)
    cw = None if win is None else torch.tensor(win, dtype=torch.int32)
    if qwen3:
        return runner.run(x=x, position_embeddings=None, rotary_pos_emb_cos=tables[0], rotary_pos_emb_sin=tables[1],
                          cu_seqlens=cu, cu_window_seqlens=None, output_indices=None,
                          attention_layout_key=(tuple(full), None))
    return runner.run(x=x, position_embeddings=tables, cu_seqlens=cu, cu_window_seqlens=cw,
                      output_indices=perm, attention_layout_key=(tuple(full), tuple(win)))

def tower_with_runner(qwen3):
    # the tower holding SGLang's generic runner, and a ModelRunner stand-in whose model holds the
    # tower (what the startup hook walks)
    vit = ViT(qwen3)
    runner = vr.ViTCudaGraphRunner(vit)
    setattr(vit, "graph_runners" if qwen3 else "cuda_graph_runner", runner)
    model = nn.Module(); model.visual = vit
    return vit, runner, types.SimpleNamespace(model=model)

def faked_graphs():
    stack = ExitStack()
    for target, name, value in ((torch.cuda, "CUDAGraph", FakeGraph), (torch.cuda, "graph", fake_graph),
                                (torch.cuda, "synchronize", lambda *a: None),
                                (vr.ViTCudaGraphRunner, "_capture_context", lambda self: mock.MagicMock()),
                                (vr.ViTCudaGraphRunner, "_create_graph", recording_create)):
        stack.enter_context(mock.patch.object(target, name, value))
    return stack
"""

# What the plugin registered through SGLang's HookRegistry, and the startup path as registered: the
# AFTER ModelRunner.load_model budget hook, called on a ModelRunner stand-in when it is there.
HOOKS = r"""
from sglang.srt.plugins.hook_registry import HookRegistry
GENERIC = "sglang.srt.multimodal.vit_cuda_graph_runner.ViTCudaGraphRunner"
LOAD_MODEL = "sglang.srt.model_executor.model_runner.ModelRunner.load_model"

def hook_list():
    hooks = {m: [(ht.value, fn.__qualname__) for ht, fn, src in HookRegistry._hooks.get(f"{GENERIC}.{m}", [])]
             for m in ("run", "create_graph")}
    hooks["forward"] = [(ht.value, fn.__qualname__) for ht, fn, src in
                        HookRegistry._hooks.get("sglang.srt.models.qwen2_5_vl.Qwen2_5_VisionTransformer.forward", [])]
    hooks["load_model"] = [fn.__module__ + "." + fn.__qualname__ for ht, fn, src in HookRegistry._hooks.get(LOAD_MODEL, [])]
    return hooks

def registered_startup(mr):
    found = [fn for ht, fn, src in HookRegistry._hooks.get(LOAD_MODEL, []) if fn is vb.capture_budgets_after_load_model]
    for fn in found:
        assert fn(None, mr) is None  # SGLang keeps load_model's own result
    return len(found)
"""

RUNNER = MODEL + HOOKS + r"""
result = {"hooks": hook_list()}
with faked_graphs():
    for qwen3 in (False, True):
        name = "qwen3" if qwen3 else "qwen25"
        vit, runner, mr = tower_with_runner(qwen3)
        # the startup path: the AFTER ModelRunner.load_model hook finds the runner, reads its dims
        STATE["startup"] = True
        assert registered_startup(mr) == 1  # the switch left at its default: registered
        STATE["startup"] = False
        state = vb.budget_state(runner)
        startup_captures = STATE["captures"]
        cases = []
        for trial in range(12):
            total, full, win = image_mix(qwen3)
            x = torch.randn(total, C)
            tables = (torch.randn(total, D), torch.randn(total, D))
            perm = None if qwen3 else torch.randperm(total // 4)
            got = call_run(runner, x, full, win, tables, qwen3, perm)
            want = reference(vit, x, full, win, tables, qwen3, perm)
            budget = budget_layouts.pick_budget(total, state.budgets)
            static = runner.block_output[state.keys[budget]] if budget else None
            cases.append({
                "tokens": total, "budget": budget,
                "max_err": float((got - want).abs().max()), "shape_ok": list(got.shape) == list(want.shape),
                "nan": bool(got.isnan().any()),
                "pad_rows_zero": None if static is None else bool((static[total // 4:] == 0).all()),
                "static_nan": None if static is None else bool(static.isnan().any()),
            })
        # a batch above the largest budget: eager, no capture
        total = 160
        x = torch.randn(total, C); tables = (torch.randn(total, D), torch.randn(total, D))
        full = [0, 160] if qwen3 else [0, 0, 160]
        win = None if qwen3 else list(range(0, 161, 16))
        perm = None if qwen3 else torch.randperm(40)
        big = call_run(runner, x, full, win, tables, qwen3, perm)
        big_err = float((big - reference(vit, x, full, win, tables, qwen3, perm)).abs().max())
        # more images than the smallest budget holding their tokens has slots: the next budget
        # that holds them (the largest holds SGLANG_FA4_VIT_GRAPH_MAX_SEGMENTS), not eager
        full = list(range(0, 49, 4)) if qwen3 else [0] + list(range(0, 49, 4))
        win = None if qwen3 else list(range(0, 49, 4))
        x = torch.randn(48, C); tables = (torch.randn(48, D), torch.randn(48, D))
        perm = None if qwen3 else torch.randperm(12)
        replays, eager = state.replays, state.eager_runs
        got = call_run(runner, x, full, win, tables, qwen3, perm)
        many = {"err": float((got - reference(vit, x, full, win, tables, qwen3, perm)).abs().max()),
                "budget": state.last_budget, "replays": state.replays - replays, "eager": state.eager_runs - eager}
        # measured routing (SGLANG_FA4_VIT_GRAPH_BUDGET_ROUTE=fastest): with 128 timed fastest, a
        # 20-token batch replays there, still right
        state.replay_ms = {32: 3.0, 64: 2.0, 128: 1.0}
        full = [0, 8, 20] if qwen3 else [0, 0, 8, 20]
        win = None if qwen3 else [0, 8, 20]
        x = torch.randn(20, C); tables = (torch.randn(20, D), torch.randn(20, D))
        perm = None if qwen3 else torch.randperm(5)
        got = call_run(runner, x, full, win, tables, qwen3, perm)
        routed = {"err": float((got - reference(vit, x, full, win, tables, qwen3, perm)).abs().max()),
                  "budget": state.last_budget}
        state.replay_ms = {}
        misfit_err = None
        if not qwen3:  # a window longer than the captured window max_seqlen: eager, not wrong
            x = torch.randn(32, C); tables = (torch.randn(32, D), torch.randn(32, D)); perm = torch.randperm(8)
            got = call_run(runner, x, [0, 0, 32], [0, 32], tables, qwen3, perm)
            misfit_err = float((got - reference(vit, x, [0, 0, 32], [0, 32], tables, qwen3, perm)).abs().max())
        result[name] = {"cases": cases, "startup_captures": startup_captures, "misfit_err": misfit_err, "many": many,
                        "routed": routed,
                        "captures_after": STATE["captures"] - startup_captures, "big_err": big_err,
                        "report": state.report(), "graphs": len(runner.block_graphs)}
        STATE["captures"] = 0
    # the guard: a capture forced after startup
    for mode in ("warn", "raise"):
        import os; os.environ["SGLANG_FA4_JIT_MONITOR"] = mode
        x = torch.randn(8, 1, C); t = torch.randn(8, D)
        try:
            runner.create_graph(x_3d=x, cu_seqlens=torch.tensor([0, 8], dtype=torch.int32), cu_window_seqlens=None,
                                position_embeddings=None, rotary_pos_emb_cos=t, rotary_pos_emb_sin=t)
            result[f"guard_{mode}"] = "ok"
        except Exception as exc:
            result[f"guard_{mode}"] = type(exc).__name__
    result["guard_count"] = vb.budget_state(runner).captures_after_startup
    result["log"] = log.getvalue()
    result["warming"] = sorted(STATE["warming"])
os.environ["SGLANG_FA4_JIT_MONITOR"] = "raise"  # below: a capture while serving would raise

# The memory bound (vit_budget_memory) through the real runner: the limit at the exact estimated cost
# of [32, 64], one byte under it, under the smallest budget alone; then (CUDA stand-in) a reserved
# probe that measures twice each estimate. Every kept ladder serves: replays in range, eager above.
from sglang_fa4.integration import vit_budget_memory as vbm
from sglang_fa4.integration import vit_budget_capture as vbc

def bounded(qwen3, limit, probe=None, serve=()):
    vit, runner, mr = tower_with_runner(qwen3)
    dims = vb.infer_capture_dims(vit)
    costs = vbm.ladder_costs((32, 64, 128), vbm.tower_widths(vit, rope_dim=dims["rope_dim"], dtype_bytes=4, table_bytes=4))
    log.truncate(0); log.seek(0)
    with faked_graphs(), torch.no_grad(), ExitStack() as stack:
        if probe is not None:
            stack.enter_context(mock.patch.object(vbc, "reserved_bytes", probe["read"]))
            real = vbc._capture_one
            def measured_capture(runner_, state_, budget, *a):
                real(runner_, state_, budget, *a); probe["reserved"] += probe["factor"] * costs[budget]
            stack.enter_context(mock.patch.object(vbc, "_capture_one", measured_capture))
        start = STATE["captures"]
        state = vb.capture_budgets(runner, budgets=(32, 64, 128), memory_limit=limit(costs), **dims)
        captured = STATE["captures"] - start
        served = {}
        for total in serve:
            full = [0, total] if qwen3 else [0, 0, total]
            win = None if qwen3 else list(range(0, total + 1, 4))
            x = torch.randn(total, C); tables = (torch.randn(total, D), torch.randn(total, D))
            perm = None if qwen3 else torch.randperm(total // 4)
            replays = state.replays
            got = call_run(runner, x, full, win, tables, qwen3, perm)
            served[total] = {"err": float((got - reference(vit, x, full, win, tables, qwen3, perm)).abs().max()),
                             "budget": state.last_budget if state.replays > replays else None}
        return {"costs": {str(b): c for b, c in costs.items()}, "budgets": list(state.budgets),
                "trimmed": list(state.trimmed), "captured": captured, "serving_captures": STATE["captures"] - start - captured,
                "graphs": len(runner.block_graphs), "served": served, "report": state.report(), "log": log.getvalue()}

bound = {name: {"exact": bounded(qwen3, lambda c: c[32] + c[64], serve=(20, 60, 100))}
         for name, qwen3 in (("qwen25", False), ("qwen3", True))}
bound["qwen3"]["byte_over"] = bounded(True, lambda c: c[32] + c[64] - 1, serve=(60,))
bound["qwen3"]["none"] = bounded(True, lambda c: c[32] - 1, serve=(20,))
probe = {"reserved": 0, "factor": 2}
probe["read"] = lambda device: probe["reserved"]
bound["qwen3"]["measured"] = bounded(True, lambda c: c[32] + c[64] + c[128], probe)
result["bound"] = bound
emit(result)
"""


def test_budget_graphs_on_real_runner(sglang_version):
    # the budgets' switch left at its default: on
    out = run_with_sglang(sglang_version, RUNNER, env={"SGLANG_VIT_ENABLE_CUDA_GRAPH": "1",
                                                       "SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE": None,
                                                       "SGLANG_FA4_JIT_MONITOR": "warn",
                                                       "SGLANG_FA4_VIT_GRAPH_BUDGETS": "128,32,64"})
    # the default with SGLANG_VIT_ENABLE_CUDA_GRAPH=1: the budget hooks, the startup capture after the
    # FA4 warmup's load_model hook
    hooks = out["hooks"]
    assert hooks["run"] == [["around", "run_around"]] and hooks["create_graph"] == [["around", "create_graph_around"]]
    assert hooks["forward"] == [["around", "qwen2_5_vit_forward"]]  # one hook: routing + no-sync forward
    assert hooks["load_model"].index("sglang_fa4.integration.hooks.warm_fa4_after_load_model") < \
        hooks["load_model"].index("sglang_fa4.integration.vit_budgets.capture_budgets_after_load_model")
    for name in ("qwen25", "qwen3"):
        r = out[name]
        assert r["startup_captures"] == 3 and r["graphs"] == 3, r  # one graph per budget, at startup
        assert r["captures_after"] == 0, r  # serving never captured
        assert {c["budget"] for c in r["cases"]} >= {32, 64}, r["cases"]  # the mixes hit several budgets
        for c in r["cases"]:
            assert c["shape_ok"] and not c["nan"], c
            assert c["max_err"] < 1e-4, c  # budgeted replay == eager on the real tokens
            assert c["pad_rows_zero"] and not c["static_nan"], c  # padded rows zeroed, nothing uninitialised
        assert r["big_err"] < 1e-4  # above the largest budget: eager, right
        rep = r["report"]
        assert rep["eager_runs"] == (1 if name == "qwen3" else 2), rep
        assert rep["replays"] == len(r["cases"]) + 2 and rep["captures_after_startup"] == 0
        assert rep["replay_ms"] == {}  # route "smallest" (the default): nothing timed at startup
        assert rep["budgets"] == [32, 64, 128]
        # the full-attention layout is sized apart from the windowed one (few, fixed slots); budgets
        # below the largest hold MIN_FULL_SLOTS real segments (256 tokens a slot), the largest 64
        assert rep["segment_capacity_full"] == {"32": 10, "64": 10, "128": 70}, rep
        assert {str(b): budget_layouts.full_capacity(b, 128) for b in (32, 64, 128)} == rep["segment_capacity_full"]
        # 12 images of 4 tokens: 48 tokens fit the 64 budget, 12 segments do not: replayed in 128
        assert r["many"] == {"err": r["many"]["err"], "budget": 128, "replays": 1, "eager": 0}, r["many"]
        assert r["many"]["err"] < 1e-4, r["many"]
        assert r["routed"]["budget"] == 128 and r["routed"]["err"] < 1e-4, r["routed"]  # the fastest holding budget
        if name == "qwen25":
            assert rep["segment_capacity_window"] == {str(b): budget_layouts.segment_capacity(b, 16) for b in (32, 64, 128)}
        else:
            assert rep["segment_capacity_window"] is None
    assert out["qwen25"]["misfit_err"] < 1e-4
    assert out["qwen25"]["report"]["window_tokens"] == 16 and out["qwen3"]["report"]["window_tokens"] is None
    assert out["guard_warn"] == "ok" and out["guard_raise"] == "GraphCaptureAfterStartup"
    assert out["guard_count"] == 2
    # FA4 calls while budgets are captured count as warmup for the JIT monitor; serving ones do not
    assert out["warming"] == [[False, 0], [True, 1]]
    assert "captured after the startup budgets" in out["log"]
    # the one startup line per runner: what was captured, what it took, the bound (default 3072 MiB)
    for name in ("qwen25", "qwen3"):
        est = out[name]["report"]["estimate_bytes_total"]
        assert est == sum(out[name]["report"]["estimate_bytes"].values()) > 0
        line = (f"sglang-fa4: 3 ViT budget graph(s) [32, 64, 128] captured at startup; graph memory not "
                f"measured (CPU), estimate {est} bytes; within the 3072.0 MiB bound (SGLANG_FA4_VIT_GRAPH_MEMORY_MB)")
        assert line in out["log"], (line, out["log"])
        assert out[name]["report"]["trimmed"] == [] and out[name]["report"]["memory_limit_mb"] == 3072
    assert out["log"].count("ViT budget graph(s)") == 2  # one line per runner, none per budget

    # the memory bound: the exact estimated cost of [32, 64] keeps both, one byte less drops 64 too;
    # trimmed budgets are never captured, and batches above the kept ladder run eagerly (right)
    for name, case, kept, trimmed in (("qwen25", "exact", [32, 64], [128]), ("qwen3", "exact", [32, 64], [128]),
                                      ("qwen3", "byte_over", [32], [64, 128])):
        r = out["bound"][name][case]
        c = {int(k): v for k, v in r["costs"].items()}
        assert c[32] < c[64] < c[128]
        assert r["budgets"] == kept and r["trimmed"] == trimmed, (case, r)
        assert r["captured"] == r["graphs"] == len(kept) and r["serving_captures"] == 0, (case, r)
        assert r["report"]["estimate_bytes_total"] == sum(c[k] for k in kept)
        assert r["served"], case
        for tokens, served in r["served"].items():
            want = next((k for k in kept if int(tokens) <= k), None)
            assert served["budget"] == want and served["err"] < 1e-4, (case, tokens, served)
        limit = c[32] + c[64] - (case == "byte_over")
        line = (f"sglang-fa4: {len(kept)} ViT budget graph(s) {kept} captured at startup; graph memory not "
                f"measured (CPU), estimate {sum(c[k] for k in kept)} bytes; trimmed {trimmed} to fit the "
                f"{limit} bytes bound (SGLANG_FA4_VIT_GRAPH_MEMORY_MB)")
        assert line in r["log"] and r["log"].count("ViT budget graph(s)") == 1, (case, r["log"])
    # under the smallest budget: nothing captured, the runner sealed with no budget (every batch eager,
    # nothing captured while serving), one warning
    none = out["bound"]["qwen3"]["none"]
    assert none["budgets"] == [] and none["trimmed"] == [32, 64, 128] and none["captured"] == 0 == none["graphs"]
    assert none["serving_captures"] == 0 and all(v["budget"] is None and v["err"] < 1e-4 for v in none["served"].values())
    assert "no budget fits, every ViT batch runs eagerly" in none["log"]
    # measured on "CUDA" (a reserved probe reading twice each estimate): the plan [32, 64, 128] fits the
    # estimate exactly, but after 64 the measured 6x c[32] plus 128's estimate scaled by the 2x shortfall
    # (8x c[32]) passes the bound: 128 is not captured
    m = out["bound"]["qwen3"]["measured"]
    c = {int(k): v for k, v in m["costs"].items()}
    assert m["budgets"] == [32, 64] and m["trimmed"] == [128] and m["graphs"] == 2, m
    assert m["report"]["reserved_bytes"] == {"32": 2 * c[32], "64": 2 * c[64]}
    assert m["report"]["reserved_bytes_total"] == 2 * (c[32] + c[64])
    assert f"graph memory {2 * (c[32] + c[64])} bytes reserved, estimate {c[32] + c[64]} bytes; trimmed [128]" in m["log"]


# The opt-out: SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE=0 registers no budget hook, and SGLang's own runner
# captures one graph per image layout on the request path (the default is test_budget_graphs_on_real_runner).
OPT_OUT = MODEL + HOOKS + r"""
hooks = hook_list()
with faked_graphs():
    vit, runner, mr = tower_with_runner(True)
    hooks["startup_hooks"] = registered_startup(mr)
    startup = STATE["captures"]
    errs = []
    for full in ([0, 16, 40], [0, 8, 20, 36]):
        total = full[-1]; x = torch.randn(total, C); tables = (torch.randn(total, D), torch.randn(total, D))
        got = call_run(runner, x, full, None, tables, True, None)
        errs.append(float((got - reference(vit, x, full, None, tables, True, None)).abs().max()))
hooks["startup_captures"] = startup
hooks["serving_captures"] = STATE["captures"] - startup
hooks["state"] = vb.budget_state(runner) is not None
hooks["err"] = max(errs)
emit(hooks)
"""


def test_opt_out_gives_sglangs_per_layout_runner(sglang_version):
    out = run_with_sglang(sglang_version, OPT_OUT, env={"SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE": "0",
                                                        "SGLANG_VIT_ENABLE_CUDA_GRAPH": "1"})
    assert out["run"] == [] and out["create_graph"] == [] and out["startup_hooks"] == 0
    assert out["forward"] == [["around", "qwen2_5_vit_forward"]]  # the host-metadata feature's
    assert "sglang_fa4.integration.vit_budgets.capture_budgets_after_load_model" not in out["load_model"]
    # nothing at startup; a capture per layout while serving, SGLang's way; outputs right
    assert out["state"] is False and out["startup_captures"] == 0 and out["serving_captures"] == 2, out
    assert out["err"] < 1e-4, out


# SGLang's real Qwen2.5-VL tower, tensor-parallel over 2 CPU processes (gloo): its linears are
# TP-sharded (2 of 4 heads per rank, all-reduces inside every block), the generic runner is the
# real one with graphs faked, budgets captured by the startup path on each rank. Per rank: the
# budget replay (windowed + full blocks, padded) equals the tower's eager forward.
TP_TOWER = FAKE_GRAPHS + r"""
import os, socket, sys
import torch.multiprocessing as mp
sys.path.insert(0, BENCH_GPU)  # benchmark/sglang_on_gpu: init_sglang, shared with the GPU checks
from sglang.srt.models import qwen2_5_vl
from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); return s.getsockname()[1]

def rank_main(rank, port, queue):
    try:
        queue.put(run_rank(rank, port))
    except BaseException:
        import traceback
        queue.put({"rank": rank, "error": traceback.format_exc()[-3000:]})
        raise

def run_rank(rank, port):
    from sglang.srt.distributed import parallel_state as ps
    from sglang_towers import init_sglang
    init_sglang("fa4", tp_size=2, rank=rank, port=port)  # gloo groups on a CPU
    with mock.patch.object(vision, "_is_cuda", True), mock.patch.object(qwen2_5_vl, "_is_cuda", True):
        cfg = Qwen2_5_VLVisionConfig(depth=4, hidden_size=64, hidden_act="silu", intermediate_size=96,
                                     num_heads=4, in_channels=3, patch_size=14, spatial_merge_size=2,
                                     temporal_patch_size=2, window_size=112, out_hidden_size=32,
                                     fullatt_block_indexes=[1, 3])
        vit = qwen2_5_vl.Qwen2_5_VisionTransformer(cfg)
    torch.manual_seed(1 + rank)  # each rank its own shard of the weights
    with torch.no_grad():
        for p in vit.parameters():
            p.normal_(0, 0.05)
    runner = vit.cuda_graph_runner
    model = nn.Module(); model.visual = vit
    class ModelRunner: pass
    mr = ModelRunner(); mr.model = model
    out = {"rank": rank, "heads_per_rank": vit.blocks[0].attn.num_attention_heads_per_partition, "cases": []}
    with mock.patch.object(torch.cuda, "CUDAGraph", FakeGraph), mock.patch.object(torch.cuda, "graph", fake_graph), \
         mock.patch.object(torch.cuda, "synchronize", lambda *a: None), \
         mock.patch.object(vr.ViTCudaGraphRunner, "_create_graph", recording_create):
        vb.capture_budgets_after_load_model(None, mr)  # the startup path, on every rank
        state = vb.budget_state(runner)
        startup = STATE["captures"]
        random.seed(5)  # the same image mixes on both ranks (TP: every rank sees every token)
        for trial in range(6):
            grid = torch.tensor([[1, 2 * random.randint(2, 9), 2 * random.randint(2, 9)]
                                 for _ in range(random.randint(1, 3))])
            x = torch.randn(int(grid.prod(-1).sum()), 3 * 2 * 14 * 14, generator=torch.Generator().manual_seed(trial))
            with torch.no_grad():
                vit.enable_cg = True
                replays = state.replays
                got = vit(x, grid).clone()
                replayed = state.replays == replays + 1
                vit.enable_cg = False
                want = vit(x, grid)
            out["cases"].append({"tokens": x.shape[0], "replayed": replayed,
                                 "max_err": float((got - want).abs().max()), "scale": float(want.abs().max())})
        # above the largest budget: the tower's own eager forward, decided from grid_thw before the
        # graph path (the runner is not called at all)
        runner_calls = []
        hooked_run = runner.run
        runner.run = lambda **kw: runner_calls.append(1) or hooked_run(**kw)
        grid = torch.tensor([[1, 28, 28]])
        x = torch.randn(784, 3 * 2 * 14 * 14, generator=torch.Generator().manual_seed(99))
        eager_runs = state.eager_runs
        # ... keeping SGLang's graph-mode rotary (the unfused one): the compiled one would be
        # compiled by Inductor on the request path
        rotary = {"compiled": 0, "unfused": 0, "no_sync_forward": 0, "sglang_window_index": 0, "sglang_rot_pos_emb": 0}
        def counted(name, fn):
            def call(*a, **k):
                rotary[name] += 1
                return fn(*a, **k)
            return call
        # ... through our no-sync forward, not SGLang's (whose window index and rotary ids are read
        # back from the device)
        from sglang_fa4.integration import qwen2_5_vit_forward as no_sync
        with torch.no_grad(), \
             mock.patch.object(vision, "apply_rotary_pos_emb", counted("compiled", vision.apply_rotary_pos_emb)), \
             mock.patch.object(vision, "apply_rotary_pos_emb_native_eager",
                               counted("unfused", vision.apply_rotary_pos_emb_native_eager)), \
             mock.patch.object(no_sync, "eager_forward", counted("no_sync_forward", no_sync.eager_forward)), \
             mock.patch.object(vit, "get_window_index", counted("sglang_window_index", vit.get_window_index)), \
             mock.patch.object(vit, "rot_pos_emb", counted("sglang_rot_pos_emb", vit.rot_pos_emb)):
            vit.enable_cg = True
            got = vit(x, grid).clone()
            flag_restored = vit.enable_cg
        with torch.no_grad():
            vit.enable_cg = False
            want = vit(x, grid)
        out["big"] = {"runner_calls": len(runner_calls), "eager_runs": state.eager_runs - eager_runs, "rotary": rotary,
                      "max_err": float((got - want).abs().max()), "enable_cg_restored": flag_restored}
        out["captures_after"] = STATE["captures"] - startup
        out["report"] = state.report()
    ps.destroy_model_parallel(); ps.destroy_distributed_environment()
    return out

ctx = mp.get_context("fork")
queue = ctx.Queue()
port = free_port()
procs = [ctx.Process(target=rank_main, args=(r, port, queue)) for r in range(2)]
for p in procs: p.start()
results = sorted((queue.get(timeout=180) for _ in procs), key=lambda r: r["rank"])
for p in procs: p.join(60)
emit({"ranks": results, "exitcodes": [p.exitcode for p in procs]})
"""


def test_budget_graphs_on_tensor_parallel_tower(sglang_version):
    prelude = f"BENCH_GPU = {str(ROOT / 'benchmark' / 'sglang_on_gpu')!r}\n"
    out = run_with_sglang(sglang_version, prelude + TP_TOWER, env={"SGLANG_VIT_ENABLE_CUDA_GRAPH": "1",
                                                         "SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE": "1",
                                                         "SGLANG_FA4_JIT_MONITOR": "raise",
                                                         "SGLANG_FA4_VIT_GRAPH_BUDGETS": "128,256,512"})
    for r in out["ranks"]:
        assert "error" not in r, r.get("error")
    assert out["exitcodes"] == [0, 0]
    for r in out["ranks"]:
        assert r["heads_per_rank"] == 2  # the tower really is sharded
        assert r["report"]["graphs"] == 3 and r["captures_after"] == 0, r
        assert sum(c["replayed"] for c in r["cases"]) >= 4, r["cases"]  # most mixes fit a budget
        for c in r["cases"]:
            assert c["max_err"] <= 1e-5 * max(1.0, c["scale"]), c  # replay == eager, fp32 on CPU
        big = r["big"]
        assert big["runner_calls"] == 0 and big["eager_runs"] == 1 and big["enable_cg_restored"], big
        assert big["max_err"] == 0.0, big
        # one unfused (graph-mode) rotary per block; our no-sync forward ran, SGLang's syncing one did not
        assert big["rotary"] == {"compiled": 0, "unfused": 4, "no_sync_forward": 1, "sglang_window_index": 0,
                                 "sglang_rot_pos_emb": 0}, big


def test_startup_capture_sees_deterministic_inference_kernels(monkeypatch):
    """--enable-deterministic-inference: SGLang turns its batch-invariant kernels on right after
    ModelRunner.load_model, i.e. after this AFTER hook. The budget graphs must capture those
    kernels, so the hook asks the runner to turn them on (SGLang's own idempotent method) before
    capturing; without the graph switch it does neither."""
    from sglang_fa4.integration import vit_budgets as vb

    calls = []

    class Runner:
        model = object()

        def maybe_enable_batch_invariant_mode(self):
            calls.append("batch_invariant")

    monkeypatch.setattr(vb, "capture_model_budgets", lambda model: calls.append(("capture", model)))
    monkeypatch.setenv("SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE", "1")
    monkeypatch.setenv("SGLANG_VIT_ENABLE_CUDA_GRAPH", "1")
    runner = Runner()
    assert vb.capture_budgets_after_load_model(None, runner) is None
    assert calls == ["batch_invariant", ("capture", runner.model)]
    calls.clear()
    monkeypatch.setenv("SGLANG_VIT_ENABLE_CUDA_GRAPH", "0")
    vb.capture_budgets_after_load_model(None, runner)
    assert calls == []
    monkeypatch.setenv("SGLANG_VIT_ENABLE_CUDA_GRAPH", "1")

    class OldRunner:  # a runner without the method (another SGLang): capture only
        model = None

    vb.capture_budgets_after_load_model(None, OldRunner())
    assert calls == [("capture", None)]


def test_sglang_has_the_batch_invariant_switch(sglang_version):
    """The method the startup capture calls exists on SGLang's ModelRunner (else the deterministic
    path would be skipped silently) and only acts under --enable-deterministic-inference."""
    out = run_with_sglang(sglang_version, """
import warnings, inspect; warnings.simplefilter("ignore")
from sglang.srt.model_executor.model_runner import ModelRunner
src = inspect.getsource(ModelRunner.maybe_enable_batch_invariant_mode)
emit({"has": callable(getattr(ModelRunner, "maybe_enable_batch_invariant_mode", None)),
      "gated": "enable_deterministic_inference" in src, "init_order": inspect.getsource(ModelRunner.initialize).find(
          "self.load_model()") < inspect.getsource(ModelRunner.initialize).find("self.maybe_enable_batch_invariant_mode()")})
""")
    assert out == {"has": True, "gated": True, "init_order": True}


TABLE_DTYPE = MODEL + r"""
# Qwen3-VL on CUDA: SGLang's rotary cache is fp32 while the tower (and so the runner's own rotary
# workspace) is bf16. Here: the tower float32, its rotary cache float64; every block records the
# dtype of the cos/sin it is handed (then computes in the tower's dtype).
seen = []
block_forward = Block.forward
def recording(self, x, cu_seqlens=None, position_embeddings=None, output_ws=None,
              rotary_pos_emb_cos=None, rotary_pos_emb_sin=None):
    seen.append(str(rotary_pos_emb_cos.dtype).replace("torch.", ""))
    return block_forward(self, x, cu_seqlens=cu_seqlens, rotary_pos_emb_cos=rotary_pos_emb_cos.to(x.dtype),
                         rotary_pos_emb_sin=rotary_pos_emb_sin.to(x.dtype))
Block.forward = recording
result = {}
with faked_graphs():
    vit, runner, mr = tower_with_runner(True)
    vit.rotary_pos_emb = nn.Module()
    vit.rotary_pos_emb.rotary_dim = D
    vit.rotary_pos_emb.register_buffer("cos_sin_cache", torch.zeros(64, D, dtype=torch.float64))
    result["dims"] = {k: str(v) for k, v in vb.infer_capture_dims(vit).items()}
    assert vb.capture_budgets_after_load_model(None, mr) is None
    state = vb.budget_state(runner)
    seen.clear()
    for total in (24, 160):  # a budget replay, then an eager run above the budgets
        tables = (torch.randn(total, D, dtype=torch.float64), torch.randn(total, D, dtype=torch.float64))
        call_run(runner, torch.randn(total, C), [0, total], None, tables, True, None)
        result[str(total)] = sorted(set(seen)); seen.clear()
    result["report"] = state.report()
emit(result)
"""


def test_graphs_read_the_rotary_tables_in_the_towers_table_dtype(sglang_version):
    """The budget graphs read the rotary tables in the dtype the tower produces them (Qwen3-VL:
    SGLang's fp32 rotary cache), not rounded into the runner's bf16 workspace, and the eager path
    above the budgets is handed the same dtype: on the H200 server a replay's bf16-rounded tables
    made an image's rows differ alone (replay) vs batched (eager) (issue #14)."""
    out = run_with_sglang(sglang_version, TABLE_DTYPE, env={"SGLANG_VIT_ENABLE_CUDA_GRAPH": "1",
                                                             "SGLANG_FA4_VIT_GRAPH_BUDGETS_ENABLE": "1",
                                                             "SGLANG_FA4_VIT_GRAPH_BUDGETS": "32,64"})
    assert out["dims"]["table_dtype"] == "torch.float64" and out["dims"]["rope_kind"] == "rotary", out
    assert out["report"]["replays"] == 1 and out["report"]["eager_runs"] == 1, out["report"]
    assert out["24"] == ["float64"], out  # the replay's blocks
    assert out["160"] == ["float64"], out  # the eager blocks


def test_host_layouts_come_from_the_layout_key_without_a_read_back():
    class DeviceCu:  # a device tensor stand-in: its shape is host data, reading it back is a sync
        def __init__(self, values):
            self.values, self.shape = values, (len(values),)

        def tolist(self):
            raise AssertionError("read back from the device")

    full, win = DeviceCu([0, 0, 16, 48]), DeviceCu([0, 8, 16, 32, 48])
    assert vb.host_layouts(full, win, ((0, 0, 16, 48), (0, 8, 16, 32, 48))) == ([0, 0, 16, 48], [0, 8, 16, 32, 48])
    assert vb.host_layouts(full, None, ((0, 0, 16, 48), None)) == ([0, 0, 16, 48], None)
    # a key that does not describe the tensors (other length, not ints, no key): read back
    import torch
    cu = torch.tensor([0, 16, 48], dtype=torch.int32)
    for key in (((0, 48), None), ((0.0, 16.0, 48.0), None), None, "layout"):
        assert vb.host_layouts(cu, None, key) == ([0, 16, 48], None)
