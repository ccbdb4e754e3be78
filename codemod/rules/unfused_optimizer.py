from __future__ import annotations

import functools

import libcst as cst

from codemod.analysis import match as m
from codemod.analysis.kinds import Kind, Place
from codemod.analysis.local_calls import local_calls
from codemod.analysis.names import kwarg, method_name, positional
from codemod.analysis.torch_facts import (
    COMPLEX_DTYPES,
    DEVICE_AND_DTYPE_KEEPING_METHODS,
    FLOAT_DTYPES,
    FUSED_CONFLICTS,
    FUSED_DEVICE_TYPES,
    FUSED_EVERYWHERE,
    FUSED_OPTIMIZERS,
    LAUNCH_FUSED_TYPES,
    SAME_DEVICE_MODEL_WRAPPERS,
    TENSOR_FACTORIES,
)
from codemod.analysis.training import Model
from codemod.edits import AddKeyword
from codemod.rule import Invalid, Level, Rule, Valid

UNKNOWN_DEVICE = (
    "optimizer steps without fused kernels; pass fused=True if `{device}` is a CUDA device or the CPU "
    "(not fixed: the device cannot be told)"
)
UNFUSED = "optimizer steps without fused kernels; pass fused=True"
DEFAULT_DEVICE = (
    "optimizer steps without fused kernels though `{device}` is {types} as the script is written, "
    "where fused kernels exist; pass fused= for those device types (another device given on the "
    "command line keeps the unfused step)"
)
PREPARED = (
    "optimizer steps without fused kernels; pass fused=True if `{prepare}` puts the model on CUDA "
    "(not fixed: the device is chosen there)"
)
UNKNOWN_PARAMETERS = (
    "optimizer steps without fused kernels; pass fused=True if all its parameters are on one CUDA device "
    "(not fixed: they are not all parameters of a model moved there)"
)
UNKNOWN_TENSOR = (
    "optimizer steps without fused kernels; pass fused=True if all its parameters are on one CUDA device "
    "(not fixed: where `{part}` lives cannot be told)"
)
HOST = (
    "optimizer steps without fused kernels though its parameters stay on the CPU, where fused kernels exist; "
    "pass fused=True"
)
ON_DEVICE = "optimizer steps without fused kernels though the device `{device}` has them; pass fused=True"
MIXED = (
    "optimizer steps without fused kernels; pass fused=True once all its parameters are on one CUDA device "
    "(not fixed: `{part}` is on the host while other parameters are moved to a device)"
)
LAUNCHED = (
    "optimizer steps without fused kernels; `{device}` is the device the training engine or trainer picks "
    "at launch: fused= is set for CUDA and the CPU, where fused kernels exist"
)
NAMED_OPTIMIZER = (
    "optimizer steps without fused kernels; pass fused=True if `{callee}` is always {everywhere} "
    "(not fixed: the optimizer is named on the command line, and of torch.optim's optimizers all but "
    "{taking} reject the `fused` keyword itself, `fused=False` too, with a TypeError; "
    "give the option `choices=` of optimizers with fused kernels)"
)
NAMED_BY_OPTION = (
    "optimizer steps without fused kernels; `{flag}` has no `choices=`: its default {default} has fused "
    "kernels, but `{flag}` may name any optimizer of torch.optim, and all but {taking} reject the `fused` "
    "keyword itself, `fused=False` too, with a TypeError, so no `fused=` argument is valid for every value "
    "(not fixed: give `{flag}` `choices=` among {everywhere} to have it fixed)"
)
UNFUSED_EVERYWHERE = "unfusable"  # a complex tensor: fused kernels take floating-point tensors only
MAX_DEPTH = 8

PREAMBLE = """\
import torch
import torch.nn as nn
device = torch.device("cuda")
"""
ARGPARSE_DEVICE = """\
import argparse
import torch
import torch.nn as nn
ap = argparse.ArgumentParser()
ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
args = ap.parse_args()
"""


def _listed(names, conjunction: str = "and") -> str:
    """`torch.optim.Adam`, ... as "Adam, AdamW and SGD", sorted."""
    short = sorted(name.rpartition(".")[2] for name in names)
    return f"{', '.join(short[:-1])} {conjunction} {short[-1]}" if len(short) > 1 else short[0]


def _moved_to(model: Model) -> str:
    """The device type of a move without a device argument: `.cpu()` or `.cuda()`."""
    return "cpu" if model.places == frozenset({Place.HOST}) else "cuda"


