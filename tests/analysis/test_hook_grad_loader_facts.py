"""The answers of three shared analyses, asked directly: where a hook's handle is removed
(codemod.analysis.hook_handles), which loops reset gradients by hand and what tells a zero
`.grad` from a missing one (codemod.analysis.grad_resets), and where a training loader's
worker count is written and what keeps it from workers (codemod.analysis.loader_workers)."""

from __future__ import annotations

import libcst as cst
import pytest

from codemod.analysis.grad_resets import grad_resets
from codemod.analysis.hook_handles import hook_handles
from codemod.analysis.loader_workers import loader_workers
from codemod.context import FileContext

HOOKED = """\
import contextlib
import torch
model = torch.nn.Linear(4, 4)
def f(module, args, out):
    pass
"""


def _registration(ctx: FileContext) -> cst.Call:
    return next(c for c in ctx.index.find(cst.Call) if ctx.source(c.func).endswith("register_forward_hook"))


@pytest.mark.parametrize(
    "code, removed",
    [
        ("h = model.register_forward_hook(f)\nh.remove()\n", ["h.remove()"]),
        ("hs = []\nhs.append(model.register_forward_hook(f))\nfor h in hs:\n    h.remove()\n", ["h.remove()"]),
        ("hs = {}\nhs['a'] = model.register_forward_hook(f)\nhs['a'].remove()\n", ["hs['a'].remove()"]),
        ("hs = [model.register_forward_hook(f)]\nwhile hs:\n    hs.pop().remove()\n", ["hs.pop().remove()"]),
        (
            "with contextlib.ExitStack() as stack:\n    stack.enter_context(model.register_forward_hook(f))\n",
            ["with contextlib.ExitStack() as stack:"],
        ),
        ("model.register_forward_hook(f)\n", []),
        ("hs = []\nhs.append(model.register_forward_hook(f))\n", []),
        ("model.h = model.register_forward_hook(f)\n", None),
        ("h = model.register_forward_hook(f)\nprint(h)\n", None),
    ],
)
def test_where_a_handle_is_removed(code, removed):
    ctx = FileContext.of_source(HOOKED + code)
    found = hook_handles(ctx).removals(_registration(ctx))
    shown = None if found is None else [ctx.source(n).splitlines()[0] for n in found]
    assert shown == removed


RESETS = """\
import torch
model = torch.nn.Linear(8, 1)
opt = torch.optim.{optimizer}
data = [(torch.randn(4, 8), torch.randn(4, 1)) for _ in range(3)]
for x, y in data:
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
{reset}
"""


@pytest.mark.parametrize(
    "reset, receiver",
    [
        ("    for p in model.parameters():\n        if p.grad is not None:\n            p.grad.zero_()\n", "model"),
        ("    for g in opt.param_groups:\n        for p in g['params']:\n            p.grad.fill_(0)\n", "opt"),
        ("    for g in opt.param_groups:\n        for p in g['params']:\n            p.grad.fill_(-0.0)\n", "opt"),
        ("    for p in model.parameters():\n        p.grad = torch.zeros_like(p)\n", "model"),
        ("    for p in model.parameters():\n        p.grad.mul_(0.5)\n", None),  # scales, does not reset
        ("    for p in model.parameters():\n        p.grad.detach_()\n", None),  # resets without zeroing
    ],
)
def test_which_loops_reset_gradients_by_hand(reset, receiver):
    ctx = FileContext.of_source(RESETS.format(optimizer="SGD(model.parameters(), lr=0.1)", reset=reset))
    loop = [f for f in ctx.index.find(cst.For) if ctx.source(f.iter) != "data"][0]
    found = grad_resets(ctx).reset_loop_receiver(loop)
    assert (ctx.source(found) if found is not None else None) == receiver


