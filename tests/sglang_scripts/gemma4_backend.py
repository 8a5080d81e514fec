"""Gemma-4's attention layers as SGLang 0.5.23 runs them, on its REAL FlashAttentionBackend
(``ATTENTION_BACKENDS["fa4"]``) with the hybrid SWA KV pool (``SWAKVPool``: a sliding-window pool of
d256 x kv heads and a full-attention pool of d512 x its own kv heads, the full -> SWA slot mapping
registered as SGLang's allocator does) in fp8_e4m3, the plugin loaded by SGLang's loader; the SM90
check faked and the FP8 KV kernels as their torch contracts (``testing.paged_kv_torch``), on the CPU:
for tests/test_gemma4_backend_cpu.py.

Params: ``model`` (attention shapes), ``checks`` (which parts to run), ``caps`` (None: today's route;
else the RouteCaps fields to pretend, for the refusal at init). Each part returns what it saw."""

from emit import emit, params

import traceback, warnings; warnings.simplefilter("ignore")
from benchmark.sglang_on_gpu import cuda_only_stubs; cuda_only_stubs.install_missing()   # sgl_kernel / flashinfer are CUDA-only wheels
import torch
from types import SimpleNamespace as NS
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
from sglang.srt.runtime_context import get_context
from sglang.test.kits.attention_unittest.attention_methods import dense_attention as kit
from sglang_fa4 import gemma4_selection
from sglang_fa4.integration import llm_fp8_kv
from sglang_fa4.kernels import fp8_paged_kv
from sglang_fa4.testing import paged_kv_torch, rel_err

P = params()
M, CHECKS, CAPS = P["model"], P["checks"], P.get("caps")
llm_fp8_kv.is_sm90 = lambda device: True          # this CPU stands in for an H100/H200
paged_kv_torch.install()                          # the split-KV kernel and the gather as their torch contracts
import sglang_fa4.kernels.fp8_sm90 as fp8_sm90
FORWARD_CALLS = []
fp8_sm90.fp8_varlen_attention = paged_kv_torch.fp8_forward_model(FORWARD_CALLS)
if CAPS is not None:
    gemma4_selection.route_caps = lambda: gemma4_selection.RouteCaps(
        tuple(CAPS["head_dims"]), tuple(CAPS["bf16_query_head_dims"]), bool(CAPS["image_prefill_masks"]))
# every call of the route, with what it was handed
ROUTED = []
_route = llm_fp8_kv.route_fp8
import sglang_fa4.integration.llm_fp8_kv as _lfk
def _counted(call):
    ROUTED.append({"head_dim": int(call["q"].shape[-1]), "q_dtype": str(call["q"].dtype),
                   "page_table": call["page_table"].data_ptr(), "cache_seqlens": call["cache_seqlens"].data_ptr(),
                   "window": list(call.get("window_size") or (-1, -1)), "causal": bool(call.get("causal")),
                   "k_descale": call.get("k_descale") is not None, "scale": call.get("softmax_scale")})
    return _route(call)
_lfk.route_fp8 = _counted

FP8 = torch.float8_e4m3fn
HQ, SW_KV, SW_D, FULL_KV, FULL_D = M["hq"], M["swa_kv"], M["swa_d"], M["full_kv"], M["full_d"]
WINDOW = M["window"]                               # the left window SGLang passes: sliding_window - 1
SWA_IDS, FULL_IDS = M["swa_layers"], M["full_layers"]
PAGE = M["page_size"]
K_SCALE, V_SCALE = 0.02, 0.015                     # a checkpoint's per-layer KV scales


def gemma4_hf_config(arch):
    text = NS(head_dim=FULL_D, v_head_dim=FULL_D, swa_head_dim=SW_D, swa_v_head_dim=SW_D, num_attention_heads=HQ,
              num_key_value_heads=FULL_KV, swa_num_key_value_heads=SW_KV, sliding_window=WINDOW + 1,
              layer_types=["full_attention" if i in FULL_IDS else "sliding_attention"
                           for i in range(len(SWA_IDS) + len(FULL_IDS))], attention_k_eq_v=True)
    return NS(architectures=[arch], text_config=text, vision_config=NS() if M.get("vision") else None)


