"""What the plugin registered through SGLang's HookRegistry, and the startup path as registered: the
AFTER ModelRunner.load_model budget hook, called on a ModelRunner stand-in (for the scripts of
tests/test_vit_budgets.py)."""

from sglang.srt.plugins.hook_registry import HookRegistry

from sglang_fa4.integration import vit_budgets as vb

GENERIC = "sglang.srt.multimodal.vit_cuda_graph_runner.ViTCudaGraphRunner"
LOAD_MODEL = "sglang.srt.model_executor.model_runner.ModelRunner.load_model"


def hook_list():
    hooks = {m: [(ht.value, fn.__qualname__) for ht, fn, src in HookRegistry._hooks.get(f"{GENERIC}.{m}", [])]
             for m in ("run", "create_graph")}
    hooks["forward"] = [(ht.value, fn.__qualname__) for ht, fn, src in
                        HookRegistry._hooks.get("sglang.srt.models.qwen2_5_vl.Qwen2_5_VisionTransformer.forward", [])]
    hooks["load_model"] = [fn.__module__ + "." + fn.__qualname__ for ht, fn, src in HookRegistry._hooks.get(LOAD_MODEL, [])]
    return hooks


def registered_startup(mr):
    found = [fn for ht, fn, src in HookRegistry._hooks.get(LOAD_MODEL, []) if fn is vb.capture_budgets_after_load_model]
    for fn in found:
        assert fn(None, mr) is None  # SGLang keeps load_model's own result
    return len(found)
