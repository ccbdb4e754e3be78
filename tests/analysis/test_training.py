"""Training-loop analysis: which loops train, and what each already does."""

import textwrap

import libcst as cst
import libcst.matchers as m
import pytest

from codemod.analysis.training import Training, TrainingLoop
from codemod.analysis.values import Place
from codemod.context import FileContext

HEAD = """\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader
device = torch.device("cuda")
class Net(nn.Module):
    pass
loader = DataLoader(dataset, batch_size=8)
"""

PLAIN = """\
model = Net().to(device)
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for x, y in loader:
    x, y = x.to(device), y.to(device)
    optimizer.zero_grad()
    out = model(x)
    loss = criterion(out, y)
    loss.backward()
    optimizer.step()
"""


def analyse(code: str, head: str = HEAD) -> Training:
    return FileContext.of_source(head + textwrap.dedent(code), "<test>").training


def only_loop(code: str, head: str = HEAD) -> tuple[TrainingLoop, Training]:
    training = analyse(code, head)
    assert len(training.loops) == 1, [training.code(t.loop) for t in training.loops]
    return training.loops[0], training


def line_of(training: Training, node: cst.CSTNode) -> int:
    return training.positions[node].start.line - HEAD.count("\n")


# -- which loops train ------------------------------------------------------------------


def test_plain_loop_and_its_parts():
    loop, training = only_loop(PLAIN)
    assert isinstance(loop.loop, cst.For)
    [opt] = loop.optimizers
    assert (opt.expression, opt.qualified_name, training.code(opt.params)) == (
        "optimizer",
        "torch.optim.AdamW",
        "model.parameters()",
    )
    assert training.code(loop.loss) == "loss"
    assert [training.code(s) for s in loop.forward.statements] == ["out = model(x)\n", "loss = criterion(out, y)\n"]
    assert loop.accumulation is None and loop.clips == () and loop.autocast is None and loop.scaler is None
    assert [model.expression for model in loop.models] == ["model"]  # the criterion is a module without weights
    assert training.code(loop.device) == "device" and loop.models[0].places == {Place.CUDA}
    assert loop.float64 is None


def test_the_loops_are_described_only_when_asked_for(monkeypatch):
    # A pass whose rules only ask whether an expression is a model does not pay for them.
    described = []
    describe = Training._describe
    monkeypatch.setattr(Training, "_describe", lambda self, loop: described.append(loop) or describe(self, loop))
    training = analyse(PLAIN)
    model = next(n for n in training.index.find(cst.Name) if n.value == "model")
    assert training.is_model(model) and not described
    assert len(training.loops) == 1 and len(described) == 1


@pytest.mark.parametrize(
    "code",
    [
        "for x, y in loader:\n    loss = model(x).sum()\n    loss.backward()\n",  # no step
        "for x, y in loader:\n    sched.step()\n",  # a scheduler steps, nothing trains
        "for x, y in loader:\n    with torch.no_grad():\n        out = model(x)\n",
    ],
    ids=["backward-only", "scheduler-only", "eval-only"],
)
def test_loops_that_do_not_train(code):
    head = HEAD + "model = Net()\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    head += "sched = torch.optim.lr_scheduler.StepLR(opt, 10)\n"
    assert analyse(code, head).loops == []


def test_a_step_in_a_called_function_trains_the_loop_that_calls_it():
    """A training step in its own function (`train_step(batch)`) runs once per
    iteration of the loop that calls it: that loop is the training loop, and its
    backward and step are the helper's."""
    loop, training = only_loop(
        """\
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        def helper(batch):
            loss = model(batch).sum()
            loss.backward()
            opt.step()
        for b in loader:
            helper(b)
        """
    )
    assert training.code(loop.loop).startswith("for b in loader")
    assert [training.code(b.call) for b in loop.backwards] == ["loss.backward()"]
    assert [training.code(s) for s in loop.forward.statements] == ["loss = model(batch).sum()\n"]


