"""The FP8 KV route's hooks on a REAL SGLang release's FlashAttentionBackend methods and fp8_e4m3
MHATokenToKVPool, then SGLang's own decode CUDA-graph metadata path (init_cuda_graph_state,
init_forward_metadata_out_graph at capture and at replay): for tests/test_llm_fp8_kv_route.py, one
subprocess per version."""

from emit import emit
import warnings; warnings.simplefilter("ignore")
from benchmark.sglang_on_gpu import cuda_only_stubs; cuda_only_stubs.install_missing()   # sgl_kernel / flashinfer are CUDA-only wheels
import torch
from sglang.srt.plugins import load_plugins
load_plugins()
import sglang.srt.layers.attention.flashattention_backend as fab
import sglang.kernels.ops.attention.flash_attention as fa
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
from sglang_fa4.integration import llm_fp8_kv
from sglang_fa4.kernels import fp8_paged_kv as fpk, fp8_sm90
import sglang_fa4.kernels.fp8_paged_kv.decode as fpd
from sglang_fa4.testing import cu_seqlens, paged_attention_fp32, paged_kv_torch, rel_err
llm_fp8_kv.is_sm90 = lambda device: True          # this CPU stands in for an H200
calls = []; fp8_sm90.fp8_varlen_attention = paged_kv_torch.fp8_forward_model(calls)
# the split-KV decode kernel runs for real, in Triton's interpreter (TRITON_INTERPRET=1), or as its torch
# contract (INTERPRET); the gather as its torch path (its own kernel is interpreted in
# test_fp8_paged_gather.py); every split-KV call counted, with the metadata tensors it read
INTERPRET = [False]
split_calls, seen = [], []
def split_kv(plan, q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, *a):
    split_calls.append(plan.return_lse)
    seen.append({"page_table": page_table.data_ptr(), "cache_seqlens": cache_seqlens.data_ptr(),
                 "cu_seqlens_q": cu_seqlens_q.data_ptr(), "pt_shape": list(page_table.shape)})
    kernel = fpd.launch if INTERPRET[0] else paged_kv_torch.split_kv
    return kernel(plan, q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, *a)
fpk.install_kernels(fpk.Kernels(split_kv, paged_kv_torch.gather))
launches = []; _launch = fpd.SPLIT.launch
fpd.SPLIT.launch = lambda *a, **k: (launches.append(a[0]), _launch(*a, **k))
res = {"hooked_dispatch": fab.flash_attn_with_kvcache is fa.flash_attn_with_kvcache
       and getattr(fab.flash_attn_with_kvcache, "__wrapped__", None) is not None,
       "hooked_prepare": getattr(fab.FlashAttentionBackend.prepare_paged_mha_query, "__wrapped__", None) is not None}

class Layer:   # the RadixAttention fields the backend and the pool read
    def __init__(s, hq, hkv, d, k_scale, v_scale):
        s.layer_id, s.tp_q_head_num, s.tp_k_head_num, s.tp_v_head_num = 0, hq, hkv, hkv
        s.head_dim = s.v_head_dim = d; s.k_scale, s.v_scale = k_scale, v_scale
        s.scaling = d ** -0.5; s.logit_cap = 0.0; s.sliding_window_size = -1

