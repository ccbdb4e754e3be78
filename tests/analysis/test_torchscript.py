"""Which code TorchScript compiles (or torch.jit.trace records): no rule writes a
`runtime` call there (issue 22: PM505 turned a loop of a scripted function into a
kernel call, and the program failed at import)."""

import libcst as cst
import pytest

from codemod.analysis.torchscript import torchscript
from codemod.context import FileContext

CASES = [
    ("import torch\n@torch.jit.script\ndef f(x):\n    return x\n", "f", True),
    ("from torch import jit\n@jit.script\ndef f(x):\n    return x\n", "f", True),
    ("import torch\ndef f(x):\n    return x\ng = torch.jit.script(f)\n", "f", True),
    ("import torch\ndef f(x):\n    return x\ng = torch.jit.trace(f, (torch.ones(1),))\n", "f", True),
    ("import torch\ndef h(x):\n    return x\ndef f(x):\n    return h(x)\ng = torch.jit.script(f)\n", "h", True),
    (
        "import torch\nclass M(torch.nn.Module):\n    def forward(self, x):\n        return x\nm = M()\n"
        "s = torch.jit.script(m)\n",
        "forward",
        True,
    ),
    (
        "import torch\nclass M(torch.nn.Module):\n    def forward(self, x):\n        return x\ns = torch.jit.script(M())\n",
        "forward",
        True,
    ),
    (
        "import torch\nclass M(torch.jit.ScriptModule):\n    @torch.jit.script_method\n    def forward(self, x):\n"
        "        return x\n",
        "forward",
        True,
    ),
    (
        "import torch\nclass M(torch.nn.Module):\n    def forward(self, x):\n        return self.log(x)\n"
        "    @torch.jit.ignore\n    def log(self, x):\n        return x\ns = torch.jit.script(M())\n",
        "log",
        False,
    ),
    ("import torch\ndef f(x):\n    return x\ng = torch.compile(f)\n", "f", False),
    ("import torch\ndef f(x):\n    return x\ndef script(f):\n    return f\ng = script(f)\n", "f", False),
    ("import torch\n@torch.no_grad()\ndef f(x):\n    return x\n", "f", False),
]


@pytest.mark.parametrize(("code", "function", "compiled"), CASES)
def test_compiled(code, function, compiled):
    context = FileContext.of_source(code)
    found = [f for f in context.index.find(cst.FunctionDef) if f.name.value == function]
    body = found[0].body.body[0]
    why = torchscript(context).compiled(body)
    assert (why is not None) == compiled, why
    if compiled:
        assert "torch.jit" in why or "TorchScript" in why or "called from compiled code" in why
