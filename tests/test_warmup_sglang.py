"""The startup warmup's hook point against the REAL SGLang 0.5.20 and 0.5.23 (subprocesses, see
sglang_harness.py): ModelRunner.load_model resolves by its dotted name, is a plain method that
ModelRunner.initialize calls (every scheduler process, before CUDA-graph capture), the plugin's
registration really wraps it through SGLang's HookRegistry, and an AFTER hook of that shape gets
the runner and keeps load_model's result.

Nothing is stubbed: the test env installs the server-side packages model_runner.py imports
(uvicorn, fastapi); opentelemetry is optional upstream (guarded import) and stays absent."""

import pytest

from sglang_harness import run_file



@pytest.mark.tripwire  # reads ModelRunner's source: initialize() calls self.load_model()
def test_load_model_hook_target(sglang_version):
    out = run_file(sglang_version, "warmup_hook_target.py")
    assert out["qualname"] == "ModelRunner.load_model"
    assert out["is_function"] and out["params"] == ["self"]
    assert out["initialize_calls_load_model"] and out["ctor_calls_initialize"]
    assert out["hooked"] and out["wrapped"]
    assert out["standin_result"] == "loaded" and out["warmed"] == ["the-model"]
