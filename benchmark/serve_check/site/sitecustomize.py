"""Imported by every Python process whose PYTHONPATH holds this folder (the server check puts it
there for the SGLang server and the processes it spawns): the plain-torch stand-ins for the
CUDA-only packages that cannot travel to the GPU machine (benchmark/sglang_on_gpu/cuda_only_stubs.py),
installed only for the packages that are really missing. Another sitecustomize later on sys.path
(the image's own, if any) still runs."""

import importlib.util
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
_stubs_dir = os.path.join(_here, os.pardir, os.pardir, "sglang_on_gpu")
if os.path.isdir(_stubs_dir) and _stubs_dir not in sys.path:
    sys.path.append(os.path.abspath(_stubs_dir))
try:
    import cuda_only_stubs

    cuda_only_stubs.install_missing()
except Exception as exc:  # noqa: BLE001 - never break interpreter start-up
    print(f"serve-check sitecustomize: stand-ins not installed: {type(exc).__name__}: {exc}", file=sys.stderr)

# run the next sitecustomize on sys.path, if there is one
for _entry in sys.path:
    if not _entry or os.path.abspath(_entry) == _here:
        continue
    _cand = os.path.join(_entry, "sitecustomize.py")
    if os.path.isfile(_cand):
        _spec = importlib.util.spec_from_file_location("_serve_check_next_sitecustomize", _cand)
        _mod = importlib.util.module_from_spec(_spec)
        try:
            _spec.loader.exec_module(_mod)
        except Exception as exc:  # noqa: BLE001
            print(f"serve-check sitecustomize: {_cand} failed: {exc}", file=sys.stderr)
        break
