"""Which kernel backends this process has, and why not."""

from . import _mlacore

_NAMES = ("native", "aiter")


def backends() -> dict:
    """Availability of every backend, e.g.
    {"native": {"available": True, "devices": ["cpu", "cuda"]},
     "aiter": {"available": False, "reason": "..."}}.

    The AITER probe runs once per process; `backend="auto"` falls back to
    native whenever AITER is unavailable or a call fails one of its gates.
    """
    out = {}
    for name in _NAMES:
        available, reason = _mlacore.backend_info(name)
        entry = {"available": available}
        if name == "native":
            entry["devices"] = ["cpu"] + [d for d in ("cuda", "hip") if _mlacore.built_with(d)]
        if not available:
            entry["reason"] = reason
        out[name] = entry
    return out
