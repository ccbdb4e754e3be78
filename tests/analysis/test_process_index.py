"""The process index a process start passes first: `mp.spawn(main, args=(world_size,),
nprocs=n)` runs `main(i, world_size)` in process i, so `main`'s first parameter is an
int, and `model.to(rank)` puts the model on CUDA device `rank`."""

from __future__ import annotations

import libcst as cst
import pytest

from codemod.config import Settings
from codemod.context import FileContext
from codemod.engine import process_source
from codemod.rule import Level

SPAWNED = """\
import torch
import torch.multiprocessing as mp


def main(rank, world_size, epochs):
    model = torch.nn.Linear(8, 1).to(rank)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(epochs):
        loss = model(torch.randn(4, 8, device=rank)).pow(2).mean()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    {start}
"""
SPAWN = "mp.spawn(main, args=(2, 3), nprocs=2)"


def first_param(code: str) -> tuple[FileContext, cst.Param]:
    context = FileContext.of_source(code)
    main = next(f for f in context.index.find(cst.FunctionDef) if f.name.value == "main")
    return context, main.params.params[0]


def moved_to(context: FileContext) -> cst.BaseExpression:
    """The argument of `.to(rank)`: a read of the parameter."""
    call = next(c for c in context.index.find(cst.Call) if context.source(c.func).endswith(".to"))
    return call.args[0].value


@pytest.mark.parametrize("start", [SPAWN, "mp.start_processes(main, args=(2, 3), nprocs=2)"])
def test_the_first_parameter_of_a_spawned_function_is_the_process_index(start):
    context, rank = first_param(SPAWNED.format(start=start))
    assert context.loops.gets_process_index(rank)
    assert context.training.is_int(moved_to(context))
    assert context.training.device_types(moved_to(context)) == frozenset({"cuda"})


@pytest.mark.parametrize(
    ("start", "why"),
    [
        ("mp.Process(target=main, args=(0, 2, 3)).start()", "Process passes its args alone"),
        (SPAWN + "\n    main('cpu', 1, 3)", "also called with a device string"),
        (SPAWN + "\n    run = main", "handed on under another name"),
    ],
)
def test_no_process_index_where_another_call_may_pass_anything(start, why):
    context, rank = first_param(SPAWNED.format(start=start))
    assert not context.loops.gets_process_index(rank), why
    assert not context.training.is_int(moved_to(context)), why


def test_pm402_fuses_the_optimizer_of_a_model_moved_to_the_process_index():
    code = SPAWNED.format(start=SPAWN)
    result = process_source(code.encode(), "<spawned>", Settings(select=("PM402",), level=Level.UNSAFE))
    (finding,) = result.findings
    assert finding.applied and b"lr=0.1, fused=True)" in result.new_source