def build(max_ctx, batch, arch="Gemma4ForConditionalGeneration", seed=0):
    """A model runner as SGLang's scheduler has it for a Gemma-4 on an fp8_e4m3 hybrid SWA pool, and
    the fa4 backend built from it."""
    case = kit.DenseAttentionCase(name="gemma4", backend="fa4", forward_mode=ForwardMode.EXTEND, num_heads=HQ,
                                  num_kv_heads=FULL_KV, page_size=PAGE, prefix_lens=(0,) * batch,
                                  extend_lens=(1,) * batch, sliding_window_size=WINDOW)
    cfg = kit.TinyModelConfig(num_heads=HQ, num_kv_heads=FULL_KV, head_dim=FULL_D, hidden_size=HQ * FULL_D,
                              context_len=max_ctx, sliding_window_size=WINDOW)
    cfg.hf_config = gemma4_hf_config(arch)      # what the plugin reads (SGLang's layers read the shapes below)
    cfg.swa_head_dim, cfg.swa_v_head_dim = SW_D, SW_D
    cfg.is_local_attention_model = False        # Gemma-4: sliding windows, not chunked local attention
    ctx_cls = type(get_context())
    override = ctx_cls.override_server_args
    ctx_cls.override_server_args = lambda self_, **kw: override(self_, **{**kw, "kv_cache_dtype": "fp8_e4m3"})
    try:
        runner = kit.MockModelRunner(case=case, model_config=cfg, dtype=FP8, device="cpu", max_context_len=max_ctx,
                                     head_dim=FULL_D)
    finally:
        ctx_cls.override_server_args = override
    runner.dtype, runner.kv_cache_dtype, runner.kv_cache_dtype_str = torch.bfloat16, FP8, "fp8_e4m3"
    size = runner.token_to_kv_pool.size
    # SGLang's kv_cache_configurator._build_hybrid_swa_kv_pool for Gemma-4 (is_hybrid_swa_compress)
    pool = SWAKVPool(size=size, size_swa=size, page_size=PAGE, dtype=FP8, head_num=FULL_KV, head_dim=FULL_D,
                     swa_attention_layer_ids=SWA_IDS, full_attention_layer_ids=FULL_IDS, device="cpu",
                     token_to_kv_pool_class=MHATokenToKVPool, enable_memory_saver=False, swa_head_num=SW_KV,
                     swa_head_dim=SW_D, swa_v_head_dim=SW_D, v_head_dim=FULL_D)
    # the allocator's full -> SWA slot mapping: whole pages to whole pages, shuffled (page 0 -> page 0)
    g = torch.Generator().manual_seed(seed)
    n_pages = size // PAGE + 1
    perm = torch.cat([torch.zeros(1, dtype=torch.int64), torch.randperm(n_pages - 1, generator=g) + 1])
    mapping = (perm[:, None] * PAGE + torch.arange(PAGE)[None, :]).reshape(-1)
    pool.register_mapping(mapping)
    for sub in (pool.full_kv_pool, pool.swa_kv_pool):   # free memory poisoned: E4M3 NaN shows a read past a length
        for buf in (*sub.k_buffer, *sub.v_buffer):
            buf.view(torch.uint8).fill_(0x7F)
    runner.token_to_kv_pool = pool
    runner.token_to_kv_pool_allocator = NS(page_size=PAGE, get_kvcache=lambda: pool)
    runner.init_kv_index_translator()
    runner.sliding_window_size = WINDOW
    backend = ATTENTION_BACKENDS["fa4"](runner)
    return runner, pool, backend


def layers():
    out = {}
    for i in SWA_IDS + FULL_IDS:
        swa = i in SWA_IDS
        d, hkv = (SW_D, SW_KV) if swa else (FULL_D, FULL_KV)
        layer = RadixAttention(HQ, d, 1.0, hkv, layer_id=i, sliding_window_size=WINDOW if swa else -1)  # scaling 1
        layer.k_scale, layer.v_scale = torch.tensor([K_SCALE]), torch.tensor([V_SCALE])
        layer.k_scale_float, layer.v_scale_float = K_SCALE, V_SCALE
        out[i] = layer
    return out


