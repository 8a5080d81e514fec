"""SGLang's ModelRunner.maybe_enable_batch_invariant_mode: there, gated on
--enable-deterministic-inference, called after load_model (for
tests/test_vit_budgets.py::test_sglang_has_the_batch_invariant_switch)."""

import inspect
import warnings

from emit import emit

warnings.simplefilter("ignore")
from sglang.srt.model_executor.model_runner import ModelRunner
src = inspect.getsource(ModelRunner.maybe_enable_batch_invariant_mode)
emit({"has": callable(getattr(ModelRunner, "maybe_enable_batch_invariant_mode", None)),
      "gated": "enable_deterministic_inference" in src, "init_order": inspect.getsource(ModelRunner.initialize).find(
          "self.load_model()") < inspect.getsource(ModelRunner.initialize).find("self.maybe_enable_batch_invariant_mode()")})
