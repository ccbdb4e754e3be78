"""What the tests of perfmod's torch tables share: the object a table's name is in the
installed torch."""

from __future__ import annotations

import importlib

import torch

from codemod.analysis.torch_ops import METHOD


def resolve(name: str):
    """The object the qualified `name` (`torch.nn.Linear`, `Tensor.view`) is in the installed torch."""
    if name.startswith(METHOD):
        return getattr(torch.Tensor, name.removeprefix(METHOD))
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):  # the longest module path, then attributes (a class's methods)
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            found = getattr(found, attribute)
        return found
    raise ModuleNotFoundError(name)