def test_scheduler_step_is_not_an_optimizer_step():
    loop, training = only_loop(
        """\
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sched = torch.optim.lr_scheduler.StepLR(opt, 10)
        for x in loader:
            model(x).sum().backward()
            opt.step()
            sched.step()
        """
    )
    assert [training.code(s.optimizer) for s in loop.steps] == ["opt"]


def test_innermost_loop_with_backward_and_step_is_the_training_loop():
    loop, training = only_loop(
        """\
        model = Net().cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(3):
            for x, y in loader:
                loss = model(x).sum()
                loss.backward()
                opt.step()
        """
    )
    assert training.code(loop.loop).startswith("for x, y in loader")


def test_while_loop_with_micro_steps_nanogpt_style():
    loop, training = only_loop(
        """\
        from model import GPT
        model = GPT(config)
        model.to(device)
        optimizer = model.configure_optimizers(0.1, 6e-4)
        while True:
            for micro_step in range(accum):
                logits, loss = model(X, Y)
                loss = loss / accum
                X, Y = get_batch("train")
                loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        """
    )
    assert isinstance(loop.loop, cst.While)
    [opt] = loop.optimizers
    assert opt.qualified_name is None and opt.params is None  # configure_optimizers: not a torch.optim call
    assert training.code(opt.call) == "model.configure_optimizers(0.1, 6e-4)"
    assert [training.code(s) for s in loop.forward.statements] == [
        "logits, loss = model(X, Y)\n",
        "loss = loss / accum\n",
    ]
    acc = loop.accumulation
    assert training.code(acc.steps) == "accum" and isinstance(acc.micro_loop, cst.For) and acc.step_guard is None
    assert training.code(acc.division) == "loss = loss / accum\n"
    assert [model.expression for model in loop.models] == ["model"]  # an imported class: known by `model.to(device)`


@pytest.mark.parametrize("start", ["0", "0x0", "START"])
def test_micro_steps_from_zero_in_any_spelling_count_the_accumulation(start):
    loop, training = only_loop(
        f"""\
        START = 0
        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        while True:
            for micro_step in range({start}, accum):
                loss = model(X).sum() / accum
                loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        """
    )
    assert training.code(loop.accumulation.steps) == "accum"


# -- optimizers, scalers, losses ---------------------------------------------------------


@pytest.mark.parametrize(
    "imports,build,qualified",
    [
        ("from torch.optim import AdamW as AW", "AW(model.parameters())", "torch.optim.AdamW"),
        ("import torch.optim as optim", "optim.SGD(params=model.parameters(), lr=0.1)", "torch.optim.SGD"),
        ("from torch import optim", "optim.Adam(model.parameters())", "torch.optim.Adam"),
    ],
)
def test_optimizer_builds_resolve_aliases(imports, build, qualified):
    loop, training = only_loop(
        f"{imports}\nmodel = Net()\nopt = {build}\nfor x in loader:\n    model(x).sum().backward()\n    opt.step()\n"
    )
    [opt] = loop.optimizers
    assert opt.qualified_name == qualified and training.code(opt.params) == "model.parameters()"


def test_scaler_forms_in_both_namespaces():
    for build, qualified in [
        ("torch.amp.GradScaler('cuda')", "torch.amp.GradScaler"),
        ("torch.cuda.amp.GradScaler()", "torch.cuda.amp.GradScaler"),
        ("GS()", "torch.cuda.amp.GradScaler"),
    ]:
        loop, training = only_loop(
            f"""\
            from torch.cuda.amp import GradScaler as GS
            model = Net()
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            scaler = {build}
            for x in loader:
                loss = model(x).sum()
                scaler.scale(loss / 4).backward()
                scaler.step(opt)
                scaler.update()
            """
        )
        assert loop.scaler.expression == "scaler" and loop.scaler.qualified_name == qualified
        [backward] = loop.backwards
        assert backward.scaled and training.code(backward.loss) == "loss" and training.code(backward.divisor) == "4"
        assert [s.scaled for s in loop.steps] == [True] and loop.optimizers[0].expression == "opt"


