"""Fixtures shared by the test modules: ``sglang_version`` runs a test once per supported real SGLang
release (see sglang_harness.py)."""

from sglang_harness import sglang_version  # noqa: F401  (fixture)
