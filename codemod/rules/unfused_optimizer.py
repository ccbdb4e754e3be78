from __future__ import annotations

import libcst as cst

from codemod.analysis.names import kwarg, positional
from codemod.analysis.placement import Parameters
from codemod.analysis.torch_facts import (
    FUSED_CONFLICTS,
    FUSED_DEVICE_TYPES,
    FUSED_EVERYWHERE,
    FUSED_OPTIMIZERS,
    LAUNCH_FUSED_TYPES,
)
from codemod.analysis.training import Model
from codemod.analysis.values import Place
from codemod.edits import AddKeyword
from codemod.rule import Invalid, Level, Rule, Valid

UNKNOWN_DEVICE = (
    "optimizer steps without fused kernels; pass fused=True if `{device}` is a CUDA device or the CPU "
    "(not fixed: the device cannot be told{why})"
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
    "(not fixed: where `{part}` lives cannot be told{why})"
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
    argparse option limited by `choices`, an f-string naming a CUDA device
    (`f"cuda:{rank}"`), what a function of the file or of the project's own
    modules returns (`device = get_device()`), a parameter to what every
    call of the file passes (a function no call of the file makes is
    reported with that reason), the process index `mp.spawn(main, ...)`
    passes as `main`'s first argument (`.to(rank)`: a CUDA ordinal); the parameters through
    factories (`build_optimizer(cfg, model.parameters())`), dicts of
    `named_parameters()`, lists filled by `append` or `extend` and added
    with `+`; another name of a model (`net = model`, `copy.deepcopy(model)`,
    `DistributedDataParallel(model)` and its `.module`, `torch.compile(model)`)
    sits where the model does, and a model a function of the file returns
    (`model = build(device)` with `return nn.Linear(8, 1).to(device)`, or
    `g, d = build(device)`) sits where that function moves it; a function
    whose models are not all moved to one device is reported with that reason. Tensors trained directly count too: a tensor
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
    TF32 turned off), and an optimizer stepped once in no loop (a
    tutorial's single step: the launches a fused kernel saves are not
    noticed once). A small model whose step is bound by kernel launches
    keeps the fix: fewer launches per step is what the fused kernel buys.

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
        func = node.func
        if isinstance(func, cst.Name):  # `opt_cls = getattr(torch.optim, args.optim)`, then `opt_cls(...)`
            sources = self.context.kinds.value_sources(func)
            func = sources[0] if len(sources) == 1 else None
        name = func.args[1].value if isinstance(func, cst.Call) and len(func.args) == 2 else None
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
        classes = self._fusable_classes(node)
        if classes is None or any(kwarg(node, name) is not None for name in FUSED_CONFLICTS):
            return
        params = kwarg(node, "params") or positional(node, 0)
        if params is None or ("torch.optim.SGD" in classes and training.placement.sparse_gradients):
            return
        found = training.placement.parameters(params.value, node)
        if found.sites is None:
            self._report_untold_parameters(node, found)
            return
        if found.complex:
            return  # a complex parameter: fused=True would be rejected
        host = self._host_beside_device(found)
        if host is not None:
            self.report(node, MIXED.format(part=_short(self.context.source(host))))
            return
        if found.sites and all(training.trainer_placed(model, at) is not None for model, at in found.sites):
            # `self` of a LightningModule in its `configure_optimizers()`: already on the trainer's device
            self._fuse(node, LAUNCHED.format(device="self.device"), cst.parse_expression(_guard("self.device.type")))
            return
        if any(model is None or model.split for model in found.placed):
            self._fuse_unplaced(node, found)
            return
        self._fuse_on_one_device(node, found.placed)

    def _fusable_classes(self, node: cst.Call) -> frozenset[str] | None:
        """The optimizer classes `node` builds when all have fused kernels and no `*args`
        hides a keyword; None otherwise, after reporting an optimizer named on the command
        line whose default has them."""
        training = self.context.training
        classes = training.callee_names(node)
        starred = any(arg.star for arg in node.args)
        if classes is not None and classes <= FUSED_EVERYWHERE and not starred:
            return classes
        written = training.callee_names(node, written=True) if classes is None else None
        if written and written <= FUSED_EVERYWHERE and not starred:
            self.report(node, self._named_optimizer(node, written))
        return None

    def _report_untold_parameters(self, node: cst.Call, found: Parameters) -> None:
        """The parameters are not all parameters of models the analysis follows."""
        if found.untold is None:
            self.report(node, UNKNOWN_PARAMETERS)
            return
        why = f"; {found.why}" if found.why else ""
        self.report(node, UNKNOWN_TENSOR.format(part=_short(self.context.source(found.untold)), why=why))

    def _host_beside_device(self, found: Parameters) -> cst.CSTNode | None:
        """A model left on the host while the others move, unsplit, to a device that may be CUDA."""
        host = next((model for (model, _), where in zip(found.sites, found.placed) if where is None), None)
        moved = [model for model in found.placed if model is not None]
        if host is not None and moved and not any(model.split for model in moved) and self._may_be_cuda(moved):
            return host
        return None

    def _fuse_unplaced(self, node: cst.Call, found: Parameters) -> None:
        """Fuse (or say why not) where a model is not moved before the optimizer is built, or
        is spread over devices: a device the launcher's `prepare()` picks, or the host."""
        training = self.context.training
        placed = found.placed
        prepare = training.placement.prepared_by(node)
        if prepare is not None and not any(model is not None and model.split for model in placed):
            self._fuse_prepared(node, prepare)
        elif all(model is None for model in placed) and all(
            training.placement.stays_on_host(found, model) for model, _ in found.sites
        ):
            self._fuse(node, HOST)
        elif found.untold is not None:
            self._report_untold_parameters(node, found)

    def _fuse_prepared(self, node: cst.Call, prepare: cst.Call) -> None:
        """The model is moved by the engine's `prepare()`: fused where its device is CUDA or the CPU."""
        engine = prepare.func.value if isinstance(prepare.func, cst.Attribute) else None
        guard = self._engine_guard(engine, node) if engine is not None else None
        if guard is not None:
            self._fuse(node, LAUNCHED.format(device=f"{engine.value}.device"), guard)
        else:
            self.report(node, PREPARED.format(prepare=self.context.source(prepare.func)))

    def _fuse_on_one_device(self, node: cst.Call, placed: list[Model]) -> None:
        """Every model is moved to one device: fused where its types all have fused kernels,
        guarded by the device's type where it may be another."""
        devices = {self._device_code(model) for model in placed}
        if len(devices) > 1:
            return
        types = [self._device_types_of(model) for model in placed]
        if all(t is not None for t in types):
            known = frozenset().union(*types)
            if known <= FUSED_DEVICE_TYPES:
                self._fuse(node, None if "cuda" in known else ON_DEVICE.format(device=devices.pop()))
                return
            if "cuda" not in known:
                return  # a device without fused kernels (XLA, ...)
        elif not frozenset().union(*(model.places for model in placed)) & {Place.CUDA, Place.UNKNOWN}:
            return
        self._fuse_guarded(node, placed[0].device, devices)

    def _fuse_guarded(self, node: cst.Call, device: cst.BaseExpression | None, devices: set[str]) -> None:
        """Fuse under a test of the device's type (one the launcher picks, or one the script
        sets as written), or say the device cannot be told."""
        training = self.context.training
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
        why = training.placement.untold_device(device)
        self.report(node, UNKNOWN_DEVICE.format(device=devices.pop(), why=f": {why}" if why else ""))

    def _device_code(self, model: Model) -> str:
        """How the script spells the device `model` is moved to."""
        return self.context.training.code(model.device) if model.device is not None else _moved_to(model)

    def _device_types_of(self, model: Model) -> frozenset[str] | None:
        """The device types `model` may be moved to; None when they cannot be told."""
        if model.device is None:
            return frozenset({_moved_to(model)})
        return self.context.training.device_types(model.device)

    def _launched(self, device: cst.BaseExpression) -> cst.Name | None:
        """The training engine (`accelerator` of `accelerator = Accelerator()`, a Fabric) whose
        `.device` `device` is, directly or through names bound only to it: a device that the
        engine picks when the script is launched."""
        training = self.context.training
        sources = self.context.kinds.value_sources(device) if isinstance(device, cst.Name) else [device]
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
        if not self.context.bindings.bound_once_where(spelled, at):
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
        if not self.context.bindings.bound_once_where(device, at):
            return None  # `device` is another function's, or rebound: it may mean something else there
        sources = self.context.kinds.value_sources(device)
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
        once = self.context.loops.stepped_once(node)
        if once is not None:
            self.report(
                node,
                f"{UNFUSED} (not fixed: it steps once, line {self.context.line(once)}, in no loop; a fused "
                "kernel saves a few kernel launches per step, which a single step does not notice)",
            )
            return
        self.report(node, message, edits=[AddKeyword(node, "fused", value or cst.Name("True"))])

    def _may_be_cuda(self, placed: list[Model]) -> bool:
        for model in placed:
            types = self._device_types_of(model)
            if types is None:
                if model.places & {Place.CUDA, Place.UNKNOWN}:
                    return True
            elif "cuda" in types:
                return True
        return False


def _guard(device_type: str) -> str:
    """`<device_type> in ("cuda", "cpu")`: fused kernels wherever the run lands on one."""
    return f"{device_type} in ({', '.join(f'{t!r}' for t in LAUNCH_FUSED_TYPES)})".replace("'", '"')


def _cuda_first(device_type: str) -> tuple[bool, str]:
    return device_type != "cuda", device_type


def _short(code: str) -> str:
    """The first line of `code`, cut to a readable length."""
    line = code.strip().splitlines()[0] if code.strip() else code
    return line if len(line) <= 60 and line == code.strip() else line[:57].rstrip() + "..."
