from __future__ import annotations

import libcst as cst

from codemod.analysis import match as m
from codemod.analysis.kinds import Place
from codemod.analysis.names import kwarg, positional
from codemod.edits import AddKeyword
from codemod.rule import Invalid, Level, Rule, Valid

FUSABLE = {"torch.optim.Adam", "torch.optim.AdamW", "torch.optim.SGD"}
# Arguments that pick the implementation or that fused=True rejects
# (`fused` does not support `differentiable`; `fused` and `foreach` cannot both be True).
CONFLICTS = ("fused", "foreach", "capturable", "differentiable")
# Device types with fused Adam, AdamW and SGD kernels in torch 2.13
# (torch.utils._foreach_utils._get_fused_kernels_supported_devices).
FUSED_DEVICE_TYPES = frozenset({"cuda", "cpu", "mps", "xpu", "hpu"})

UNKNOWN_DEVICE = (
    "optimizer steps without fused kernels; pass fused=True if `{device}` is a CUDA device or the CPU "
    "(not fixed: the device cannot be told)"
)
UNFUSED = "optimizer steps without fused kernels; pass fused=True"
PREPARED = (
    "optimizer steps without fused kernels; pass fused=True if `{prepare}` puts the model on CUDA "
    "(not fixed: the device is chosen there)"
)
UNKNOWN_PARAMETERS = (
    "optimizer steps without fused kernels; pass fused=True if all its parameters are on one CUDA device "
    "(not fixed: they are not all parameters of a model moved there)"
)

PREAMBLE = """\
import torch
import torch.nn as nn
device = torch.device("cuda")
"""


