"""PM101 on the batches of a loader that reach a copy through function values, as in spd:
the training function of `run.py` defines `create_pgd_data_iter()`, a closure that returns
`iter(train_loader)`, and hands it to an evaluation of `evalmod.py`, which hands it on to
`pgd.py` (in a call, or in a call of a partial of the function it calls); there a
`functools.partial` of `_fwd_bwd` is called with `data_iter=create_data_iter()`, and
`_fwd_bwd` copies `next(data_iter)`. The copy is fixed when the loader `main.py` passes to
the training function pins its batches, and the rewritten module computes the same
losses on the CPU; it is left alone when that loader does not pin, and names the callers
whose function values give unpinned batches."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.package_support import check_unsafe, run_main, write_package

DATA = """\
import torch
from torch.utils.data import DataLoader, TensorDataset


def make_loader(n):
    data = TensorDataset(torch.randn(n, 4), torch.randn(n, 1))
    generator = torch.Generator()
    return DataLoader(data, batch_size=4, shuffle=True, generator=generator, pin_memory={pin})


def inputs_of(batch) -> torch.Tensor:
    return batch[0] if isinstance(batch, (list, tuple)) else batch
"""

PGD = """\
import functools

import torch

from {package}.data import inputs_of


def pgd_loss(model, create_data_iter, device, n_steps):
    source = torch.zeros(4, requires_grad=True)
    fwd_bwd = functools.partial(_fwd_bwd, model, source=source, device=device, accumulation=3)
    for _ in range(n_steps):
        loss, grad = fwd_bwd(data_iter=create_data_iter())
        with torch.no_grad():
            source.add_(0.1 * grad.sign())
    final, _ = fwd_bwd(data_iter=create_data_iter(), accumulation=2)
    return final


def _fwd_bwd(model, data_iter, source, device, accumulation):
    total = torch.tensor(0.0, device=device)
    for _ in range(accumulation):
        item = next(data_iter)
        x = inputs_of(item).to(device)
        total = total + model(x * source).pow(2).mean()
    grad = torch.autograd.grad(total, source)[0]
    return total.detach(), grad
"""

EVALUATION = """\
from {package}.pgd import pgd_loss


def evaluate_pgd(model, create_data_iter, device):
    return pgd_loss(model, create_data_iter=create_data_iter, device=device, n_steps=2)
"""

# The evaluation calls `pgd_loss` through a partial of its own.
EVALUATION_THROUGH_A_PARTIAL = """\
from functools import partial

from {package}.pgd import pgd_loss


def evaluate_pgd(model, create_data_iter, device):
    run_pgd = partial(pgd_loss, model, device=device, n_steps=2)
    return run_pgd(create_data_iter=create_data_iter)
"""

RUN = """\
import torch

from {package}.evalmod import evaluate_pgd


def optimize(model, device, train_loader, seed):
    def create_pgd_data_iter():
        train_loader.generator.manual_seed(seed)
        return iter(train_loader)

    losses = []
    for step in range(3):
        losses.append(evaluate_pgd(model, create_data_iter=create_pgd_data_iter, device=device))
    return torch.stack(losses)
"""

MAIN = """\
import torch

from {package}.data import make_loader
from {package}.run import optimize


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = torch.nn.Linear(4, 1).to(device)
    return optimize(model, device, make_loader(24), seed=0)
"""

# A second evaluation, whose function value iterates a loader that does not pin.
PLAIN_CALLER = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

from {package}.evalmod import evaluate_pgd


def main():
    torch.manual_seed(0)
    plain = DataLoader(TensorDataset(torch.randn(24, 4)), batch_size=4)
    return evaluate_pgd(torch.nn.Linear(4, 1), lambda: iter(plain), torch.device("cpu")).reshape(1)
"""