@pytest.mark.parametrize(
    "optimizer, extra, changes_nothing",
    [
        ("SGD(model.parameters(), lr=0.1)", "", True),
        ("SGD(model.parameters(), lr=0.1, momentum=0.9)", "", False),  # momentum moves on a zero gradient
        ("SGD(model.parameters(), lr=0.1, momentum=-0.0, weight_decay=0x0)", "", True),  # 0 in other spellings
        ("SGD([{'params': model.parameters(), 'weight_decay': 0.1}], lr=0.1)", "", False),
        ("AdamW(model.parameters(), lr=1e-3)", "", False),
        ("SGD(model.parameters(), lr=0.1)", "print(model.weight.grad)\n", False),  # reads .grad elsewhere
    ],
)
def test_whether_a_zero_step_changes_nothing(optimizer, extra, changes_nothing):
    reset = "    opt.zero_grad(set_to_none=False)\n"
    ctx = FileContext.of_source(RESETS.format(optimizer=optimizer, reset=reset) + extra)
    site = next(c for c in ctx.index.find(cst.Call) if ctx.source(c.func) == "opt.zero_grad")
    optimizers = ctx.training.loop_of(site).optimizers
    assert grad_resets(ctx).zero_step_changes_nothing(optimizers, site) is changes_nothing


LOADER = """\
import torch
from torch.utils.data import DataLoader, TensorDataset
{dataset}
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader({arguments})
for x, y in loader:
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
{after}"""

MAP_STYLE = """\
class Squares(torch.utils.data.Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        x = torch.full((8,), float(i)).sin()
        return x, x.sum(0, keepdim=True)
ds = Squares()
"""


def _loader(dataset: str, arguments: str, after: str = ""):
    ctx = FileContext.of_source(LOADER.format(dataset=dataset, arguments=arguments, after=after))
    loader = ctx.loaders.constructions[0]
    feeds, _ = loader_workers(ctx).training_feeds()
    return ctx, loader, feeds[id(loader)]


def test_a_map_style_loader_without_a_count_may_get_workers():
    ctx, loader, loop = _loader(MAP_STYLE, "ds, batch_size=8")
    count = loader_workers(ctx).count(loader)
    assert count.zero is None and count.anchor is loader and count.hidden is None
    assert loader_workers(ctx).blocker(loader, count, loop) is None


@pytest.mark.parametrize(
    "arguments, written",
    [("ds, batch_size=8, num_workers=0", True), ("ds, batch_size=8, num_workers=0, prefetch_factor=None", False)],
)
def test_an_explicit_zero_is_replaced_only_when_it_is_the_only_worker_option(arguments, written):
    ctx, loader, loop = _loader(MAP_STYLE, arguments)
    count = loader_workers(ctx).count(loader)
    assert ctx.source(count.zero) == "0" and count.written is written
    blocker = loader_workers(ctx).blocker(loader, count, loop)
    assert (blocker is None) is written and (written or blocker.kind == "explicit")


@pytest.mark.parametrize("arguments", ["ds, num_workers=2", "ds, persistent_workers=False"])
def test_a_loader_told_how_to_load_is_left_as_it_is(arguments):
    ctx, loader, _ = _loader(MAP_STYLE, arguments)
    assert loader_workers(ctx).count(loader) is None


def test_what_keeps_a_loader_from_workers():
    ctx, loader, loop = _loader("ds = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))\n", "ds, batch_size=8")
    assert loader_workers(ctx).blocker(loader, loader_workers(ctx).count(loader), loop).kind == "indexes"
    ctx, loader, loop = _loader(MAP_STYLE, "ds, batch_size=8", after="    ds.scale = 2\n")
    blocker = loader_workers(ctx).blocker(loader, loader_workers(ctx).count(loader), loop)
    assert blocker.kind == "changed" and ctx.source(blocker.node).startswith("ds.scale")
    ctx, loader, _ = _loader(MAP_STYLE, "ds, batch_size=8, **options")
    assert ctx.source(loader_workers(ctx).count(loader).hidden) == "options"
