"""The startup warmup's hook point inside a REAL SGLang release (ModelRunner.load_model, its callers'
source, the plugin's AFTER hook through SGLang's HookRegistry), for tests/test_warmup_sglang.py."""

from emit import emit

import inspect, logging, os, pkgutil, sys, types, warnings
warnings.simplefilter("ignore")
os.environ["SGLANG_FA4_KERNEL_CACHE"] = "0"
from sglang_fa4 import plugin
from sglang_fa4.integration import hooks
from sglang_fa4.startup import warmup

target = pkgutil.resolve_name(hooks.MODEL_RUNNER_LOAD_MODEL)
from sglang.srt.model_executor.model_runner import ModelRunner
original_id = id(ModelRunner.load_model)  # an id: HookRegistry rebinds module globals holding it
init_src = inspect.getsource(ModelRunner.initialize)
ctor_src = inspect.getsource(ModelRunner.__init__)

plan = plugin.register()  # the real plugin, through SGLang's real HookRegistry
from sglang.srt.plugins.hook_registry import HookRegistry, HookType
HookRegistry.apply_hooks()
wrapped = id(ModelRunner.load_model) != original_id

# the AFTER-hook contract with SGLang's registry, on a stand-in class (running the real
# load_model needs a GPU and a model)
mod = types.ModuleType("standin_runner")
class StandIn:
    model = "the-model"
    def load_model(self):
        return "loaded"
mod.ModelRunner = StandIn
sys.modules["standin_runner"] = mod
seen = []
warmup.warm_model = lambda model, **kw: seen.append(model)
HookRegistry.register("standin_runner.ModelRunner.load_model", hooks.warm_fa4_after_load_model, HookType.AFTER)
HookRegistry.apply_hooks()
result = StandIn().load_model()

emit({
    "qualname": target.__qualname__,
    "is_function": inspect.isfunction(target),
    "params": list(inspect.signature(target).parameters),
    "initialize_calls_load_model": "self.load_model()" in init_src,
    "ctor_calls_initialize": "self.initialize(" in ctor_src,
    "hooked": "fa4_startup_warmup" in plan.hooked,
    "wrapped": wrapped,
    "standin_result": result,
    "warmed": seen,
})
