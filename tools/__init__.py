"""Repository tooling, run from a checkout (``python -m tools.docs``, ``python -m tools.architecture``);
not part of the installed package: the wheel ships ``sglang_fa4/`` only."""
