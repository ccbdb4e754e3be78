"""The name-kind analysis: what each name holds and where, on small programs.

Each case marks the expression under test with a `probe(...)` call; the test
asks Kinds for the fact of the probe's argument."""

import libcst as cst
import pytest

from codemod.analysis.values import Fact, Kind, Memory, Place
from codemod.context import FileContext

HEAD = """\
import torch
import torch.nn as nn
import torch.utils.data as tud
from torch.utils.data import DataLoader as DL, TensorDataset
import numpy as np
device = torch.device("cuda")
"""


def facts_of_probes(code: str) -> list[Fact]:
    context = FileContext.of_source(HEAD + code)
    kinds = context.kinds
    found = []

    class Probe(cst.CSTVisitor):
        def visit_Call(self, node):
            if isinstance(node.func, cst.Name) and node.func.value == "probe":
                found.append(kinds.fact(node.args[0].value))

    context.module.visit(Probe())
    return found


TENSOR_HOST = Fact(Kind.TENSOR, Place.HOST)
TENSOR_CUDA = Fact(Kind.TENSOR, Place.CUDA)
TENSOR_ANY = Fact(Kind.TENSOR, Place.UNKNOWN)
UNKNOWN = Fact(Kind.UNKNOWN)

CASES = [
    ("x = torch.randn(3)\nprobe(x)", [TENSOR_HOST]),
    ("x = torch.zeros(3, device='cuda:0')\nprobe(x)", [TENSOR_CUDA]),
    ("x = torch.zeros(3, device=device)\nprobe(x)", [TENSOR_CUDA]),
    ("x = torch.from_numpy(np.ones(3))\nprobe(x)", [TENSOR_HOST]),
    ("x = torch.randn(3).cuda()\nprobe(x)", [TENSOR_CUDA]),
    ("x = torch.randn(3).to(device)\nprobe(x.float())", [TENSOR_CUDA]),
    ("x = torch.randn(3).to(torch.float16)\nprobe(x)", [TENSOR_HOST]),
    ("x = torch.randn(3, device=device)\nprobe(x.cpu())\nprobe(x[0])", [TENSOR_HOST, TENSOR_CUDA]),
    ("m = nn.Linear(2, 2)\nprobe(m)\nprobe(m.to(device))", [Fact(Kind.MODULE), Fact(Kind.MODULE, Place.CUDA)]),
    # a module just built is on the host; one a name holds and moves in place is not known to be
    ("class Net(nn.Module):\n    pass\nclass Big(Net):\n    pass\nprobe(Big())", [Fact(Kind.MODULE, Place.HOST)]),
    ("class DataLoader:\n    pass\nprobe(DataLoader())", [UNKNOWN]),
    # The import of DL in HEAD is shadowed by a local class: not torch's loader any more.
    ("class DL:\n    pass\nprobe(DL(None))", [UNKNOWN]),
    # a loss module holds no parameters: its output is where its input is
    (
        "criterion = nn.CrossEntropyLoss()\nx = torch.randn(4, 3).to(device)\nprobe(criterion(x, None))",
        [TENSOR_CUDA],
    ),
    ("criterion = nn.MSELoss()\nprobe(criterion(torch.randn(4), torch.randn(4)))", [TENSOR_HOST]),
    ("opt = torch.optim.AdamW([])\nprobe(opt)", [Fact(Kind.OPTIMIZER)]),
    ("sched = torch.optim.lr_scheduler.StepLR(None, 1)\nprobe(sched)", [UNKNOWN]),
    ("ds = TensorDataset(torch.randn(4, 2))\nl = DL(ds)\nprobe(l)", [Fact(Kind.LOADER, Place.HOST)]),
    (
        "ds = TensorDataset(torch.randn(4, 2, device=device))\nl = tud.DataLoader(ds)\nprobe(l)",
        [Fact(Kind.LOADER, Place.CUDA)],
    ),
    ("l = DL(None)\nfor x, y in l:\n    probe(x)\n    probe(y)", [TENSOR_HOST, TENSOR_HOST]),
    ("l = DL(None)\nfor i, (x, y) in enumerate(l):\n    probe(i)\n    probe(x)", [UNKNOWN, TENSOR_HOST]),
    (
        "l = DL(None)\nfor batch in l:\n    probe(batch)\n    probe(batch['ids'])",
        [Fact(Kind.BATCH, Place.HOST), TENSOR_HOST],
    ),
    ("l = DL(None)\nfor batch in l:\n    probe({k: probe(v) for k, v in batch.items()})", [UNKNOWN, TENSOR_HOST]),
    ("l = DL(None)\nbatch = next(iter(l))\nx, y = batch\nprobe(x)", [TENSOR_HOST]),
    # The last binding before a use wins when it dominates the use ...
    ("x = torch.randn(3)\nx = x.cuda()\nprobe(x)", [TENSOR_CUDA]),
    # ... and the loop target re-binds before `x = x.to(...)` is carried around.
    ("l = DL(None)\nfor x, y in l:\n    probe(x)\n    x = x.to(device)\n    probe(x)", [TENSOR_HOST, TENSOR_CUDA]),
    # Without a re-binding, the later binding in the loop reaches the earlier use.
    ("x = torch.randn(3)\nfor _ in range(3):\n    probe(x)\n    x = x.cuda()", [TENSOR_ANY]),
    # A loop-carried self-reference is resolved to a fixpoint, not poisoned by the cycle.
    ("x = torch.randn(3)\nfor _ in range(3):\n    x = x.cuda()\nprobe(x)", [TENSOR_ANY]),
    ("x = torch.randn(3)\nfor _ in range(3):\n    probe(x.cuda())\n    x = x * 2", [TENSOR_CUDA]),
    # A binding in a branch does not dominate: both reach.
    ("x = torch.randn(3)\nif c:\n    x = x.cuda()\nprobe(x)", [TENSOR_ANY]),
    ("def f(t: torch.Tensor, device):\n    probe(t)\n    probe(device)", [TENSOR_ANY, Fact(Kind.DEVICE)]),
    ("def f(batch):\n    probe(batch)", [UNKNOWN]),
    ("d = 'cuda' if torch.cuda.is_available() else 'cpu'\nprobe(d)", [Fact(Kind.DEVICE, Place.UNKNOWN)]),
    ("x = torch.randn(3) * 2 + torch.randn(3)\nprobe(x)", [TENSOR_HOST]),
    ("x = torch.stack([torch.randn(3), torch.randn(3)])\nprobe(x)", [TENSOR_HOST]),
    ("torch.set_default_device('cuda')\nx = torch.randn(3)\nprobe(x)", [TENSOR_ANY]),
    # draws from the tensors they are given are where those are (`Op.placement`), not made
    # where a factory is told: a mask of dropout probabilities on the GPU, indices of weights
    ("p = torch.full((3,), 0.5, device=device)\nprobe(torch.bernoulli(p))", [TENSOR_CUDA]),
    ("w = torch.ones(4, device=device)\nprobe(torch.multinomial(w, 2))", [TENSOR_CUDA]),
    ("x = torch.randn(3, device=device)\nprobe(x.new_zeros(3))\nprobe(x.argmax())", [TENSOR_CUDA, TENSOR_CUDA]),
    # a `_like` factory makes its tensor where the one it copies is, unless told otherwise
    (
        "x = torch.randn(3, device=device)\nprobe(torch.zeros_like(x))\nprobe(torch.rand_like(x, device='cpu'))",
        [TENSOR_CUDA, TENSOR_HOST],
    ),
    ("probe(torch.zeros_like(torch.randn(3)))", [TENSOR_HOST]),
]


