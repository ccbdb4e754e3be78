"""torch.compile for kernels on CUDA, guarded: eager on other devices and wherever compile fails."""

import functools
import os
import warnings

import torch

ENV_VAR = "PERFMOD_KERNELS_COMPILE"  # "0": never compile (eager on CUDA too)


def compiled_on_cuda(fn):
    """`fn(*tensors)`, run through torch.compile when the first tensor is on CUDA.

    Eager on other devices, inside an outer torch.compile (which traces fn itself), when
    PERFMOD_KERNELS_COMPILE=0, and from the first time compiling raises on (no triton, an
    unsupported GPU): a warning then says why. Compiled on first CUDA use, as creating a
    compiled function imports torch._dynamo (seconds). dynamic=False: one graph per shape,
    as the kernels unroll loops whose length depends on the shape.
    """
    compiled = None

    @functools.wraps(fn)
    def run(*tensors):
        nonlocal compiled
        if (
            compiled is False
            or not tensors[0].is_cuda
            or torch.compiler.is_compiling()
            or os.environ.get(ENV_VAR) == "0"
        ):
            return fn(*tensors)
        try:
            compiled = compiled or torch.compile(fn, dynamic=False)
            return compiled(*tensors)
        except Exception as err:  # torch raises many types here; eager stays correct
            compiled = False
            warnings.warn(f"torch.compile of {fn.__name__} failed, running eager: {err}", stacklevel=2)
            return fn(*tensors)

    return run
