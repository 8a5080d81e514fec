"""Child process of tests/test_fp8_paged_decode.py (and the GPU run's long-context check): runs the
paged FP8 decode kernel on the cases given as JSON on stdin and prints one JSON result per case.

Run under TRITON_INTERPRET=1 on the CPU (Triton must see the variable before it is imported, hence
a child process), or on a GPU with ``--device cuda``.  Every pool is filled with NaN first (E4M3
0x7F), then only the cached tokens are written: a read of free memory shows up as a NaN on a GPU
(Triton's interpreter converts 0x7F to 480, which shows up as a large error instead)."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time

import torch

from sglang_fa4.kernels.fp8_paged_kv import paged_decode_attention, paged_kv_attention, plan
from sglang_fa4.testing import attention_fp32, cu_seqlens, page_table, rel_err

FP8 = torch.float8_e4m3fn
ULP = {"cpu": 2.0 ** -7, "cuda": 2.0 ** -8}


def make_pool(lens, page_size, hkv, d, seed, device, width=None):
    """SGLang's layout: k_cache[page, offset, head, :]; pages shuffled; table rows as wide as the
    longest sequence plus one, entries past a sequence's pages point nowhere valid."""
    g = torch.Generator().manual_seed(seed)
    need = [-(-n // page_size) for n in lens]
    total_pages = sum(need) + 2
    k = torch.full((total_pages, page_size, hkv, d), float("nan")).to(FP8)
    v = k.clone()
    table = page_table(need, torch.randperm(total_pages, generator=g), width, fill=2**30)  # garbage past the pages
    for b in range(len(lens)):
        t = torch.arange(lens[b])
        slots = table[b].long()[t // page_size] * page_size + t % page_size
        k.view(-1, hkv, d)[slots] = (torch.randn(lens[b], hkv, d, generator=g) * 2).to(FP8)
        v.view(-1, hkv, d)[slots] = torch.randn(lens[b], hkv, d, generator=g).to(FP8)
    return k.to(device), v.to(device), table.to(device), torch.tensor(lens, dtype=torch.int32, device=device)


def reference(q, k, v, table, seqlens, cu_q, kd, vd, scale, causal, window, key_ranges=None):
    """fp64 on the dequantized pool: out (total_q, Hq, d) and natural-log LSE (Hq, total_q), from
    sglang_fa4.testing's reference (bottom-right causal and window, SGLang's -1 as unbounded)."""
    page_size, hkv, d = k.shape[1:]
    ks, vs = [], []
    for b, n in enumerate(seqlens.tolist()):
        t = torch.arange(n)
        slots = table[b].long()[t // page_size] * page_size + t % page_size
        ks.append(k.view(-1, hkv, d)[slots].double() * kd[b].double()[None, :, None])
        vs.append(v.view(-1, hkv, d)[slots].double() * vd[b].double()[None, :, None])
    return attention_fp32(q, torch.cat(ks), torch.cat(vs), cu_q, cu_seqlens(seqlens.tolist()), scale=scale,
                          causal=causal, window=tuple(window), dtype=torch.float64, return_lse=True,
                          key_ranges=key_ranges)


def image_ranges(images, lens, new):
    """SGLang's ``image_token_ranges`` (gemma4_mm.prepare_attn_masks): (total_q, 2) int32, a query
    row inside an image [begin, end] (absolute key positions of its sequence, inclusive) holds
    (begin, end), every other row (-1, -1). ``images``: [sequence, begin, end] each."""
    cu = [0]
    for n in new:
        cu.append(cu[-1] + n)
    ranges = torch.full((cu[-1], 2), -1, dtype=torch.int32)
    for b, begin, end in images:
        prefix = lens[b] - new[b]
        assert prefix <= begin <= end < lens[b], (b, begin, end)  # SGLang leaves split images causal
        ranges[cu[b] + begin - prefix: cu[b] + end + 1 - prefix] = torch.tensor([begin, end], dtype=torch.int32)
    return ranges


def descale(kind: str, batch: int, hkv: int, value: float):
    """(the values the reference multiplies by (batch, hkv), what the kernel is given) for one
    descale layout: per (batch, kv head) around 1, "wide" (log-uniform over 1e-3 .. 1e2), "scalar"
    (SGLang's layer scale: a (batch, kv head) expand of one value), "one" (a 1-element tensor),
    "none" (None: 1)."""
    if kind == "per":
        x = 0.5 + torch.rand(batch, hkv)
        return x, x
    if kind == "wide":
        x = 10.0 ** (-3 + 5 * torch.rand(batch, hkv))
        return x, x
    if kind == "scalar":
        x = torch.tensor([value]).expand(batch, hkv)
        return x, x
    if kind == "one":
        return torch.tensor([value]).expand(batch, hkv), torch.tensor([value])
    if kind == "none":
        return torch.ones(batch, hkv), None
    raise ValueError(f"unknown descale kind {kind!r}")


def run_case(c: dict, device: str) -> dict:
    """One case: lens, page, hq, hkv, d, new (tokens per sequence), window (left, right or None),
    causal, splits (None: the heuristic), descale / descale_v (see :func:`descale`), q (fp8 |
    bf16), width (page-table columns), slice_table (the table a column slice of a wider one),
    auto (the route's own plan, ``paged_kv_attention``: no forced backend, split count or LSE;
    the result names the backend it took), images ([sequence, begin, end] each: SGLang's image rows,
    :func:`image_ranges`)."""
    torch.manual_seed(c.get("seed", 0))
    lens, P, hq, hkv, d = c["lens"], c["page"], c["hq"], c["hkv"], c["d"]
    new = c.get("new", [1] * len(lens))
    k, v, table, seqlens = make_pool(lens, P, hkv, d, c.get("seed", 0), "cpu", c.get("width"))
    cu_q = cu_seqlens(new)
    q = torch.randn(sum(new), hq, d)
    q = q.to(FP8) if c.get("q", "fp8") == "fp8" else q.to(torch.bfloat16)
    # descale layouts, k's and v's each its own ("descale" for both unless "descale_v" says otherwise)
    kd, kd_arg = descale(c.get("descale", "per"), len(lens), hkv, 0.7)
    vd, vd_arg = descale(c.get("descale_v", c.get("descale", "per")), len(lens), hkv, 1.3)
    if c.get("slice_table"):  # a column slice of a wider table: rows strided, columns contiguous
        wide = torch.full((table.shape[0], table.shape[1] + 5), 2**30, dtype=torch.int32)
        wide[:, : table.shape[1]] = table
        table = wide[:, : table.shape[1]]
    window = c.get("window") or (-1, -1)
    causal = c.get("causal", True)
    scale = c.get("scale", d ** -0.5)
    dev = lambda x: x.to(device)  # noqa: E731
    out = torch.full((sum(new), hq, d), float("nan"), dtype=torch.bfloat16, device=device)
    args = (dev(q), dev(k), dev(v), dev(table), dev(seqlens), dev(cu_q), max(new))
    ranges = image_ranges(c["images"], lens, new) if c.get("images") else None
    kw = dict(k_descale=None if kd_arg is None else dev(kd_arg), v_descale=None if vd_arg is None else dev(vd_arg),
              softmax_scale=scale, causal=causal, window_size=tuple(window), out=out,
              image_ranges=None if ranges is None else dev(ranges))
    result = {}
    if c.get("auto"):  # the route's own choice (the LSE would force the split-KV kernel: not asked)
        result["backend"] = plan(*args, **kw).backend
        got, lse = paged_kv_attention(*args, **kw), None
    else:
        got, lse = paged_decode_attention(*args, **kw, return_lse=True, num_splits=c.get("splits"),
                                          sms=c.get("sms", 132 if device == "cpu" else None), launch=c.get("launch"))
    # the reference takes the ranges within each sequence's keys (absolute positions: the same)
    ref, ref_lse = reference(q.float(), k, v, table, seqlens, cu_q, kd, vd, scale, causal, window, ranges)
    into_out = got is out
    got = got.float().cpu().double()
    diff = (got - ref).abs()
    result.update({
        "into_out": into_out,
        "finite": bool(torch.isfinite(got).all()),
        "rel_err": rel_err(got, ref),
        # per element, against bf16 rounding of the value plus fp16 P's share: one ulp (2^-7 relative)
        # in the interpreter, which truncates fp32 -> bf16; half of one (rounding) on a GPU
        "max_excess": float((diff - (ref.abs() * ULP[device] + 2e-3)).max()),
    })
    if lse is not None:
        result["lse_err"] = float((lse.cpu().double() - ref_lse).abs().max())
    return result


def run_decode_vs_extend(c: dict, device: str) -> dict:
    """One cache of ``L`` tokens; extend: the last ``n`` positions as ``n`` new rows of one sequence;
    decode: ``n`` sequences sharing its page-table row, lengths L-n+1 .. L, one row each (position
    t's decode step).  Row i of both must agree within bf16 rounding."""
    L, n, P, hq, hkv, d = c["L"], c["n"], c["page"], c["hq"], c["hkv"], c["d"]
    k, v, table, _ = make_pool([L], P, hkv, d, c.get("seed", 0), "cpu")
    q = torch.randn(n, hq, d).to(FP8 if c.get("q", "fp8") == "fp8" else torch.bfloat16)
    kd, vd = 0.5 + torch.rand(1, hkv), 0.5 + torch.rand(1, hkv)
    window = tuple(c.get("window") or (-1, -1))
    dev = lambda x: x.to(device)  # noqa: E731
    ext = paged_decode_attention(dev(q), dev(k), dev(v), dev(table), dev(torch.tensor([L], dtype=torch.int32)),
                                 dev(cu_seqlens([n])), n, k_descale=dev(kd), v_descale=dev(vd),
                                 causal=True, window_size=window, num_splits=c.get("extend_splits"),
                                 sms=132 if device == "cpu" else None, launch=c.get("launch"))
    lens = torch.arange(L - n + 1, L + 1, dtype=torch.int32)
    dec = paged_decode_attention(dev(q), dev(k), dev(v), dev(table.expand(n, -1).contiguous()), dev(lens),
                                 dev(torch.arange(n + 1, dtype=torch.int32)), 1,
                                 k_descale=dev(kd.expand(n, hkv)), v_descale=dev(vd.expand(n, hkv)), causal=True,
                                 window_size=window, num_splits=c.get("decode_splits"),
                                 sms=132 if device == "cpu" else None, launch=c.get("launch"))
    ref, _ = reference(q.float(), k, v, table, torch.tensor([L], dtype=torch.int32), cu_seqlens([n]), kd, vd,
                       d ** -0.5, True, window)
    e, dd = ext.float().cpu().double(), dec.float().cpu().double()
    return {
        "finite": bool(torch.isfinite(e).all() and torch.isfinite(dd).all()),
        "rel_err": rel_err(e, ref),
        "decode_rel_err": rel_err(dd, ref),
        # decode row t vs extend row t: at most one bf16 rounding step of the larger apart
        "max_excess": float(((e - dd).abs() - torch.maximum(e.abs(), dd.abs()) * 2.0 ** -7 - 1e-3).max()),
        "bitwise_rows": int(((e == dd).all(dim=(1, 2))).sum()),
        "lse_err": 0.0,
    }


#: contexts the CPU interpreter cannot afford, for the GPU run (``--matrix gpu``): 32k and 128k tokens,
#: every head dim's largest cases, windows, GQA 7, a batch of 8 at 32k, decode == extend at 32k
GPU_CASES = {
    "gpu-32k-d128-P16": dict(lens=[32768, 32767, 1, 16], page=16, hq=28, hkv=4, d=128),
    "gpu-b8-32k-d128-P64": dict(lens=[32768] * 8, page=64, hq=28, hkv=4, d=128),
    "gpu-128k-d128-P1": dict(lens=[131072, 65537], page=1, hq=28, hkv=4, d=128),
    "gpu-128k-d256-P64": dict(lens=[131072], page=64, hq=16, hkv=4, d=256),
    "gpu-32k-d256-window-P64": dict(lens=[32768, 20000], page=64, hq=16, hkv=4, d=256, window=(4095, 0)),
    "gpu-128k-g7-d192-P32": dict(lens=[131072], page=32, hq=7, hkv=1, d=192),
    "gpu-128k-d96-g8-bf16q": dict(lens=[131071], page=16, hq=8, hkv=1, d=96, q="bf16"),
    "gpu-32k-d64-noncausal-splits64": dict(lens=[32768], page=16, hq=4, hkv=1, d=64, causal=False, splits=64),
    "gpu-decode-vs-extend-32k": dict(L=32768, n=16, page=16, hq=28, hkv=4, d=128),
    # descales per (batch, kv head) over 1e-3 .. 1e2, ragged long batches (Llama's and Qwen's GQA)
    "gpu-wide-descales-b8-llama": dict(lens=[8192 + 997 * b for b in range(8)], page=16, hq=32, hkv=8, d=128,
                                       descale="wide"),
    "gpu-wide-descales-b4-d256": dict(lens=[30000, 1, 4097, 12345], page=64, hq=16, hkv=8, d=256, descale="wide"),
    # SGLang's decode graphs: a page table as wide as the context limit (128k) over 4k contexts
    "gpu-wide-table-128k-4k": dict(lens=[4096, 3900, 4300, 17], page=16, hq=32, hkv=8, d=128, width=8192),
}


#: head dim 512 on the GPU (``--matrix d512``: with tests/test_fp8_paged_d512.py's cases): Gemma-4's
#: full-attention layers (31B: 32 q / 4 kv heads, 26B-A4B: 16 / 2; bf16 q, no descales as SGLang
#: passes them, or the pool's), decode at 8k-32k, prefills with a cached prefix on the route's own
#: plan (the split-KV kernel: no gather at d512), decode == extend at 16k
GPU_D512_CASES = {
    "gpu-d512-31b-decode-b8-8k": dict(lens=[8192] * 8, page=16, hq=32, hkv=4, d=512, q="bf16", descale="none"),
    "gpu-d512-26b-decode-32k": dict(lens=[32768, 1, 4097], page=64, hq=16, hkv=2, d=512, q="bf16", descale="one"),
    "gpu-d512-31b-prefill-1k-prefix-3k": dict(lens=[4096], new=[1024], page=16, hq=32, hkv=4, d=512, q="bf16",
                                              descale="none", auto=True),
    "gpu-d512-26b-prefill-2k-P1": dict(lens=[2048, 700], new=[2048, 300], page=1, hq=16, hkv=2, d=512, q="bf16",
                                       descale="scalar", auto=True),
    "gpu-d512-decode-vs-extend-16k": dict(L=16384, n=16, page=16, hq=32, hkv=4, d=512, q="bf16"),
    # Gemma-4 image prefill (SGLang 0.5.22+'s image rows): two 256-token images behind a 512-token
    # prefix at d512, and on a sliding d256 layer with its window (1023, 0)
    "gpu-d512-31b-image-prefill-2k": dict(lens=[2560], new=[2048], page=16, hq=32, hkv=4, d=512, q="bf16",
                                          descale="none", auto=True, images=[[0, 600, 855], [0, 1200, 1455]]),
    "gpu-d256-swa-image-prefill-2k": dict(lens=[2048], new=[2048], page=16, hq=32, hkv=16, d=256,
                                          window=(1023, 0), descale="one", auto=True,
                                          images=[[0, 100, 355], [0, 1500, 1755]]),
}


def passed(r: dict) -> bool:
    """The thresholds tests/test_fp8_paged_decode.py asserts."""
    return ("error" not in r and r["finite"] and r["rel_err"] < 5e-3 and r["max_excess"] <= 0
            and r.get("lse_err", 0.0) < 1e-4 and r.get("decode_rel_err", 0.0) < 5e-3)


def run_interpreted(cases: dict, timeout: int = 600) -> dict:
    """``cases`` run by this script in a child process under Triton's CPU interpreter (Triton must
    see TRITON_INTERPRET before it is imported): {case name: result}."""
    import os
    import subprocess
    from pathlib import Path

    here = Path(__file__).resolve()
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(here.parents[1])}
    p = subprocess.run([sys.executable, str(here)], input=json.dumps(cases), env=env, capture_output=True,
                       text=True, timeout=timeout)
    lines = [line for line in p.stdout.splitlines() if line.startswith("RESULTS ")]
    if p.returncode != 0 or not lines:
        raise AssertionError(p.stderr[-3000:])
    return json.loads(lines[-1][len("RESULTS "):])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--matrix", choices=["stdin", "ci", "gpu", "d512"], default="stdin",
                    help="stdin: cases as JSON on stdin; ci: the CPU test's matrix; gpu: ci + GPU_CASES (32k / 128k); "
                         "d512: tests/test_fp8_paged_d512.py's cases + GPU_D512_CASES")
    ap.add_argument("--only", nargs="+", default=None, metavar="SUBSTRING",
                    help="run only the cases whose name contains one of these")
    ap.add_argument("--launch", type=json.loads, default=None, metavar="JSON",
                    help='launch-plan overrides for every case (e.g. \'{"block_n": 32}\': a launch candidate to check), '
                         'or per head dim as bench decode --candidate takes them (\'{"256": {...}}\': cases at other '
                         'head dims keep their launch)')
    ap.add_argument("--out", default=None, help="also write the results (JSON) here")
    ap.add_argument("--check", action="store_true", help="exit 1 unless every case passes the test's thresholds")
    args = ap.parse_args()
    if args.matrix == "stdin":
        cases = json.load(sys.stdin)
    elif args.matrix == "d512":
        from test_fp8_paged_d512 import CASES

        cases = {**CASES, **GPU_D512_CASES}
    else:
        from test_fp8_paged_decode import CASES

        cases = {**CASES, **(GPU_CASES if args.matrix == "gpu" else {})}
    if args.only:
        cases = {n: c for n, c in cases.items() if any(part in n for part in args.only)}
    if args.launch:
        from sglang_fa4.bench.decode import candidate_launch

        cases = {n: {**c, "launch": {**c.get("launch", {}), **candidate_launch(args.launch, c["d"])}}
                 for n, c in cases.items()}
    results = {}
    for name, c in cases.items():
        try:
            run = run_decode_vs_extend if "L" in c else run_case
            t0 = time.perf_counter()
            results[name] = run(c, args.device)
            results[name]["seconds"] = round(time.perf_counter() - t0, 2)
        except Exception as exc:  # reported per case
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
    print("RESULTS " + json.dumps(results))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"command": " ".join(shlex.quote(a) for a in ["python3", *sys.argv]),
                       "device": args.device, "matrix": args.matrix, "cases": cases, "results": results,
                       "passed": {n: passed(r) for n, r in results.items()}}, f, indent=1)
    if args.check:
        failed = [n for n, r in results.items() if not passed(r)]
        print(f"{len(results) - len(failed)} of {len(results)} cases pass" + (f"; FAILED: {failed}" if failed else ""))
        sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
