"""What the server-args scripts share (llm_fp8_kv_server_args.py, gemma4_server_args.py): the
platforms they fake through SGLang's ``override_platform``, and the model directories they resolve."""

from __future__ import annotations

import json
import os

PLATFORMS = {
    "sm90": dict(is_sm90=True, is_hopper_with_cuda_12_3=True, is_sm100=False, is_sm120=False, is_blackwell=False),
    "sm100": dict(is_sm90=False, is_hopper_with_cuda_12_3=False, is_sm100=True, is_sm120=False, is_blackwell=True),
}


def write_model_dirs(models: dict, root: str) -> None:
    """One directory per model under ``root`` holding its config.json."""
    for name, cfg in models.items():
        os.makedirs(f"{root}/{name}", exist_ok=True)
        with open(f"{root}/{name}/config.json", "w") as f:
            json.dump(cfg, f)