class UnfusedOptimizer(Rule):
    """
    ## What it does
    Finds `torch.optim.Adam`, `AdamW` and `SGD` built over parameters on a
    device with fused optimizer kernels (CUDA, the CPU, MPS) without choosing
    an implementation, and passes `fused=True`.

    ## Why is this bad?
    Without `foreach` or `fused`, torch picks the *foreach* implementation on
    CUDA: each step of the update (moment updates, bias correction, weight
    decay, the parameter write) is a separate multi-tensor kernel that reads
    and writes every parameter and state tensor again. The fused
    implementation does the whole update in one kernel per group of tensors,
    reading each tensor once. Typical gain: the optimizer step gets 1.5-3x
    faster, a few percent of step time for large models and more for small
    ones, where the step is bound by kernel launches.

    Fused Adam, AdamW and SGD also exist on the CPU since torch 2.4 (float32,
    float64, bfloat16 and float16 parameters all step), on MPS, XPU and HPU.
    On the CPU the fused step is one pass over each tensor, parallel over
    its elements: measured with torch 2.13 on 2 cores, Adam and AdamW steps
    got 3-7x faster and SGD with momentum 1.3-2.5x
    (`python -m benchmarks.optimizer_step`). So a script whose device is
    `"cuda" if torch.cuda.is_available() else "cpu"`, or whose model stays on
    the CPU, gets `fused=True` too: it is valid on each.

    The device is followed where the script keeps it: a variable, a `self.`
    attribute set in `__init__` or `setup`, a config object (a dataclass
    field's default or what its construction passes, a dict literal), an
    argparse option limited by `choices`, what a function of the file
    returns, a parameter to what every call passes; the parameters through
    factories (`build_optimizer(cfg, model.parameters())`), dicts of
    `named_parameters()`, lists filled by `append` or `extend` and added
    with `+`; another name of a model (`net = model`, `copy.deepcopy(model)`,
    `DistributedDataParallel(model)` and its `.module`, `torch.compile(model)`)
    sits where the model does. Tensors trained directly count too: a tensor
    made with `requires_grad=True` or `requires_grad_()`, or wrapped in
    `nn.Parameter(...)`, sits where its factory's `device=` or its last
    `.to(device)` / `.cuda()` puts it (on the host without either), also in a
    comprehension (`[nn.Parameter(torch.randn(d, device=device)) for _ in
    range(n)]`) or a `self.` attribute.

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
    before the optimizer is built, or from tensors made for training (above),
    all on one device with fused kernels (CUDA, the CPU, MPS, or a choice
    among them). A model that is never moved counts as on the CPU only when
    it is built here on the host (by `torch.nn`, a class of this file whose
    `__init__` places nothing, or a function of this file returning one) and
    no call of the file moves it, before or after; the fused kernels need
    torch 2.4 or later there. Left alone: an explicit `fused`, `foreach`,
    `capturable` or `differentiable` argument, `**kwargs`, other optimizers,
    models built by libraries (`from_pretrained` may place them anywhere),
    models moved after the optimizer is built, devices without fused kernels
    (XLA), models whose submodules are moved on their own or parameters on
    two different devices (`cuda:0` and `cuda:1`), complex tensors (fused
    kernels take floating-point tensors only), tensors made under
    `torch.set_default_device`, and SGD in a file with `sparse=True` (fused
    SGD rejects sparse gradients). Reported without a fix: a parameter whose
    origin or device the analysis cannot tell (the message names it), a host
    tensor trained together with parameters moved to a device, an optimizer
    class named on the command line by an option without `choices` (of
    torch.optim's optimizers only Adagrad, Adam, AdamW and SGD take the
    `fused` keyword; the others, RMSprop say, reject it with a TypeError,
    `fused=False` too, so no `fused=` argument suits every name the option
    may take: give the option `choices=` among Adam, AdamW and SGD), and
    scripts that ask for exact float32 results (deterministic algorithms,
    TF32 turned off).

    A device picked when the script is launched gets a guard instead of
    `fused=True`: `fused=device.type in ("cuda", "cpu")` for
    `device = accelerator.device` (accelerate, Lightning Fabric),
    `fused=accelerator.device.type in ("cuda", "cpu")` for a model that
    `accelerator.prepare(...)` places, and `fused=self.device.type in ("cuda",
    "cpu")` in a LightningModule's `configure_optimizers()`, which its Trainer
    calls once the module is on the device it picked. The class may also be
    `getattr(torch.optim, name)` where `name` is a literal or an option whose
    `choices` all have fused kernels.
    """

    CODE = "PM402"
    NAME = "unfused-optimizer"
    LEVEL = Level.NUMERIC
    REQUIRES = ("Adam", "SGD")
    MESSAGE = "optimizer steps without fused kernels though its parameters are on CUDA; pass fused=True"
    GAIN = (
        "optimizer step faster: one fused kernel per tensor group instead of one per update term "
        "(1.5-3x on CUDA in the literature; Adam 3-7x, SGD 1.3-2.5x measured on the CPU)"
    )

    VALID = [
        Valid(
            PREAMBLE + "model = nn.Linear(8, 1).to('xla')\nopt = torch.optim.AdamW(model.parameters())\n",
            "a device without fused kernels",
        ),
        Valid(
            "import torch\nfrom transformers import AutoModel\n"
            "model = AutoModel.from_pretrained('gpt2')\nopt = torch.optim.AdamW(model.parameters())\n",
            "built by a library that may place it anywhere (no CUDA in the file)",
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
    ]
    INVALID = [
        Invalid(
            "import torch\nimport torch.nn as nn\n"
            "model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))\n"
            "opt = torch.optim.AdamW(model.parameters(), lr=1e-3)\n",
            "import torch\nimport torch.nn as nn\n"
            "model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))\n"
            "opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)\n",
            "the model stays on the CPU, which has fused kernels",
        ),
        Invalid(
            "import torch\nmodel = torch.nn.Linear(8, 1).to('mps')\nopt = torch.optim.AdamW(model.parameters())\n",
            "import torch\nmodel = torch.nn.Linear(8, 1).to('mps')\n"
            "opt = torch.optim.AdamW(model.parameters(), fused=True)\n",
            "MPS has fused kernels too",
        ),
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
            "import torch\nmodel = torch.nn.Linear(8, 1)\n"
            'opt = getattr(torch.optim, "AdamW")(model.parameters(), lr=1e-3)\n',
            "import torch\nmodel = torch.nn.Linear(8, 1)\n"
            'opt = getattr(torch.optim, "AdamW")(model.parameters(), lr=1e-3, fused=True)\n',
            "the optimizer class named by getattr with a literal name",
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
            ARGPARSE_DEVICE + "device = torch.device(args.device)\nmodel = nn.Linear(8, 1).to(device)\n"
            "opt = torch.optim.AdamW(model.parameters(), lr=3e-4)\n",
            ARGPARSE_DEVICE + "device = torch.device(args.device)\nmodel = nn.Linear(8, 1).to(device)\n"
            'opt = torch.optim.AdamW(\n    model.parameters(), lr=3e-4, fused=device.type in ("cuda", "cpu")\n)\n',
            "an argparse device whose default is CUDA or the CPU: fused on those, as the option may name another",
        ),
        Invalid(
            ARGPARSE_DEVICE + "model = nn.Linear(8, 1).to(args.device)\nopt = torch.optim.Adam(model.parameters())\n",
            None,
            "the option's string read where it is used: no name for the guard to read",
        ),
        Invalid(
            ARGPARSE_DEVICE + "device = args.device\nmodel = nn.Linear(8, 1).to(device)\n"
            "opt = torch.optim.Adam(model.parameters())\n",
            ARGPARSE_DEVICE + "device = args.device\nmodel = nn.Linear(8, 1).to(device)\n"
            'opt = torch.optim.Adam(\n    model.parameters(), fused=torch.device(device).type in ("cuda", "cpu")\n)\n',
            "the device as a string",
        ),
        Invalid(
            ARGPARSE_DEVICE + "device = torch.device(args.device)\nmodel = nn.Linear(8, 1).to(device)\n"
            "device = torch.device('cpu')\nopt = torch.optim.Adam(model.parameters())\n",
            None,
            "the name is rebound between the move and the optimizer",
        ),
        Invalid(
            PREAMBLE + "model = nn.Linear(8, 1).to(device)\nscale = torch.ones(1, requires_grad=True)\n"
            "opt = torch.optim.AdamW(list(model.parameters()) + [scale])\n",
            None,
            "a tensor that is not a model's parameter",
        ),
    ]

    def _named_optimizer(self, node: cst.Call, written: frozenset[str]) -> str:
        """Why `getattr(torch.optim, name)(...)` is not fixed: the name is an option (or
        another value) whose value as written has fused kernels but whose others may not."""
        taking = _listed(FUSED_OPTIMIZERS)
        everywhere = _listed(FUSED_EVERYWHERE, "or")
        name = node.func.args[1].value if isinstance(node.func, cst.Call) else None
        option = (
            self.context.command_line.option(name.attr.value)
            if isinstance(name, cst.Attribute) and isinstance(name.value, cst.Name)
            else None
        )
        flag = (
            next(
                (a.value for a in option.call.args if a.keyword is None and isinstance(a.value, cst.SimpleString)),
                None,
            )
            if option is not None and option.choices is None
            else None
        )
        if flag is not None and len(written) == 1:
            return NAMED_BY_OPTION.format(
                flag=flag.evaluated_value,
                default=next(iter(written)).rpartition(".")[2],
                taking=taking,
                everywhere=_listed(FUSED_EVERYWHERE),
            )
        return NAMED_OPTIMIZER.format(callee=self.context.source(node.func), everywhere=everywhere, taking=taking)

    def visit_Call(self, node: cst.Call) -> None:
        training = self.context.training
        classes = training.callee_names(node)
        if classes is None or not classes <= FUSED_EVERYWHERE or any(arg.star for arg in node.args):
            written = training.callee_names(node, written=True) if classes is None else None
            if written and written <= FUSED_EVERYWHERE and not any(arg.star for arg in node.args):
                self.report(node, self._named_optimizer(node, written))
            return
        if any(kwarg(node, name) is not None for name in FUSED_CONFLICTS):
            return
        params = kwarg(node, "params") or positional(node, 0)
        if params is None:
            return
        if "torch.optim.SGD" in classes and self._has_sparse_gradients:
            return
        self._tensors: dict[cst.CSTNode, Model | str] = {}
        self._untold: cst.BaseExpression | None = None
        models = training.parameter_model_sites(params.value, node, tensors=self._tensor_sites)
        if models is None:
            if self._untold is not None:
                self.report(node, UNKNOWN_TENSOR.format(part=_short(self.context.source(self._untold))))
            else:
                self.report(node, UNKNOWN_PARAMETERS)
            return
        if any(self._tensors.get(model) == UNFUSED_EVERYWHERE for model, _ in models):
            return  # a complex parameter: fused=True would be rejected
        placed = [self._tensor_or_model(model, at) for model, at in models]
        host = next((model for (model, _), where in zip(models, placed) if where is None), None)
        moved = [model for model in placed if model is not None]
        if host is not None and moved and not any(model.split for model in moved) and self._may_be_cuda(moved):
            self.report(node, MIXED.format(part=_short(self.context.source(host))))
            return
        if models and all(training.trainer_placed(model, at) is not None for model, at in models):
            # `self` of a LightningModule in its `configure_optimizers()`: already on the trainer's device
            self._fuse(node, LAUNCHED.format(device="self.device"), cst.parse_expression(_guard("self.device.type")))
            return
        if any(model is None or model.split for model in placed):
            prepare = self._prepared_by(node)
            if prepare is not None and not any(model is not None and model.split for model in placed):
                engine = prepare.func.value if isinstance(prepare.func, cst.Attribute) else None
                guard = self._engine_guard(engine, node) if engine is not None else None
                if guard is not None:
                    self._fuse(node, LAUNCHED.format(device=f"{engine.value}.device"), guard)
                else:
                    self.report(node, PREPARED.format(prepare=self.context.source(prepare.func)))
            elif not moved and all(self._stays_on_host(model) for model, _ in models):
                self._fuse(node, HOST)
            return  # moved after the optimizer is built, or spread over devices
        devices = {training.code(model.device) if model.device is not None else _moved_to(model) for model in placed}
        if len(devices) > 1:
            return
        types = [
            training.device_types(model.device) if model.device is not None else frozenset({_moved_to(model)})
            for model in placed
        ]
        if all(t is not None for t in types):
            known = frozenset().union(*types)
            if known <= FUSED_DEVICE_TYPES:
                self._fuse(node, None if "cuda" in known else ON_DEVICE.format(device=devices.pop()))
                return
            if "cuda" not in known:
                return  # a device without fused kernels (XLA, ...)
        elif not frozenset().union(*(model.places for model in placed)) & {Place.CUDA, Place.UNKNOWN}:
            return
        device = placed[0].device
        engine = self._launched(device) if device is not None else None
        guard = self._engine_guard(engine, node, device) if engine is not None else None
        if guard is not None:
            self._fuse(node, LAUNCHED.format(device=devices.pop()), guard)
            return
        guard = self._device_type_guard(device, node) if device is not None else None
        if guard is not None:
            types = " or ".join(sorted(training.device_types(device, written=True), key=_cuda_first))
            self._fuse(node, DEFAULT_DEVICE.format(device=devices.pop(), types=types), guard)
            return
        self.report(node, UNKNOWN_DEVICE.format(device=devices.pop()))

    def _launched(self, device: cst.BaseExpression) -> cst.Name | None:
        """The training engine (`accelerator` of `accelerator = Accelerator()`, a Fabric) whose
        `.device` `device` is, directly or through names bound only to it: a device that the
        engine picks when the script is launched."""
        training = self.context.training
        sources = training.value_sources(device) if isinstance(device, cst.Name) else [device]
        engines = [
            s.value
            for s in sources
            if isinstance(s, cst.Attribute) and s.attr.value == "device" and isinstance(s.value, cst.Name)
        ]
        if not sources or len(engines) != len(sources) or len({e.value for e in engines}) != 1:
            return None
        return engines[0] if training.precision_owner(engines[0]) is not None else None

    def _engine_guard(
        self, engine: cst.BaseExpression, at: cst.Call, device: cst.BaseExpression | None = None
    ) -> cst.BaseExpression | None:
        """`device.type in ("cuda", "cpu")` (or `accelerator.device.type ...`) for a device the
        engine picks at launch, when the names mean the same at the optimizer; else None."""
        if not isinstance(engine, cst.Name) or self.context.training.precision_owner(engine) is None:
            return None
        spelled = device if isinstance(device, cst.Name) else engine
        scope = self.context.scopes.get(spelled)
        if scope is None or scope is not self.context.scopes.get(at) or len(scope[spelled.value]) != 1:
            return None  # another function's name, or rebound: it may mean something else there
        device_type = f"{spelled.value}.type" if spelled is device else f"{engine.value}.device.type"
        return cst.parse_expression(_guard(device_type))

    def _device_type_guard(self, device: cst.BaseExpression, at: cst.Call) -> cst.BaseExpression | None:
        """`device.type in ("cuda", "cpu")`, over the types `device` has as the script is
        written (an argparse default) when all have fused kernels and the name means the
        same at the optimizer; None otherwise."""
        training = self.context.training
        written = training.device_types(device, written=True)
        if not written or not written <= FUSED_DEVICE_TYPES or not isinstance(device, cst.Name):
            return None
        scope = self.context.scopes.get(device)
        if scope is None or scope is not self.context.scopes.get(at) or len(scope[device.value]) != 1:
            return None  # `device` is another function's, or rebound: it may mean something else there
        sources = training.value_sources(device)
        if sources and all(isinstance(s, cst.Call) and self.context.names.is_(s.func, "torch.device") for s in sources):
            device_type = f"{device.value}.type"
        elif sources and all(s is not None and training.device_types(s, written=True) for s in sources):
            device_type = f"torch.device({device.value}).type"
        else:
            return None
        types = sorted(written, key=_cuda_first)
        if len(types) == 1:
            return cst.parse_expression(f'{device_type} == "{types[0]}"')
        return cst.parse_expression(f"{device_type} in ({', '.join(f'{t!r}' for t in types)})".replace("'", '"'))

    def _fuse(self, node: cst.Call, message: str | None, value: cst.BaseExpression | None = None) -> None:
        """Pass `fused=True` (or `fused=value`), unless the script asks for exact float32 results."""
        exact = self.context.training.exact_float32
        if exact is not None:
            self.report(
                node,
                f"{UNFUSED} (not fixed: the script asks for exact float32 results, line "
                f"{self.context.line(exact)}; the fused kernel rounds differently)",
            )
            return
        self.report(node, message, edits=[AddKeyword(node, "fused", value or cst.Name("True"))])

    def _may_be_cuda(self, placed: list[Model]) -> bool:
        training = self.context.training
        for model in placed:
            types = training.device_types(model.device) if model.device is not None else frozenset({_moved_to(model)})
            if types is None:
                if model.places & {Place.CUDA, Place.UNKNOWN}:
                    return True
            elif "cuda" in types:
                return True
        return False

    def _stays_on_host(self, part: cst.BaseExpression) -> bool:
        """Whether a part of the parameters that no call moves before the optimizer is
        built is on the CPU for good: a tensor made on the host, or a model built here
        on the host (by torch.nn, a class of this file, or a function of this file that
        returns one) that no call of the file moves to a device, before or after."""
        if part in self._tensors:
            return True  # `_tensor_or_model` found it made on the host
        if "set_default_device" in self.context.code or "set_default_tensor_type" in self.context.code:
            return False
        return self._built_on_host(part, 0)

    def _built_on_host(self, expr: cst.BaseExpression, depth: int) -> bool:
        if depth > MAX_DEPTH:
            return False
        training = self.context.training
        if isinstance(expr, cst.Call):
            wrapped = self._wrapped(expr)
            if wrapped is not None:
                return self._built_on_host(wrapped, depth + 1)
            if kwarg(expr, "device") is not None or kwarg(expr, "device_map") is not None:
                return False
            returned = self.context.loops.returned(expr)
            if returned:
                return all(self._built_on_host(value, depth + 1) for value in returned)
            classdef = self.context.kinds.local_class(expr.func)
            if classdef is not None:
                return not self._places_itself(classdef)
            return self.context.names.startswith(expr.func, ("torch.nn",)) is not None
        if isinstance(expr, (cst.Subscript, cst.Attribute)) and training.is_model(expr.value):
            return self._built_on_host(expr.value, depth + 1)  # `model[0]`, `model.head`
        if not isinstance(expr, (cst.Name, cst.Attribute)) or training.moved_anywhere(training.code(expr)):
            return False
        sources = training.value_sources(expr) if isinstance(expr, cst.Name) else self.context.loops.values_of(expr)
        return bool(sources) and all(s is not None and self._built_on_host(s, depth + 1) for s in sources)

    def _places_itself(self, classdef: cst.ClassDef) -> bool:
        """A module class whose constructor may put its weights on a device: its `__init__`
        (or that of a base class of this file it inherits) calls `.to(...)` / `.cuda()` or
        passes `device=` to what it builds."""
        init = local_calls(self.context).method(classdef, "__init__")
        if init is None:
            return False
        return any(
            method_name(call) in ("to", "cuda") or kwarg(call, "device") is not None
            for call in self.context.index.find(cst.Call, within=init)
        )

    def _tensor_or_model(self, expr: cst.BaseExpression, at: cst.CSTNode | None):
        """The placement of one part of the parameters: a tensor followed by
        `_tensor_sites` (None: on the host), else the model whose parameters it is."""
        if expr in self._tensors:
            found = self._tensors[expr]
            return found if isinstance(found, Model) and found.move is not None else None
        return self._placed(expr, at)

    def _placed(self, expr: cst.BaseExpression, at: cst.CSTNode | None, depth: int = 0):
        """The model (`model` for `model[0]` or `model.head`) that is moved before `at`;
        for another name of it (`net = model`, `local = copy.deepcopy(model)`, `ddp =
        DistributedDataParallel(model)` and its `.module`, `torch.compile(model)`), the
        model it names, when every binding names the same placed model."""
        training = self.context.training
        current = expr
        while True:
            if isinstance(current, cst.Call) and depth < MAX_DEPTH:
                wrapped = self._wrapped(current)
                return self._placed(wrapped, at, depth + 1) if wrapped is not None else None
            if isinstance(current, cst.IfExp) and depth < MAX_DEPTH:
                return self._same_model([self._placed(v, at, depth + 1) for v in (current.body, current.orelse)])
            if isinstance(current, (cst.Name, cst.Attribute)):
                model = training.model(current, at)
                if model.move is not None:
                    return model
                if depth < MAX_DEPTH:
                    aliased = self._aliased(current, at, depth)
                    if aliased is not None:
                        return aliased
            if not isinstance(current, (cst.Attribute, cst.Subscript)):
                return None
            current = current.value

    def _aliased(self, expr: cst.BaseExpression, at: cst.CSTNode | None, depth: int) -> Model | None:
        """The placed model every binding of `expr` names (all on one device), else None."""
        values = self.context.loops.values_of(expr)
        if not values or any(v is expr for v in values):
            return None
        found = []
        for value in values:  # (one binding that is not a placed model settles it)
            model = self._placed(value, at, depth + 1)
            if model is None:
                return None
            found.append(model)
        return self._same_model(found)

    def _same_model(self, found: list[Model | None]) -> Model | None:
        """The placement all of `found` share, else None."""
        if not found or any(model is None for model in found):
            return None
        training = self.context.training
        keys = {(training.code(m.device) if m.device is not None else None, m.places, m.split) for m in found}
        return found[0] if len(keys) == 1 else None

    def _wrapped(self, call: cst.Call) -> cst.BaseExpression | None:
        """`m` of `DistributedDataParallel(m, ...)`, `torch.compile(m)`, `copy.deepcopy(m)`."""
        first = positional(call, 0) or kwarg(call, "module") or kwarg(call, "model")
        if first is None or not self.context.names.is_(call.func, *SAME_DEVICE_MODEL_WRAPPERS):
            return None
        return first.value

    # -- tensors made to be trained ----------------------------------------------

    def _tensor_sites(self, expr: cst.BaseExpression, at: cst.CSTNode | None):
        """Asked by the parameter analysis about a part that is no model's parameters:
        a tensor whose device can be followed stands for itself."""
        if isinstance(expr, cst.Attribute) and self.context.training.is_model(expr.value):
            return [(expr, at)]  # `model.weight`: where the model is
        found = self._tensor_place(expr, 0, set())
        if found is None or found == ():
            if self._untold is None or not self.context.inside(self._untold, expr):
                self._untold = expr  # the innermost part that cannot be told is the one to name
            return None
        self._tensors[expr] = found
        return [(expr, at)]

    def _tensor_place(self, expr: cst.BaseExpression, depth: int, seen: set) -> Model | str | None:
        """Where the tensor `expr` is made: a Model whose `move` is the call that puts it
        on a device (None: the host), UNFUSED_EVERYWHERE for a complex tensor, None when it
        cannot be told. Followed through names, `self.` attributes, `nn.Parameter`,
        `requires_grad_()` and other methods that keep the device, arithmetic with
        numbers, and what functions of this file return."""
        if depth > MAX_DEPTH:
            return None
        training = self.context.training
        if isinstance(expr, (cst.Name, cst.Attribute)):
            key = (id(self.context.scopes.get(expr)), training.code(expr))
            if key in seen:
                return ()  # a binding that refers to itself (`w = nn.Parameter(w)`): adds nothing
            seen = seen | {key}
            if isinstance(expr, cst.Name):
                sources = self._reaching_values(expr)
            else:
                sources = self.context.loops.values_of(expr)
            if not sources or any(source is None for source in sources):
                return None
            return self._join([self._tensor_place(source, depth + 1, seen) for source in sources])
        if isinstance(expr, cst.Call):
            return self._made_by(expr, depth, seen)
        if isinstance(expr, cst.BinaryOperation):
            sides = [side for side in (expr.left, expr.right) if self.context.kinds.fact(side).kind is Kind.TENSOR]
            return self._join([self._tensor_place(side, depth + 1, seen) for side in sides]) if sides else None
        if isinstance(expr, cst.UnaryOperation):
            return self._tensor_place(expr.expression, depth + 1, seen)
        if isinstance(expr, cst.IfExp):
            return self._join([self._tensor_place(v, depth + 1, seen) for v in (expr.body, expr.orelse)])
        if isinstance(expr, (cst.ListComp, cst.GeneratorExp)) and expr.for_in.inner_for_in is None:
            return self._tensor_place(expr.elt, depth + 1, seen)
        return None

    def _reaching_values(self, name: cst.Name) -> list[cst.BaseExpression | None]:
        """What `name` may hold where it is read: the assignments that reach it
        (`w = torch.randn(n); w = w.to(device)` reads the second), else every binding
        (a parameter: what the calls of its function pass)."""
        reaching = self.context.kinds.reaching(name)
        values = [self.context.bindings.assigned_value(a) for a in reaching]
        if reaching and all(v is not None for v in values):
            return values
        return self.context.training.value_sources(name)

    def _made_by(self, call: cst.Call, depth: int, seen: set) -> Model | str | None:
        training = self.context.training
        names = self.context.names
        code = training.code(call)
        first = positional(call, 0)
        if names.is_(call.func, "torch.nn.Parameter", "torch.nn.parameter.Parameter"):
            data = first or kwarg(call, "data")
            return self._tensor_place(data.value, depth + 1, seen) if data is not None else None
        if names.startswith(call.func, ("torch.nn.init.",)):
            return self._tensor_place(first.value, depth + 1, seen) if first is not None else None
        factory = next((n for n in names.of(call.func) if n in TENSOR_FACTORIES), None)
        if factory is not None:
            dtype = self._dtype(kwarg(call, "dtype"))
            if dtype != "float":
                return dtype
            device = kwarg(call, "device")
            if device is not None:
                return Model(code, call, device.value, training.device_places(device.value), False, None)
            if factory.endswith("_like"):
                return self._tensor_place(first.value, depth + 1, seen) if first is not None else None
            if "set_default_device" in self.context.code or "set_default_tensor_type" in self.context.code:
                return None
            return Model(code, None, None, frozenset(), False, None)  # made on the host
        receiver = call.func.value if isinstance(call.func, cst.Attribute) else None
        if receiver is not None and not isinstance(receiver, cst.Call) and names.startswith(receiver, ("torch",)):
            receiver = None  # `torch.sigmoid(...)`, `torch.nn.init.normal_(...)`: a function, no method
        method = method_name(call) if receiver is not None else None
        if receiver is None and names.startswith(call.func, ("torch",)):
            return None
        if method in DEVICE_AND_DTYPE_KEEPING_METHODS:
            return self._tensor_place(receiver, depth + 1, seen)
        if method in ("cfloat", "cdouble", "chalf"):
            return UNFUSED_EVERYWHERE
        if method == "cpu":
            return Model(code, None, None, frozenset(), False, None)
        if method == "cuda":
            index = first or kwarg(call, "device")
            if index is not None:
                return Model(code, call, index.value, training.device_places(index.value), False, None)
            return Model(code, call, None, frozenset({Place.CUDA}), False, None)
        if method == "to":
            return self._moved(call, receiver, depth, seen)
        returned = self.context.loops.returned(call)
        if returned:
            return self._join([self._tensor_place(v, depth + 1, seen) for v in returned])
        return None

    def _moved(self, call: cst.Call, receiver: cst.BaseExpression, depth: int, seen: set) -> Model | str | None:
        """`x.to(device)`, `x.to(device, dtype)`, `x.to(dtype=...)`."""
        kinds = self.context.kinds
        training = self.context.training
        if any(arg.star for arg in call.args):
            return None
        device = kwarg(call, "device")
        dtype = kwarg(call, "dtype")
        for arg in call.args:
            if arg.keyword is not None:
                continue
            if kinds.is_dtype(arg.value) and dtype is None:
                dtype = arg
            elif kinds.is_device(arg.value) and device is None:
                device = arg
            else:
                return None  # `.to(other)` or an argument that cannot be told
        kind = self._dtype(dtype)
        if kind != "float":
            return kind
        if device is None:
            return self._tensor_place(receiver, depth + 1, seen)
        return Model(training.code(call), call, device.value, training.device_places(device.value), False, None)

    def _dtype(self, arg: cst.Arg | None, depth: int = 0) -> str | None:
        """ "float" for no dtype or a floating one, UNFUSED_EVERYWHERE for a complex one, None when it cannot be told."""
        if arg is None:
            return "float"
        expr = arg.value if isinstance(arg, cst.Arg) else arg
        qualified = self.context.names.of(expr)
        if qualified & FLOAT_DTYPES:
            return "float"
        if qualified & COMPLEX_DTYPES:
            return UNFUSED_EVERYWHERE
        if isinstance(expr, cst.Name) and depth < 3:
            sources = self.context.training.value_sources(expr)
            kinds = {self._dtype(s, depth + 1) if s is not None else None for s in sources}
            if sources and len(kinds) == 1:
                return kinds.pop()
        return None

    def _join(self, found: list) -> Model | str | None | tuple:
        """One placement for several possible ones: all the same, else None (cannot be told).
        `()` stands for a binding that adds nothing."""
        found = [f for f in found if f != ()]
        if not found:
            return ()
        if any(f is None for f in found):
            return None
        if UNFUSED_EVERYWHERE in found:
            return UNFUSED_EVERYWHERE
        training = self.context.training
        keys = {(m.move is None, training.code(m.device) if m.device is not None else None, m.places) for m in found}
        return found[0] if len(keys) == 1 else None

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
        for call in self._prepare_calls:
            if any(isinstance(a.value, cst.Name) and a.value.value == name for a in call.args) and (
                self.context.index.before(optimizer, call)
            ):
                return call
        return None

    @functools.cached_property
    def _prepare_calls(self) -> list[cst.Call]:
        """The `x.prepare(...)`, `x.setup(...)`, `x.initialize(...)` calls of the file."""
        return [
            call
            for call in self.context.index.find(cst.Call)
            if isinstance(call.func, cst.Attribute) and call.func.attr.value in ("prepare", "setup", "initialize")
        ]

    @functools.cached_property
    def _has_sparse_gradients(self) -> bool:
        """`nn.Embedding(..., sparse=True)` (or any `sparse=True`) somewhere in the file."""
        if "sparse" not in self.context.code:
            return False
        return any(
            arg.keyword is not None and arg.keyword.value == "sparse" and m.matches(arg.value, m.Name("True"))
            for arg in self.context.index.find(cst.Arg)
        )


def _guard(device_type: str) -> str:
    """`<device_type> in ("cuda", "cpu")`: fused kernels wherever the run lands on one."""
    return f"{device_type} in ({', '.join(f'{t!r}' for t in LAUNCH_FUSED_TYPES)})".replace("'", '"')


def _cuda_first(device_type: str) -> tuple[bool, str]:
    return device_type != "cuda", device_type


def _short(code: str) -> str:
    """The first line of `code`, cut to a readable length."""
    line = code.strip().splitlines()[0] if code.strip() else code
    return line if len(line) <= 60 and line == code.strip() else line[:57].rstrip() + "..."
