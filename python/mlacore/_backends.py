"""Which kernel backends this process has, and why not."""

import importlib.util
import os

from . import _mlacore

_NAMES = ("native", "aiter")

# Where an installed aiter package keeps the built module that exports
# mla_decode_stage1_asm_fwd (its JIT modules live in aiter/jit/).
_AITER_MLA_LIBRARY = os.path.join("jit", "module_mla_asm.so")


def _hand_over_aiter_library() -> None:
    """Tells the core where an installed aiter's MLA library is, if any.

    Only looks: find_spec of a top-level name does not import it (importing
    aiter would pull in torch extensions and initialize HIP at our import).
    MLACORE_AITER_LIB, when set, still wins inside the core.
    """
    try:
        spec = importlib.util.find_spec("aiter")
    except (ImportError, ValueError):  # a broken or half-installed aiter: treat as absent
        return
    if spec is None or not spec.submodule_search_locations:
        return
    for location in spec.submodule_search_locations:
        candidate = os.path.join(location, _AITER_MLA_LIBRARY)
        if os.path.isfile(candidate):
            try:
                _mlacore.aiter_set_library(candidate)
            except RuntimeError:
                # The probe already ran (a C++ caller in this process asked
                # first); its cached answer stands and backends() reports it.
                pass
            return


_hand_over_aiter_library()


def _native_devices() -> tuple[list[str], list[str], str]:
    """(devices the native backend serves in this process now, GPU backends
    libmlacore was built with, why a built GPU backend serves nothing here or "")."""
    import torch

    built = [name for name in ("cuda", "hip") if _mlacore.built_with(name)]
    # torch names a ROCm device "cuda" too; torch.version.hip tells them apart.
    torch_gpu = "hip" if getattr(torch.version, "hip", None) else "cuda"
    devices, why = ["cpu"], []
    for name in built:
        if name == torch_gpu and torch.cuda.is_available():
            devices.append(name)
        elif name != torch_gpu:
            why.append(f"libmlacore was built with {name.upper()} but this torch is a "
                       f"{'ROCm' if torch_gpu == 'hip' else 'CUDA'} build")
        else:
            why.append(f"libmlacore was built with {name.upper()} but no GPU is visible here "
                       "(torch.cuda.is_available() is False)")
    if not built:
        why.append("libmlacore was built without a GPU backend (CPU only)")
    return devices, built, "; ".join(why)


def backends() -> dict:
    """What can run in this process now, and why not, e.g. on a GPU machine
    {"native": {"available": True, "devices": ["cpu", "cuda"], "built_with": ["cuda"]},
     "aiter": {"available": False, "reason": "...", "abi_version": 0, "library": "", "entry_points": []}}
    and on the same build without a GPU
    {"native": {"available": True, "devices": ["cpu"], "built_with": ["cuda"],
                "devices_note": "libmlacore was built with CUDA but no GPU is visible here (...)"}, ...}.

    native: `devices` are the devices its kernels serve here and now (the
    CPU path always; a GPU only when libmlacore was built for it and a device
    is visible), `built_with` the GPU backends compiled in, `devices_note` why
    a compiled GPU backend serves nothing here (absent when nothing is missing).
    The AITER probe runs once per process; `backend="auto"` falls back to
    native whenever AITER is unavailable or a call fails one of its gates.
    For AITER: `abi_version` is what the library's aiter_c_abi_version()
    returned (0 when it was not read), `library` the file opened or tried,
    `entry_points` the C entry points of mlacore's AITER ABI it exports (the
    decode always; the cache writes only from a shim, see docs/AITER.md).
    """
    out = {}
    for name in _NAMES:
        available, reason = _mlacore.backend_info(name)
        entry = {"available": available}
        if name == "native":
            devices, built, note = _native_devices()
            entry.update(devices=devices, built_with=built)
            if note:
                entry["devices_note"] = note
        if not available:
            entry["reason"] = reason
        if name == "aiter":
            abi_version, library, entry_points = _mlacore.aiter_library_info()
            entry.update(abi_version=abi_version, library=library, entry_points=list(entry_points))
        out[name] = entry
    return out
