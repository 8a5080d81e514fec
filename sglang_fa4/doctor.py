"""``sglang-fa4 doctor``: what this machine has and what the plugin would do on it.

Works without SGLang, FA4, torch or a GPU; imports none of them (the GPU comes from the CUDA driver).
"""

from __future__ import annotations

import json
from importlib import metadata
from typing import Any, Optional

from sglang_fa4 import features, gemma4_selection, llm_selection, plugin, selection
from sglang_fa4.environ import envs
from sglang_fa4.integration import vit_budget_memory
from sglang_fa4.sglang_version import installed_sglang_version

PLUGIN_NAME = "sglang_fa4"


def _dist_version(name: str) -> Optional[str]:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def plugin_status() -> dict[str, Any]:
    eps = [ep for ep in metadata.entry_points(group="sglang.srt.plugins") if ep.name == PLUGIN_NAME]
    allowed = envs.SGLANG_PLUGINS.get()
    allowed_set = {x.strip() for x in allowed.split(",") if x.strip()}
    if not eps:
        return {"enabled": False, "reason": "entry point not installed (pip install sglang-fa4)"}
    if allowed_set and PLUGIN_NAME not in allowed_set:
        return {"enabled": False, "reason": f"SGLANG_PLUGINS={allowed!r} does not name {PLUGIN_NAME}"}
    return {"enabled": True, "reason": "installed entry point; SGLANG_PLUGINS " + ("names it" if allowed_set else "is empty (all load)")}


# --capability: CUDA's majors run to 12 (sm_121) so far; a few spare for GPUs after this release
CAPABILITY_MAJORS = range(1, 16)
CAPABILITY_MINORS = range(0, 10)


def parse_capability_arg(text: str) -> tuple[int, int]:
    """--capability: MAJOR.MINOR of a GPU that can exist (100.0 is refused, not answered)."""
    major, minor = selection.parse_capability(text)
    if major not in CAPABILITY_MAJORS or minor not in CAPABILITY_MINORS:
        raise ValueError(
            f"compute capability {text.strip()} is out of range: MAJOR {CAPABILITY_MAJORS.start}-"
            f"{CAPABILITY_MAJORS.stop - 1}, MINOR {CAPABILITY_MINORS.start}-{CAPABILITY_MINORS.stop - 1} (e.g. 10.3)"
        )
    return major, minor


def gpu_status(capability_arg: Optional[str]) -> dict[str, Any]:
    if capability_arg is not None:
        return {"name": None, "capability": list(parse_capability_arg(capability_arg)), "source": "--capability"}
    return cuda_driver_gpu()


# CUdevice_attribute: CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR / _MINOR
_CC_MAJOR, _CC_MINOR = 75, 76


def cuda_driver_gpu() -> dict[str, Any]:
    """GPU 0 as the CUDA driver (libcuda) reports it: name and compute capability. No torch: doctor
    must answer on a machine where torch (or numpy) is missing or broken."""
    import ctypes

    lib = None
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            continue
    if lib is None:
        return {"name": None, "capability": None, "source": "no CUDA driver (libcuda) found"}
    count, device = ctypes.c_int(0), ctypes.c_int(0)
    major, minor = ctypes.c_int(0), ctypes.c_int(0)
    raw_name = ctypes.create_string_buffer(256)
    if (
        lib.cuInit(0) != 0
        or lib.cuDeviceGetCount(ctypes.byref(count)) != 0
        or count.value < 1
        or lib.cuDeviceGet(ctypes.byref(device), 0) != 0
    ):
        return {"name": None, "capability": None, "source": "no CUDA GPU visible"}
    lib.cuDeviceGetName(raw_name, len(raw_name), device)
    lib.cuDeviceGetAttribute(ctypes.byref(major), _CC_MAJOR, device)
    lib.cuDeviceGetAttribute(ctypes.byref(minor), _CC_MINOR, device)
    return {
        "name": raw_name.value.decode(errors="replace") or None,
        "capability": [major.value, minor.value],
        "source": "CUDA driver",
    }


def collect(capability_arg: Optional[str] = None) -> dict[str, Any]:
    version = installed_sglang_version()
    plan = plugin.make_plan(version)
    gpu = gpu_status(capability_arg)
    if gpu["capability"] is not None:
        choice = selection.select_mm_attention_backend(None, None, tuple(gpu["capability"]), "cuda", warn=False)
        backend = {"backend": choice.backend, "reason": choice.reason, "source": choice.source}
        if choice.warning:
            backend["warning"] = choice.warning
    else:
        backend = {"backend": None, "reason": "no CUDA GPU: SGLang's own platform default applies", "source": "upstream"}
    return {
        "sglang": {"version": version or "not installed", "supported": plan.supported, "note": plan.message},
        "plugin": plugin_status(),
        "features": {
            f.name: ("upstream" if f.name in plan.upstream else "hooked" if f.name in plan.hooked else "off")
            for f in features.FEATURES
        }
        if plan.supported
        else {},
        "fa4": _fa4_report(),
        "gpu": gpu,
        "vit_backend": backend,
        "llm_fp8_kv": llm_selection.describe_rule(tuple(gpu["capability"]) if gpu["capability"] else None),
        "gemma4_fp8_kv": gemma4_selection.describe_rule(tuple(gpu["capability"]) if gpu["capability"] else None,
                                                        version),
        "vit_graphs": vit_budget_memory.doctor_report(),  # budget ladder per reference tower, memory bound
        "env": envs.snapshot(),
    }


