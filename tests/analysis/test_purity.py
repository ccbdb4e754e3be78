"""Purity of the file's own functions and methods: what may be computed once
instead of once per step."""

import textwrap

import libcst as cst
import pytest

from codemod.context import FileContext

TOKENIZER = """
import random

SEP = " "
counter = [0]


class WordTokenizer:
    pad = 0

    def __init__(self, docs):
        vocab = {"<pad>": 0, "<unk>": 1}
        for d in docs:
            for w in d.split():
                vocab.setdefault(w, len(vocab))
        self.vocab = vocab

    def encode(self, text, max_len):
        ids = [self.vocab.get(w, 1) for w in text.split()][:max_len]
        return ids + [self.pad] * (max_len - len(ids))

    def chat_template(self, role):
        return self.encode("<%s> you are a helpful model" % role, 8)

    def padded(self, texts):
        out = []
        for t in texts:
            out.append(self.encode(t, 4))
        return out
{extra}
"""


def purity(source: str) -> dict[str, bool]:
    context = FileContext.of_source(textwrap.dedent(source))
    return {f.name.value: context.purity.is_pure(f) for f in context.index.find(cst.FunctionDef)}


def test_a_small_tokenizer_class_is_pure():
    found = purity(TOKENIZER.replace("{extra}", ""))
    assert found["encode"] and found["chat_template"] and found["padded"]
    assert not found["__init__"]  # it assigns to self


@pytest.mark.parametrize(
    "extra, impure",
    [
        ("\n    def grow(self, w):\n        self.vocab[w] = len(self.vocab)\n", "encode"),  # vocab changes later
        ("\ndef add(tok):\n    tok.vocab.update({'x': 2})\n", "encode"),  # changed from outside the class
        ("\n    def reset(self):\n        self.vocab = {}\n", "encode"),  # rebound outside __init__
        ("\n    def noisy(self, t):\n        return self.encode(t, random.randint(1, 4))\n", "noisy"),
        ("\n    def logged(self, t):\n        print(t)\n        return self.encode(t, 4)\n", "logged"),
        ("\n    def joined(self, ts):\n        return SEP.join(ts)\n", "joined"),  # a module variable
        ("\n    def counted(self, t):\n        counter.append(t)\n        return t\n", "counted"),
        ("\n    def into(self, t, out):\n        out.append(t)\n        return out\n", "into"),  # an argument
        ("\n    def rec(self, t):\n        return self.rec(t[1:]) if t else t\n", "rec"),
        (
            "\n    def guarded(self, t):\n        try:\n            return self.encode(t, 4)\n        except KeyError:\n            return []\n",
            "guarded",
        ),
    ],
)
def test_what_makes_a_method_impure(extra, impure):
    assert purity(TOKENIZER.replace("{extra}", extra))[impure] is False


def test_a_local_function_over_builtins_is_pure_and_calls_of_it_too():
    source = "def words(text):\n    return sorted(set(text.lower().split()))\n\nn = words('a b')\n"
    context = FileContext.of_source(source)
    call = [c for c in context.index.find(cst.Call) if context.source(c.func) == "words"][0]
    assert context.purity.pure_call(call)


@pytest.mark.parametrize(
    ("expression", "free"),
    [
        ("torch.stack([x, x]).argmax()", True),  # torch's table and the tensor methods: one set
        ("torch.cat([x]).to('cpu').tolist()", True),
        ("x.gather(0, x.long()).isnan()", True),
        ("nn.CrossEntropyLoss()", True),  # a loss module has no weights
        ("nn.Linear(4, 4)", False),  # building it draws its weights from the RNG
        ("nn.LSTM(4, 4)", False),
        ("torch.randn(4)", False),
        ("x.add_(1)", False),
    ],
)
def test_one_notion_of_a_pure_torch_call(expression, free):
    context = FileContext.of_source(f"import torch\nimport torch.nn as nn\nx = torch.ones(4)\ny = {expression}\n")
    (statement,) = [a for a in context.index.find(cst.Assign) if context.source(a.targets[0].target) == "y"]
    assert context.purity.side_effect_free(statement.value) is free


def test_loops_and_comprehensions_that_unpack_into_locals_stay_pure():
    source = """
    class HashTokenizer:
        def __init__(self, vocab):
            self.vocab = vocab

        def __call__(self, text):
            return [sum(ord(c) * 31**i for i, c in enumerate(w)) % self.vocab for w in text.split()]

        def pairs(self, text):
            out = []
            for i, (a, b) in enumerate(zip(text, text[1:])):
                out.append(ord(a) + ord(b) + i)
            return out
    """
    assert purity(source) == {"__init__": False, "__call__": True, "pairs": True}


def test_a_call_of_an_instance_held_in_an_attribute_calls_its_dunder_call():
    source = """
    class HashTokenizer:
        def __init__(self, vocab):
            self.vocab = vocab

        def __call__(self, text):
            return [len(w) % self.vocab for w in text.split()]

    class Trainer:
        def __init__(self):
            self.tokenizer = HashTokenizer(64)

        def step(self):
            return self.tokenizer("a b")
    """
    context = FileContext.of_source(textwrap.dedent(source))
    (call,) = [c for c in context.index.find(cst.Call) if context.source(c.func) == "self.tokenizer"]
    callee = context.kinds.local_callee(call)
    assert callee is not None and callee.name.value == "__call__"
    assert context.purity.pure_call(call)


@pytest.mark.parametrize(
    ("body", "pure"),
    [
        # a GCN's normalised adjacency: torch's functions and tensor methods, nothing drawn or written
        (
            "a_hat = a + torch.eye(a.shape[0], device=a.device)\n    d = a_hat.sum(dim=1).pow(-0.5)\n"
            "    return d[:, None] * a_hat * d[None, :]",
            True,
        ),
        ("return a + torch.randn(a.shape)", False),  # draws from the RNG
        ("a.add_(1)\n    return a", False),  # writes its argument in place
        ("return a.clamp_(0)", False),
    ],
)
def test_a_function_of_torch_math_is_pure(body, pure):
    source = f"import torch\n\ndef f(a):\n    {body}\n\ny = f(torch.ones(3, 3))\n"
    context = FileContext.of_source(source)
    call = [c for c in context.index.find(cst.Call) if context.source(c.func) == "f"][0]
    assert context.purity.pure_call(call) is pure
