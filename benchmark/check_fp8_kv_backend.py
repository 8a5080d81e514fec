"""Issue #17 items 2-3 with SGLang's REAL attention backend and KV pool objects: SGLang's own
``FlashAttentionBackend`` (``fa4``, built by ``ATTENTION_BACKENDS["fa4"]`` from a model runner) on
an ``fp8_e4m3`` ``MHATokenToKVPool``, driven through a ``RadixAttention`` layer and a
``ForwardBatch`` exactly as a model's forward does (``init_forward_metadata``, then the layer:
``set_kv_buffer`` quantizes the new K/V into the pool, ``prepare_paged_mha_query`` casts q, the
dispatcher call goes through the plugin's hook to the SM90 FP8 kernel).

The model runner is SGLang's own test double (``sglang.test.kits.attention_unittest``:
``MockModelRunner``, ``TinyModelConfig``, the same in 0.5.20 and 0.5.23) with its pool switched to
fp8_e4m3 and the server args saying so. Each request owns whole pages in a shuffled order (SGLang's
allocation), page 0 reserved.

Correctness: fp32 attention on the dequantized cache (K/V read back from the pool's buffers through
``req_to_token``, times the layer's k/v scales; q cast to E4M3 as SGLang does), bottom-right causal;
the CUDA caching allocator's free memory NaN-poisoned before each forward (the backend allocates
its output); Qwen2.5-7B-like layer (28 q / 4 kv heads, d=128) and a d=256 layer (16 q / 4 kv
heads), page sizes 1, 16, 64, extend with a cached prefix and decode.

Speed (``--speed``): prefill 8k tokens and decode (batch 64, 4k context), the layer's forward
(KV write + attention) timed as CUDA-graph replays (eager CUDA events where capture fails), for
fa4 on the fp8 pool (our route), fa4 on a bf16 pool (SGLang's vendored FA4) and SGLang's triton
backend on both pools.

    python3 benchmark/check_fp8_kv_backend.py --out DIR [--speed] [--cpu-smoke]
        (writes fp8_kv_backend-<sglang version>.json / .md)

``--cpu-smoke``: on a machine without a GPU, the same code with the FP8 kernel replaced by the torch
model of its contract (tests/test_llm_fp8_kv_route.model_kernel) and the SM90 check faked.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (str(ROOT), str(ROOT / "benchmark" / "sglang_on_gpu")):
    if p not in sys.path:
        sys.path.insert(0, p)

import torch  # noqa: E402

FP8 = torch.float8_e4m3fn
BAR = 3e-2
LAYERS = {"qwen2.5-7b d128": (28, 4, 128), "d256": (16, 4, 256)}
K_SCALE, V_SCALE = 0.02, 0.015  # checkpoint-style per-layer scales (descales on the fa3/fa4 path)
RESULT: dict = {"command": "python3 " + " ".join(shlex.quote(a) for a in sys.argv), "correctness": [], "speed": [],
                "notes": []}
T0 = time.time()
DEV = "cuda"
ROUTED_CALLS: list = []
SPEED_FILTER = None
STEM_SUFFIX = ""


def log(*a):
    print(f"[{time.time() - T0:6.1f}s]", *a, flush=True)


def setup(cpu_smoke: bool) -> dict:
    """What a scheduler process has before its first forward: CUDA-only wheels stubbed where absent,
    SGLang's plugin loader run (sglang_fa4's hooks applied)."""
    os.environ.setdefault("SGLANG_IS_FLASHINFER_AVAILABLE", "false")
    import cuda_only_stubs

    stubbed = cuda_only_stubs.install_missing()
    import sglang
    from sglang.srt.plugins import load_plugins
    from sglang.test.kits.attention_unittest.attention_methods import dense_attention  # noqa: F401 (TP=1 view)

    load_plugins()
    import sglang.kernels.ops.attention.flash_attention as fa
    import sglang.srt.layers.attention.flashattention_backend as fab

    if cpu_smoke:
        sys.path.insert(0, str(ROOT / "tests"))
        import sglang_fa4.kernels.fp8_sm90.launch as launch
        from sglang_fa4.integration import llm_fp8_kv
        from test_llm_fp8_kv_route import model_kernel

        llm_fp8_kv.is_sm90 = lambda device: True
        launch.fp8_varlen_attention = model_kernel([])
    import sglang_fa4.kernels.fp8_paged_kv as paged

    routed = paged.paged_fp8_attention  # counted: proves each forward took the FP8 route

    def counted(*a, **k):
        ROUTED_CALLS.append(1)
        return routed(*a, **k)

    paged.paged_fp8_attention = counted
    return {"sglang": sglang.__version__, "stubbed": stubbed,
            "dispatch_hooked": getattr(fab.flash_attn_with_kvcache, "__wrapped__", None) is not None
            and fab.flash_attn_with_kvcache is fa.flash_attn_with_kvcache,
            "prepare_query_hooked": getattr(fab.FlashAttentionBackend.prepare_paged_mha_query, "__wrapped__", None)
            is not None}


class Built:
    """A backend + pool + layer + forward batch for one case."""

    def __init__(self, backend_name, kv, hq, hkv, d, page_size, prefix_lens, new_lens, decode, seed):
        from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
        from sglang.srt.runtime_context import get_context
        from sglang.test.kits.attention_unittest.attention_methods import dense_attention as kit

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
        """The layer's forward as a model calls it (KV write + attention)."""
        with torch.no_grad(), self.context():
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
    if DEV == "cuda":
        x = torch.full((mib * 1024 * 1024 // 2,), float("nan"), dtype=torch.bfloat16, device=DEV)
        del x


def section_correctness():
    for lname, (hq, hkv, d) in LAYERS.items():
        for page_size in (1, 16, 64):
            for mode, prefix, new in (("extend+prefix", [1000, 0, 517, 64], [200, 1500, 17, 1]),
                                      ("decode", [100, 777, 2047, 1, 129, 4095, 33, 640], None)):
                row = {"layer": lname, "hq": hq, "hkv": hkv, "d": d, "page_size": page_size, "case": mode,
                       "cached": prefix, "new": new or [1] * len(prefix)}
                try:
                    b = Built("fa4", "fp8_e4m3", hq, hkv, d, page_size, prefix, new, mode == "decode",
                              seed=page_size * 7 + d)
                    b.init_metadata()
                    poison_free_memory()
                    before = len(ROUTED_CALLS)
                    out = b.forward()
                    row["routed_calls"] = len(ROUTED_CALLS) - before
                    if DEV == "cuda":
                        torch.cuda.synchronize()
                    ref = b.reference()
                    o = out.float().reshape(ref.shape)
                    row.update(rel_err=float((o - ref).norm() / ref.norm()), finite=bool(torch.isfinite(o).all()),
                               out_dtype=str(out.dtype))
                    row["pass"] = row["finite"] and row["rel_err"] < BAR and row["routed_calls"] == 1
                except Exception as exc:  # noqa: BLE001 - recorded, the next case runs
                    row.update(error=f"{type(exc).__name__}: {exc}"[:400], trace=traceback.format_exc()[-1500:],
                               **{"pass": False})
                RESULT["correctness"].append(row)
                log("correct", {k: v for k, v in row.items() if k not in ("cached", "new", "trace")})


def timed(fn, row, label):
    from sglang_fa4.bench.timing import eager_median_ms, graph_replay_ms

    try:
        row[label] = graph_replay_ms(fn, replays=20)
        row[label + "_how"] = "graph"
    except Exception as exc:  # noqa: BLE001 - recorded, then timed eagerly
        torch.cuda.synchronize()
        row[label + "_graph_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        try:
            row[label] = eager_median_ms(fn, iters=20, warmup=3)
            row[label + "_how"] = "eager events"
        except Exception as exc2:  # noqa: BLE001
            row[label] = None
            row[label + "_error"] = f"{type(exc2).__name__}: {str(exc2)[:300]}"


SPEED_BACKENDS = (("fa4", "fp8_e4m3"), ("fa4", "auto"), ("triton", "fp8_e4m3"), ("triton", "auto"))


def section_speed(budget_s):
    shapes = [("prefill 8k", "qwen2.5-7b d128", [0], [8192], False, 16),
              ("decode b64 ctx4k", "qwen2.5-7b d128", [4095] * 64, None, True, 16),
              ("prefill 8k", "d256", [0], [8192], False, 16),
              ("decode b64 ctx4k", "d256", [4095] * 64, None, True, 16)]
    for name, lname, prefix, new, decode, page_size in shapes:
        hq, hkv, d = LAYERS[lname]
        row = {"shape": name, "layer": lname, "hq": hq, "hkv": hkv, "d": d, "page_size": page_size}
        for backend_name, kv in SPEED_BACKENDS:
            label = f"{backend_name}_{'fp8' if kv == 'fp8_e4m3' else 'bf16'}_ms"
            if SPEED_FILTER and not re.search(SPEED_FILTER, f"{name}|{lname}|{backend_name}|{kv}"):
                continue
            if time.time() - T0 > budget_s:
                row[label + "_error"] = "skipped: time budget"
                continue
            try:
                b = Built(backend_name, kv, hq, hkv, d, page_size, prefix, new, decode, seed=1)
                b.init_metadata()
                timed(b.forward, row, label)
            except Exception as exc:  # noqa: BLE001
                row[label] = None
                row[label + "_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            log(name, lname, label, row.get(label), row.get(label + "_how"), row.get(label + "_error", ""))
            b = None
            torch.cuda.empty_cache()
        base = row.get("fa4_bf16_ms")
        for key in ("fa4_fp8_ms", "triton_fp8_ms", "triton_bf16_ms"):
            if base and row.get(key):
                row[key.replace("_ms", "_vs_fa4_bf16")] = base / row[key]
        if any(k.endswith("_ms") for k in row):
            RESULT["speed"].append(row)
        save()


OUT = None


def save():
    if OUT is None:
        return
    OUT.mkdir(parents=True, exist_ok=True)
    name = f"fp8_kv_backend-{RESULT.get('env', {}).get('sglang', 'x')}{STEM_SUFFIX}"
    (OUT / f"{name}.json").write_text(json.dumps(RESULT, indent=1))
    (OUT / f"{name}.md").write_text(markdown(RESULT))


def markdown(r) -> str:
    env = r.get("env", {})
    lines = [f"# SGLang {env.get('sglang')}'s FlashAttentionBackend (fa4) on an fp8_e4m3 MHATokenToKVPool (SM90)", "",
             f"Command: `{r['command']}`", "",
             f"GPU: {env.get('gpu')}; torch {env.get('torch')}; plugin hooks on the dispatcher / prepare_paged_mha_query: "
             f"{env.get('dispatch_hooked')} / {env.get('prepare_query_hooked')}; stubbed: {env.get('stubbed')}", "",
             "## Correctness (fp32 on the dequantized pool; free memory NaN-poisoned first)", "",
             "| layer (hq/hkv/d) | page | case | cached | new | rel. error | finite | FP8 route calls | pass (<3e-2, routed) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for c in r["correctness"]:
        err = f"{c['rel_err']:.2e}" if "rel_err" in c else c.get("error", "?")
        lines.append(f"| {c['layer']} ({c['hq']}/{c['hkv']}/{c['d']}) | {c['page_size']} | {c['case']} | {c['cached']} | "
                     f"{c['new']} | {err} | {c.get('finite', '-')} | {c.get('routed_calls', '-')} | {c['pass']} |")
    if r["speed"]:
        lines += ["", "## Speed (the layer's forward: KV write + attention; median ms of CUDA-graph replays unless noted)",
                  "", "| shape | layer | page | fa4 fp8 pool (ours) | fa4 bf16 pool | triton fp8 pool | triton bf16 pool "
                  "| fa4-bf16 / fa4-fp8 | fa4-bf16 / triton-fp8 |", "|---|---|---|---|---|---|---|---|---|"]

        def f(x):
            return "-" if x is None else f"{x:.3f}"

        for s in r["speed"]:
            cells = []
            for backend_name, kv in SPEED_BACKENDS:
                label = f"{backend_name}_{'fp8' if kv == 'fp8_e4m3' else 'bf16'}_ms"
                how = "" if s.get(label + "_how") in (None, "graph") else " (eager)"
                cells.append(f(s.get(label)) + how)
            lines.append(f"| {s['shape']} | {s['layer']} | {s['page_size']} | " + " | ".join(cells)
                         + f" | {f(s.get('fa4_fp8_vs_fa4_bf16'))}x | {f(s.get('triton_fp8_vs_fa4_bf16'))}x |")
            errs = {k: v for k, v in s.items() if k.endswith("_error")}
            if errs:
                lines.append(f"|  | errors: {errs} |  |  |  |  |  |  |  |")
    if r.get("notes"):
        lines += ["", "Notes:", ""] + [f"- {n}" for n in r["notes"]]
    if r.get("errors"):
        lines += ["", "Errors:", ""] + [f"- `{json.dumps(e)[:600]}`" for e in r["errors"]]
    return "\n".join(lines) + "\n"


def wait_for(path, limit_s=90.0):
    if not path:
        return
    t = time.time()
    while not Path(path).exists() and time.time() - t < limit_s:
        time.sleep(0.5)
    RESULT["notes"].append(f"timing started after {time.time() - t:.1f} s waiting for {Path(path).name} "
                           f"({'present' if Path(path).exists() else 'absent'}): the GPU was not shared while timing"
                           if Path(path).exists() else f"{Path(path).name} absent after {limit_s} s: timing may "
                           "overlap the other process's work")


def main():
    global DEV, OUT
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--speed", action="store_true")
    ap.add_argument("--no-correctness", action="store_true")
    ap.add_argument("--suffix", default="", help="output file name suffix")
    ap.add_argument("--speed-filter", default=None,
                    help="speed: only rows/backends whose 'shape|layer|backend|kv' matches this regex")
    ap.add_argument("--budget-s", type=float, default=150.0, help="skip speed rows after this many seconds")
    ap.add_argument("--cpu-smoke", action="store_true")
    ap.add_argument("--layers", default=None, help="comma list of layer names (default: all of LAYERS)")
    ap.add_argument("--wait-file", help="before timing, wait (up to 90 s) for this file: another process "
                    "sharing the GPU (the other SGLang version's correctness run) is done")
    ap.add_argument("--md-from", help="only rewrite the markdown from this JSON")
    args = ap.parse_args()
    OUT = Path(args.out)
    if args.md_from:
        r = json.loads(Path(args.md_from).read_text())
        Path(args.md_from).with_suffix(".md").write_text(markdown(r))
        return
    if args.cpu_smoke:
        DEV = "cpu"
    if args.layers:
        for name in list(LAYERS):
            if name not in args.layers.split(","):
                del LAYERS[name]
    RESULT["env"] = setup(args.cpu_smoke)
    RESULT["env"].update(gpu=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (smoke)",
                         torch=torch.__version__)
    log(RESULT["env"])
    global SPEED_FILTER, STEM_SUFFIX
    SPEED_FILTER = args.speed_filter
    STEM_SUFFIX = args.suffix
    sections = [] if args.no_correctness else [("correctness", section_correctness)]
    if args.speed:
        sections.append(("speed", lambda: (wait_for(args.wait_file), section_speed(args.budget_s))))
    for name, fn in sections:
        try:
            fn()
        except Exception:  # noqa: BLE001 - keep what was measured
            RESULT.setdefault("errors", []).append({name: traceback.format_exc()[-2000:]})
            log(traceback.format_exc())
        save()
    log("done")


if __name__ == "__main__":
    os.environ.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "1")
    main()
