"""The paged FP8 decode kernel's launch plan: row and key blocks, and how many pieces it splits
each sequence's keys into (split-KV).

Decode reads every cached K/V byte once and does little arithmetic on it: the kernel is
bandwidth-bound, and a GPU only reaches its HBM bandwidth with enough CTAs in flight on every SM.
One CTA per (query-row block, sequence, kv head) gives batch x kv_heads CTAs -- 4 at batch 1 with 4
kv heads, on a GPU of 132 SMs.  Splitting each sequence's keys into ``n`` ranges, each its own CTA
(partial outputs combined by their log-sum-exp afterwards), multiplies that by ``n``.

:func:`choose_splits` is a pure function of host facts (batch, kv heads, row blocks, the context
bound the page table allows, the SM count), so the grid of a captured CUDA graph is fixed per
captured batch size.  It fills one wave of the CTAs an SM holds at once (:func:`programs_per_sm`),
never a second: on an H100 (``benchmark/results/h100/decode_tune-splits-call4.json.gz``,
``decode_tune-splits-gemma.json.gz``) the count that just overflowed one wave took 1.11-1.20x the
time of the largest that fit (batch 8 x 8k: 9 splits against 8; batch 32 x 8k: 3 against 2; d256
batch 1 x 32k: 64 against 32). :data:`MAX_SPLITS` bounds the scratch buffers.
"""

from __future__ import annotations

from typing import Optional

#: CTAs of the decode program an SM holds at once, by its registers (ptxas, sm_90a): 128 a thread
#: at d <= 128 (4 warps, capped: 4 CTAs), up to 255 above (2 CTAs; 3 in the split regime's launch,
#: capped at 168: SPLIT_REGIME_LAUNCH)
PROGRAMS_PER_SM = 4
PROGRAMS_PER_SM_WIDE = 2
#: a split gets at least this many keys: below it the partial's write-back and the combine cost
#: more than the parallelism gains
MIN_KEYS_PER_SPLIT = 256
#: most splits per sequence (the partial outputs are splits x rows x heads x head_dim fp32)
MAX_SPLITS = 64
#: query rows (token x group head) per program: at least 16 (tl.dot), at most this
MAX_BLOCK_M = 64
#: ... and at most this above head dim 256: the fp32 accumulator is rows x 512
MAX_BLOCK_M_WIDE = 32


