"""PM101 and PM102 on a step that computes far longer than its batch takes to copy: a
language model of known size fed small token batches. Overlapping the copy (pinned
memory, `non_blocking=True`) would save under 1% of such a step, so neither rule fixes
it; PM102 says why. The same program with a small model is fixed as before."""

import libcst as cst
import pytest

from codemod.analysis.sizes import sizes_of
from codemod.config import Settings
from codemod.context import FileContext
from codemod.engine import process_source
from codemod.rules.blocking_host_to_device_copy import NonBlockingCopy
from codemod.rules.unpinned_loader_batches_to_cuda import UnpinnedLoaderToCuda

PROGRAM = """\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

CFG = {"vocab": 32000, "dim": DIM, "layers": LAYERS, "drop": 0.1}


class Block(nn.Module):
    def __init__(self, dim, dropout):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.dropout = dropout

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        att = (q @ k.transpose(-2, -1)).softmax(-1)
        x = x + self.proj(att @ v)
        return x + self.mlp(x)


class LM(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.emb = nn.Embedding(cfg["vocab"], cfg["dim"])
        self.blocks = nn.Sequential(*[Block(cfg["dim"], cfg["drop"]) for _ in range(cfg["layers"])])
        self.head = nn.Linear(cfg["dim"], cfg["vocab"])

    def forward(self, idx):
        return self.head(self.blocks(self.emb(idx)))


def loss_of(x, y, model, device):
    x, y = x.to(device), y.to(device)
    logits = model(x)
    return nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())


def main():
    device = torch.device("cuda")
    tokens = torch.randint(0, CFG["vocab"], (512, 256))
    loader = DataLoader(TensorDataset(tokens, tokens), batch_size=16, shuffle=True, PINNED)
    model = LM(CFG).to(device)
    opt = torch.optim.AdamW(model.parameters())
    for step, (x, y) in enumerate(loader):
        loss = loss_of(x, y, model, device)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 100 == 0:
            print(loss.item())
"""

LARGE = {"DIM": "1024", "LAYERS": "24"}  # about 4,096 tokens x 335M flops a step: 8.8 ms at 312 TFLOPS
SMALL = {"DIM": "64", "LAYERS": "2"}


def program(size: dict, pinned: bool) -> str:
    code = PROGRAM.replace(", PINNED", ", pin_memory=True" if pinned else "")
    for key, value in size.items():
        code = code.replace(key, value)
    return code


def run(code: str, rule):
    result = process_source(code.encode(), "train.py", Settings(select=(rule.CODE,)), [rule])
    assert result.error is None, result.error
    return result


def test_an_unpinned_loader_feeding_a_large_model_is_reported_with_the_step_time_not_pinned():
    result = run(program(LARGE, pinned=False), UnpinnedLoaderToCuda)
    [finding] = result.findings
    assert result.new_source is None or b"pin_memory" not in result.new_source
    assert "not pinned: the forward's matrix products alone take at least 8.8 ms a step" in finding.message
    assert "over 100 times the 55 us a blocking copy of its 66 KB batch can cost it" in finding.message


def test_an_unpinned_loader_feeding_a_small_model_is_pinned():
    result = run(program(SMALL, pinned=False), UnpinnedLoaderToCuda)
    [finding] = result.findings
    assert b"pin_memory=" in result.new_source
    assert "not pinned" not in finding.message


@pytest.mark.parametrize(("size", "fixed"), [(LARGE, False), (SMALL, True)])
def test_a_pinned_batch_is_copied_non_blocking_only_where_the_step_is_short(size, fixed):
    """The copies are in a helper whose parameters are rebound (`x = x.to(device)`): the
    rows the model runs over come through what the loop passes it."""
    result = run(program(size, pinned=True), NonBlockingCopy)
    assert bool(result.findings) is fixed
    if fixed:
        assert b"x.to(device, non_blocking=True), y.to(device, non_blocking=True)" in result.new_source


def test_a_read_of_a_rebound_parameter_reads_the_parameter():
    code = "def f(x, device):\n    x = x.to(device)\n    return x\n"
    context = FileContext(cst.parse_module(code), "t.py", Settings(), code)
    function = context.module.body[0]
    receiver = function.body.body[0].body[0].value.func.value  # `x` in `x.to(device)`
    returned = function.body.body[1].body[0].value  # `x` in `return x`
    assert context.kinds.parameter_read(receiver) == (function, function.params.params[0])
    assert context.kinds.parameter_read(returned) is None


def test_a_recursive_helper_that_copies_is_fed_by_the_loops_around_its_outer_calls():
    """`_prepare_input` calls itself on each element of a dict or list: its recursive calls
    run inside the loop around the outer call, which is what feeds the copy."""
    code = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

device = torch.device("cuda")


def prepare(data):
    if isinstance(data, dict):
        return {k: prepare(v) for k, v in data.items()}
    if isinstance(data, (tuple, list)):
        return type(data)(prepare(v) for v in data)
    return data.to(device)


loader = DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=8, pin_memory=True)
for batch in loader:
    batch = prepare(batch)
"""
    context = FileContext(cst.parse_module(code), "t.py", Settings(), code)
    copy = next(c for c in context.index.find(cst.Call) if context.source(c) == "data.to(device)")
    size, loops = sizes_of(context).feeding_batch_bytes(copy)
    assert size == 8 * 8 * 4
    assert [context.line(loop) for loop in loops] == [16]  # `for batch in loader:`
