"""Gemma-4's attention backend through a REAL SGLang release's server-args resolution
(``ServerArgs.resolve_once`` on a model directory, the platform faked with SGLang's
``override_platform``), the plugin loaded by SGLang's loader: for tests/test_gemma4_selection.py.
Params: ``models`` (name -> config.json), ``cases`` (model, platform, server args), ``root`` (where
the model directories go), ``caps`` (None: today's route; else the RouteCaps fields to pretend)."""

from emit import emit, params

import dataclasses, logging, warnings; warnings.simplefilter("ignore")
from server_args_kit import PLATFORMS, write_model_dirs
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.server_args import ServerArgs
from sglang.srt.arg_groups.overrides import resolved_view
from sglang.srt.runtime_context import override_platform
from sglang_fa4 import gemma4_selection
_PARAMS = params()
MODELS, CASES, ROOT, CAPS = _PARAMS["models"], _PARAMS["cases"], _PARAMS["root"], _PARAMS.get("caps")
if CAPS is not None:   # what the route will run once the kernels grow (e.g. head dim 512)
    gemma4_selection.route_caps = lambda: gemma4_selection.RouteCaps(
        tuple(CAPS["head_dims"]), tuple(CAPS["bf16_query_head_dims"]), bool(CAPS["image_prefill_masks"]))
write_model_dirs(MODELS, ROOT)
lines = []
class _Keep(logging.Handler):
    def emit(self, record):
        if record.getMessage().startswith("sglang-fa4: Gemma-4"):
            lines.append(record.getMessage())
logging.getLogger("sglang_fa4").addHandler(_Keep())
logging.getLogger("sglang_fa4").setLevel(logging.INFO)
from sglang_fa4.integration import gemma4_fp8_kv
out = []
for case in CASES:
    gemma4_fp8_kv._logged.clear(); lines.clear()
    with override_platform(is_cuda=True, **PLATFORMS[case["platform"]]):
        sa = ServerArgs(model_path=f"{ROOT}/{case['model']}", device="cuda", **case["args"])
        try:
            sa.resolve_once()
        except Exception as e:   # SGLang's own refusal (0.5.20/0.5.21: no fa4 for Gemma-4)
            out.append({"error": f"{type(e).__name__}: {e}", "log": list(lines)})
            continue
        v = resolved_view(sa)
        from sglang.srt.arg_groups.model_override_base import model_config_of
        facts = gemma4_selection.facts_from_config(model_config_of(sa).hf_config)
        out.append({"facts": dataclasses.asdict(facts) if facts else None, "backend": v.attention_backend, "prefill": v.prefill_attention_backend,
                    "decode": v.decode_attention_backend, "log": list(lines)})
emit(out)
