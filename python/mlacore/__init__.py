"""mlacore: the glue between an LLM serving engine and MLA decode kernels over a paged KV cache.

The torch-facing API. Heavy lifting happens in libmlacore (C++/CUDA/HIP); this
package allocates outputs, registers torch custom ops and shapes the API.
"""

from . import _mlacore
from ._paths import get_cmake_dir, get_include, get_library_dir, get_pkgconfig_dir

__version__ = _mlacore.version()


def built_with(feature: str) -> bool:
    """True when libmlacore was built with the GPU backend `feature` ("cuda" or "hip")."""
    return _mlacore.built_with(feature)


__all__ = [
    "__version__",
    "built_with",
    "get_include",
    "get_library_dir",
    "get_pkgconfig_dir",
    "get_cmake_dir",
]