torch.manual_seed(0)
hq, hkv, d = 28, 4, 128
for P in (1, 16, 64):
    # the split-KV kernel interpreted at page 16 (its arithmetic at every page size: test_fp8_paged_decode.py);
    # its torch contract at pages 1 and 64 (CI time)
    INTERPRET[0] = P == 16
    for mode, lens, new in (("extend", [90, 257], [40, 257]), ("extend-short", [90, 257], [5, 16]),
                            ("decode", [33, 130, 64], [1, 1, 1])):
        B = len(lens)
        pool = MHATokenToKVPool(size=4096, page_size=P, dtype=torch.float8_e4m3fn, head_num=hkv, head_dim=d,
                                layer_num=1, device="cpu", enable_memory_saver=False, enable_alt_stream=False)
        layer = Layer(hq, hkv, d, torch.tensor([0.05]), torch.tensor([0.04]))
        # SGLang's allocation: each request owns whole pages, in a shuffled order; req_to_token holds token slots
        n_pages = [-(-n // P) for n in lens]
        pages = (torch.randperm(4096 // P - 1)[: sum(n_pages)] + 1).tolist()
        width = max(lens)
        req_to_token = torch.zeros(B, width, dtype=torch.int32)
        at = 0
        for b, n in enumerate(lens):
            slots = torch.cat([torch.arange(p * P, p * P + P) for p in pages[at: at + n_pages[b]]])[:n]
            req_to_token[b, :n] = slots.to(torch.int32); at += n_pages[b]
        k = torch.randn(sum(lens), hkv, d, dtype=torch.bfloat16) * 0.1
        v = torch.randn(sum(lens), hkv, d, dtype=torch.bfloat16) * 0.1
        loc = torch.cat([req_to_token[b, :n] for b, n in enumerate(lens)]).long()
        pool.set_kv_buffer(layer, loc, k.clone(), v.clone(), layer.k_scale, layer.v_scale)   # SGLang quantizes
        be = object.__new__(fab.FlashAttentionBackend)
        be.fa_impl_ver, be.kv_cache_dtype, be.kv_cache_dtype_str = 4, torch.float8_e4m3fn, "fp8_e4m3"
        be.kv_cache_is_mxfp8, be.use_mla, be.device, be.page_size, be.token_to_kv_pool = False, False, "cpu", P, pool
        q_bf16 = torch.randn(sum(new), hq * d, dtype=torch.bfloat16)
        q, _, _, kd, vd = be.prepare_paged_mha_query(q_bf16, None, None, layer, logical_batch_size=B,
                                                     kv_head_num=hkv, is_prefill=(mode != "decode"))
        key_cache, value_cache = be.get_paged_mha_kv_cache(layer)
        page_table = (req_to_token[:, ::P] // P).to(torch.int32)     # FlashAttentionBackend's page table
        cache_seqlens = torch.tensor(lens, dtype=torch.int32)
        cu_q = cu_seqlens(new)
        out = fab.flash_attn_with_kvcache(                           # forward_extend's / forward_decode's call
            q=q.contiguous().view(-1, hq, d), k_cache=key_cache, v_cache=value_cache, page_table=page_table,
            cache_seqlens=cache_seqlens, cu_seqlens_q=cu_q, cu_seqlens_k_new=None, max_seqlen_q=max(new),
            softmax_scale=layer.scaling, causal=True, window_size=(-1, -1), softcap=layer.logit_cap,
            return_softmax_lse=False, num_splits=0, out=None, ver=4, k_descale=kd, v_descale=vd)
        ref = paged_attention_fp32(q.view(-1, hq, d), key_cache, value_cache, page_table, cache_seqlens, cu_q,
                                        k_descale=layer.k_scale, v_descale=layer.v_scale, causal=True)
        res[f"{mode}-P{P}"] = {
            "q_dtype": str(q.dtype), "descale": None if kd is None else [float(kd[0, 0]), float(vd[0, 0]), list(kd.shape)],
            "err": rel_err(out, ref), "shape": list(out.shape),
            "finite": bool(torch.isfinite(out.float()).all()),
        }
        if mode == "decode":  # cascade attention's LSE request through SGLang's dispatcher
            o2, lse = fab.flash_attn_with_kvcache(
                q=q.contiguous().view(-1, hq, d), k_cache=key_cache, v_cache=value_cache, page_table=page_table,
                cache_seqlens=cache_seqlens, cu_seqlens_q=cu_q, max_seqlen_q=1, softmax_scale=layer.scaling,
                causal=False, window_size=(-1, -1), softcap=0.0, return_softmax_lse=True, num_splits=0, ver=4,
                k_descale=kd, v_descale=vd)
            res[f"{mode}-P{P}"].update(lse_shape=list(lse.shape), lse_same_out=bool(torch.equal(o2, out)),
                                        lse_finite=bool(torch.isfinite(lse).all()))
res["kernel_calls"] = len(calls)
res["split_calls"] = list(split_calls)
res["interpreted_launches"] = len(launches)

# ---- SGLang's own decode-graph metadata path (init_cuda_graph_state + init_forward_metadata_out_graph) ----
torch.manual_seed(1)
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.layers.radix_attention import RadixAttention
from test_fp8_paged_decode import _NoSync

def graph_backend(P, max_context_len, pool, req_to_token):
    be = object.__new__(fab.FlashAttentionBackend)
    be.fa_impl_ver, be.kv_cache_dtype, be.kv_cache_dtype_str = 4, torch.float8_e4m3fn, "fp8_e4m3"
    be.kv_cache_is_mxfp8, be.use_mla, be.device, be.page_size, be.token_to_kv_pool = False, False, "cpu", P, pool
    be.max_context_len, be.max_num_pages = max_context_len, -(-max_context_len // P)
    be.req_to_token = req_to_token
    from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator   # the plain pool's: passthrough
    be.kv_index_translator = KVIndexTranslator(req_to_token=req_to_token, token_to_kv_pool_allocator=None,
                                               token_to_kv_pool=pool, page_size=P, device="cpu")
    be._get_scheduler_metadata = None; be._get_fa_runtime_policy = None
    be.num_splits = be.decode_num_splits = 0; be._decode_uses_static_max_seqlen_k = False
    be.has_local_attention = False; be.local_attn_builder = None; be.attention_chunk_size = None
    be.topk = 0; be.speculative_num_steps = 0; be.speculative_step_id = 0; be.speculative_num_draft_tokens = None
    be.sliding_window_size = None; be.has_swa = False; be.use_sliding_window_kv_pool = False
    be.is_encoder_decoder = False; be.decode_cuda_graph_metadata = {}; be.target_verify_metadata = {}
    be.forward_metadata = None; be.forward_metadata_spec_decode_expand = None
    be.full_cg_prefill_metadata = None; be.needs_cpu_seq_lens = False; be.is_draft_runner = False
    be.is_prefill_aware_swa = False; be.skip_prefill = False; be.fa_skip_kv_cache = False; be.has_softcap = False; be._verify_mask = None
    return be

graph = {"max_context_len": 2048}
hq, hkv, d, P, max_bs = 28, 4, 128, 16, 8
max_context_len = graph["max_context_len"]
pool = MHATokenToKVPool(size=8192, page_size=P, dtype=torch.float8_e4m3fn, head_num=hkv, head_dim=d,
                        layer_num=1, device="cpu", enable_memory_saver=False, enable_alt_stream=False)
layer = RadixAttention(hq, d, d ** -0.5, hkv, layer_id=0)
layer.k_scale, layer.v_scale = torch.tensor([0.05]), torch.tensor([0.04])   # the checkpoint's KV scales
for buf in (pool.k_buffer[0], pool.v_buffer[0]):   # free pool memory poisoned: a read past a length shows
    buf.view(torch.uint8).fill_(0x7F)               # E4M3 NaN
# every request owns whole pages (shuffled) up to its longest length; req_to_token holds token slots
longest = 200
n_req = max_bs + 2
req_to_token = torch.zeros(n_req, max_context_len, dtype=torch.int32)
pages = (torch.randperm(8192 // P - 1)[: n_req * -(-longest // P)] + 1).view(n_req, -1)
for r in range(n_req):
    req_to_token[r, :longest] = torch.cat([torch.arange(p * P, p * P + P) for p in pages[r].tolist()])[:longest].to(torch.int32)
be = graph_backend(P, max_context_len, pool, req_to_token)
be.init_cuda_graph_state(max_bs, max_bs)
bufs = be.decode_cuda_graph_metadata
graph["buffers"] = {k: list(v.shape) for k, v in bufs.items() if isinstance(v, torch.Tensor)}

def forward_batch(bs, req_pool_indices, seq_lens, out_cache_loc):   # as SGLang's decode graph runner builds it
    return ForwardBatch(forward_mode=ForwardMode.DECODE, batch_size=bs, input_ids=torch.zeros(bs, dtype=torch.int64),
                        req_pool_indices=req_pool_indices, seq_lens=seq_lens, out_cache_loc=out_cache_loc,
                        seq_lens_sum=int(seq_lens.sum()), seq_lens_cpu=seq_lens.clone(), positions=seq_lens - 1)

# fill every token slot the replays use (positions < longest) with real K/V
all_loc = req_to_token[:, :longest].reshape(-1).long()
pool.set_kv_buffer(layer, all_loc, (torch.randn(all_loc.numel(), hkv, d) * 0.1).to(torch.bfloat16),
                   (torch.randn(all_loc.numel(), hkv, d) * 0.1).to(torch.bfloat16), layer.k_scale, layer.v_scale)

graph_launches, ran = [], []
INTERPRET[0] = True   # the launch path a GPU call takes: the launches are recorded, not run
real_split, real_combine = _launch, fpd.COMBINE.launch
def run_split(grid, args, index, **o):
    ran.append(list(grid)); return real_split(grid, args, index, **o)
def recorder(name):
    return lambda grid, args, index, **o: graph_launches.append(
        [name, list(grid), [a for a in args if not isinstance(a, torch.Tensor)], sorted(o.items())])

def decode(fb, q, k, v, capturing):
    torch.cuda.is_current_stream_capturing = (lambda: True) if capturing else (lambda: False)
    try:
        if capturing:
            with _NoSync():
                return be.forward_decode(q, k, v, layer, fb)
        return be.forward_decode(q, k, v, layer, fb)
    finally:
        torch.cuda.is_current_stream_capturing = lambda: False

fill = be.get_cuda_graph_seq_len_fill_value()
for bs in (1, 4, 8):
    rec = graph[f"bs{bs}"] = {}
    req = torch.arange(1, bs + 1, dtype=torch.int64)
    # capture: SGLang's graph runner fills seq_lens with the backend's fill value
    fb = forward_batch(bs, req, torch.full((bs,), fill, dtype=torch.int64), torch.zeros(bs, dtype=torch.int64))
    be.init_forward_metadata_out_graph(fb, in_capture=True)
    be.init_forward_metadata_in_graph(fb)
    md = be.forward_metadata
    rec["metadata_is_graph_state"] = md is be.decode_cuda_graph_metadata[bs]
    q = (torch.randn(bs, hq * d) * 0.5).to(torch.bfloat16)
    # the step's own K/V, shaped as RadixAttention.forward hands them to the backend
    k_new, v_new = ((torch.randn(bs, hkv, d) * 0.1).to(torch.bfloat16) for _ in "kv")
    fpd.SPLIT.launch, fpd.COMBINE.launch = recorder("split"), recorder("combine")
    graph_launches.clear(); seen.clear()
    decode(fb, q, k_new, v_new, capturing=True)
    rec["capture"] = list(graph_launches)
    ptrs = {"page_table": bufs["page_table"].data_ptr(), "cache_seqlens": bufs["cache_seqlens"].data_ptr(),
            "cu_seqlens_q": bufs["cu_seqlens_q"].data_ptr()}
    rec["capture_from_buffers"] = all(seen[-1][k] == v for k, v in ptrs.items()) and seen[-1]["pt_shape"] == [bs, be.max_num_pages]
    # replays with other lengths: longer (several pages, off a page end, one page exactly) then shorter
    for name, lens in (("long", [200, 17, 16, 129, 64, 1, 33, 177][:bs]), ("short", [3, 16, 1, 15, 2, 31, 48, 5][:bs])):
        r = rec[name] = {}
        fb = forward_batch(bs, req, torch.tensor(lens, dtype=torch.int64),   # the new token's slot: position len-1
                           req_to_token[req, torch.tensor(lens) - 1].long())
        be.init_forward_metadata_out_graph(fb, in_capture=False)
        be.init_forward_metadata_in_graph(fb)
        r["metadata_is_graph_state"] = be.forward_metadata is md
        r["cache_seqlens"] = bufs["cache_seqlens"][:bs].tolist()
        graph_launches.clear(); seen.clear()
        decode(fb, q, k_new, v_new, capturing=True)          # the graph's launches, recorded again
        r["launches_equal_capture"] = graph_launches == rec["capture"]
        r["from_buffers"] = all(seen[-1][k] == v for k, v in ptrs.items())
        # the result, on what the replay left in the buffers: the kernel itself in Triton's interpreter
        # at batch 4 (GQA 7, split + combine), its torch contract at 1 and 8 (CI time)
        fpd.SPLIT.launch, fpd.COMBINE.launch = run_split, real_combine
        INTERPRET[0] = bs == 4
        ran.clear()
        out = decode(fb, q, k_new, v_new, capturing=False).view(bs, hq, d)
        INTERPRET[0] = True
        r["interpreted_grids"] = list(ran)
        fpd.SPLIT.launch, fpd.COMBINE.launch = recorder("split"), recorder("combine")
        qf = q.view(bs, hq, d).to(torch.float8_e4m3fn)     # prepare_paged_mha_query's cast, as the route sees it
        key_cache, value_cache = be.get_paged_mha_kv_cache(layer)
        ref_table = (req_to_token[req, ::P][:, : be.max_num_pages] // P).to(torch.int32)  # independent of the buffers
        ref = paged_attention_fp32(qf, key_cache, value_cache, ref_table, torch.tensor(lens, dtype=torch.int32),
                                   cu_seqlens([1] * bs), k_descale=layer.k_scale, v_descale=layer.v_scale, causal=True)
        r["err"] = rel_err(out, ref); r["finite"] = bool(torch.isfinite(out.float()).all())
INTERPRET[0] = False
res["graph"] = graph
emit(res)
