"""Where the C++ side of an installed mlacore lives (headers, libmlacore, pkg-config, CMake)."""

from pathlib import Path

from . import _mlacore

_PKG = Path(__file__).resolve().parent


def _installed() -> bool:
    # A wheel or regular install carries lib/ and include/ inside the package;
    # an editable install leaves them in the source and build trees.
    return (_PKG / "include" / "mlacore" / "mlacore.h").is_file()


def get_include() -> str:
    """Directory to add to the include path: holds <mlacore/mlacore.h> and <dlpack/dlpack.h>."""
    if _installed():
        return str(_PKG / "include")
    return str(_PKG.parent.parent / "core" / "include")


def get_library_dir() -> str:
    """Directory holding libmlacore.so."""
    if _installed():
        return str(_PKG / "lib")
    return str(Path(_mlacore.library_path()).resolve().parent)


def get_pkgconfig_dir() -> str:
    """Directory holding mlacore.pc (for PKG_CONFIG_PATH)."""
    if _installed():
        return str(_PKG / "lib" / "pkgconfig")
    return get_library_dir()


def get_cmake_dir() -> str:
    """Directory holding mlacoreConfig.cmake (for mlacore_DIR or CMAKE_PREFIX_PATH)."""
    if _installed():
        return str(_PKG / "lib" / "cmake" / "mlacore")
    return get_library_dir()
