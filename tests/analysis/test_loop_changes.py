"""What a loop changes through a chain of attributes (`cfg.model.dim = ...`,
`self.tok.vocab = ...`): a value read through the chain is not the same on every step,
and PM203 leaves it in the loop; nor does it move a value the loop changes through an
attribute (`ids.data[0] += 1`, `enc.input_ids[:, 0] += 1`), which would carry the change
to the next step. The original and the rewrite run on the CPU and give the same losses,
bit for bit."""

import libcst as cst
import pytest

from codemod.analysis.variance import single_assignment, variance
from codemod.config import Settings
from codemod.context import FileContext
from codemod.engine import process_source
from codemod.rule import Level
from tests.package_support import stand_in_module

CONFIG = """\
from types import SimpleNamespace

import torch


def main():
    torch.manual_seed(0)
    cfg = SimpleNamespace(model=SimpleNamespace(dim=2, sizes=[2]), other=SimpleNamespace(x=0))
    emb = torch.nn.Embedding(32, 4)
    losses = []
    for step in range(4):
        pos = torch.arange(READ)
        loss = emb(pos).pow(2).mean()
        loss.backward()
        losses.append(loss.item())
        CHANGE
    return losses
"""

TOKENIZER_HELD_ON_SELF = """\
from types import SimpleNamespace

import torch


class Trainer:
    def __init__(self):
        self.tok = SimpleNamespace(vocab={"a": 1, "b": 2})
        self.emb = torch.nn.Embedding(32, 4)

    def fit(self):
        losses = []
        for step in range(4):
            pos = torch.arange(len(self.tok.vocab))
            loss = self.emb(pos).pow(2).mean()
            loss.backward()
            losses.append(loss.item())
            self.tok.vocab = {**self.tok.vocab, str(step): step}
        return losses


def main():
    torch.manual_seed(0)
    return Trainer().fit()
"""

# (what the positions are read from, what the loop changes, why they are not the same every step)
CHANGED = [
    ("cfg.model.dim", "cfg.model.dim = cfg.model.dim + 2", "`cfg.model` has attributes assigned in the loop"),
    ("cfg.model.dim", "cfg.model.dim += 2", "`cfg.model` has attributes assigned in the loop"),
    ("cfg.model.dim", 'setattr(cfg.model, "dim", step + 3)', "`cfg.model` has attributes assigned in the loop"),
    (
        "cfg.model.dim",
        "if step == 3:\n            del cfg.model.dim",
        "`cfg.model` has attributes assigned in the loop",
    ),
    ("cfg.model.sizes[0]", "cfg.model.sizes[0] += 2", "`cfg.model.sizes` is changed in place in the loop"),
    ("len(cfg.model.sizes)", "cfg.model.sizes.append(step)", "`cfg.model.sizes` is changed in place in the loop"),
]


def _config(read: str, change: str) -> str:
    return CONFIG.replace("READ", read).replace("CHANGE", change)


def _rewrite(source: str):
    result = process_source(source.encode(), "<test>", Settings(select=("PM203",), level=Level.SAFE))
    assert result.error is None, result.error
    return result


def _losses(source: str) -> list[float]:
    namespace = {"__name__": "fixture"}
    exec(compile(source, "<fixture>", "exec"), namespace)
    return namespace["main"]()


def _why_positions_stay(source: str) -> str | None:
    """Why the value of `pos = ...` is not the same on every step of the loop (None: it is)."""
    context = FileContext.of_source(source)
    loop = next(iter(context.index.find(cst.For)))
    line = next(line for line in variance(context).step_lines(loop) if "pos" in context.source(line))
    return variance(context).of(single_assignment(line).value, loop)


@pytest.mark.parametrize("read, change, reason", CHANGED)
def test_a_value_read_through_a_chain_the_loop_changes_stays_in_the_loop(read, change, reason):
    source = _config(read, change)
    assert _why_positions_stay(source) == reason
    result = _rewrite(source)
    assert not [f for f in result.findings if f.applied]
    assert _losses(result.new_source.decode()) == _losses(source)


def test_a_tokenizer_held_on_self_whose_vocab_the_loop_assigns_is_not_invariant():
    assert _why_positions_stay(TOKENIZER_HELD_ON_SELF) == "`self.tok` has attributes assigned in the loop"
    result = _rewrite(TOKENIZER_HELD_ON_SELF)
    assert not [f for f in result.findings if f.applied]
    assert _losses(result.new_source.decode()) == _losses(TOKENIZER_HELD_ON_SELF)


def test_a_chain_beside_the_one_read_leaves_the_value_invariant():
    """`cfg.other.x = ...` changes neither `cfg.model` nor what it holds: the positions are
    computed once, before the loop."""
    source = _config("cfg.model.dim", "cfg.other.x = step")
    assert _why_positions_stay(source) is None
    result = _rewrite(source)
    assert [f.applied for f in result.findings] == [True]
    assert _losses(result.new_source.decode()) == _losses(source)


CHANGED_THROUGH_A_VIEW = """\
import torch


def main():
    torch.manual_seed(0)
    emb = torch.nn.Embedding(32, 4)
    losses = []
    for step in range(4):
        ids = torch.arange(4)
        ids.data[0] += step
        loss = emb(ids).pow(2).mean()
        loss.backward()
        losses.append(loss.item())
    return losses
"""

CHANGED_THROUGH_AN_ATTRIBUTE = """\
import torch
import transformers


def main():
    torch.manual_seed(0)
    tok = transformers.GPT2TokenizerFast.from_pretrained("gpt2")
    emb = torch.nn.Embedding(32, 4)
    losses = []
    for step in range(4):
        enc = tok("a fixed text", return_tensors="pt")
        enc.input_ids[:, 0] += 1
        loss = emb(enc["input_ids"]).pow(2).mean()
        loss.backward()
        losses.append(loss.item())
    return losses
"""

# A stand-in for transformers' fast tokenizer: its BatchEncoding reads `input_ids` as an
# item and as an attribute.
STAND_IN = """\
import torch


class BatchEncoding(dict):
    __getattr__ = dict.__getitem__


class GPT2TokenizerFast:
    @classmethod
    def from_pretrained(cls, name):
        return cls()

    def __call__(self, text, return_tensors=None):
        return BatchEncoding(input_ids=torch.tensor([[3 + len(word) for word in text.split()]]))
"""


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    """`transformers` is the stand-in above while the test runs."""
    stand_in_module(tmp_path, monkeypatch, "transformers", STAND_IN)


def test_a_tensor_changed_through_its_view_attribute_is_made_on_every_step():
    result = _rewrite(CHANGED_THROUGH_A_VIEW)
    assert not [f for f in result.findings if f.applied]
    assert _losses(result.new_source.decode()) == _losses(CHANGED_THROUGH_A_VIEW)


def test_an_encoding_changed_through_its_attribute_is_made_on_every_step(stand_in):
    result = _rewrite(CHANGED_THROUGH_AN_ATTRIBUTE)
    (finding,) = result.findings
    assert not finding.applied
    assert "`enc` is changed in place in the loop, and hoisted it would carry the change" in finding.message
    assert _losses(result.new_source.decode()) == _losses(CHANGED_THROUGH_AN_ATTRIBUTE)
