"""PM203 on a tokenizer class of the script called as `self.tokenizer(text)`, and on
torch computations of invariant operands (`torch.tril(torch.ones(L, L))`): hoisted,
and the rewrite trains bit for bit as the original."""

import contextlib
import io
import re

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rules.loop_invariant_tokenization import LoopInvariantTokenization
from tests.rules.scripts import one_thread

SCRIPT = """\
import torch
import torch.nn.functional as F


class CharHash:
    def __init__(self, buckets):
        self.buckets = buckets

    def __call__(self, text):
        return [sum(ord(c) * 7**i for i, c in enumerate(w)) % self.buckets for w in text.split()]


class Trainer:
    def __init__(self):
        torch.manual_seed(0)
        self.tokenizer = CharHash(32)
        self.emb = torch.nn.Embedding(32, 16)
        self.head = torch.nn.Linear(16, 3)
        params = list(self.emb.parameters()) + list(self.head.parameters())
        self.opt = torch.optim.SGD(params, lr=0.1)

    def fit(self, steps):
        for step in range(steps):
            prompt = torch.tensor(self.tokenizer("label the words of this line"))
            n = len(prompt)
            mask = torch.tril(torch.ones(n, n))
            h = (mask @ self.emb(prompt)) / mask.sum(-1, keepdim=True)
            loss = F.cross_entropy(self.head(h), torch.arange(n) % 3)
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            print(f"step {step} loss {loss.item()!r}")


Trainer().fit(6)
"""


def losses(source: str) -> list[str]:
    out = io.StringIO()
    with one_thread(), contextlib.redirect_stdout(out):
        exec(compile(source, "<script>", "exec"), {"__name__": "__main__"})
    return re.findall(r"loss (\S+)", out.getvalue())


def rewrite(source: str) -> str:
    result = process_source(source.encode(), "<script>", Settings(select=("PM203",)), [LoopInvariantTokenization])
    assert result.error is None, result.error
    return result.new_source.decode()


def test_an_own_callable_tokenizer_and_the_mask_built_from_its_ids_run_once():
    new_source = rewrite(SCRIPT)
    loop = new_source[new_source.index("for step in range(steps):") :]
    for hoisted in ("self.tokenizer(", "n = len(prompt)", "torch.tril("):
        assert hoisted in new_source and hoisted not in loop, hoisted
    before, after = losses(SCRIPT), losses(new_source)
    assert len(before) == 6 and after == before


def test_a_torch_computation_of_a_trained_parameter_stays_in_the_loop():
    script = SCRIPT.replace(
        "            mask = torch.tril(torch.ones(n, n))\n",
        "            mask = torch.tril(torch.sigmoid(self.head.weight[:, :1] @ self.head.weight[:, :1].T))[:n, :n]\n",
    ).replace("torch.arange(n) % 3", "torch.arange(n).clamp(max=2) % 3")
    new_source = rewrite(script)
    loop = new_source[new_source.index("for step in range(steps):") :]
    assert "torch.sigmoid(" in loop