@pytest.mark.parametrize("code,expected", CASES, ids=[c[0].splitlines()[-1][:40] for c in CASES])
def test_fact(code, expected):
    # what a name holds and where; the memory of host tensors: tests/analysis/test_kinds_memory.py
    assert [(f.kind, f.place, f.single) for f in facts_of_probes(code)] == [
        (e.kind, e.place, e.single) for e in expected
    ]


def copy_of_last_call(code: str):
    context = FileContext.of_source(HEAD + code)
    kinds = context.kinds
    calls = []

    class Calls(cst.CSTVisitor):  # the outermost call of the last line
        def visit_Call(self, node):
            if context.module.body[-1].body[0].value is node:
                calls.append(node)

    context.module.visit(Calls())
    return kinds, kinds.copy_of(calls[-1])


@pytest.mark.parametrize(
    "code,target,moves,non_blocking",
    [
        ("x.to(device)", Place.CUDA, True, False),
        ("x.to('cpu')", Place.HOST, True, False),
        ("x.to(torch.float16)", Place.UNKNOWN, False, False),
        ("x.to(dtype=torch.float16)", Place.UNKNOWN, False, False),
        ("x.to(d, torch.float16)", Place.UNKNOWN, True, False),
        ("x.to(device, torch.float16, True)", Place.CUDA, True, True),
        ("x.to(device, non_blocking=False)", Place.CUDA, True, True),
        ("x.cuda(0, True)", Place.CUDA, True, True),
        ("x.to(torch.device('cpu'))", Place.HOST, True, False),
        ("x.to(f'cuda:{rank}')", Place.UNKNOWN, True, False),
    ],
)
def test_copy_of(code, target, moves, non_blocking):
    _, copy = copy_of_last_call(code + "\n")
    assert (copy.target, copy.moves_device, copy.has_non_blocking) == (target, moves, non_blocking)


@pytest.mark.parametrize("code", ["x.to(thing)", "x.to(*args)", "x.float()"])
def test_copy_of_undecidable_or_other(code):
    _, copy = copy_of_last_call(code + "\n")
    assert copy is None


