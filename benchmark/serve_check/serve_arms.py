"""The arms of the LLM serving comparison (benchmark/release/serve_llm.py): per model, which servers
run side by side on the one GPU, each one's launch_server arguments and environment, and the
attention backend each must end up on (the harness reads it back from SGLang's resolution on the
CPU and from the server's log on the GPU).

Every arm of a model gets the same arguments but for what the arm is about: the KV cache dtype
(``--kv-cache-dtype``) and the plugin's switch ``SGLANG_FA4_FP8_KV_UPGRADE``. No arm names an
attention backend: SGLang's own default (Gemma-4: ``triton`` on Hopper; Llama: ``fa3``) is what the
upgrade replaces, so giving one would turn the rule off.
"""

from __future__ import annotations

from dataclasses import dataclass, field

UPGRADE = "SGLANG_FA4_FP8_KV_UPGRADE"


@dataclass(frozen=True)
class Arm:
    name: str
    kv_cache_dtype: str  # "fp8_e4m3" or "auto" (the model's bf16)
    upgrade: bool  # SGLANG_FA4_FP8_KV_UPGRADE
    backend: str  # the attention backend the server must resolve to
    what: str


@dataclass(frozen=True)
class ModelPlan:
    model: str
    arms: tuple[Arm, ...]
    baseline: str  # the arm every ratio is taken against
    extra_args: tuple[str, ...] = field(default=())


PLANS = {
    "gemma4_31b": ModelPlan(
        "gemma4_31b",
        (Arm("triton", "fp8_e4m3", False, "triton", "SGLang's Gemma-4 default on Hopper, FP8 KV cache"),
         Arm("fa4", "fp8_e4m3", True, "fa4", "the plugin's FP8 KV route on every layer (triton -> fa4)"),
         Arm("triton_bf16", "auto", False, "triton", "SGLang's default on a bf16 KV cache (reference point)")),
        # SGLang 0.5.23 refuses --language-model-only for Gemma-4 (a CPU dry run found it): the
        # checkpoint declares language_model_only itself (llm_checkpoints.py), so no processor is loaded
        baseline="triton"),
    "llama3_8b": ModelPlan(
        "llama3_8b",
        (Arm("fa3", "fp8_e4m3", False, "fa3", "SGLang's Hopper default, FA3 with split-KV (fa3_seam)"),
         Arm("fa4", "fp8_e4m3", True, "fa4", "the upgrade (fa3 -> fa4, sglang-fa4's FP8 KV route)")),
        baseline="fa3"),
}


def parse_arms(model: str, names: str | None) -> tuple[Arm, ...]:
    """``names`` (comma-separated; None: all) of ``model``'s arms, baseline first."""
    plan = PLANS.get(model)
    if plan is None:
        raise ValueError(f"unknown model {model!r}; known: {sorted(PLANS)}")
    by_name = {a.name: a for a in plan.arms}
    wanted = [n.strip() for n in names.split(",") if n.strip()] if names else [a.name for a in plan.arms]
    bad = [n for n in wanted if n not in by_name]
    if bad:
        raise ValueError(f"{model}: unknown arm(s) {bad}; known: {sorted(by_name)}")
    if plan.baseline not in wanted:
        raise ValueError(f"{model}: the arms must include the baseline {plan.baseline!r} (ratios are taken against it)")
    if len(set(wanted)) != len(wanted):
        raise ValueError(f"{model}: an arm is named twice in {names!r}")
    return tuple(sorted((by_name[n] for n in wanted), key=lambda a: a.name != plan.baseline))


#: arms that are reference points, not compared arms: left out first when the servers would not fit
REFERENCE_ARMS = frozenset({"triton_bf16"})

#: what a server takes beyond its weights and KV pools (CUDA context, activations, decode graphs), GiB
SERVER_OVERHEAD_GIB = 3.0


def arms_that_fit(arms: tuple, need_gib: dict, gpu_gib: float, share: float = 0.9) -> tuple[tuple, list[str]]:
    """``arms`` less reference arms (last first) until every server's weights + KV + overhead fit
    ``share`` of the GPU; the compared arms are never dropped (then it refuses). Returns the arms and
    one note per arm left out."""
    kept, notes = list(arms), []

    def total():
        return sum(need_gib[a.name] + SERVER_OVERHEAD_GIB for a in kept)

    while (need := total()) > share * gpu_gib:
        refs = [a for a in kept if a.name in REFERENCE_ARMS]
        if not refs:
            raise ValueError(f"the arms {[a.name for a in kept]} need ~{need:.1f} GiB together, over "
                             f"{share:.0%} of the GPU's {gpu_gib:.0f} GiB: use fewer --layers or --arms")
        kept.remove(refs[-1])
        notes.append(f"arm {refs[-1].name} left out: the servers together would need ~{need:.1f} GiB "
                     f"of the GPU's {gpu_gib:.0f} GiB (run it with --arms on a larger card)")
    return tuple(kept), notes


@dataclass(frozen=True)
class ServerOpts:
    """What every server of a comparison shares (so the KV pools are the same size in tokens)."""

    max_total_tokens: int
    mem_fraction_static: float
    swa_full_tokens_ratio: float
    max_running_requests: int
    chunked_prefill_size: int
    cuda_graph_max_bs: int


def server_args(model: str, arm: Arm, model_dir: str, port: int, opts: ServerOpts) -> list[str]:
    """launch_server's arguments for ``arm`` (decode CUDA graphs on: SGLang's default)."""
    plan = PLANS[model]
    args = ["--model-path", model_dir, "--load-format", "dummy", "--kv-cache-dtype", arm.kv_cache_dtype,
            "--host", "127.0.0.1", "--port", str(port),
            "--mem-fraction-static", str(opts.mem_fraction_static),
            "--max-total-tokens", str(opts.max_total_tokens),
            "--max-running-requests", str(opts.max_running_requests),
            "--chunked-prefill-size", str(opts.chunked_prefill_size),
            "--cuda-graph-max-bs-decode", str(opts.cuda_graph_max_bs),
            # the same prompts go to every arm three times: no prefix reuse between rounds
            "--disable-radix-cache",
            # SGLang 0.5.23 also captures prefill graphs (58 "breakable" shapes): 48.6 GB at capture on
            # the first H100 run, so a second server could not load. Decode graphs, what the issues
            # measure, stay on
            "--disable-prefill-cuda-graph",
            # the CUDA-only stand-ins have no sampling kernels
            "--sampling-backend", "pytorch",
            "--random-seed", "0", "--log-level", "info", *plan.extra_args]
    if plan.model == "gemma4_31b":
        args += ["--swa-full-tokens-ratio", str(opts.swa_full_tokens_ratio)]
    return args


#: the environment every server gets (the arm adds only UPGRADE)
BASE_ENV = {
    "PYTHONUNBUFFERED": "1",
    "SGLANG_FA4_JIT_MONITOR": "raise",
    # the flashinfer stand-in must not make SGLang pick flashinfer paths
    "SGLANG_IS_FLASHINFER_AVAILABLE": "false",
    # sgl-kernel is a stand-in (no dist-info): SGLang's own switch for its version check
    "SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK": "1",
    # the harness's plugin (llm_plugin.py): route SGLang's FA3 loader to the source build, in every arm
    "SERVE_LLM_FA3_SEAM": "1",
}


def server_env(arm: Arm) -> dict[str, str]:
    """The variables an arm's server gets on top of the inherited environment."""
    return {**BASE_ENV, UPGRADE: "1" if arm.upgrade else "0"}
