"""SGLang's own ``fa3`` attention backend on the GPU machine, running FA3 built from source.

SGLang's FlashAttentionBackend with ``fa_impl_ver=3`` (``ATTENTION_BACKENDS["fa3"]``, SGLang's
Hopper default with ``--kv-cache-dtype fp8_e4m3``) reaches FA3 through one loader,
``sglang.kernels.ops.attention.flash_attention_v3._load_fa3_kernels`` (sgl-kernel's FA3 or the
kernels-community build; neither can be on the machine). :func:`install` makes that loader return
the source build's paged FP8 call under sgl-kernel's signature
(``sglang_fa4.bench.fa3.sgl_kernel_kvcache``, which refuses what the build lacks), so everything
else -- q cast to E4M3, the pool's scales as descales, the page table, the call's arguments -- is
SGLang's. :func:`prepare` turns off the backend's FA3 scheduler-metadata precompute (sgl-kernel's
``get_scheduler_metadata`` is not in the build; SGLang passes no metadata where it is disabled).

Benchmark code (SGLang private names are used here, not in the package).
"""

from __future__ import annotations

CALLS: list = []  # one entry per FA3 call made through the seam (proves the column ran FA3)


def install(impl=None):
    """Route SGLang's FA3 loader to the source build (or ``impl``, of ``fa3.paged_fp8``'s signature:
    a torch model on a CPU). Returns None, or why the FA3 column cannot run here."""
    from sglang_fa4.bench import fa3

    if impl is None:
        try:
            fa3.load()
        except fa3.Fa3Unavailable as exc:
            return f"FA3-FP8 not measured: {exc}"
    try:
        import sglang.kernels.ops.attention.flash_attention_v3 as v3
    except ImportError as exc:
        return f"FA3-FP8 not measured: this SGLang has no flash_attention_v3 module ({exc})"
    if not hasattr(v3, "_load_fa3_kernels"):
        return "FA3-FP8 not measured: this SGLang's flash_attention_v3 has no _load_fa3_kernels (the seam used)"
    call = fa3.sgl_kernel_kvcache(impl)

    def counted(*args, **kwargs):
        CALLS.append(1)
        return call(*args, **kwargs)

    def varlen(*args, **kwargs):
        raise fa3.Fa3Unavailable("the FA3 build has no flash_attn_varlen_func for SGLang's fa3 backend")

    kernels = {"flash_attn_with_kvcache": counted, "flash_attn_varlen_func": varlen}
    v3._load_fa3_kernels = lambda: kernels
    if impl is not None:  # a CPU stands in for the H200
        v3._is_fa3_supported = lambda device=None: True
    return None


def prepare(backend) -> None:
    """A built fa3 FlashAttentionBackend: no FA3 scheduler-metadata precompute."""
    backend._get_scheduler_metadata = None
