"""The FP8 KV upgrade rules through a REAL SGLang release's server-args resolution
(``ServerArgs.resolve_once`` on a model directory, the platform faked with SGLang's
``override_platform``), the plugin loaded by SGLang's loader: for tests/test_llm_fp8_kv_selection.py.
Params: ``models`` (name -> config.json), ``cases`` (model, platform, server args), ``root`` (where
the model directories go)."""

from emit import emit, params

import warnings; warnings.simplefilter("ignore")
from server_args_kit import PLATFORMS, write_model_dirs
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.server_args import ServerArgs
from sglang.srt.arg_groups.overrides import resolved_view
from sglang.srt.runtime_context import override_platform
_PARAMS = params()
MODELS, CASES, ROOT = _PARAMS["models"], _PARAMS["cases"], _PARAMS["root"]
write_model_dirs(MODELS, ROOT)
out = []
for case in CASES:
    with override_platform(is_cuda=True, **PLATFORMS[case["platform"]]):
        sa = ServerArgs(model_path=f"{ROOT}/{case['model']}", device="cuda", **case["args"])
        sa.resolve_once()
        v = resolved_view(sa)
        out.append({"backend": v.attention_backend, "page_size": v.page_size})
emit(out)
