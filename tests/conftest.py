"""Fixtures shared by the test modules: ``sglang_version`` runs a test once per supported real SGLang
release (see sglang_harness.py). The paged FP8 KV route's kernels are the torch models of their
contracts on CPU tensors outside Triton's interpreter (``sglang_fa4.testing.paged_kv_torch``), as
in the SGLang CPU harnesses; a CUDA tensor, or any under TRITON_INTERPRET, takes the kernels."""

import pytest

from sglang_fa4.kernels import settings
from sglang_fa4.testing import paged_kv_torch
from sglang_harness import sglang_version  # noqa: F401  (fixture)

paged_kv_torch.install()


def pytest_addoption(parser):
    parser.addoption("--device", default="cpu",
                     help="where the refusal tests of the paged FP8 KV kernels build their tensors "
                          "(cuda on the GPU machine: the checks must refuse there too)")


@pytest.fixture
def device(request):
    """The device of the tests that take it (``--device``; cpu unless asked)."""
    return request.config.getoption("--device")


@pytest.fixture
def reload_settings():
    """The routing settings read again from the environment (after a test's setenv): call it.
    Afterwards they are read again on first use (the test's environment is gone by then)."""
    yield settings.reload
    settings.install(None)
