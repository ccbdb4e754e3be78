from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from codemod.rule import Invalid, Level, Rule, Valid

# Any of these names means the script already chose its float32 matmul precision
# (on or off, legacy or per-backend API); the rule then leaves the choice alone.
PRECISION_SETTINGS = ("allow_tf32", "fp32_precision", "set_float32_matmul_precision")
ENABLE_TF32 = 'torch.set_float32_matmul_precision("high")'

IMPORTS = "import torch\nimport torch.nn as nn\n"
MODEL = "model = nn.Linear(8, 1).to(device)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
LOOP = (
    "for x, y in data:\n"
    "    loss = nn.functional.mse_loss(model(x.to(device)), y.to(device))\n"
    "    loss.backward()\n"
    "    opt.step()\n"
    "    opt.zero_grad()\n"
)
SCRIPT_BODY = 'device = torch.device("cuda")\ndata = [(torch.randn(4, 8), torch.randn(4, 1))]\n' + MODEL + LOOP


def _indented(code: str) -> str:
    return "".join(f"    {line}" if line.strip() else line for line in code.splitlines(keepends=True))


class Float32MatmulWithoutTf32(Rule):
    """
    ## What it does
    Finds training scripts that use CUDA and never choose a float32 matmul
    precision, and enables TF32 once at start-up with
    `torch.set_float32_matmul_precision("high")`: right after the last
    top-level import, or at the top of the function that holds the training
    loop when it is in one.

    ## Why is this bad?
    By default float32 matrix multiplications on CUDA use full IEEE float32,
    which on Ampere and newer GPUs runs on the general CUDA cores at a fraction
    of the speed of the tensor cores (A100: 19.5 TFLOPS in float32 against 156
    in TF32). TF32 keeps float32's range and rounds the inputs of each product
    to a 10-bit mantissa, which deep learning training tolerates. Typical gain:
    1.5-3x on matmul-bound float32 training on Ampere or newer; nothing on
    older GPUs, where the setting has no effect.

    Why this spelling (checked against torch 2.13):
    - `torch.set_float32_matmul_precision("high")` sets both the new
      per-backend flag (`torch.backends.cuda.matmul.fp32_precision == "tf32"`)
      and the legacy one (`torch.backends.cuda.matmul.allow_tf32 == True`), so
      code and libraries that read either agree. torch's own compiler warning
      recommends this call.
    - Setting the new API directly
      (`torch.backends.cuda.matmul.fp32_precision = "tf32"`) makes any later
      `torch.get_float32_matmul_precision()` raise a RuntimeError about mixing
      the legacy and new APIs, and torch's inductor autotuning still calls
      that getter; so the rule does not write it.
    - `torch.backends.cuda.matmul.allow_tf32 = True` still works without a
      warning, but torch's CUDA notes say the `allow_tf32` flags will be
      deprecated in favour of the `fp32_precision` ones.
    - cuDNN convolutions already use TF32 by default
      (`torch.backends.cudnn.allow_tf32` is True), so nothing is needed there.

    ## Example
    ```python
    import torch

    model = Net().cuda()
    for x, y in loader:
        ...
    ```
    Use instead:
    ```python
    import torch

    torch.set_float32_matmul_precision("high")
    model = Net().cuda()
    for x, y in loader:
        ...
    ```

    ## Fix safety
    Numeric: matmuls round their inputs to TF32, so losses differ from
    float32 by about 1e-3 relative per product and drift apart slowly over
    training; `perfmod verify` compares them. On CPU the setting also asks
    oneDNN for reduced-precision float32 matmuls, which only CPUs with such
    units honour (on an AVX-512 CPU without them results were bit for bit
    the same). Not reported when the file has no training loop (an inference
    script may need exact float32), when every training loop trains a float64
    model (TF32 touches float32 matmuls only), when the file shows no sign of
    CUDA (a `"cuda"` device string, `.cuda()`, a `torch.cuda` call other than
    `is_available()`), or when it already sets `allow_tf32`,
    `fp32_precision` or `set_float32_matmul_precision` anywhere, to any value.
    """

    CODE = "PM302"
    NAME = "float32-matmul-without-tf32"
    LEVEL = Level.NUMERIC
    REQUIRES = ("backward",)
    MESSAGE = "float32 matmuls on CUDA run without TF32 tensor cores; enable TF32 once at start-up"
    GAIN = "1.5-3x on matmul-bound float32 training on Ampere or newer GPUs"

    VALID = [
        Valid(IMPORTS + 'device = torch.device("cuda")\nmodel = nn.Linear(8, 1).to(device)\n'
              "print(model(torch.randn(2, 8, device=device)))\n", "no training loop"),
        Valid(IMPORTS + SCRIPT_BODY.replace('"cuda"', '"cpu"'), "no CUDA in sight"),
        Valid(IMPORTS + SCRIPT_BODY.replace(".to(device)\nopt", ".double().to(device)\nopt"), "a float64 model"),
        Valid(IMPORTS + "torch.backends.cuda.matmul.allow_tf32 = True\n" + SCRIPT_BODY, "already on, legacy flag"),
        Valid(IMPORTS + "torch.backends.cudnn.allow_tf32 = False\n" + SCRIPT_BODY, "an explicit choice, even for cuDNN"),
        Valid(IMPORTS + 'torch.set_float32_matmul_precision("highest")\n' + SCRIPT_BODY, "exact float32 asked for"),
        Valid(IMPORTS + 'torch.backends.cuda.matmul.fp32_precision = "ieee"\n' + SCRIPT_BODY, "new API"),
        Valid(IMPORTS + "from torch import set_float32_matmul_precision as precision\nprecision('medium')\n"
              + SCRIPT_BODY, "imported under another name"),
    ]
    INVALID = [
        Invalid(
            IMPORTS + "\n" + SCRIPT_BODY,
            IMPORTS + "\n" + ENABLE_TF32 + "\n\n" + SCRIPT_BODY,
            "a script: right after the imports",
        ),
        Invalid(
            IMPORTS + "\n\ndef main():\n" + '    """Train."""\n' + _indented(SCRIPT_BODY)
            + '\n\nif __name__ == "__main__":\n    main()\n',
            IMPORTS + "\n\ndef main():\n" + '    """Train."""\n    ' + ENABLE_TF32 + "\n" + _indented(SCRIPT_BODY)
            + '\n\nif __name__ == "__main__":\n    main()\n',
            "the loop is in main(): at its top, after the docstring",
        ),
        Invalid(
            "from torch import nn, optim\n\nclass Trainer:\n    def fit(self, model, data):\n"
            "        # move to the GPU\n        model = model.cuda()\n        opt = optim.SGD(model.parameters(), lr=0.1)\n"
            "        for x, y in data:\n            model(x).sum().backward()\n            opt.step()\n",
            "from torch import nn, optim\nimport torch\n\nclass Trainer:\n    def fit(self, model, data):\n"
            "        " + ENABLE_TF32 + "\n"
            "        # move to the GPU\n        model = model.cuda()\n        opt = optim.SGD(model.parameters(), lr=0.1)\n"
            "        for x, y in data:\n            model(x).sum().backward()\n            opt.step()\n",
            "a method; torch is imported for the call",
        ),
        Invalid(
            IMPORTS + "\ndef pretrain(model, opt, data):\n" + _indented(LOOP)
            + "\ndef finetune(model, opt, data):\n" + _indented(LOOP) + 'device = "cuda"\n',
            IMPORTS + "\n" + ENABLE_TF32 + "\n\ndef pretrain(model, opt, data):\n" + _indented(LOOP)
            + "\ndef finetune(model, opt, data):\n" + _indented(LOOP) + 'device = "cuda"\n',
            "loops in two functions: once, after the imports",
        ),
    ]

    def visit_Module(self, node: cst.Module) -> None:
        training = self.context.training
        if not training.loops or training.cuda_use is None:
            return
        if all(loop.float64 is not None for loop in training.loops):
            return  # TF32 changes float32 matmuls only
        if any(name.value in PRECISION_SETTINGS for name in m.findall(node, m.Name())):
            return
        enable = cst.parse_statement(ENABLE_TF32 + "\n")
        functions = {self._outermost_function(loop.loop) for loop in training.loops}
        function = functions.pop() if len(functions) == 1 else None
        if function is not None:
            self._report_at_top_of(function, enable)
            return
        first_statement = self._module_statement(training.loops[0].loop)
        imports = [
            statement for statement in node.body[: node.body.index(first_statement)]
            if isinstance(statement, cst.SimpleStatementLine)
            and all(isinstance(small, (cst.Import, cst.ImportFrom)) for small in statement.body)
        ]
        if imports:
            separated = enable.with_changes(leading_lines=[cst.EmptyLine()])
            self.report(imports[-1], replacement=cst.FlattenSentinel([imports[-1], separated]), imports=[("torch", None)])
        else:
            self.report(first_statement, replacement=cst.FlattenSentinel([enable, first_statement]),
                        imports=[("torch", None)])

    def _report_at_top_of(self, function: cst.FunctionDef, enable: cst.BaseStatement) -> None:
        first = function.body.body[0]
        if m.matches(first, m.SimpleStatementLine(body=[m.Expr(value=m.SimpleString() | m.ConcatenatedString())])):
            self.report(first, replacement=cst.FlattenSentinel([first, enable]), imports=[("torch", None)])
        else:
            self.report(first, replacement=cst.FlattenSentinel([enable, first]), imports=[("torch", None)])

    def _outermost_function(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        outermost = None
        current = self.context.parents.get(node)
        while current is not None:
            if isinstance(current, cst.FunctionDef):
                outermost = current
            current = self.context.parents.get(current)
        return outermost

    def _module_statement(self, node: cst.CSTNode) -> cst.CSTNode:
        current = node
        while not isinstance(self.context.parents.get(current), cst.Module):
            current = self.context.parents.get(current)
        return current