def allocate(runner, lens, seed):
    """Requests own whole pages in a shuffled order (page 0 reserved); req_to_token holds full-pool slots."""
    g = torch.Generator().manual_seed(seed)
    pool_pages = runner.token_to_kv_pool.size // PAGE
    need = [-(-n // PAGE) for n in lens]
    pages = torch.randperm(pool_pages - 1, generator=g)[: sum(need)] + 1
    r2t = runner.req_to_token_pool.req_to_token
    slots_of, at = [], 0
    for b, n in enumerate(lens):
        pg = pages[at: at + need[b]]; at += need[b]
        slots = (pg[:, None] * PAGE + torch.arange(PAGE)[None, :]).reshape(-1)[:n]
        r2t[b, :n] = slots.to(torch.int32)
        slots_of.append(slots)
    return slots_of


def batch(runner, prefix, new, decode, slots_of):
    seq = [p + n for p, n in zip(prefix, new)]
    out_loc = torch.cat([slots_of[b][p:p + n] for b, (p, n) in enumerate(zip(prefix, new))])
    fb = ForwardBatch(forward_mode=ForwardMode.DECODE if decode else ForwardMode.EXTEND, batch_size=len(seq),
                      input_ids=torch.zeros(sum(new), dtype=torch.int64),
                      req_pool_indices=torch.arange(len(seq), dtype=torch.int32),
                      seq_lens=torch.tensor(seq, dtype=torch.int32), seq_lens_cpu=torch.tensor(seq, dtype=torch.int32),
                      out_cache_loc=out_loc, seq_lens_sum=sum(seq),
                      positions=torch.cat([torch.arange(p, p + n) for p, n in zip(prefix, new)]))
    if hasattr(runner.kv_index_translator, "bind_own_plan"):
        runner.kv_index_translator.bind_own_plan(fb)
    if not decode:
        fb.extend_prefix_lens = torch.tensor(prefix, dtype=torch.int32); fb.extend_prefix_lens_cpu = list(prefix)
        fb.extend_seq_lens = torch.tensor(new, dtype=torch.int32); fb.extend_seq_lens_cpu = list(new)
        fb.extend_num_tokens = sum(new)
    return fb


def reference(pool, layer, q, prefix, new, slots_of):
    """fp32 attention on the dequantized pool read back through each request's slots (the SWA ones
    through the full -> SWA mapping), SGLang's q cast for d <= 256, Gemma-4's scale 1, causal, and
    the window as FlashAttention reads (left, 0): keys j with i - left <= j <= i."""
    swa = layer.layer_id in SWA_IDS
    d, hkv = layer.head_dim, layer.tp_k_head_num
    kb, vb = pool.get_key_buffer(layer.layer_id), pool.get_value_buffer(layer.layer_id)
    qv = q.view(-1, HQ, d)
    qf = (qv.to(FP8) if d <= 256 else qv).float()
    rep = HQ // hkv
    outs, at = [], 0
    for b, (p, n) in enumerate(zip(prefix, new)):
        slots = slots_of[b][:p + n]
        if swa:
            slots = pool.full_to_swa_index_mapping[slots]
        kf = (kb[slots].float() * K_SCALE).repeat_interleave(rep, 1)
        vf = (vb[slots].float() * V_SCALE).repeat_interleave(rep, 1)
        s = torch.einsum("qhd,khd->hqk", qf[at:at + n], kf) * layer.scaling
        i = torch.arange(p, p + n)[:, None]
        j = torch.arange(p + n)[None, :]
        hide = j > i
        if swa:
            hide = hide | (j < i - WINDOW)
        s = s.masked_fill(hide, float("-inf"))
        outs.append(torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), vf))
        at += n
    return torch.cat(outs).reshape(-1, HQ * d)