def _fa4_report() -> dict[str, Any]:
    """FA4's versions and which launch path the ViT calls take with them (no FA4 import)."""
    from sglang_fa4.kernels.fa4 import CALL_LAYOUT_CHECKED, WRITTEN_AGAINST

    version = _dist_version("flash-attn-4")
    if version is None:
        launch = "none (flash-attn-4 not installed)"
    elif version == WRITTEN_AGAINST:
        launch = f"direct cached-kernel launch (the call layout of flash-attn-4 {WRITTEN_AGAINST})"
    elif version in CALL_LAYOUT_CHECKED:
        launch = (f"direct cached-kernel launch: flash-attn-4 {version}'s kernel call was checked to match "
                  f"{WRITTEN_AGAINST}'s layout ({', '.join(CALL_LAYOUT_CHECKED[version])}); still checked per "
                  "configuration, FA4's public API where it does not match (one warning)")
    else:
        launch = (f"direct launch where flash-attn-4 {version}'s kernel call matches {WRITTEN_AGAINST}'s layout, "
                  "FA4's public API for configurations where it does not (checked per configuration, one warning)")
    from sglang_fa4.kernels import dsl_versions

    return {"flash-attn-4": version, "nvidia-cutlass-dsl": _dist_version("nvidia-cutlass-dsl"),
            "written_against": WRITTEN_AGAINST, "launch_path": launch,
            "cutlass_dsl_builds": dsl_versions.report(_dist_version("nvidia-cutlass-dsl"))}


def format_text(report: dict[str, Any]) -> str:
    lines = list(report.get("errors", ())) + [
        f"SGLang:       {report['sglang']['version']}"
        + (f"  ({report['sglang']['note']})" if report["sglang"]["version"] != "not installed" and report["sglang"]["note"] else ""),
        f"plugin:       {'enabled' if report['plugin']['enabled'] else 'disabled'} - {report['plugin']['reason']}",
    ]
    for name, state in report["features"].items():
        lines.append(f"  {name:<30} {state}")
    fa4 = report["fa4"]
    lines.append(f"FA4:          flash-attn-4 {fa4['flash-attn-4'] or 'not installed'}, "
                 f"nvidia-cutlass-dsl {fa4['nvidia-cutlass-dsl'] or 'not installed'}")
    lines.append(f"  launch path: {fa4['launch_path']}")
    lines += [f"  {family:<12} {state}" for family, state in fa4["cutlass_dsl_builds"].items()]
    gpu = report["gpu"]
    cap = ".".join(map(str, gpu["capability"])) if gpu["capability"] else "-"
    lines.append(f"GPU:          {gpu['name'] or '-'}  capability {cap}  ({gpu['source']})")
    vb = report["vit_backend"]
    lines.append(f"ViT backend:  {vb['backend'] or '(SGLang default)'} - {vb['reason']}")
    if vb.get("warning"):
        lines.append(f"  warning: {vb['warning']}")
    kv = report["llm_fp8_kv"]
    lines.append(f"LLM, fp8 KV:  {'fa4 upgrade' if kv['upgrade'] else 'no upgrade'} - {kv['reason']}")
    g4 = report["gemma4_fp8_kv"]
    lines.append(f"Gemma-4, fp8 KV: {g4['rule']}")
    for name, verdict in g4["models"].items():
        lines.append(f"  {name}: {verdict['backend']} - {verdict['reason']}")
    if any(v["missing"] for v in g4["models"].values()):
        lines.append(f"  (SGLang {g4['sglang']}; the route lacks: "
                     + "; ".join(sorted({m for v in g4["models"].values() for m in v["missing"]})) + ")")
    lines.extend(vit_budget_memory.doctor_lines(report["vit_graphs"]))
    lines.append("environment:")
    for name, entry in report["env"].items():
        value = entry.get("error") or repr(entry["value"])
        lines.append(f"  {name:<40} {value}{'' if entry['set'] else '  (default)'}")
    return "\n".join(lines)


def run(args) -> int:
    """The report (exit 0), with the plugin's own ERROR lines for malformed variables first and the
    values the server would run with (exit 1); a bad --capability is refused (exit 2). With --json
    every outcome is one JSON object, errors under "errors"."""
    errors = list(plugin.environment_errors().values())  # the lines the plugin logs, in its words
    try:
        report = collect(args.capability)
    except ValueError as exc:
        message = f"sglang-fa4 doctor: error: {exc}"
        print(json.dumps({"errors": [message]}, indent=2) if args.json else message)
        return 2
    report = {"errors": errors, **report}
    print(json.dumps(report, indent=2) if args.json else format_text(report))
    return 1 if errors else 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("doctor", help="report SGLang, FA4, GPU, the chosen ViT backend and the env registry")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--capability", metavar="X.Y", help="pretend the GPU has this compute capability (e.g. 10.3)")
    p.set_defaults(handler=run)
