"""Every case of tests/test_plugin_real_loader.py through a REAL SGLang release's plugin loader, in one
interpreter (the loader's once-per-process guard, the hook registry and the plugin's state reset
between cases). Params: ``cases`` (name -> [environment, feature whose registrar raises, the
Qwen2.5-VL forward hook's target instead]), ``owner_values``
(raw values of SGLANG_VIT_ENABLE_CUDA_GRAPH to read beside SGLang)."""

from emit import emit, params

_PARAMS = params()
CASES, OWNER_VALUES = _PARAMS["cases"], _PARAMS["owner_values"]
import logging, os, warnings
warnings.simplefilter("ignore")
from benchmark.sglang_on_gpu import cuda_only_stubs; cuda_only_stubs.install_missing()  # sgl_kernel / flashinfer: CUDA-only wheels
RECORDS = []
class _Keep(logging.Handler):
    def emit(self, record):
        RECORDS.append((record.levelname, record.getMessage()))
logging.getLogger().addHandler(_Keep())
logging.getLogger().setLevel(logging.INFO)
import sglang.srt.plugins as plugins
from sglang.srt.plugins.hook_registry import HookRegistry
from sglang_fa4 import plugin
from sglang_fa4.environ import envs
from sglang_fa4.integration import hooks, registration

def _broken(registry, hook_type):
    raise ImportError("no such SGLang class")

from sglang.srt.environ import envs as sglang_envs
OWNER_READS = []
for raw in OWNER_VALUES:  # SGLang's own variable: our read beside SGLang's
    os.environ["SGLANG_VIT_ENABLE_CUDA_GRAPH"] = raw
    OWNER_READS.append([raw, envs.SGLANG_VIT_ENABLE_CUDA_GRAPH.get(), sglang_envs.SGLANG_VIT_ENABLE_CUDA_GRAPH.get()])

REAL = dict(registration.REGISTRARS)
QWEN2_5_FORWARD = hooks.QWEN2_5_VIT_FORWARD
OUT = {"owner_reads": OWNER_READS}
for name, (env, broken, retarget) in CASES.items():
    hooks.QWEN2_5_VIT_FORWARD = retarget or QWEN2_5_FORWARD
    plugins._plugins_loaded = False
    HookRegistry.reset()
    plugin._registered_plan = None
    envs.clear_fallbacks()
    registration.REGISTRARS.clear(); registration.REGISTRARS.update(REAL)
    if broken:
        registration.REGISTRARS[broken] = (_broken,)
    for key in ("SGLANG_FA4_PLUGIN_STRICT", "SGLANG_FA4_VIT_GRAPH_MAX_SEGMENTS", "SGLANG_VIT_ENABLE_CUDA_GRAPH",
                "TRITON_INTERPRET", "SGLANG_FA4_WARMUP", "SGLANG_FA4_ENV_ERRORS_REPORTED"):
        os.environ.pop(key, None)
    os.environ.update(env)
    del RECORDS[:]
    refused = None
    try:
        plugins.load_plugins()
    except SystemExit as exc:  # what the interpreter would print, then exit 1
        refused = str(exc.code)
    ours = sorted({t for t, hooks in HookRegistry._hooks.items() for _, _, src in hooks
                   if getattr(src, "plugin_name", None) == "sglang_fa4"})
    plan = plugin._registered_plan
    OUT[name] = {"refused": refused, "targets": ours, "applied": sorted(set(ours) & HookRegistry._patched),
                 "hooked": plan.hooked if plan else None,
                 "errors": [m for level, m in RECORDS if level == "ERROR"],
                 "sglang_failed": [m for level, m in RECORDS if "Failed to execute general plugin" in m],
                 "graph_env": envs.SGLANG_VIT_ENABLE_CUDA_GRAPH.get(), "interpret": envs.TRITON_INTERPRET.get()}
emit(OUT)
