"""Type-checked by tests/run.sh (mypy) against the installed package: the
public API as a user calls it, through the package's py.typed and the
compiled module's stubs (_mlacore.pyi). Not run."""

import mlacore
from mlacore import _mlacore


def describe() -> str:
    version: str = mlacore.__version__
    core_version: str = _mlacore.version()
    cuda: bool = mlacore.built_with("cuda")
    elements: int = _mlacore.plan_schedule_size(8, 64)
    workspace: int = _mlacore.mla_decode_workspace_bytes(8, 64, 1, 64, 16)
    reason: tuple[bool, str] = _mlacore.backend_info("native")
    paths: list[str] = [mlacore.get_include(), mlacore.get_library_dir(), mlacore.get_pkgconfig_dir()]
    return f"{version} {core_version} {cuda} {elements} {workspace} {reason} {paths}"


def plan_sizes() -> tuple[int, int]:
    work: int = mlacore.default_max_work(8, 132)
    return work, mlacore.plan_schedule_size(8, work)