def run_layers(runner, pool, backend, lays, fb, prefix, new, slots_of, seed, ids):
    """Each layer's forward as Gemma4Attention calls it (KV write + attention), then its reference."""
    g = torch.Generator().manual_seed(seed)
    res = {}
    with torch.no_grad(), forward_context(ForwardContext(attn_backend=backend)):
        backend.init_forward_metadata(fb)
        for i in ids:
            layer = lays[i]
            d, hkv = layer.head_dim, layer.tp_k_head_num
            # the prefix the earlier forwards wrote (set_kv_buffer quantizes with the layer's scales)
            tot = sum(prefix)
            if tot:
                loc = torch.cat([slots_of[b][:p] for b, p in enumerate(prefix)])
                kp = torch.randn(tot, hkv, d, generator=g).to(torch.bfloat16)
                vp = torch.randn(tot, hkv, d, generator=g).to(torch.bfloat16)
                swa_loc = pool.translate_loc_from_full_to_swa(loc) if i in SWA_IDS else None
                from sglang.srt.mem_cache.memory_pool import KVWriteLoc
                pool.set_kv_buffer(layer, KVWriteLoc(loc=loc, swa_loc=swa_loc), kp, vp, layer.k_scale, layer.v_scale)
            ntok = sum(new)
            q = (torch.randn(ntok, HQ * d, generator=g) * 0.5).to(torch.bfloat16)
            k = (torch.randn(ntok, hkv, d, generator=g)).to(torch.bfloat16)
            v = (torch.randn(ntok, hkv, d, generator=g)).to(torch.bfloat16)
            before = len(ROUTED)
            try:
                out = layer(q, k, v, fb)
            except Exception as e:
                res[i] = {"error": f"{type(e).__name__}: {e}", "where": traceback.format_exc().splitlines()[-3:]}
                continue
            ref = reference(pool, layer, q, prefix, new, slots_of)
            o = out.float().view(-1, HQ * d)
            cuts = torch.tensor([0] + new).cumsum(0).tolist()
            res[i] = {"err": rel_err(o, ref), "finite": bool(torch.isfinite(out.float()).all()),
                      "err_per_request": [rel_err(o[a:b], ref[a:b]) for a, b in zip(cuts, cuts[1:]) if b > a],
                      "routed": ROUTED[before:]}
    return res


res = {"sglang_fa4": gemma4_selection.__file__, "head_dims": list(fp8_paged_kv.HEAD_DIMS),
       "bf16_query": list(llm_fp8_kv.BF16_QUERY_HEAD_DIMS)}

if "init" in CHECKS:   # the refusal at backend init (an explicit fa4 on a Gemma-4 the route cannot run)
    try:
        build(256, 2)
        res["init"] = {"ok": True}
    except Exception as e:
        res["init"] = {"ok": False, "error": f"{type(e).__name__}: {e}"}