@pytest.mark.parametrize(
    "build, compute_dtype",
    [
        ("torch.amp.GradScaler() if COMPUTE_DTYPE == torch.float16 else None", "COMPUTE_DTYPE"),
        ("None if torch.float16 != cfg.dtype else torch.amp.GradScaler()", None),  # not the scaler's branch
        ("torch.amp.GradScaler() if torch.float16 == cfg.dtype else None", "cfg.dtype"),
        ("torch.amp.GradScaler() if use_amp else None", None),
        ("torch.amp.GradScaler()", None),
    ],
)
def test_a_scaler_built_only_for_a_float16_compute_dtype_names_it(build, compute_dtype):
    # nanochat: the model casts its activations to COMPUTE_DTYPE and builds a GradScaler
    # only when that dtype is float16; the script chooses its own precision.
    loop, training = only_loop(
        f"""\
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = {build}
        for x in loader:
            loss = model(x).sum()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        """
    )
    found = loop.scaler.compute_dtype
    assert (training.code(found) if found is not None else None) == compute_dtype


def test_loss_attribute_of_model_output():
    loop, training = only_loop(
        """\
        model = Net().to(device)
        opt = torch.optim.AdamW(model.parameters())
        for batch in loader:
            outputs = model(**batch)
            outputs.loss.backward()
            opt.step()
        """
    )
    assert training.code(loop.loss) == "outputs.loss"
    assert [training.code(s) for s in loop.forward.statements] == ["outputs = model(**batch)\n"]


# -- forward region -------------------------------------------------------------------------


def test_forward_region_keeps_statements_between_model_and_loss():
    loop, training = only_loop(
        """\
        model = Net().to(device)
        crit = nn.MSELoss()
        opt = torch.optim.AdamW(model.parameters())
        for x, y in loader:
            x = x.to(device)
            # forward pass
            out = model(x)
            if out.isnan().any():
                continue
            loss = crit(out, y)  # mean over the batch
            print(loss.item())
            loss.backward()
            opt.step()
        """
    )
    region = loop.forward
    assert region.block is loop.loop.body and (region.first, region.last) == (1, 3)


def test_forward_through_a_helper_given_the_model():
    loop, training = only_loop(
        """\
        def compute_loss(net, batch):
            return net(batch).sum()
        model = Net().to(device)
        opt = torch.optim.AdamW(model.parameters())
        for batch in loader:
            batch = batch.to(device)
            loss = compute_loss(model, batch)
            loss.backward()
            opt.step()
        """
    )
    assert [training.code(s) for s in loop.forward.statements] == ["loss = compute_loss(model, batch)\n"]


def test_forward_in_a_trainer_class_uses_self_model():
    loop, training = only_loop(
        """\
        class Trainer:
            def __init__(self, net):
                self.model = net.to(device)
                self.opt = torch.optim.AdamW(self.model.parameters())
            def fit(self):
                for x, y in loader:
                    out = self.model(x)
                    loss = ((out - y) ** 2).mean()
                    loss.backward()
                    self.opt.step()
                    self.opt.zero_grad()
        """
    )
    assert [training.code(s) for s in loop.forward.statements] == [
        "out = self.model(x)\n",
        "loss = ((out - y) ** 2).mean()\n",
    ]
    assert loop.optimizers[0].qualified_name == "torch.optim.AdamW"
    [model] = loop.models
    assert model.expression == "self.model"


@pytest.mark.parametrize(
    "block",
    [
        "if flag:\n    loss = out.sum()\nelse:\n    loss = out.mean()\n",
        "if aux > 0:\n    # an auxiliary term\n    loss = loss + aux * out.abs().mean()\n",
        "with torch.no_grad():\n    scale = out.detach().std()\nloss = loss / scale\nif flag:\n    loss = loss * 2\n",
        "try:\n    loss = loss + out.logsumexp(-1).mean()\nexcept RuntimeError:\n    pass\n",
    ],
    ids=["if-else", "if", "with-then-if", "try"],
)
def test_the_forward_region_ends_with_the_if_with_or_try_that_computes_the_loss(block):
    code = "model = Net().to(device)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor x, y in loader:\n"
    body = "out = model(x)\nloss = out.pow(2).mean()\n" + block + "opt.zero_grad()\nloss.backward()\nopt.step()\n"
    code += textwrap.indent(body, "    ")
    loop, training = only_loop(code)
    assert loop.forward is not None, loop.forward_problem
    statements = loop.forward.statements
    assert training.code(statements[0]) == "out = model(x)\n"
    assert isinstance(statements[-1], (cst.If, cst.Try)), training.code(statements[-1])


