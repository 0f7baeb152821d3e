"""The package itself: version, build flags, C++ consumer paths, error mapping."""

import os
import subprocess
import sys

import pytest
import torch

import mlacore
from mlacore import _mlacore

from conftest import requires_cuda


def run_module(*args):
    return subprocess.run([sys.executable, "-m", "mlacore", *args], capture_output=True, text=True, check=True).stdout


def test_version_matches_core():
    assert mlacore.__version__ == _mlacore.version()
    assert run_module("--version").strip() == mlacore.__version__


def test_paths_point_at_real_files():
    inc = mlacore.get_include()
    assert os.path.isfile(os.path.join(inc, "mlacore", "mlacore.h"))
    assert os.path.isfile(os.path.join(inc, "dlpack", "dlpack.h"))
    assert os.path.isfile(os.path.join(mlacore.get_library_dir(), "libmlacore.so.0"))
    assert os.path.isfile(os.path.join(mlacore.get_cmake_dir(), "mlacoreConfig.cmake"))
    assert os.path.isfile(os.path.join(mlacore.get_pkgconfig_dir(), "mlacore.pc"))
    assert run_module("--cflags").strip() == f"-I{inc}"
    assert "-lmlacore" in run_module("--libs")
    assert run_module("--cmakedir").strip() == mlacore.get_cmake_dir()


def test_library_has_a_versioned_soname_and_no_torch():
    lib = os.path.join(mlacore.get_library_dir(), "libmlacore.so.0")
    dynamic = subprocess.run(["objdump", "-p", lib], capture_output=True, text=True).stdout.splitlines()
    needed = [line.split()[-1] for line in dynamic if line.strip().startswith("NEEDED")]
    soname = [line.split()[-1] for line in dynamic if line.strip().startswith("SONAME")]
    assert soname == ["libmlacore.so.0"]
    assert needed and not [n for n in needed if "torch" in n or "python" in n.lower()]
    # -lmlacore finds it through the linker script beside it.
    with open(os.path.join(mlacore.get_library_dir(), "libmlacore.so")) as f:
        assert "INPUT(libmlacore.so.0)" in f.read()
    # The bindings load it by that name.
    ext = subprocess.run(["objdump", "-p", _mlacore.__file__], capture_output=True, text=True).stdout
    assert "libmlacore.so.0" in [line.split()[-1] for line in ext.splitlines() if line.strip().startswith("NEEDED")]


def test_noop_accepts_tensors_and_rejects_objects():
    ts = [torch.zeros(3, dtype=torch.int32) for _ in range(9)]
    _mlacore.noop(*ts)
    with pytest.raises(TypeError, match="expected a tensor"):
        _mlacore.noop(*ts[:8], [1, 2, 3])
    with pytest.raises(TypeError, match="got None"):
        _mlacore.noop(*ts[:8], None)


def test_noop_accepts_dlpack_producers_without_the_exchange_api():
    np = pytest.importorskip("numpy")
    arrays = [np.zeros(4, dtype=np.int32) for _ in range(9)]
    _mlacore.noop(*arrays)


def test_built_with_reports_a_bool():
    assert mlacore.built_with("cuda") in (True, False)
    assert mlacore.built_with("hip") in (True, False)
    assert mlacore.built_with("nonsense") is False


@requires_cuda
def test_gpu_smoke_noop_on_device_tensors():
    ts = [torch.zeros(3, dtype=torch.int32, device="cuda") for _ in range(9)]
    _mlacore.noop(*ts)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        _mlacore.noop(*ts)
    _mlacore.noop(*ts, stream=s.cuda_stream)
    torch.cuda.synchronize()
