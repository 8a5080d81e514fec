"""One attention layer of a model on SGLang's REAL attention backend and KV pool (benchmark code).

:class:`Built` is what a model's forward has for one layer: SGLang's own test double of a model
runner (``sglang.test.kits.attention_unittest``: ``MockModelRunner``, ``TinyModelConfig``, the same
in 0.5.20 and 0.5.23) with its ``MHATokenToKVPool`` in the asked dtype and the server args saying
so, ``ATTENTION_BACKENDS[name]`` building the backend from it, a ``RadixAttention`` layer (with a
checkpoint's k/v scales on an fp8 pool), requests owning whole pages in a shuffled order (page 0
reserved) with their cached prefix written by ``set_kv_buffer``, and the ``ForwardBatch`` of an
extend (with a cached prefix) or a decode. :meth:`Built.forward` is the layer's forward (KV write +
attention) as the model calls it; :meth:`Built.reference` is fp32 attention on the dequantized
pool read back through the request slots. Used by ``benchmark/release/check_fp8_kv_backend.py``.
"""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
K_SCALE, V_SCALE = 0.02, 0.015  # checkpoint-style per-layer scales (descales on the fa3/fa4 path)


class Built:
    """A backend + pool + layer + forward batch for one case."""

    def __init__(self, backend_name, kv, hq, hkv, d, page_size, prefix_lens, new_lens, decode, seed, device="cuda"):
        from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
        from sglang.srt.runtime_context import get_context
        from sglang.test.kits.attention_unittest.attention_methods import dense_attention as kit

        DEV = device
        g = torch.Generator(device="cpu").manual_seed(seed)
        self.decode, self.hq, self.hkv, self.d, self.page_size = decode, hq, hkv, d, page_size
        self.prefix_lens = list(prefix_lens)
        self.new_lens = [1] * len(prefix_lens) if decode else list(new_lens)
        seq_lens = [p + n for p, n in zip(self.prefix_lens, self.new_lens)]
        self.seq_lens = seq_lens
        batch = len(seq_lens)
        max_ctx = page_size * (-(-max(seq_lens) // page_size) + 1)
        mode = ForwardMode.DECODE if decode else ForwardMode.EXTEND
        case = kit.DenseAttentionCase(name="fp8kv", backend=backend_name, forward_mode=mode, num_heads=hq,
                                      num_kv_heads=hkv, page_size=page_size, prefix_lens=tuple(self.prefix_lens),
                                      extend_lens=() if decode else tuple(self.new_lens))
        cfg = kit.TinyModelConfig(num_heads=hq, num_kv_heads=hkv, head_dim=d, hidden_size=hq * d, context_len=max_ctx)
        pool_dtype = FP8 if kv == "fp8_e4m3" else torch.bfloat16
        ctx_cls = type(get_context())
        override = ctx_cls.override_server_args
        # the runner publishes its server args with kv_cache_dtype "auto": say what the pool holds
        ctx_cls.override_server_args = lambda self_, **kw: override(self_, **{**kw, "kv_cache_dtype": kv})
        try:
            runner = kit.MockModelRunner(case=case, model_config=cfg, dtype=pool_dtype, device=DEV,
                                         max_context_len=max_ctx, head_dim=d)
        finally:
            ctx_cls.override_server_args = override
        runner.dtype, runner.kv_cache_dtype, runner.kv_cache_dtype_str = torch.bfloat16, pool_dtype, kv
        self.runner, self.pool = runner, runner.token_to_kv_pool
        self.backend = ATTENTION_BACKENDS[backend_name](runner)
        from sglang.srt.layers.radix_attention import RadixAttention

        self.layer = RadixAttention(num_heads=hq, head_dim=d, scaling=d ** -0.5, num_kv_heads=hkv, layer_id=0)
        if kv == "fp8_e4m3":  # a checkpoint's kv scales (RadixAttention holds them as the quant method sets)
            self.layer.k_scale = torch.tensor([K_SCALE], device=DEV)
            self.layer.v_scale = torch.tensor([V_SCALE], device=DEV)
            self.layer.k_scale_float, self.layer.v_scale_float = K_SCALE, V_SCALE
        # SGLang's allocation: whole pages per request in a shuffled order, page 0 reserved
        pool_pages = self.pool.size // page_size
        need = [-(-n // page_size) for n in seq_lens]
        pages = torch.randperm(pool_pages - 1, generator=g)[: sum(need)] + 1
        r2t = runner.req_to_token_pool.req_to_token
        at = 0
        slots_of = []
        for b, n in enumerate(seq_lens):
            pg = pages[at: at + need[b]]
            at += need[b]
            slots = (pg[:, None] * page_size + torch.arange(page_size)[None, :]).reshape(-1)[:n]
            r2t[b, :n] = slots.to(torch.int32).to(DEV)
            slots_of.append(slots)
        self.slots_of = slots_of
        # the cached prefix, written the way the model's earlier forwards wrote it
        tot_prefix = sum(self.prefix_lens)
        if tot_prefix:
            k_pre = torch.randn(tot_prefix, hkv, d, generator=g).to(torch.bfloat16).to(DEV)
            v_pre = torch.randn(tot_prefix, hkv, d, generator=g).to(torch.bfloat16).to(DEV)
            loc = torch.cat([slots_of[b][:p] for b, p in enumerate(self.prefix_lens)]).to(DEV)
            self.pool.set_kv_buffer(self.layer, loc, k_pre, v_pre, self.layer.k_scale, self.layer.v_scale)
        ntok = sum(self.new_lens)
        self.q = torch.randn(ntok, hq * d, generator=g).to(torch.bfloat16).to(DEV)
        self.k = torch.randn(ntok, hkv * d, generator=g).to(torch.bfloat16).to(DEV)
        self.v = torch.randn(ntok, hkv * d, generator=g).to(torch.bfloat16).to(DEV)
        # SGLang's fp8 pool divides the k/v it is handed by the layer's scales in place
        # (set_kv_buffer: cache_k.div_(k_scale)); a model hands it fresh k/v every forward, so
        # forward() restores them from these first (else every timed replay divides again: after
        # two the values pass E4M3's 448 and the pool holds NaN)
        self.k0, self.v0 = self.k.clone(), self.v.clone()
        out_loc = torch.cat([slots_of[b][p:p + n] for b, (p, n) in enumerate(zip(self.prefix_lens, self.new_lens))])
        positions = torch.cat([torch.arange(p, p + n) for p, n in zip(self.prefix_lens, self.new_lens)])
        fb = ForwardBatch(
            forward_mode=mode, batch_size=batch, input_ids=torch.zeros(ntok, dtype=torch.int64, device=DEV),
            req_pool_indices=torch.arange(batch, dtype=torch.int32, device=DEV),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=DEV),
            seq_lens_cpu=torch.tensor(seq_lens, dtype=torch.int32), out_cache_loc=out_loc.to(DEV),
            seq_lens_sum=sum(seq_lens), positions=positions.to(DEV))
        if hasattr(runner.kv_index_translator, "bind_own_plan"):  # 0.5.23: KV ids from the batch's plan
            runner.kv_index_translator.bind_own_plan(fb)
        if not decode:
            fb.extend_prefix_lens = torch.tensor(self.prefix_lens, dtype=torch.int32, device=DEV)
            fb.extend_prefix_lens_cpu = list(self.prefix_lens)
            fb.extend_seq_lens = torch.tensor(self.new_lens, dtype=torch.int32, device=DEV)
            fb.extend_seq_lens_cpu = list(self.new_lens)
            fb.extend_num_tokens = ntok
        self.fb = fb
        self.kv = kv

    def context(self):
        from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

        return forward_context(ForwardContext(attn_backend=self.backend))

    def init_metadata(self):
        with torch.no_grad(), self.context():
            self.backend.init_forward_metadata(self.fb)

    def forward(self):
        """The layer's forward as a model calls it (KV write + attention), on the same k/v each time
        (two copies of ~tokens x kv heads x d bf16 each, in every column alike)."""
        with torch.no_grad(), self.context():
            self.k.copy_(self.k0)
            self.v.copy_(self.v0)
            return self.layer(self.q, self.k, self.v, self.fb)

    def reference(self):
        """fp32 attention on the dequantized cache, read back from the pool through the slots."""
        kb = self.pool.get_key_buffer(0)
        vb = self.pool.get_value_buffer(0)
        ks = K_SCALE if self.kv == "fp8_e4m3" else 1.0
        vs = V_SCALE if self.kv == "fp8_e4m3" else 1.0
        q = self.q.view(-1, self.hq, self.d)
        q = (q.to(FP8) if self.kv == "fp8_e4m3" else q).float()  # SGLang: q.to(kv dtype), no scale
        rep = self.hq // self.hkv
        outs, at = [], 0
        for b, (p, n) in enumerate(zip(self.prefix_lens, self.new_lens)):
            slots = self.slots_of[b].to(kb.device)
            kf = (kb[slots].float() * ks).repeat_interleave(rep, 1)
            vf = (vb[slots].float() * vs).repeat_interleave(rep, 1)
            s = torch.einsum("qhd,khd->hqk", q[at:at + n], kf) * self.d ** -0.5
            i = torch.arange(n, device=s.device)[:, None]
            j = torch.arange(p + n, device=s.device)[None, :]
            s = s.masked_fill(j > i + p, float("-inf"))
            outs.append(torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), vf))
            at += n
        return torch.cat(outs).reshape(-1, self.hq * self.d)


def poison_free_memory(mib: int = 512):
    """Fill the caching allocator's free blocks with NaN (a tensor the backend allocates next is
    likely carved from them): a kernel that leaves rows unwritten shows up as non-finite."""
    if torch.cuda.is_available():
        x = torch.full((mib * 1024 * 1024 // 2,), float("nan"), dtype=torch.bfloat16, device="cuda")
        del x