@pytest.mark.parametrize(
    "body,problem",
    [
        (
            "out = model(x)\nif out.mean() > 0:\n    loss = out.sum()\nelse:\n    loss = out.mean()\n"
            "loss.backward()\nopt.step()\n",
            "the `if` that computes the loss (line 12) tests `out`, which the step computes before it",
        ),
        (
            "out = model(x)\nloss = 0\nfor part in out.chunk(2):\n    loss = loss + part.sum()\n"
            "loss.backward()\nopt.step()\n",
            "the loss is computed inside a nested loop (line 13)",
        ),
        (
            "out = model(x)\nif flag:\n    loss = out.sum()\n    loss.backward()\n    opt.step()\n",
            "the forward spans blocks: `out` comes from a model call at line",
        ),
        ("model(x).sum().backward()\nopt.step()\n", "the loss is computed in the backward() statement itself"),
        ("loss = x.sum()\nloss.backward()\nopt.step()\n", "no model call before the loss"),
        (
            "loss = model(x).sum()\nloss.backward()\nloss2 = model(x).mean()\nloss2.backward()\nopt.step()\n",
            "the loop calls backward() 2 times",
        ),
        ("out = model(x)\nyield out\nloss = out.sum()\nloss.backward()\nopt.step()\n", "the forward region yields"),
    ],
    ids=[
        "branch-on-forward-output",
        "loss-in-loop",
        "forward-spans-blocks",
        "loss-inline",
        "no-model-call",
        "two-backwards",
        "yields",
    ],
)
def test_forward_that_cannot_be_delimited(body, problem):
    code = "model = Net().to(device)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor x, y in loader:\n"
    code += textwrap.indent(body, "    ")
    loop, _ = only_loop(code)
    assert loop.forward is None and loop.forward_problem.startswith(problem), loop.forward_problem


def test_eval_block_binding_the_same_name_does_not_split_the_forward():
    loop, training = only_loop(
        """\
        model = Net().to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step, (x, y) in enumerate(loader):
            out = model(x)
            loss = (out - y).pow(2).mean()
            loss.backward()
            opt.step()
            if step % 100 == 0:
                with torch.no_grad():
                    out = model(x)
        """
    )
    assert loop.forward is not None and (loop.forward.first, loop.forward.last) == (0, 1)
    assert loop.accumulation is None  # `% 100` guards evaluation, not the step


# -- accumulation and clipping ----------------------------------------------------------------


@pytest.mark.parametrize(
    "division,backward,divisor",
    [
        ("    loss = loss / accum\n", "loss.backward()", "accum"),
        ("    loss /= accum\n", "loss.backward()", "accum"),
        ("", "(loss / accum).backward()", "accum"),
    ],
)
def test_accumulation_with_guarded_step(division, backward, divisor):
    loop, training = only_loop(
        "from torch.nn.utils import clip_grad_norm_\n"
        "model = Net().to(device)\nopt = torch.optim.AdamW(model.parameters())\naccum = 4\n"
        "for i, (x, y) in enumerate(loader):\n"
        "    loss = model(x).mean()\n"
        f"{division}"
        f"    {backward}\n"
        "    if (i + 1) % accum == 0:\n"
        "        clip_grad_norm_(model.parameters(), 1.0)\n"
        "        opt.step()\n"
        "        opt.zero_grad()\n"
    )
    acc = loop.accumulation
    assert training.code(acc.steps) == divisor and acc.division is not None and acc.micro_loop is None
    assert training.code(acc.step_guard.test) == "(i + 1) % accum == 0"
    assert [training.code(c) for c in loop.clips] == ["clip_grad_norm_(model.parameters(), 1.0)"]