# The function value is a function of another module, over a loader it builds.
MODULE_FUNCTION_CALLER = """\
import torch

from {package} import data

torch.manual_seed(1)
LOADER = data.make_loader(24)


def fresh_iter():
    LOADER.generator.manual_seed(0)
    return iter(LOADER)
"""
MAIN_PASSING_A_MODULE_FUNCTION = """\
import torch

from {package}.evalmod import evaluate_pgd
from {package}.sources import fresh_iter


def main():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    return evaluate_pgd(model, create_data_iter=fresh_iter, device=torch.device("cpu")).reshape(1)
"""

COPY = "x = inputs_of(item).to(device)"
FIXED = "x = inputs_of(item).to(device, non_blocking=True)"


def _package(tmp_path: Path, pin: str, others: dict[str, str] | None = None) -> Path:
    files = {"data.py": DATA, "pgd.py": PGD, "evalmod.py": EVALUATION, "run.py": RUN, "main.py": MAIN}
    return write_package(tmp_path, "spdpgd", {**files, "data.py": DATA.replace("{pin}", pin), **(others or {})})


def _computes_the_same(tmp_path: Path, folder: Path, rewritten: str, *entries: str) -> None:
    """Each entry module's `main()` gives the same losses with `rewritten` as pgd.py."""
    before = [run_main(tmp_path, entry).tolist() for entry in entries]
    (folder / "pgd.py").write_text(rewritten)
    assert [run_main(tmp_path, entry).tolist() for entry in entries] == before


@pytest.mark.parametrize("evaluation", [EVALUATION, EVALUATION_THROUGH_A_PARTIAL], ids=["call", "partial"])
def test_a_copy_of_batches_of_a_function_value_handed_through_a_partial_is_fixed(tmp_path, evaluation):
    folder = _package(tmp_path, "torch.cuda.is_available()", {"evalmod.py": evaluation})
    result = check_unsafe(folder / "pgd.py", "PM101")
    assert [(f.code, f.line) for f in result.findings] == [("PM101", 23)]
    assert result.findings[0].message == "host-to-device copy blocks the CPU; pass non_blocking=True"
    rewritten = result.new_source.decode()
    assert FIXED in rewritten
    _computes_the_same(tmp_path, folder, rewritten, "spdpgd.main")


def test_a_function_of_another_module_passed_as_the_value_is_followed_to_its_loader(tmp_path):
    others = {"sources.py": MODULE_FUNCTION_CALLER, "main.py": MAIN_PASSING_A_MODULE_FUNCTION, "run.py": ""}
    folder = _package(tmp_path, "torch.cuda.is_available()", others)
    result = check_unsafe(folder / "pgd.py", "PM101")
    assert [f.line for f in result.findings] == [23]
    _computes_the_same(tmp_path, folder, result.new_source.decode(), "spdpgd.main")


def test_the_copy_is_left_alone_when_the_function_value_iterates_a_loader_that_does_not_pin(tmp_path):
    folder = _package(tmp_path, "False")
    result = check_unsafe(folder / "pgd.py", "PM101")
    assert result.findings == []
    assert COPY in result.new_source.decode()


def test_a_second_caller_whose_function_value_gives_unpinned_batches_is_named(tmp_path):
    """The calls named are those that pass the function values (`run.py`'s closure over
    the pinned loader, `plain.py`'s lambda over one that does not pin)."""
    folder = _package(tmp_path, "torch.cuda.is_available()", {"plain.py": PLAIN_CALLER})
    result = check_unsafe(folder / "pgd.py", "PM101")
    assert [f.line for f in result.findings] == [23]
    assert result.findings[0].message == (
        "host-to-device copy blocks the CPU; pass non_blocking=True: the batches of the loader passed at "
        "spdpgd/run.py:13 are pinned; for those of the loader passed at spdpgd/plain.py:10, not seen to "
        "be pinned, the copy stays synchronous"
    )
    _computes_the_same(tmp_path, folder, result.new_source.decode(), "spdpgd.main", "spdpgd.plain")
