"""The plugin registered through a REAL SGLang release's loader (``load_plugins()``): the plan, the
registered and applied hook targets, the ViT backend per GPU capability, doctor's report and the
plugin's log; for tests/test_sglang_window.py."""

from emit import emit

import io, logging, warnings
warnings.simplefilter("ignore")
# sgl_kernel / flashinfer are CUDA-only wheels: the LLM attention backend's module imports them
from benchmark.sglang_on_gpu import cuda_only_stubs; cuda_only_stubs.install_missing()
log = io.StringIO()
handler = logging.StreamHandler(log)
logging.getLogger("sglang_fa4").addHandler(handler)
logging.getLogger("sglang_fa4").setLevel(logging.INFO)
from unittest import mock
import sglang.srt.plugins as plugins
from sglang.srt.plugins.hook_registry import HookRegistry
plugins.load_plugins()
from sglang_fa4 import doctor, plugin
from sglang_fa4.integration import hooks

from sglang.srt.server_args import ServerArgs
from sglang.srt.runtime_context import get_context, override_platform
import sglang.srt.layers.attention.vision as vision

def determine(cap):
    get_context().set_server_args(ServerArgs(model_path="dummy"))
    obj = object.__new__(vision.VisionAttention)
    with mock.patch.object(vision, "is_cuda", lambda: True), \
         mock.patch.object(vision, "get_device_capability", lambda *a, **k: cap), \
         override_platform(is_blackwell=cap[0] in (10, 11, 12)):
        return vision.VisionAttention._determine_attention_backend(obj, None)

plan = plugin._registered_plan
report = doctor.collect("10.3")
emit({
    "version": plan.sglang_version, "supported": plan.supported,
    "hooked": plan.hooked, "upstream": plan.upstream,
    "registered": sorted(HookRegistry._hooks), "patched": sorted(HookRegistry._patched),
    "targets": {"backend": hooks.DETERMINE_BACKEND, "runner": hooks.GENERIC_RUNNER},
    "backend": {"10.0": determine((10, 0)), "10.3": determine((10, 3)), "9.0": determine((9, 0))},
    "doctor": {"supported": report["sglang"]["supported"], "features": report["features"],
               "backend": report["vit_backend"]["backend"]},
    "log": log.getvalue(),
})