def test_accumulation_guarded_by_a_helper_of_the_file():
    loop, training = only_loop(
        "def divisible_by(num, den):\n    return (num % den) == 0\n"
        "model = Net().to(device)\nopt = torch.optim.AdamW(model.parameters())\naccum = 4\n"
        "for i, (x, y) in enumerate(loader):\n"
        "    loss = model(x).mean() / accum\n"
        "    loss.backward()\n"
        "    if divisible_by(i + 1, accum):\n"
        "        opt.step()\n"
        "        opt.zero_grad()\n"
    )
    acc = loop.accumulation
    assert training.code(acc.steps) == "accum" and acc.division is not None
    assert training.code(acc.step_guard.test) == "divisible_by(i + 1, accum)"


def test_division_by_a_non_count_is_not_accumulation():
    loop, _ = only_loop(
        """\
        model = Net().to(device)
        opt = torch.optim.AdamW(model.parameters())
        for x, y in loader:
            loss = model(x).sum() / x.shape[0]
            loss.backward()
            nn.utils.clip_grad_value_(model.parameters(), 0.5)
            opt.step()
        """
    )
    assert loop.accumulation is None
    assert len(loop.clips) == 1


# -- what the loop already does ---------------------------------------------------------------------

AMP_LOOP = """\
model = Net().to(device)
opt = torch.optim.AdamW(model.parameters())
{before}
for x, y in loader:
{inside}
        loss = model(x).sum()
    loss.backward()
    opt.step()
"""


@pytest.mark.parametrize(
    "before,with_item,form",
    [
        ("", "torch.autocast(device_type='cuda', dtype=torch.bfloat16)", "call"),
        ("", "torch.amp.autocast('cuda')", "call"),
        ("from torch.cuda.amp import autocast", "autocast()", "call"),
        ("", "torch.cuda.amp.autocast(dtype=torch.float16)", "call"),
        ("", "torch.cpu.amp.autocast()", "call"),
        (
            "from contextlib import nullcontext\nctx = nullcontext() if device.type == 'cpu' else "
            "torch.amp.autocast(device_type='cuda', dtype=torch.bfloat16)",
            "ctx",
            "context variable",
        ),
        ("def amp_context():\n    return torch.autocast('cuda', dtype=torch.bfloat16)", "amp_context()", "helper"),
        ("from runtime.amp import Precision\nprecision = Precision.for_device(device)", "precision.autocast()", "call"),
    ],
)
def test_autocast_in_any_form(before, with_item, form):
    loop, _ = only_loop(AMP_LOOP.format(before=before, inside=f"    with {with_item}:"))
    assert loop.autocast is not None and loop.autocast.form == form
    assert isinstance(loop.autocast.node, cst.With)


def test_autocast_around_the_loop():
    loop, _ = only_loop(
        """\
        model = Net().to(device)
        opt = torch.optim.AdamW(model.parameters())
        with torch.autocast("cuda"):
            for x in loader:
                loss = model(x).sum()
                loss.backward()
                opt.step()
        """
    )
    assert loop.autocast.form == "call"


@pytest.mark.parametrize("with_item", ["torch.no_grad()", "open('log.txt')", "torch.enable_grad()"])
def test_other_contexts_are_not_autocast(with_item):
    loop, training = only_loop(AMP_LOOP.format(before="", inside=f"    with {with_item}:"))
    assert loop.autocast is None and loop.scaler is None and training.autocast_uses == []


@pytest.mark.parametrize(
    "elsewhere",
    [
        "class Wrapped(nn.Module):\n    def forward(self, x):\n        with torch.autocast('cuda'):\n            return x\n",
        "torch.set_autocast_enabled('cuda', True)\n",
    ],
)
def test_autocast_elsewhere_in_the_file_is_listed(elsewhere):
    training = analyse(PLAIN + elsewhere)
    assert training.loops[0].autocast is None and len(training.autocast_uses) == 1


