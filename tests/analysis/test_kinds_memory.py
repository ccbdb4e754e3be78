"""The memory of host tensors (issue 22): pinned where the program asks for it
(a DataLoader that pins its batches, `.pin_memory()`, `pin_memory=True`) and
through views of such tensors; pageable where a factory, numpy, a tokenizer or a
computation on pageable tensors makes them; unknown otherwise."""

import pytest

from codemod.analysis.values import Memory, PassedMemory
from tests.analysis.test_kinds import HEAD, facts_of_probes

LOADER = "ds = TensorDataset(torch.randn(8, 3), torch.randn(8))\n"
CASES = [
    # pinned
    (LOADER + "for x, y in DL(ds, batch_size=2, pin_memory=True):\n    probe(x)", Memory.PINNED),
    (LOADER + "loader = DL(ds, 2, False, None, None, 0, None, True)\nfor x, y in loader:\n    probe(y)", Memory.PINNED),
    (LOADER + "for b in DL(ds, pin_memory=device.type == 'cuda'):\n    probe(b[0])", Memory.PINNED),
    (
        LOADER + "kw = {'batch_size': 2}\nkw.update({'pin_memory': True})\nfor b in DL(ds, **kw):\n    probe(b)",
        Memory.PINNED,
    ),
    (LOADER + "kw = dict(batch_size=2, pin_memory=True)\nfor b in DL(ds, **kw):\n    probe(b)", Memory.PINNED),
    (LOADER + "it = iter(DL(ds, pin_memory=True))\nprobe(next(it)[1])", Memory.PINNED),
    (LOADER + "for b in DL(ds, pin_memory=True):\n    probe({k: v for k, v in enumerate(b)}[0])", Memory.PINNED),
    ("probe(torch.randn(3).pin_memory())", Memory.PINNED),
    ("probe(torch.empty(4, 2, pin_memory=True)[1:].view(-1).T)", Memory.PINNED),
    ("x = torch.zeros(4, pin_memory=True)\nfor i in range(4):\n    probe(x[i])", Memory.PINNED),
    ("x = torch.zeros(4, pin_memory=True)\nx.mul_(2)\nprobe(x.add_(1))", Memory.PINNED),
    # pageable
    ("probe(torch.tensor([1, 2, 3]))", Memory.PAGEABLE),
    ("probe(torch.from_numpy(np.zeros(3)))", Memory.PAGEABLE),
    ("probe(torch.zeros(3, 4))", Memory.PAGEABLE),
    ("probe(torch.zeros(3, pin_memory=False))", Memory.PAGEABLE),
    ("X = torch.randn(8, 3)\nprobe(torch.stack([X[i : i + 2] for i in range(0, 8, 2)]))", Memory.PAGEABLE),
    ("probe(torch.stack([torch.from_numpy(a) for a in [np.ones(3)]]))", Memory.PAGEABLE),
    ("enc = tok(['a b'], return_tensors='pt')\nprobe(enc['input_ids'])", Memory.PAGEABLE),
    (LOADER + "for x, y in DL(ds, batch_size=2):\n    probe(x)", Memory.PAGEABLE),
    ("probe(torch.randn(3) * 2 + 1)", Memory.PAGEABLE),
    ("probe(torch.randn(3, device=device).cpu())", Memory.PAGEABLE),
    # unknown: computed from pinned memory (a new tensor, or the same one), or not seen
    ("probe(torch.randn(3).pin_memory().float())", Memory.UNKNOWN),
    ("probe(torch.randn(3).pin_memory() * 2)", Memory.UNKNOWN),
    ("x = torch.zeros(4, pin_memory=True)\nprobe(x[torch.tensor([0, 1])])", Memory.UNKNOWN),
    ("probe(torch.stack([torch.zeros(3, pin_memory=True)]))", Memory.UNKNOWN),
    (LOADER + "for x, y in DL(ds, collate_fn=lambda b: b):\n    probe(x)", Memory.UNKNOWN),
    (LOADER + "for x, y in DL(ds, **cfg['loader']):\n    probe(x)", Memory.UNKNOWN),
    ("def f(loader: tud.DataLoader):\n    for x in loader:\n        probe(x)", Memory.UNKNOWN),
    ("x = torch.randn(3) if flag else torch.randn(3).pin_memory()\nprobe(x)", Memory.UNKNOWN),
]


@pytest.mark.parametrize("code,memory", CASES, ids=[c[0].splitlines()[-1][:50] for c in CASES])
def test_memory(code, memory):
    (fact,) = facts_of_probes(code)
    assert fact.memory is memory, fact


TRAIN = "def train(loader):\n    for x, y in loader:\n        probe(x)\n"


@pytest.mark.parametrize(
    ("calls", "memory"),
    [
        ("train(DL(ds, pin_memory=True))\ntrain(DL(ds, batch_size=2, pin_memory=True))", Memory.PINNED),
        ("train(DL(ds))\ntrain(DL(ds, batch_size=2))", Memory.PAGEABLE),
        ("train(DL(ds))\ntrain(DL(ds, **cfg))", Memory.UNKNOWN),
        ("train(DL(ds, pin_memory=True))\ntrain(DL(ds))\ntrain(DL(ds, **cfg))", ((0,), (1, 2))),
    ],
    ids=["every-caller-pins", "none-pins", "none-seen-to-pin", "one-pins"],
)
def test_memory_of_a_loader_the_callers_pass(calls, memory):
    """Pinned when every call passes a loader that pins, the callers' memory when none
    does; when some do, which calls (`path:line`) pass loaders that pin, and which not."""
    code = LOADER + TRAIN + calls
    (fact,) = facts_of_probes(code)
    if isinstance(memory, Memory):
        assert fact.memory is memory, fact
        return
    first = (HEAD + LOADER + TRAIN).count("\n") + 1  # the line of the first call
    pinned, others = memory
    assert isinstance(fact.memory, PassedMemory)
    assert [int(site.rpartition(":")[2]) - first for site in fact.memory.pinned] == list(pinned)
    assert [int(site.rpartition(":")[2]) - first for site in fact.memory.others] == list(others)


def test_batches_of_a_generator_over_a_loader_are_those_of_the_loader_it_is_given():
    """`cycle` is called with a loader that pins and with one that does not: what each call
    yields is the batches of its own loader."""
    code = LOADER + (
        "def cycle(loader):\n    while True:\n        for b in loader:\n            yield b\n"
        "train = cycle(DL(ds, pin_memory=True))\nval = cycle(DL(ds))\n"
        "probe(next(train)[0])\nfor x, y in val:\n    probe(x)"
    )
    assert [fact.memory for fact in facts_of_probes(code)] == [Memory.PINNED, Memory.PAGEABLE]
