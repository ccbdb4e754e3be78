"""What rewritten training code calls; usable on its own. Never imports codemod.

Submodules load on first use, so `import runtime` does not import torch.
"""

import importlib

# Exported name -> the submodule that defines it.
_EXPORTS = {
    "Precision": "amp",
    "AsyncCheckpointer": "checkpoint",
    "DevicePrefetcher": "data",
    "default_num_workers": "data",
    "PretokenizedDataset": "data",
    "PadCollate": "data",
    "PersistentHooks": "hooks",
    "linear_scan": "kernels",
    "linear_attention": "kernels",
}
_SUBMODULES = {"amp", "checkpoint", "data", "distributed", "hooks", "kernels", "trace"}

__all__ = sorted(_EXPORTS) + sorted(_SUBMODULES)


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