@pytest.mark.parametrize(
    "code",
    [
        "model = Net().double().to(device)",
        "model = Net().to(device)\nmodel.double()",
        "model = Net()\nmodel.to(device, torch.float64)",
        "model = Net().to(dtype=torch.double)",
        "model = nn.Linear(4, 1, dtype=torch.float64)",
        "torch.set_default_dtype(torch.float64)\nmodel = Net()",
        "torch.set_default_tensor_type(torch.DoubleTensor)\nmodel = Net()",
    ],
)
def test_float64_models(code):
    loop, _ = only_loop(
        code + "\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for x in loader:\n    loss = model(x).sum()\n    loss.backward()\n    opt.step()\n"
    )
    assert loop.float64 is not None


@pytest.mark.parametrize(
    "code",
    [
        "model = Net().float().to(device)",
        "model = Net().to(device, torch.float32)",
        "model = Net().half()",
        "model = Net()\nother = Net().double()",
        "torch.set_default_dtype(torch.float32)\nmodel = Net()",
    ],
)
def test_models_that_are_not_float64(code):
    loop, _ = only_loop(
        code + "\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for x in loader:\n    loss = model(x).sum()\n    loss.backward()\n    opt.step()\n"
    )
    assert loop.float64 is None


HALF_LOOP = (
    "{code}\nmodel = torch.compile(model)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "for x in loader:\n    loss = model(x).sum()\n    loss.backward()\n    opt.step()\n"
)


@pytest.mark.parametrize(
    "code",
    [
        "model = Net().cuda()\nfor m in model.modules():\n    if isinstance(m, nn.Linear):\n        m.bfloat16()",
        "model = Net().cuda()\nfor name, m in model.named_children():\n    m.to(torch.float16)",
        "model = Net().cuda()\nfor m in model.modules():\n    m.weight.data = m.weight.data.bfloat16()",
        "model = Net().cuda()\nfor p in model.parameters():\n    p.data = p.data.to(dtype=torch.bfloat16)",
        "model = Net().cuda()\nfor n, p in model.named_parameters():\n    p.data = p.data.half()",
    ],
)
def test_models_cast_to_16_bits_through_a_loop_over_their_parts(code):
    loop, _ = only_loop(HALF_LOOP.format(code=code))
    assert loop.half is not None


@pytest.mark.parametrize(
    "code",
    [
        "model = Net().cuda()\nfor p in model.parameters():\n    p.bfloat16()",  # a copy, thrown away
        "model = Net().cuda()\nfor p in model.parameters():\n    q = p.data.bfloat16()",
        "model = Net().cuda()\nfor m in other.modules():\n    m.bfloat16()",
        "model = Net().cuda()\nfor m in model.modules():\n    m.float()",
        "model = Net().cuda()\nfor m in model.modules():\n    w = m.weight.data.half()",
    ],
)
def test_loops_over_parts_that_leave_the_model_float32(code):
    loop, _ = only_loop(HALF_LOOP.format(code=code))
    assert loop.half is None


# -- devices ------------------------------------------------------------------------------------------

DEVICE_LOOP = (
    "{code}\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor x in loader:\n"
    "    loss = model(x).sum()\n    loss.backward()\n    opt.step()\n{after}"
)


@pytest.mark.parametrize(
    "code,device,places",
    [
        ("model = Net().to(device)", "device", {Place.CUDA}),
        (
            "dev = 'cuda' if torch.cuda.is_available() else 'cpu'\nmodel = Net()\nmodel.to(dev)",
            "dev",
            {Place.CUDA, Place.HOST},
        ),
        (
            "dev = torch.device('cuda:0' if ok else 'cpu')\nmodel = Net()\nmodel = model.to(dev)",
            "dev",
            {Place.CUDA, Place.HOST},
        ),
        ("model = torch.compile(Net().to('cuda'))", "'cuda'", {Place.CUDA}),
        ("model = Net().to(args.device)", "args.device", {Place.UNKNOWN}),
        ("model = Net().to('cpu')", "'cpu'", {Place.HOST}),
    ],
)
def test_model_device_expression(code, device, places):
    loop, training = only_loop(DEVICE_LOOP.format(code=code, after=""))
    [model] = loop.models
    assert training.code(model.device) == device and model.places == places and not model.split