class UnfusedOptimizerOnCuda(Rule):
    """
    ## What it does
    Finds `torch.optim.Adam`, `AdamW` and `SGD` built over the parameters of
    a model on CUDA without choosing an implementation, and passes
    `fused=True`.

    ## Why is this bad?
    Without `foreach` or `fused`, torch picks the *foreach* implementation on
    CUDA: each step of the update (moment updates, bias correction, weight
    decay, the parameter write) is a separate multi-tensor kernel that reads
    and writes every parameter and state tensor again. The fused
    implementation does the whole update in one kernel per group of tensors,
    reading each tensor once. Typical gain: the optimizer step gets 1.5-3x
    faster, a few percent of step time for large models and more for small
    ones, where the step is bound by kernel launches.

    Checked against torch 2.13: fused Adam, AdamW and SGD also exist on the
    CPU (float32, float64, bfloat16 and float16 parameters all step), on MPS,
    XPU and HPU, so a script whose device is `"cuda" if
    torch.cuda.is_available() else "cpu"` (or a function that picks CUDA, MPS
    or the CPU) gets `fused=True` too: it is valid on each.

    The device is followed where the script keeps it: a variable, a `self.`
    attribute set in `__init__` or `setup`, a config object (a dataclass
    field's default or what its construction passes, a dict literal), an
    argparse option limited by `choices`, what a function of the file
    returns, a parameter to what every call passes; the parameters through
    factories (`build_optimizer(cfg, model.parameters())`), dicts of
    `named_parameters()` and lists filled by `append`; a copy of a model
    (`copy.deepcopy`) sits where the model does.

    ## Example
    ```python
    model = Net().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    ```
    Use instead:
    ```python
    model = Net().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    ```

    ## Fix safety
    Numeric: the fused kernel computes the same update in another order of
    floating-point operations (with fused multiply-adds), so parameters drift
    apart in the last bits. Measured on the CPU with torch 2.13 (a small MLP,
    20 steps, 10 seeds): AdamW's parameters differ by at most 1.0e-7 and
    Adam's by 8.9e-8 from the default implementation; SGD with momentum was
    bit for bit the same.

    The fix is offered only when every parameter provably comes from
    `.parameters()` / `.named_parameters()` of models (param groups,
    comprehensions, `filter`, lists built by appending them) that are moved,
    before the optimizer is built, to one device that is CUDA or may be CUDA
    or the CPU. Left alone: an explicit `fused`, `foreach`, `capturable` or
    `differentiable` argument, `**kwargs`, other optimizers, models that are
    not moved (they train on the CPU) or are moved after the optimizer is
    built, models whose submodules are moved on their own or that sit on
    different devices (parameters spread over devices), and SGD in a file with
    `sparse=True` (fused SGD rejects sparse gradients). Reported without a fix:
    parameters that are not all a model's, models moved to a device the
    analysis cannot tell (an argparse option that takes any value), models
    placed by `accelerator.prepare(...)`, and scripts that ask for exact
    float32 results (deterministic algorithms, TF32 turned off).
    """

    CODE = "PM402"
    NAME = "unfused-optimizer"
    LEVEL = Level.NUMERIC
    REQUIRES = ("Adam", "SGD")
    MESSAGE = "optimizer steps without fused kernels though its parameters are on CUDA; pass fused=True"
    GAIN = "optimizer step 1.5-3x faster: one fused kernel per tensor group instead of one per update term"

    VALID = [
        Valid(
            PREAMBLE
            + "model = nn.Linear(8, 1)\nopt = torch.optim.AdamW(model.parameters())\nx = torch.zeros(1).cuda()\n",
            "the model stays on the CPU",
        ),
        Valid(
            PREAMBLE + "model = nn.Linear(8, 1).to('cpu')\nopt = torch.optim.AdamW(model.parameters())\n"
            "x = torch.zeros(1).cuda()\n",
            "moved to the CPU",
        ),
        Valid(
            PREAMBLE
            + "model = nn.Linear(8, 1).to(device)\nopt = torch.optim.AdamW(model.parameters(), foreach=False)\n",
            "an explicit implementation",
        ),
        Valid(
            PREAMBLE + "model = nn.Linear(8, 1).to(device)\nopt = torch.optim.Adam(model.parameters(), fused=False)\n",
            "an explicit choice",
        ),
        Valid(
            PREAMBLE
            + "model = nn.Linear(8, 1).to(device)\nopt = torch.optim.Adam(model.parameters(), capturable=True)\n",
            "capturable: CUDA-graph set-up, left to its author",
        ),
        Valid(
            PREAMBLE + "model = nn.Linear(8, 1).to(device)\n"
            "opt = torch.optim.SGD(model.parameters(), lr=0.1, differentiable=True)\n",
            "fused rejects differentiable",
        ),
        Valid(
            PREAMBLE + "model = nn.Linear(8, 1).to(device)\nopt = torch.optim.RMSprop(model.parameters())\n",
            "no fused RMSprop",
        ),
        Valid(
            PREAMBLE
            + "model = nn.Linear(8, 1).to(device)\nkw = {'lr': 0.1}\nopt = torch.optim.SGD(model.parameters(), **kw)\n",
            "**kwargs may hold fused or foreach",
        ),
        Valid(
            PREAMBLE + "model = nn.Linear(8, 1)\nopt = torch.optim.AdamW(model.parameters())\nmodel.to(device)\n",
            "built before the model is moved",
        ),
        Valid(
            PREAMBLE + "model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 1)).to(device)\nmodel[1].to('cuda:1')\n"
            "opt = torch.optim.AdamW(model.parameters())\n",
            "a submodule on another device",
        ),
        Valid(
            PREAMBLE + "a = nn.Linear(8, 8).to('cuda:0')\nb = nn.Linear(8, 1).to('cuda:1')\n"
            "opt = torch.optim.AdamW(list(a.parameters()) + list(b.parameters()))\n",
            "two models on two devices",
        ),
        Valid(
            PREAMBLE + "model = nn.Embedding(10, 4, sparse=True).to(device)\n"
            "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n",
            "fused SGD rejects sparse gradients",
        ),
        Valid(
            "import torch\nmodel = torch.nn.Linear(8, 1).to('mps')\nopt = torch.optim.AdamW(model.parameters())\n",
            "no CUDA in the file",
        ),
    ]
    INVALID = [
        Invalid(
            PREAMBLE + "model = nn.Linear(8, 1).cuda()\nopt = torch.optim.Adam(model.parameters(), lr=1e-3)\n",
            PREAMBLE
            + "model = nn.Linear(8, 1).cuda()\nopt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)\n",
        ),
        Invalid(
            "import torch\nfrom torch.optim import AdamW as Opt\n"
            "device = 'cuda' if torch.cuda.is_available() else 'cpu'\n"
            "model = torch.nn.Linear(8, 1)\nmodel.to(device)\nopt = Opt(model.parameters())\n",
            "import torch\nfrom torch.optim import AdamW as Opt\n"
            "device = 'cuda' if torch.cuda.is_available() else 'cpu'\n"
            "model = torch.nn.Linear(8, 1)\nmodel.to(device)\nopt = Opt(model.parameters(), fused=True)\n",
            "CUDA or the CPU: fused kernels exist on both",
        ),
        Invalid(
            PREAMBLE + "model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 1)).to(device)\n"
            "opt = torch.optim.SGD(\n    [\n        {'params': model[0].parameters()},\n"
            "        {'params': model[1].parameters(), 'lr': 1e-3},\n    ],\n    lr=0.1,\n    momentum=0.9,\n)\n",
            PREAMBLE + "model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 1)).to(device)\n"
            "opt = torch.optim.SGD(\n    [\n        {'params': model[0].parameters()},\n"
            "        {'params': model[1].parameters(), 'lr': 1e-3},\n    ],\n    lr=0.1,\n    momentum=0.9,\n"
            "    fused=True,\n)\n",
            "param groups of one model",
        ),
        Invalid(
            PREAMBLE + "model = torch.compile(nn.Linear(8, 1).to(device))\n"
            "decay = [p for n, p in model.named_parameters() if p.dim() >= 2]\n"
            "other = [p for n, p in model.named_parameters() if p.dim() < 2]\n"
            "groups = [{'params': decay, 'weight_decay': 0.1}, {'params': other, 'weight_decay': 0.0}]\n"
            "opt = torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95))\n",
            PREAMBLE + "model = torch.compile(nn.Linear(8, 1).to(device))\n"
            "decay = [p for n, p in model.named_parameters() if p.dim() >= 2]\n"
            "other = [p for n, p in model.named_parameters() if p.dim() < 2]\n"
            "groups = [{'params': decay, 'weight_decay': 0.1}, {'params': other, 'weight_decay': 0.0}]\n"
            "opt = torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95), fused=True)\n",
            "weight-decay groups from named_parameters()",
        ),
        Invalid(
            PREAMBLE + "model = nn.Linear(8, 1).to(args.device)\nopt = torch.optim.AdamW(model.parameters())\n",
            None,
            "a device the analysis cannot tell",
        ),
        Invalid(
            PREAMBLE + "model = nn.Linear(8, 1).to(device)\nscale = torch.ones(1, requires_grad=True)\n"
            "opt = torch.optim.AdamW(list(model.parameters()) + [scale])\n",
            None,
            "a tensor that is not a model's parameter",
        ),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        names = self.context.names
        if not names.is_(node.func, *FUSABLE) or any(arg.star for arg in node.args):
            return
        if any(kwarg(node, name) is not None for name in CONFLICTS):
            return
        training = self.context.training
        params = kwarg(node, "params") or positional(node, 0)
        if training.cuda_use is None or params is None:
            return
        if names.is_(node.func, "torch.optim.SGD") and self._has_sparse_gradients():
            return
        models = training.parameter_model_sites(params.value, node)
        if models is None:
            self.report(node, UNKNOWN_PARAMETERS)
            return
        placed = [self._placed(model, at) for model, at in models]
        if any(model is None or model.split for model in placed):
            prepare = self._prepared_by(node)
            if prepare is not None and not any(model is not None and model.split for model in placed):
                self.report(node, PREPARED.format(prepare=self.context.source(prepare.func)))
            return  # not moved before the optimizer is built (CPU), or spread over devices
        devices = {training.code(model.device) if model.device is not None else "cuda" for model in placed}
        if len(devices) > 1:
            return
        types = [
            training.device_types(model.device) if model.device is not None else frozenset({"cuda"}) for model in placed
        ]
        if all(t is not None for t in types):
            known = frozenset().union(*types)
            if "cuda" not in known:
                return  # never on CUDA (the CPU, MPS): the rule is about CUDA steps
            if known <= FUSED_DEVICE_TYPES and training.exact_float32 is not None:
                self.report(
                    node,
                    f"{UNFUSED} (not fixed: the script asks for exact float32 results, line "
                    f"{self.context.line(training.exact_float32)}; the fused kernel rounds differently)",
                )
                return
            if known <= FUSED_DEVICE_TYPES:
                self.report(node, edits=[AddKeyword(node, "fused", cst.Name("True"))])
                return
        elif not frozenset().union(*(model.places for model in placed)) & {Place.CUDA, Place.UNKNOWN}:
            return
        self.report(node, UNKNOWN_DEVICE.format(device=devices.pop()))

    def _placed(self, expr: cst.BaseExpression, at: cst.Call, depth: int = 0):
        """The model (`model` for `model[0]` or `model.head`) that is moved before `at`;
        for a copy (`local = copy.deepcopy(global_model)`), the model it copies."""
        training = self.context.training
        current = expr
        while True:
            if isinstance(current, (cst.Name, cst.Attribute)):
                model = training.model(current, at)
                if model.move is not None:
                    return model
                copied = self._copied(current)
                if copied is not None and depth < 4:
                    return self._placed(copied, at, depth + 1)
            if not isinstance(current, (cst.Attribute, cst.Subscript)):
                return None
            current = current.value

    def _prepared_by(self, optimizer: cst.Call) -> cst.Call | None:
        """`accelerator.prepare(model, optimizer, ...)` (Accelerate, Fabric, DeepSpeed
        style) that is handed the optimizer this call builds: it picks the device."""
        statement = self.context.parents.get(optimizer)
        if not (
            isinstance(statement, cst.Assign)
            and len(statement.targets) == 1
            and isinstance(statement.targets[0].target, cst.Name)
        ):
            return None
        name = statement.targets[0].target.value
        for call in self.context.index.find(cst.Call):
            if (
                isinstance(call.func, cst.Attribute)
                and call.func.attr.value in ("prepare", "setup", "initialize")
                and any(isinstance(a.value, cst.Name) and a.value.value == name for a in call.args)
                and self.context.index.before(optimizer, call)
            ):
                return call
        return None

    def _copied(self, expr: cst.BaseExpression) -> cst.BaseExpression | None:
        """`m` for a name bound only to `copy.deepcopy(m)` (a copy keeps the device)."""
        values = self.context.loops.values_of(expr)
        if (
            len(values) == 1
            and isinstance(values[0], cst.Call)
            and len(values[0].args) == 1
            and self.context.names.is_(values[0].func, "copy.deepcopy")
        ):
            return values[0].args[0].value
        return None

    def _has_sparse_gradients(self) -> bool:
        """`nn.Embedding(..., sparse=True)` (or any `sparse=True`) somewhere in the file."""
        if "sparse" not in self.context.code:
            return False
        return any(
            arg.keyword is not None and arg.keyword.value == "sparse" and m.matches(arg.value, m.Name("True"))
            for arg in self.context.index.find(cst.Arg)
        )
