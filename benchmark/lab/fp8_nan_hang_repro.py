"""Which inputs hung the SM90 FP8 forward (git show 244b9bd:benchmark/results/h200/fp8_nan_hang.md): 1x8192 causal, 16/4 heads,
three calls, the given tiles (n96: the d=256 causal default, layout.D256_CAUSAL_DEFAULT_SWITCHES;
n128: 128-key tiles) and input case.  Run each case in its own process under a deadline:

    for c in "n128 satcast" "n96 big" "n96 satcast" "n96 vnan" "n96 knan" "n96 qnan"; do
        timeout 25 python3 benchmark/lab/fp8_nan_hang_repro.py $c; echo "$c rc=$?"; done

The CI-side guard is tests/test_fp8_gpu.py::test_nan_inputs_finish (GPU) and the PTX check of the
branch in tests/test_fp8_xcompile.py."""
import sys
import time

import torch

from sglang_fa4.kernels.fp8_sm90 import forward, launch

tiles, case = sys.argv[1], sys.argv[2]  # n96|n128, big|satcast|knan|vnan|qnan|krow
d = int(sys.argv[3]) if len(sys.argv) > 3 else 256
if tiles == "n128":
    forward.D256_CAUSAL_DEFAULT_SWITCHES = frozenset()
F8 = torch.float8_e4m3fn
g = torch.Generator(device="cuda").manual_seed(0)


def rnd(*shape, sigma=2.0):
    return (torch.randn(*shape, device="cuda", generator=g) * sigma).to(F8)


n = 8192
q, k, v = rnd(n, 16, d), rnd(n, 4, d), rnd(n, 4, d)
nan = torch.full((1,), float("nan"), device="cuda").to(F8)
if case == "knan":
    k[:] = nan
elif case == "vnan":
    v[:] = nan
elif case == "qnan":
    q[:] = nan
elif case == "krow":
    k[100] = nan
elif case == "big":
    for t in (q, k, v):
        t[:] = torch.full((1,), 448.0, device="cuda").to(F8)
elif case == "satcast":  # what SGLang's pool held after a bf16 -> E4M3 cast of values past 448
    k, v = rnd(n, 4, d, sigma=2500.0), rnd(n, 4, d, sigma=2500.0)
print(tiles, case, d, "k bytes 0x7f/0xff:", int(((k.view(torch.uint8) & 0x7F) == 0x7F).sum()), flush=True)
cu = torch.tensor([0, n], dtype=torch.int32, device="cuda")
t0 = time.time()
for _ in range(3):
    o = launch.fp8_varlen_attention(q, k, v, cu, cu, n, n, causal=True)
    torch.cuda.synchronize()
print(tiles, case, d, "OK", f"{time.time() - t0:.1f}s", "finite frac", float(torch.isfinite(o.float()).float().mean()),
      flush=True)