def test_cuda_call_and_unmoved_and_moved_after():
    loop, _ = only_loop(DEVICE_LOOP.format(code="model = Net().cuda()", after=""))
    assert loop.models[0].places == {Place.CUDA} and loop.models[0].device is None and loop.device is None
    loop, _ = only_loop(DEVICE_LOOP.format(code="model = Net()", after="model.to(device)\n"))
    assert loop.models[0].places == frozenset() and loop.models[0].move is None


def test_submodules_moved_on_their_own():
    loop, _ = only_loop(DEVICE_LOOP.format(code="model = Net().to(device)\nmodel.head.to('cuda:1')", after=""))
    assert loop.models[0].split
    loop, _ = only_loop(DEVICE_LOOP.format(code="model = Net().to(device)\npos = model.pos.to('cuda:1')", after=""))
    assert not loop.models[0].split  # a copy of a tensor attribute moves nothing


def test_moves_in_other_functions_do_not_count():
    loop, _ = only_loop(
        "def export(model):\n    model.cpu()\n" + DEVICE_LOOP.format(code="model = Net().to(device)", after="")
    )
    assert loop.models[0].places == {Place.CUDA}


@pytest.mark.parametrize(
    "code,uses",
    [
        ("x = torch.zeros(3, device='cuda:0')", True),
        ("x = torch.zeros(3).cuda()", True),
        ("torch.cuda.synchronize()", True),
        ("x = torch.zeros(3, device=f'cuda:{rank}')", True),
        ("ok = torch.cuda.is_available()", False),
        ("x = torch.zeros(3, device='cpu')", False),
        ("name = 'cudart'", False),
    ],
)
def test_cuda_use(code, uses):
    training = analyse(code + "\n", head="import torch\n")
    assert (training.cuda_use is not None) is uses


# -- parameters of optimizers --------------------------------------------------------------------


@pytest.mark.parametrize(
    "setup,params,models",
    [
        ("", "model.parameters()", ["model"]),
        ("", "[p for p in model.parameters() if p.requires_grad]", ["model"]),
        ("", "filter(lambda p: p.requires_grad, model.parameters())", ["model"]),
        (
            "",
            "[{'params': model.body.parameters()}, {'params': model.head.parameters(), 'lr': 1e-4}]",
            ["model.body", "model.head"],
        ),
        (
            "decay = [p for n, p in model.named_parameters() if p.dim() >= 2]\n"
            "no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]\n"
            "groups = [{'params': decay, 'weight_decay': 0.1}, {'params': no_decay, 'weight_decay': 0.0}]\n",
            "groups",
            ["model", "model"],
        ),
        ("decay = []\nfor name, p in model.named_parameters():\n    decay.append(p)\n", "decay", ["model"]),
        (
            "import itertools\nhead = Net()\n",
            "itertools.chain(model.parameters(), head.parameters())",
            ["model", "head"],
        ),
        ("", "list(model.parameters()) + [torch.zeros(3, requires_grad=True)]", None),
        ("", "[torch.zeros(3, requires_grad=True)]", None),
        ("", "[{'lr': 0.1}]", None),
        ("extra = []\nextra.append(torch.zeros(3))\n", "extra", None),
        ("", "[p.detach() for p in model.parameters()]", None),
    ],
)
def test_parameter_models(setup, params, models):
    training = analyse(f"model = Net()\n{setup}opt = torch.optim.AdamW({params})\n")
    [call] = m.findall(training.module, m.Call(func=m.Attribute(attr=m.Name("AdamW"))))
    found = training.parameter_models(call.args[0].value)
    assert (None if found is None else [training.code(model) for model in found]) == models