if "layers" in CHECKS:
    # as a non-Gemma architecture the init check does not apply: what each layer's call does
    arch = M.get("layers_arch", "Gemma4ForConditionalGeneration")
    W = WINDOW + 1  # the config's sliding_window: prefixes over it, extends across it, decodes at its edge
    for name, prefix, new in (("extend", [W + 76, 30, 0], [40, W * 11 // 16, W + 176]),
                              ("extend-short", [W + 76, 9], [3, 16]),
                              ("decode", [W + 76, 17, W - 1, W], [1, 1, 1, 1])):
        max_ctx = PAGE * (-(-max(p + n for p, n in zip(prefix, new)) // PAGE) + 1)
        runner, pool, backend = build(max_ctx, len(prefix), arch=arch)
        lays = layers()
        slots = allocate(runner, [p + n for p, n in zip(prefix, new)], seed=1)
        fb = batch(runner, prefix, new, name == "decode", slots)
        ids = SWA_IDS[:1] + FULL_IDS[:1]
        res[name] = run_layers(runner, pool, backend, lays, fb, prefix, new, slots, seed=2, ids=ids)

if "interpret" in CHECKS:
    # the split-KV kernel itself (Triton's interpreter, TRITON_INTERPRET=1) on the sliding layer:
    # a decode past the window and a short extend, through the SWA pool
    import sglang_fa4.kernels.fp8_paged_kv.decode as fpd
    torch_kernels = fp8_paged_kv.installed_kernels()
    fp8_paged_kv.install_kernels(None)      # the real launches
    grids, real_split = [], fpd.SPLIT.launch
    fpd.SPLIT.launch = lambda grid, *a, **k: (grids.append(list(grid)), real_split(grid, *a, **k))[1]
    arch = M.get("layers_arch", "Gemma4ForConditionalGeneration")
    try:
        W = WINDOW + 1
        for name, prefix, new in (("decode", [W + 76, 40], [1, 1]), ("extend-short", [W + 6], [5])):
            max_ctx = PAGE * (-(-max(p + n for p, n in zip(prefix, new)) // PAGE) + 1)
            runner, pool, backend = build(max_ctx, len(prefix), arch=arch)
            lays = layers()
            slots = allocate(runner, [p + n for p, n in zip(prefix, new)], seed=6)
            fb = batch(runner, prefix, new, name == "decode", slots)
            res[f"interpret-{name}"] = run_layers(runner, pool, backend, lays, fb, prefix, new, slots, seed=7,
                                                  ids=SWA_IDS[:1])
            res[f"interpret-{name}"]["grids"], grids[:] = list(grids), []
    finally:
        fp8_paged_kv.install_kernels(torch_kernels)
        fpd.SPLIT.launch = real_split

if "graph" in CHECKS:
    # SGLang's decode CUDA-graph path as far as a CPU goes: init_cuda_graph_state, then per captured
    # batch size init_forward_metadata_out_graph / _in_graph and the layer's forward at capture (no
    # tensor may reach the host: _NoSync; the kernels' launches recorded, not run) and at replays with
    # longer and shorter contexts (the same launches from the same graph buffers; then run eagerly on
    # what the replay left in the buffers, against the reference)
    import sglang_fa4.kernels.fp8_paged_kv.decode as fpd
    from test_fp8_paged_decode import _NoSync
    arch = M.get("layers_arch", "Gemma4ForConditionalGeneration")
    W = WINDOW + 1
    max_ctx, max_bs, longest = 2 * W, 4, W + W // 2
    runner, pool, be = build(max_ctx, max_bs + 2, arch=arch, seed=3)
    lays = layers()
    ids = SWA_IDS[:1] + FULL_IDS[:1]
    slots = allocate(runner, [longest] * (max_bs + 2), seed=4)
    g = torch.Generator().manual_seed(5)
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc
    for i in ids:   # every slot the replays read holds real K/V
        layer = lays[i]; loc = torch.cat(slots)
        swa_loc = pool.translate_loc_from_full_to_swa(loc) if i in SWA_IDS else None
        kv = [torch.randn(loc.numel(), layer.tp_k_head_num, layer.head_dim, generator=g).to(torch.bfloat16) for _ in "kv"]
        pool.set_kv_buffer(layer, KVWriteLoc(loc=loc, swa_loc=swa_loc), *kv, layer.k_scale, layer.v_scale)
    be.init_cuda_graph_state(max_bs, max_bs)
    bufs = be.decode_cuda_graph_metadata
    launches = []
    real_split, real_combine = fpd.SPLIT.launch, fpd.COMBINE.launch
    def recorder(name):
        return lambda grid, args, index, **o: launches.append(
            [name, list(grid), [a for a in args if not isinstance(a, torch.Tensor)], sorted(o.items())])
    torch_kernels = fp8_paged_kv.installed_kernels()
    def forward(layer, fb, q, k, v, capturing):
        torch.cuda.is_current_stream_capturing = (lambda: True) if capturing else (lambda: False)
        # at capture the launch path a GPU takes (recorded); eagerly the kernels' torch contracts
        fp8_paged_kv.install_kernels(fp8_paged_kv.Kernels(fpd.launch, torch_kernels.gather) if capturing else torch_kernels)
        fpd.SPLIT.launch, fpd.COMBINE.launch = (recorder("split"), recorder("combine")) if capturing else (real_split, real_combine)
        try:
            with torch.no_grad(), forward_context(ForwardContext(attn_backend=be)):
                if capturing:
                    with _NoSync():
                        return layer(q, k, v, fb)
                return layer(q, k, v, fb)
        finally:
            torch.cuda.is_current_stream_capturing = lambda: False
            fp8_paged_kv.install_kernels(torch_kernels)
            fpd.SPLIT.launch, fpd.COMBINE.launch = real_split, real_combine
    def decode_batch(bs, lens, capture):
        seq = torch.tensor(lens, dtype=torch.int64)
        loc = torch.zeros(bs, dtype=torch.int64) if capture else torch.stack([slots[b][n - 1] for b, n in enumerate(lens)])
        fb = ForwardBatch(forward_mode=ForwardMode.DECODE, batch_size=bs, input_ids=torch.zeros(bs, dtype=torch.int64),
                          req_pool_indices=torch.arange(bs, dtype=torch.int64), seq_lens=seq, out_cache_loc=loc,
                          seq_lens_sum=int(seq.sum()), seq_lens_cpu=seq.clone(), positions=seq - 1)
        if hasattr(runner.kv_index_translator, "bind_own_plan"):
            runner.kv_index_translator.bind_own_plan(fb)
        be.init_forward_metadata_out_graph(fb, in_capture=capture)
        be.init_forward_metadata_in_graph(fb)
        return fb
    fill = be.get_cuda_graph_seq_len_fill_value()
    graph = res["graph"] = {"buffers": sorted(k for k, v in bufs.items() if isinstance(v, torch.Tensor))}
    for bs in (1, 4):
        for i in ids:
            layer = lays[i]
            rec = graph[f"bs{bs}-layer{i}"] = {}
            q = (torch.randn(bs, HQ * layer.head_dim, generator=g) * 0.5).to(torch.bfloat16)
            k, v = ((torch.randn(bs, layer.tp_k_head_num, layer.head_dim, generator=g)).to(torch.bfloat16) for _ in "kv")
            fb = decode_batch(bs, [fill] * bs, capture=True)
            md = be.forward_metadata
            rec["metadata_is_graph_state"] = md is bufs[bs]
            launches.clear(); before = len(ROUTED)
            try:
                forward(layer, fb, q, k.clone(), v.clone(), capturing=True)
            except Exception as e:
                rec["capture_error"] = f"{type(e).__name__}: {e}"
                continue
            capture, routed = list(launches), ROUTED[before:]
            rec["capture_launches"] = len(capture)
            rec["capture_reads"] = [next((n for n in ("swa_page_table", "page_table")
                                          if getattr(md, n, None) is not None and getattr(md, n).data_ptr() == x["page_table"]),
                                         None) for x in routed]
            rec["capture_routed"] = [{x: r[x] for x in ("head_dim", "q_dtype", "window", "k_descale")} for r in routed]
            for name, lens in (("long", [longest, W, 17, W + 1][:bs]), ("short", [3, W - 1, 16, W * 7 // 8][:bs])):
                r = rec[name] = {}
                fb = decode_batch(bs, lens, capture=False)
                r["metadata_is_graph_state"] = be.forward_metadata is md
                launches.clear(); before = len(ROUTED)
                forward(layer, fb, q, k.clone(), v.clone(), capturing=True)
                r["launches_equal_capture"] = launches == capture
                r["same_buffers_as_capture"] = [(x["page_table"], x["cache_seqlens"]) for x in ROUTED[before:]] == [
                    (x["page_table"], x["cache_seqlens"]) for x in routed]
                out = forward(layer, fb, q, k.clone(), v.clone(), capturing=False)
                ref = reference(pool, layer, q, [n - 1 for n in lens], [1] * bs, slots)
                r["err"] = rel_err(out.float().view(bs, -1), ref)
                r["finite"] = bool(torch.isfinite(out.float()).all())

res["forward_calls"] = len(FORWARD_CALLS)
emit(res)