def choose_splits(batch: int, kv_heads: int, row_blocks: int, max_context: int, sm_count: int, *,
                  programs_per_sm: int = PROGRAMS_PER_SM, min_keys_per_split: int = MIN_KEYS_PER_SPLIT,
                  max_splits: int = MAX_SPLITS) -> int:
    """Splits per sequence: the most that keep ``batch * kv_heads * row_blocks * splits`` within one
    wave of ``programs_per_sm * sm_count`` CTAs (a CTA past it starts a second wave that the others
    wait for), no split shorter than ``min_keys_per_split`` keys of ``max_context`` (the longest
    context the call can have: page-table width x page size), at most ``max_splits``; 1 when the
    batch alone fills a wave or the context is short."""
    for name, value in (("batch", batch), ("kv_heads", kv_heads), ("row_blocks", row_blocks),
                        ("max_context", max_context)):
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    for name, value in (("sm_count", sm_count), ("programs_per_sm", programs_per_sm),
                        ("min_keys_per_split", min_keys_per_split), ("max_splits", max_splits)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    base = batch * kv_heads * row_blocks
    if base == 0 or max_context == 0:
        return 1
    one_wave = programs_per_sm * sm_count // base
    by_context = max(1, max_context // min_keys_per_split)
    return max(1, min(one_wave, by_context, max_splits))


#: the wave-filling rule's slack: the fewest splits whose wave use is within this of the best count's
FILL_SLACK = 0.05


def wave_use(ctas: int, wave: int) -> float:
    """The share of the CTA slots ``ctas`` CTAs use over the whole waves of ``wave`` slots they take."""
    return ctas / (-(-ctas // wave) * wave)


def choose_splits_filling_waves(batch: int, kv_heads: int, row_blocks: int, max_context: int, sm_count: int, *,
                                programs_per_sm: int, min_keys_per_split: int = MIN_KEYS_PER_SPLIT,
                                max_splits: int = MAX_SPLITS) -> int:
    """Splits per sequence that fill whole waves: :func:`choose_splits`' count where the batch leaves
    room for two splits in one wave; past that, the fewest splits whose CTAs use the waves they
    start within :data:`FILL_SLACK` of the best count's use (the one-wave rule keeps 1 there,
    however little of its waves the batch fills: 512 CTAs on a wave of 396 use 65% of two).
    Same bounds as :func:`choose_splits` (context, ``max_splits``); a candidate
    (launch ``fill_waves``)."""
    one_wave = choose_splits(batch, kv_heads, row_blocks, max_context, sm_count, programs_per_sm=programs_per_sm,
                             min_keys_per_split=min_keys_per_split, max_splits=max_splits)
    base = batch * kv_heads * row_blocks
    if one_wave > 1 or base == 0 or max_context == 0:  # splits that fit one wave: the more the better
        return one_wave
    wave = programs_per_sm * sm_count
    top = max(1, min(max_context // min_keys_per_split, max_splits))
    use = {s: wave_use(base * s, wave) for s in range(1, top + 1)}
    best = max(use.values())
    return min(s for s, u in use.items() if u >= best - FILL_SLACK)


def programs_per_sm(head_dim: int) -> int:
    """CTAs of the decode program an SM holds at once (:data:`PROGRAMS_PER_SM`)."""
    return PROGRAMS_PER_SM if head_dim <= 128 else PROGRAMS_PER_SM_WIDE


def block_n(head_dim: int, block_m_: int = 16) -> int:
    """Keys per loop step: 64 (32 took 0.98-1.22x its time on an H100, d128 and d256:
    benchmark/results/h100/decode_tune_summary.md, as the other measured choices here). Over head
    dim 256: 32 for a 16-row (decode) program, 16 for wider (prefill) row blocks.

    d512 on the H100 (decode_tune-kernel-gemma.json.gz, Gemma-4 31B's 32/4 heads): 32 keys with 4
    warps took 0.48-0.55x the time of 16 keys with 8 warps at batch 1, 8 and 64. Registers a thread
    (ptxas for sm_90a through ``benchmark/lab/decode_regs.py``): 16 rows x 32 keys, 4 warps: 255,
    no stack with several splits, 64-104 bytes with one; 32 rows x 16 keys, 8 warps: 174 (E4M3 q)
    or 180 (bf16 q), no spill; 32 x 32: 246-248; 64 x 16: 255 with 824 bytes of stack."""
    if head_dim <= 256:
        return 64
    return 32 if block_m_ <= 16 else 16


def pow2_at_least(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def max_block_m(head_dim: int) -> int:
    """The most query rows a program takes at ``head_dim``."""
    return MAX_BLOCK_M if head_dim <= 256 else MAX_BLOCK_M_WIDE


def block_m(rows: int, head_dim: int = 0) -> int:
    """Query rows per program for ``rows`` = max new tokens x group size."""
    return min(max_block_m(head_dim), max(16, pow2_at_least(rows)))


def num_warps(block_m_: int, head_dim: int) -> int:
    """Warps per program: 4 for 16 rows (decode) at every head dim and up to 16 rows x 256 in all,
    8 above (extend row blocks at large head dims). 8 warps took 1.15-1.25x the time of 4 on the
    d256 decode program, 1.8-2.1x at d512 (with 32 keys a step)."""
    return 4 if block_m_ <= 16 or block_m_ * pow2_at_least(head_dim) <= 16 * 256 else 8


def maxnreg(head_dim: int, warps: int) -> Optional[int]:
    """The register cap a thread gets: 128 for the 4-warp d <= 128 program, which ptxas otherwise
    gives 190 registers (2 CTAs an SM; capped, 4 CTAs, no spill; uncapped took 0.94-1.24x the
    time); None (the compiler's choice) elsewhere."""
    return 128 if head_dim <= 128 and warps == 4 else None


#: software-pipelining depth of the key loop (Triton's num_stages): the K/V tiles in flight
NUM_STAGES = 3


#: the largest head dim whose key loop loads each block's page indices one block ahead rather than
#: inside the block. Inside, Triton 3.6-3.8's pipeliner keeps a single K/V buffer and waits for every
#: copy at each step; ahead, it double-buffers K and V (results/cpu/decode_pipeline-triton*.md). On an
#: H100 ahead took 0.87-1.01x the time at d128 (median of the interleaved rounds' ratios, 42 cases:
#: batch 1 0.87-1.01x, of Qwen's 4 kv heads 0.87-0.90x; Llama's batch 64-128 0.93-0.95x; the rest
#: 0.99-1.01x) and
#: 1.03-1.28x at d256 and d512, where the second buffer's shared memory costs a CTA an SM
#: (results/h100/decode_tune-candidate.json.gz, decode_tune-custom.json.gz, decode-best-{1,2}.md).
PREFETCH_PAGES_MAX_HEAD_DIM = 128


def prefetch_pages(head_dim: int) -> bool:
    """Whether the key loop loads the page indices a key block ahead (:data:`PREFETCH_PAGES_MAX_HEAD_DIM`)."""
    return head_dim <= PREFETCH_PAGES_MAX_HEAD_DIM


#: the decode program's launch above head dim 128 while a batch does not fill the GPU by itself
#: (:func:`in_split_regime`): the head dim in two column pieces (each its own pair of products, half
#: a K/V tile live at once) under a 168-register cap, 3 CTAs an SM instead of 2, and the one-wave
#: split rule told so. Two pieces spill 24 stack bytes at d256 under that cap where one piece spills
#: 312 (ptxas sm_90a, results/cpu/decode_pieces-triton*.md). On an H100 it took 0.84-0.98x the
#: default's time in each of the 16 such cases measured (d256 batch 1-16, Gemma-4's sliding shape
#: batch 1-8, its d512 layers batch 1-8; results/h100/decode-best-1.md, decode_tune-candidate.json.gz,
#: decode_tune-custom.json.gz); in the 11 where the batch fills a wave by itself 0.87-1.09x, so the
#: default stays there.
SPLIT_REGIME_LAUNCH = {"d_pieces": 2, "maxnreg": 168, "programs_per_sm": 3}
#: the launch of the same program once the batch fills the GPU: the whole head dim, no cap (ptxas
#: gives 255 registers, 2 CTAs an SM); what :func:`launch_variants` warms beside the split regime's
FILLED_LAUNCH = {"d_pieces": 1, "maxnreg": None}
#: the launch change under evaluation: ``bench decode``'s ``fa4_fp8_split_kv_candidate`` and
#: ``decode_tune.py --sweep candidate`` time it beside the default: the split regime's launch at
#: every batch with splits that fill whole waves (:func:`choose_splits_filling_waves`). Where the
#: batch fills the GPU the split regime's launch took 0.87-1.09x of the default's time with one
#: split, and its losses were where its wave of 3 CTAs an SM was filled least (d256 batch 64: 512
#: CTAs, 65% of two waves); with 3 splits there they fill 97% of four.
CANDIDATE = {**SPLIT_REGIME_LAUNCH, "fill_waves": True}


def _has_split_regime(head_dim: int, block_m_: int) -> bool:
    """A decode program (16 rows) above head dim 128: the one that takes SPLIT_REGIME_LAUNCH or
    FILLED_LAUNCH by the batch."""
    return head_dim > 128 and block_m_ == 16


def in_split_regime(batch: int, hkv: int, row_blocks: int, max_context: int, sms: int, head_dim: int,
                    block_m_: int, min_keys_per_split: int = MIN_KEYS_PER_SPLIT) -> bool:
    """Whether a decode program (16 rows) above head dim 128 takes :data:`SPLIT_REGIME_LAUNCH`: the
    one-wave rule at its 3 CTAs an SM splits the keys (the batch's CTAs alone fill less than half
    that wave, and the context allows two splits). Host facts only, as :func:`choose_splits`: a
    captured graph's launch is fixed per batch size."""
    return _has_split_regime(head_dim, block_m_) and choose_splits(
        batch, hkv, row_blocks, max_context, sms, programs_per_sm=SPLIT_REGIME_LAUNCH["programs_per_sm"],
        min_keys_per_split=min_keys_per_split) > 1


def launch_variants(head_dim: int, block_m_: int) -> tuple:
    """The launch overrides that give every compiled variant the plan itself may choose at
    ``head_dim`` and row block ``block_m_`` (the warmup resolves each): the split regime's and the
    filled GPU's for a decode program above head dim 128, the one default elsewhere."""
    if _has_split_regime(head_dim, block_m_):
        return (dict(SPLIT_REGIME_LAUNCH), dict(FILLED_LAUNCH))
    return ({},)


class DecodePlan(tuple):
    """(block_m, row_blocks, block_n, num_splits, num_warps, num_stages, min_chunk, maxnreg,
    prefetch_pages, d_pieces): the launch's host facts (tests read them)."""

    __slots__ = ()

    def __new__(cls, block_m, row_blocks, block_n, num_splits, num_warps=4, num_stages=NUM_STAGES,
                min_chunk=MIN_KEYS_PER_SPLIT, maxnreg=None, prefetch_pages=False, d_pieces=1):
        return super().__new__(cls, (block_m, row_blocks, block_n, num_splits, num_warps, num_stages, min_chunk,
                                     maxnreg, bool(prefetch_pages), d_pieces))

    block_m = property(lambda s: s[0])
    row_blocks = property(lambda s: s[1])
    block_n = property(lambda s: s[2])
    num_splits = property(lambda s: s[3])
    num_warps = property(lambda s: s[4])
    num_stages = property(lambda s: s[5])
    #: keys a split takes at least, applied on the device to the real context: a page table wider
    #: than the batch's contexts (SGLang's decode graphs) leaves the surplus splits empty, not thin
    min_chunk = property(lambda s: s[6])
    #: a register cap per thread (Triton's maxnreg; None: the compiler's choice): the CTAs an SM
    #: holds at once are bounded by registers, and decode needs many in flight
    maxnreg = property(lambda s: s[7])
    #: page indices loaded a key block ahead (:func:`prefetch_pages`)
    prefetch_pages = property(lambda s: s[8])
    #: column pieces of the head dim, 1 or 2 (:data:`SPLIT_REGIME_LAUNCH`)
    d_pieces = property(lambda s: s[9])


def _need(cond: bool, msg: str) -> None:
    """gather._need (a PagedKVError), imported only when it raises: this module stays free of torch."""
    if not cond:
        from sglang_fa4.kernels.fp8_paged_kv.gather import PagedKVError

        raise PagedKVError(msg)


#: what ``plan``'s ``launch`` may override
LAUNCH_KEYS = frozenset({"block_m", "block_n", "num_warps", "num_stages", "min_chunk", "programs_per_sm", "maxnreg",
                         "prefetch_pages", "d_pieces", "fill_waves"})


def plan(batch: int, hkv: int, group: int, head_dim: int, max_seqlen_q: int, max_context: int, sms: int,
         num_splits: Optional[int] = None, *, launch: Optional[dict] = None) -> DecodePlan:
    """The grid's host facts for one call (``num_splits`` forces a split count, tests/bench;
    ``launch`` overrides block_m / block_n / num_warps / num_stages / min_chunk / programs_per_sm /
    maxnreg / prefetch_pages / d_pieces / fill_waves, for the tuning sweep and the warmup: over the split
    regime's launch where :func:`in_split_regime`, over the defaults elsewhere)."""
    launch = launch or {}
    unknown = sorted(set(launch) - LAUNCH_KEYS)
    _need(not unknown, f"launch overrides {unknown} are not among {sorted(LAUNCH_KEYS)}")
    rows = max_seqlen_q * group
    bm = launch.get("block_m", block_m(rows, head_dim))
    _need(isinstance(bm, int) and bm >= 16 and bm & (bm - 1) == 0,
          f"launch block_m must be a power of two >= 16, got {bm!r}")
    row_blocks = max(1, -(-rows // bm))
    min_chunk = launch.get("min_chunk", MIN_KEYS_PER_SPLIT)
    if in_split_regime(batch, hkv, row_blocks, max_context, sms, head_dim, bm, min_chunk):
        launch = {**SPLIT_REGIME_LAUNCH, **launch}
    fill = launch.get("fill_waves", False)
    _need(isinstance(fill, bool), f"launch fill_waves must be true or false, got {fill!r}")
    if num_splits is None:
        rule = choose_splits_filling_waves if fill else choose_splits
        num_splits = rule(batch, hkv, row_blocks, max_context, sms,
                          programs_per_sm=launch.get("programs_per_sm", programs_per_sm(head_dim)),
                          min_keys_per_split=min_chunk)
    _need(isinstance(num_splits, int) and 1 <= num_splits <= MAX_SPLITS,
          f"num_splits must be an int in 1..{MAX_SPLITS}, got {num_splits!r}")
    pieces = launch.get("d_pieces", 1)
    _need(pieces in (1, 2) and not isinstance(pieces, bool), f"launch d_pieces must be 1 or 2, got {pieces!r}")
    bn = launch.get("block_n", block_n(head_dim, bm))
    warps = launch.get("num_warps", num_warps(bm, head_dim))
    return DecodePlan(bm, row_blocks, bn, num_splits, warps, launch.get("num_stages", NUM_STAGES), min_chunk,
                      launch.get("maxnreg", maxnreg(head_dim, warps)) or None,
                      launch.get("prefetch_pages", prefetch_pages(head_dim)), pieces)