def test_the_copies_of_host_tensors_to_the_device_in_a_loop():
    context = FileContext.of_source(
        HEAD
        + "device = torch.device('cuda')\n"
        + "table = torch.randn(8, 4)\n"
        + "for step in range(3):\n"
        + "    t = table.to(device)\n"
        + "    u = t.to(device)\n"
        + "    v = table.to(torch.float16)\n"
        + "    w = table.cuda()\n"
        + "    model.to(device)\n"
    )
    loop = context.module.body[-1]
    uploads = context.kinds.host_uploads(loop.body)
    # not a tensor on the device already, a cast that stays on the host, or a model
    assert [context.source(call) for call in uploads] == ["table.to(device)", "table.cuda()"]


@pytest.mark.parametrize(
    "code,mutated",
    [
        ("buf = torch.empty(3)\nbuf.copy_(torch.ones(3))\nprobe(buf)", True),
        ("buf = torch.empty(3)\nbuf[0] = 1\nprobe(buf)", True),
        ("buf = torch.empty(3)\nbuf += 1\nprobe(buf)", True),
        ("buf = torch.empty(3)\ntorch.add(buf, 1, out=buf)\nprobe(buf)", True),
        ("buf = torch.empty(3)\ny = buf.add(1)\nprobe(buf)", False),
        # a part or view of the storage, written
        ("buf = torch.empty(3, 2)\nbuf[:, 0].copy_(torch.ones(3))\nprobe(buf)", True),
        ("buf = torch.empty(3, 2)\nbuf[1:] += 1\nprobe(buf)", True),
        ("buf = torch.empty(3, 2)\nbuf.T[0].fill_(1)\nprobe(buf)", True),
        ("buf = torch.empty(3, 2)\nbuf.data.zero_()\nprobe(buf)", True),
        ("buf = torch.empty(3, 2)\nbuf.view(-1)[:2].copy_(torch.ones(2))\nprobe(buf)", True),
        ("buf = torch.empty(3, 2)\ncol = buf[:, 0]\nflat = col.view(-1)\nflat.fill_(1)\nprobe(buf)", True),
        ("buf = torch.empty(3, 2)\ncol = buf[:, 0]\ncol = col * 2\ncol.fill_(1)\nprobe(buf)", True),
        # read only: a copy of a part, a part read into a sum
        ("buf = torch.empty(3, 2)\ny = buf[:, 0].clone()\ny.add_(1)\nprobe(buf)", False),
        ("buf = torch.empty(3, 2)\ntotal = torch.zeros(2)\ntotal += buf[0]\nprobe(buf)", False),
        ("buf = torch.empty(3, 2)\ncol = buf[:, 0].clone()\ncol.fill_(1)\nprobe(buf)", False),
    ],
)
def test_in_place_mutation(code, mutated):
    context = FileContext.of_source(HEAD + code)
    kinds = context.kinds
    probes = []

    class Probe(cst.CSTVisitor):
        def visit_Call(self, node):
            if isinstance(node.func, cst.Name) and node.func.value == "probe":
                probes.append(node.args[0].value)

    context.module.visit(Probe())
    assert kinds.is_mutated_in_place(probes[0]) is mutated


def test_a_question_that_needs_more_work_than_its_budget_is_unknown(monkeypatch):
    """A chain of helpers, each returning what the next gives: known within the
    budget, UNKNOWN (never a guess) past it."""
    chain = "def f0():\n    return torch.zeros(3)\n" + "".join(
        f"def f{i}():\n    return f{i - 1}()\n" for i in range(1, 40)
    )
    code = chain + "probe(f39())\n"
    assert facts_of_probes(code) == [Fact(Kind.TENSOR, Place.HOST, memory=Memory.PAGEABLE)]
    monkeypatch.setattr("codemod.analysis.values.WORK_PER_QUESTION", 10)
    assert facts_of_probes(code) == [UNKNOWN]


def lists_in_memory(code: str) -> list[bool]:
    context = FileContext.of_source(HEAD + code)
    found = []

    class Probe(cst.CSTVisitor):
        def visit_Call(self, node):
            if isinstance(node.func, cst.Name) and node.func.value == "probe":
                found.append(context.kinds.in_memory_list(node.args[0].value))

    context.module.visit(Probe())
    return found


@pytest.mark.parametrize(
    "code,expected",
    [
        ("docs = ['a b', 'c']\nprobe(docs)", [True]),
        ("docs = [line.strip() for line in open('f')]\nprobe(docs)", [True]),
        ("docs = sorted(set(words))\nprobe(docs)\nprobe(open('f').read().split())", [True, True]),
        # a function of the file that fills a list and returns it (naive_lm's make_corpus)
        (
            "def corpus(n):\n    docs = []\n    for _ in range(n):\n        docs.append('a b')\n    return docs\n"
            "docs = corpus(3)\nprobe(docs)",
            [True],
        ),
        ("def stream(n):\n    for _ in range(n):\n        yield 'a b'\nprobe(stream(3))", [False]),
        ("from datasets import load_dataset\ndocs = load_dataset('x')['train']['text']\nprobe(docs)", [False]),
        ("docs = ['a'] if flag else load_texts()\nprobe(docs)", [False]),
    ],
)
def test_in_memory_list(code, expected):
    assert lists_in_memory(code) == expected
