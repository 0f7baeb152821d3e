import pytest
import torch

import mlacore

HAS_CUDA = torch.cuda.is_available() and mlacore.built_with("cuda")
CUDA_SKIP_REASON = (
    "no CUDA device" if not torch.cuda.is_available() else "mlacore built without CUDA"
)

requires_cuda = pytest.mark.skipif(not HAS_CUDA, reason=CUDA_SKIP_REASON)


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=requires_cuda)])
def device(request):
    """Runs a test on the CPU and, where available, on the GPU."""
    return torch.device(request.param)
