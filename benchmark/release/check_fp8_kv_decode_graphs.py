"""The FP8 KV route's decode under SGLang's REAL decode CUDA graphs, on a GPU (issue #42, item 2).

SGLang's own ``FlashAttentionBackend`` (fa4, an ``fp8_e4m3`` ``MHATokenToKVPool``) with the plugin
loaded through SGLang's plugin loader, driven as SGLang's decode graph runner drives it:
``init_cuda_graph_state``, then per batch size ``init_forward_metadata_out_graph(in_capture=True)``
+ ``init_forward_metadata_in_graph`` and a ``torch.cuda.CUDAGraph`` capture of ``forward_decode``
(the step's K/V written into the pool, q cast to E4M3, the split-KV kernel over the page table at
full width: the model's context limit), then replays at other lengths -- longer and shorter than
any seen at capture, across page ends -- each after ``init_forward_metadata_out_graph(in_capture=
False)`` refills the graph's buffers, as SGLang's runner does.  Each replay's output is checked
against fp32 attention on the dequantized pool (the page table rebuilt from ``req_to_token``, not
from the graph's buffers); free pool memory is E4M3-NaN-poisoned, so a read past a length shows.

    PYTHONPATH=$(bash .sgl/install.sh 0.5.23 $PWD):$PWD python3 benchmark/release/check_fp8_kv_decode_graphs.py --out DIR
    ... --cpu-dry: the same plumbing on the CPU, eager (no graph), the kernel's torch contract
        (with TRITON_INTERPRET=1: SGLang's own decode-metadata kernels are Triton)

Benchmark code (SGLang private names are used here, not in the package).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

#: (q heads, kv heads, head dim) of the layers checked: Llama-3-8B's, a d=256 layer and Gemma-4 31B's
#: full-attention layer (d=512: SGLang hands fa4 a bf16 q there, the plugin's hook adds the descales)
LAYERS = {"llama3-8b": (32, 8, 128), "d256": (16, 8, 256), "gemma4-full": (32, 4, 512)}
PAGE = 16
BAR = 2e-2


def build_backend(fab, pool, req_to_token, page, max_context_len, device):
    """A FlashAttentionBackend as a decode graph runner holds it (fa4, fp8 pool, no speculative
    decoding, no sliding window): the attributes its decode paths read."""
    import torch

    be = object.__new__(fab.FlashAttentionBackend)
    be.fa_impl_ver, be.kv_cache_dtype, be.kv_cache_dtype_str = 4, torch.float8_e4m3fn, "fp8_e4m3"
    be.kv_cache_is_mxfp8, be.use_mla, be.device, be.page_size, be.token_to_kv_pool = False, False, device, page, pool
    be.max_context_len, be.max_num_pages = max_context_len, -(-max_context_len // page)
    be.req_to_token = req_to_token
    try:
        from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator  # 0.5.23: the plain pool's passthrough
        be.kv_index_translator = KVIndexTranslator(req_to_token=req_to_token, token_to_kv_pool_allocator=None,
                                                   token_to_kv_pool=pool, page_size=page, device=device)
    except ImportError:
        pass
    be._get_scheduler_metadata = None
    be._get_fa_runtime_policy = None
    be.num_splits = be.decode_num_splits = 0
    be._decode_uses_static_max_seqlen_k = False
    be.has_local_attention = False
    be.local_attn_builder = None
    be.attention_chunk_size = None
    be.topk = be.speculative_num_steps = be.speculative_step_id = 0
    be.speculative_num_draft_tokens = None
    be.sliding_window_size = None
    be.has_swa = be.use_sliding_window_kv_pool = be.is_encoder_decoder = False
    be.decode_cuda_graph_metadata, be.target_verify_metadata = {}, {}
    be.forward_metadata = be.forward_metadata_spec_decode_expand = be.full_cg_prefill_metadata = None
    be.needs_cpu_seq_lens = be.is_draft_runner = be.is_prefill_aware_swa = be.skip_prefill = False
    be.fa_skip_kv_cache = be.has_softcap = False
    be._verify_mask = None
    return be


def check_layer(name, hq, hkv, d, device, graphs: bool, batch_sizes, max_context_len, longest) -> dict:
    import torch

    import sglang.srt.layers.attention.flashattention_backend as fab
    from sglang_fa4.kernels import fp8_paged_kv as fpk
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
    from sglang_fa4.gemma4_selection import SGLANG_FP8_QUERY_MAX_HEAD_DIM
    from sglang_fa4.testing import cu_seqlens, paged_attention_fp32, rel_err

    P = PAGE
    n_req = max(batch_sizes) + 1
    pages_per_req = -(-longest // P)
    size = (n_req * pages_per_req + 2) * P
    pool = MHATokenToKVPool(size=size, page_size=P, dtype=torch.float8_e4m3fn, head_num=hkv, head_dim=d,
                            layer_num=1, device=device, enable_memory_saver=False, enable_alt_stream=False)
    layer = RadixAttention(hq, d, d ** -0.5, hkv, layer_id=0)
    layer.k_scale = torch.tensor([0.05], device=device)
    layer.v_scale = torch.tensor([0.04], device=device)
    for buf in (pool.k_buffer[0], pool.v_buffer[0]):  # free pool memory: E4M3 NaN
        buf.view(torch.uint8).fill_(0x7F)
    req_to_token = torch.zeros(n_req, max_context_len, dtype=torch.int32, device=device)
    perm = (torch.randperm(size // P - 1)[: n_req * pages_per_req] + 1).view(n_req, -1)
    for r in range(n_req):
        slots = (perm[r][:, None] * P + torch.arange(P)[None, :]).reshape(-1)[:longest]
        req_to_token[r, :longest] = slots.to(torch.int32).to(device)
    # every slot a replay may read holds real K/V (SGLang's quantizing write)
    loc = req_to_token[:, :longest].reshape(-1).long()
    pool.set_kv_buffer(layer, loc, (torch.randn(loc.numel(), hkv, d, device=device) * 0.1).to(torch.bfloat16),
                       (torch.randn(loc.numel(), hkv, d, device=device) * 0.1).to(torch.bfloat16),
                       layer.k_scale, layer.v_scale)
    be = build_backend(fab, pool, req_to_token, P, max_context_len, device)
    be.init_cuda_graph_state(max(batch_sizes), max(batch_sizes))
    bufs = be.decode_cuda_graph_metadata
    fill = be.get_cuda_graph_seq_len_fill_value()
    calls = []
    real = fpk.installed_kernels()

    def counted(plan, q, k_cache, v_cache, page_table, *a):  # the split-KV kernel's calls, counted
        calls.append({"pt_shape": list(page_table.shape), "pt_ptr": page_table.data_ptr()})
        return real.split_kv(plan, q, k_cache, v_cache, page_table, *a)

    fpk.install_kernels(fpk.Kernels(counted, real.gather))
    out_rec = {"hq": hq, "hkv": hkv, "d": d, "page": P, "max_context_len": max_context_len, "graphs": graphs}
    g = torch.Generator().manual_seed(7)
    try:
        for bs in batch_sizes:
            rec = out_rec[f"bs{bs}"] = {}
            req = torch.arange(1, bs + 1, dtype=torch.int64, device=device)
            capture_lens = torch.full((bs,), fill, dtype=torch.int64, device=device)
            fb = ForwardBatch(forward_mode=ForwardMode.DECODE, batch_size=bs,
                              input_ids=torch.zeros(bs, dtype=torch.int64, device=device), req_pool_indices=req,
                              seq_lens=capture_lens.clone(), out_cache_loc=torch.zeros(bs, dtype=torch.int64,
                                                                                        device=device),
                              seq_lens_sum=int(capture_lens.sum()), seq_lens_cpu=capture_lens.cpu(),
                              positions=capture_lens - 1)
            q = (torch.randn(bs, hq * d, device=device) * 0.5).to(torch.bfloat16)
            k_new = (torch.randn(bs, hkv, d, device=device) * 0.1).to(torch.bfloat16)
            v_new = (torch.randn(bs, hkv, d, device=device) * 0.1).to(torch.bfloat16)
            # SGLang's fp8 set_kv_buffer divides k/v by the scales in place: a model recomputes them
            # every step, this check refills its static inputs before every forward (else each
            # replay divides again, and the step's own K/V overflow E4M3 into NaN)
            k0, v0 = k_new.clone(), v_new.clone()

            def fresh_kv():
                k_new.copy_(k0)
                v_new.copy_(v0)
            be.init_forward_metadata_out_graph(fb, in_capture=True)
            be.init_forward_metadata_in_graph(fb)
            graph = None
            calls.clear()
            if graphs:  # SGLang's runner: a warm-up forward, then the capture
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    be.forward_decode(q, k_new, v_new, layer, fb)
                torch.cuda.current_stream().wait_stream(s)
                torch.cuda.synchronize()
                calls.clear()  # the capture's own calls are counted, not the warm-up's
                fresh_kv()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    static_out = be.forward_decode(q, k_new, v_new, layer, fb)
            rec["capture_calls"] = len(calls)
            rec["capture_page_table"] = calls[-1]["pt_shape"] if calls else None
            rec["page_table_is_buffer"] = bool(calls) and calls[-1]["pt_ptr"] == bufs["page_table"].data_ptr()
            for label, lens in (("long", [longest] + [int(x) for x in torch.randint(P, longest, (bs - 1,), generator=g)]),
                                ("short", [1, P, P + 1, 2 * P - 1, 3, 100, 31, 64][:bs]
                                 + [int(x) for x in torch.randint(1, 2 * P, (max(0, bs - 8),), generator=g)])):
                lens_t = torch.tensor(lens, dtype=torch.int64, device=device)
                new_loc = req_to_token[req, lens_t - 1].long()
                # the graph runner's static inputs, refilled in place, then the out-of-graph metadata
                fb.seq_lens.copy_(lens_t)
                fb.out_cache_loc.copy_(new_loc)
                fb.positions.copy_(lens_t - 1)
                fb.seq_lens_cpu = lens_t.cpu()
                fb.seq_lens_sum = int(lens_t.sum())
                be.init_forward_metadata_out_graph(fb, in_capture=False)
                be.init_forward_metadata_in_graph(fb)
                calls.clear()
                fresh_kv()
                if graphs:
                    static_out.fill_(float("nan"))
                    graph.replay()
                    torch.cuda.synchronize()
                    out = static_out
                else:
                    out = be.forward_decode(q, k_new, v_new, layer, fb)
                route_calls = len(calls)
                # prepare_paged_mha_query's cast, up to its head-dim limit (q stays bf16 above it)
                qf = q.view(bs, hq, d)
                if d <= SGLANG_FP8_QUERY_MAX_HEAD_DIM:
                    qf = qf.to(torch.float8_e4m3fn)
                key_cache, value_cache = be.get_paged_mha_kv_cache(layer)
                ref_table = (req_to_token[req, ::P][:, : be.max_num_pages] // P).to(torch.int32)
                ref = paged_attention_fp32(qf, key_cache, value_cache, ref_table,
                                           lens_t.to(torch.int32), cu_seqlens([1] * bs, device=device),
                                           k_descale=layer.k_scale, v_descale=layer.v_scale, causal=True)
                o = out.view(bs, hq, d)
                rec[label] = {"lens_min": min(lens), "lens_max": max(lens), "err": rel_err(o, ref),
                              "finite": bool(torch.isfinite(o.float()).all()),
                              "cache_seqlens": bufs["cache_seqlens"][:bs].tolist()[:8]}
                # a replay runs no Python (0 route calls); the eager dry run takes the route once
                rec[label]["route_calls"] = route_calls
                rec[label]["pass"] = (rec[label]["finite"] and rec[label]["err"] < BAR
                                      and route_calls == (0 if graphs else 1)
                                      and (not graphs or (rec["capture_calls"] == 1 and rec["page_table_is_buffer"]
                                                          and rec["capture_page_table"] == [bs, be.max_num_pages])))
            if graph is not None:
                graph.reset()
    finally:
        fpk.install_kernels(real)
    return out_rec


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cpu-dry", action="store_true", help="eager on the CPU (plumbing only; TRITON_INTERPRET=1: "
                                                           "SGLang's own metadata kernels are Triton)")
    ap.add_argument("--layers", nargs="+", choices=sorted(LAYERS), default=list(LAYERS), help="the layers checked")
    args = ap.parse_args()
    layers = {n: LAYERS[n] for n in args.layers}
    from benchmark.sglang_on_gpu import cuda_only_stubs

    cuda_only_stubs.install_missing()
    import torch
    from sglang.srt.plugins import load_plugins

    load_plugins()
    import sglang
    from sglang_fa4.integration import llm_fp8_kv

    device = "cpu" if args.cpu_dry else "cuda"
    if args.cpu_dry:
        from sglang_fa4.testing import paged_kv_torch

        llm_fp8_kv.is_sm90 = lambda dev: True
        paged_kv_torch.install()  # the split-KV kernel's torch contract on CPU tensors
    else:
        assert torch.cuda.get_device_capability() == (9, 0), "the FP8 KV route is for SM90"
    t0 = time.time()
    res = {"command": " ".join(shlex.quote(a) for a in ["python3", *sys.argv]),
           "sglang": getattr(sglang, "__version__", "?"), "device": torch.cuda.get_device_name(0) if not args.cpu_dry
           else "cpu (dry run: eager, torch contract)", "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    sizes = (1, 3) if args.cpu_dry else (1, 8, 32)
    for name, (hq, hkv, d) in layers.items():
        try:
            res[name] = check_layer(name, hq, hkv, d, device, not args.cpu_dry, sizes,
                                    max_context_len=2048 if args.cpu_dry else 131072,
                                    longest=200 if args.cpu_dry else 9000)
        except Exception as exc:  # noqa: BLE001 - recorded per layer
            import traceback

            res[name] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2000:]}
    res["elapsed_s"] = round(time.time() - t0, 1)
    checks = [(f"{n} bs{bs} {k}", r) for n in layers for bs in sizes for k in ("long", "short")
              for r in [res.get(n, {}).get(f"bs{bs}", {}).get(k)] if r is not None]
    res["passed"] = bool(checks) and all(r["pass"] for _, r in checks) and len(checks) == len(layers) * len(sizes) * 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"fp8_kv_decode_graphs-{res['sglang']}" + ("-cpu-dry" if args.cpu_dry else "")
    (out / f"{stem}.json").write_text(json.dumps(res, indent=1))
    for label, r in checks:
        print(f"{label:<24} lens {r['lens_min']}-{r['lens_max']} err {r['err']:.2e} finite {r['finite']} "
              f"{'PASS' if r['pass'] else 'FAIL'}")
    for n in layers:
        if "error" in res.get(n, {}):
            print(n, "ERROR", res[n]["error"])
    print("passed" if res["passed"] else "FAILED", f"({res['elapsed_s']} s)")


if __name__ == "__main__":
    main()