def test_a_method_of_the_model_that_returns_its_loader_is_not_a_forward_call():
    training = analyse(
        """
        from torch.utils.data import DataLoader, TensorDataset

        class Lit(nn.Module):
            def __init__(self):
                super().__init__()
                self.net = nn.Linear(4, 2)
                self.X, self.Y = torch.randn(64, 4), torch.randint(0, 2, (64,))

            def forward(self, x):
                return self.net(x)

            def train_dataloader(self):
                return DataLoader(TensorDataset(self.X, self.Y), batch_size=8)

            def training_step(self, batch):
                x, y = batch
                return F.cross_entropy(self(x), y)

        module = Lit()
        opt = torch.optim.SGD(module.parameters(), lr=0.1)
        for batch in module.train_dataloader():
            loss = module.training_step(batch)
            loss.backward()
            opt.step()
        """
    )
    calls = {training.code(c.func): training.is_model_call(c) for c in training.index.find(cst.Call)}
    assert calls["module.train_dataloader"] is False
    assert calls["module.training_step"] is True
    (loop,) = training.loops
    assert loop.forward is not None, loop.forward_why


def test_nn_modules_own_methods_are_no_forward_calls():
    """`model.compile()`, `model.type(...)`, `model.to_empty(...)`: nn.Module's methods run no forward."""
    training = analyse(
        """
        model = nn.Linear(4, 2)
        model.compile()
        model.type(torch.float64)
        model.to_empty(device="cpu")
        out = model.forward(torch.randn(3, 4))
        """
    )
    calls = {training.code(c.func): training.is_model_call(c) for c in training.index.find(cst.Call)}
    assert calls["model.forward"] is True
    assert not any(calls[f"model.{name}"] for name in ("compile", "type", "to_empty"))


def test_a_model_of_the_optimizer_a_function_is_handed_is_where_the_main_block_moves_it():
    code = (
        "def train(net, optimizer, device, loader):\n"
        "    for x, y in loader:\n"
        "        loss = compute_loss(x, y, net, device)\n"
        "        optimizer.zero_grad()\n        loss.backward()\n        optimizer.step()\n\n"
        "if __name__ == '__main__':\n"
        "    model = Net()\n    model.to(device)\n"
        "    opt = torch.optim.AdamW(model.parameters())\n"
        "    train(model, opt, device, loader)\n"
    )
    loop, training = only_loop(code)
    [model] = loop.models
    assert training.code(model.move) == "model.to(device)" and model.places == {Place.CUDA}
    loop, _ = only_loop(code.replace("    model.to(device)\n", ""))
    assert loop.models[0].move is None  # never moved


# -- a trainer class handed its pieces ---------------------------------------------------------

HANDED = """\
class Trainer:
    def __init__(self, model, optimizer, distributed):
        self.model = model
        if distributed:
            self.model = nn.parallel.DistributedDataParallel(self.model)
        self.optimizer = optimizer

    def training_step(self, x, y):
        return nn.functional.cross_entropy(self.model(x), y)

    def fit(self):
        for x, y in loader:
            loss = self.training_step(x.to(device), y.to(device))
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()


net = Net().to(device)
Trainer(net, torch.optim.AdamW(net.parameters()), False).fit()
"""


def test_a_model_wrapped_in_ddp_in_place_is_still_the_model():
    training = analyse(HANDED)
    reads = [a for a in training.index.find(cst.Attribute) if training.code(a) == "self.model"]
    assert reads and all(training.is_model(read) for read in reads)


def test_a_method_of_the_trainer_that_runs_the_model_is_the_forward_pass():
    loop, training = only_loop(HANDED)
    assert loop.forward is not None, loop.forward_problem
    [statement] = loop.forward.statements
    assert "self.training_step(" in training.code(statement)


def test_the_model_a_trainer_is_constructed_with_is_where_the_construction_finds_it():
    loop, training = only_loop(HANDED)
    [model] = [m for m in loop.models if m.expression == "self.model"]
    assert model.places == frozenset({Place.CUDA}) and training.code(model.move) == "Net().to(device)"


def test_a_construction_of_another_instance_is_not_placed_by_a_move_of_the_first():
    loop, training = only_loop(HANDED + "Trainer(Net(), None, False).fit()\n")
    assert not [m for m in loop.models if m.expression == "self.model" and m.move is not None]
