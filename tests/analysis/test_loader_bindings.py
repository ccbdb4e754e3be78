"""Which DataLoader a loop's batches come from, and what the loader holds, read where each
name is used: a loop variable that shadows the dataset's tensor, a tensor updated in place
before the loader is built, a loader handed back by a library's set-up call."""

from __future__ import annotations

import textwrap

import libcst as cst

from codemod.config import Settings
from codemod.context import FileContext
from codemod.engine import process_source
from codemod.result import Level

SHADOWED = """\
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def main():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    x = torch.randn(512, 3, 32, 32)
    y = torch.randint(0, 10, (512,))
    loader = DataLoader(TensorDataset(x, y), batch_size=128)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3072, 512), nn.ReLU(), nn.Linear(512, 10)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def context(code: str) -> FileContext:
    code = textwrap.dedent(code)
    return FileContext(cst.parse_module(code), "<test>", Settings(), code)


def _loader_call(ctx: FileContext) -> cst.Call:
    [call] = [c for c in ctx.index.find(cst.Call) if ctx.source(c.func) == "DataLoader"]
    return call


def test_a_loop_variable_that_shadows_the_dataset_tensor_is_not_what_the_loader_holds():
    ctx = context(SHADOWED)
    loader = _loader_call(ctx)
    # the dataset's `x` is the host tensor made before the loop, not the copy the loop makes
    assert not ctx.loaders.may_hold_device_data(ctx.loaders.dataset(loader), 0)
    assert [len(copies) for copies in ctx.loaders.device_copies.values()] == [2]
    found = process_source(SHADOWED.encode(), "<test>", Settings(select=("PM102", "PM103"), level=Level.UNSAFE))
    assert sorted(f.code for f in found.findings if f.applied) == ["PM102", "PM103"]


def test_a_tensor_updated_in_place_keeps_the_value_it_updates():
    ctx = context(
        """
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        x = torch.randn(192, 3, 16, 16)
        y = torch.randint(0, 10, (192,))
        x += y.view(-1, 1, 1, 1).float() * 0.1
        loader = DataLoader(TensorDataset(x, y), batch_size=32)
        """
    )
    [tensors] = [c for c in ctx.index.find(cst.Call) if ctx.source(c.func) == "TensorDataset"]
    name = tensors.args[0].value
    assert [ctx.source(value) for value, _ in ctx.loaders.bound_values(name)] == ["torch.randn(192, 3, 16, 16)"]


def test_a_loader_handed_back_by_a_set_up_call_is_the_one_given_to_it():
    ctx = context(
        """
        import torch
        from accelerate import Accelerator
        from torch.utils.data import DataLoader, TensorDataset
        accelerator = Accelerator()
        loader = DataLoader(TensorDataset(torch.randn(64, 8), torch.randn(64, 1)), batch_size=8)
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model, opt, loader = accelerator.prepare(model, opt, loader)
        for x, y in loader:
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            opt.step()
        """
    )
    [feed] = ctx.loaders.feeds
    assert feed.loader is _loader_call(ctx)
    # the model and optimizer it hands back are no loaders
    [prepare] = [c for c in ctx.index.find(cst.Call) if ctx.source(c.func) == "accelerator.prepare"]
    assert not ctx.loaders.only_loaders(prepare, (0,), 0) and ctx.loaders.only_loaders(prepare, (2,), 0)


def test_the_training_loops_are_the_for_loops_that_run_a_backward_pass_in_order():
    source = textwrap.dedent(
        """\
        def step(model, x):
            model(x).sum().backward()

        for x in loader:
            print(x)
        for x in loader:
            step(model, x)
        while True:
            model(x).sum().backward()
        for epoch in range(3):
            for x in loader:
                model(x).sum().backward()
        """
    )
    context = FileContext.of_source(source)
    loops = context.loaders.training_loops
    assert [context.source(loop.iter) for loop in loops] == ["loader", "range(3)", "loader"]


PLACED = """\
import torch
{imports}
from torch.utils.data import DataLoader, TensorDataset

engine = {engine}
data = DataLoader(TensorDataset(torch.randn(64, 8), torch.randn(64, 1)), batch_size=8, pin_memory=True)
loader = {setup}
batches = iter(loader)
for step in range(8):
    x, y = next(batches)
    x = x.to("cuda")
    torch.nn.functional.mse_loss(model(x), y).backward()
"""
ACCELERATE = "from accelerate import Accelerator"
FABRIC = "import lightning as L"


def _placed(imports: str, engine: str, setup: str) -> tuple[FileContext, list]:
    ctx = context(PLACED.format(imports=imports, engine=engine, setup=setup))
    return ctx, [feed.placed for feed in ctx.loaders.feeds]


def test_batches_of_a_loader_an_engine_prepares_are_on_its_device_already():
    for imports, engine, setup in [
        (ACCELERATE, "Accelerator()", "engine.prepare(data)"),
        (ACCELERATE, "Accelerator(device_placement=True)", "engine.prepare(data)"),
        (FABRIC, "L.Fabric(accelerator='cuda')", "engine.setup_dataloaders(data)"),
    ]:
        ctx, placed = _placed(imports, engine, setup)
        assert [ctx.source(call) for call in placed] == [setup], (engine, setup)
        [iterated] = [c.args[0].value for c in ctx.index.find(cst.Call) if ctx.source(c.func) == "iter"]
        assert ctx.loaders.placing_setup(iterated) is placed[0]
        [given] = [c.args[0].value for c in ctx.index.find(cst.Call) if c is placed[0]]
        assert ctx.loaders.placing_setup(given) is None  # the loader before the engine prepares it


def test_batches_an_engine_is_told_not_to_place_or_that_may_not_place_them_stay_where_the_loader_made_them():
    for imports, engine, setup in [
        (ACCELERATE, "Accelerator(device_placement=False)", "engine.prepare(data)"),
        (ACCELERATE, "Accelerator(**options)", "engine.prepare(data)"),
        (ACCELERATE, "Accelerator(device_placement=on_gpu)", "engine.prepare(data)"),
        (FABRIC, "L.Fabric()", "engine.prepare(data)"),  # not the method that places
        ("from other import Engine", "Engine()", "engine.prepare(data)"),  # an engine perfmod does not know
    ]:
        _, placed = _placed(imports, engine, setup)
        assert placed == [None], (engine, setup)
