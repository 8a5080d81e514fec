"""Patch sets for SGLang: apply/revert them on an installed package or checkout, or bake them into a
fork wheel. Patch files live in ``patches/sglang/<version>/`` (``series`` + numbered ``.patch``)."""
