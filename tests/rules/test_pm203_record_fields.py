"""PM203 on fields of a plain config record (a dataclass of the file) whose other fields
the loop changes: the fields it does not change are the same every step, and what is
computed from them moves out of the loop; anything that may change the field read (an
alias assigning it, a name made at run time, the record handed to a call, a class that
runs code on attribute access) keeps the call in the loop."""

import contextlib
import io
import re

import pytest

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rules.loop_invariant_tokenization import LoopInvariantTokenization
from tests.rules.scripts import one_thread

SCRIPT = """\
from dataclasses import dataclass, field

import torch


class WordTokenizer:
    def __init__(self, words):
        self.vocab = {w: i + 1 for i, w in enumerate(sorted(set(words)))}

    def encode(self, text, n):
        ids = [self.vocab.get(w, 0) for w in text.split()][:n]
        return ids + [0] * (n - len(ids))


@dataclass
class DataCfg:
    prompt: str = "tag the words of this line"
    prompt_len: int = 6
    max_len: int = 4


@dataclass
class Config:
    data: DataCfg = field(default_factory=DataCfg)
    weights: list = field(default_factory=lambda: [1.0, 2.0, 0.5])
{CLASS_EXTRA}

torch.manual_seed(0)
cfg = Config()
tok = WordTokenizer(cfg.data.prompt.split())
model = torch.nn.Embedding(16, 3)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
{BEFORE}
for step in range(6):
    cfg.data.max_len += 1
{CHANGE}
    ids = torch.tensor(tok.encode(cfg.data.prompt, cfg.data.prompt_len))
    weights = torch.tensor(cfg.weights)
    logits = model(ids)
    loss = torch.nn.functional.cross_entropy(logits, ids % 3, weight=weights)
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item()!r}")
"""


def script(change: str = "", before: str = "", class_extra: str = "") -> str:
    """The script with `change` at the top of the step, `before` ahead of the loop and
    `class_extra` in the body of `Config`."""
    return SCRIPT.replace("{CHANGE}\n", change).replace("{BEFORE}\n", before).replace("{CLASS_EXTRA}\n", class_extra)


def rewrite(source: str) -> tuple[str, list]:
    result = process_source(source.encode(), "<script>", Settings(select=("PM203",)), [LoopInvariantTokenization])
    assert result.error is None, result.error
    return result.new_source.decode(), result.findings


def losses(source: str) -> list[str]:
    out = io.StringIO()
    with one_thread(), contextlib.redirect_stdout(out):
        exec(compile(source, "<script>", "exec"), {"__name__": "__main__"})
    return re.findall(r"loss (\S+)", out.getvalue())


def in_loop(source: str, text: str) -> bool:
    return text in source[source.index("for step in range(6):") :]


def test_fields_the_loop_leaves_alone_move_out_and_train_bit_for_bit():
    original = script()
    new_source, _ = rewrite(original)
    assert not in_loop(new_source, "tok.encode(") and not in_loop(new_source, "torch.tensor(cfg.weights)")
    before = losses(original)
    assert len(before) == 6 and losses(new_source) == before


@pytest.mark.parametrize(
    "change,before,kept",
    [
        ("    cfg.data.prompt = cfg.data.prompt + ' again'\n", "", "tok.encode("),
        ("    alias.prompt = alias.prompt + ' again'\n", "alias = cfg.data\n", "tok.encode("),  # through an alias
        ("    setattr(cfg.data, key, 'other words')\n", "key = 'prompt'\n", "tok.encode("),  # a name made at run time
        ("    tweak(cfg.data)\n", "def tweak(d):\n    d.prompt = d.prompt + ' again'\n", "tok.encode("),  # handed on
        ("    cfg.data = DataCfg(prompt='other words')\n", "", "tok.encode("),  # the record above it replaced
        ("    cfg.weights[0] = 1.0 + step\n", "", "torch.tensor(cfg.weights)"),  # what it holds, changed in place
    ],
)
def test_what_may_change_the_field_keeps_the_call_in_the_loop(change, before, kept):
    original = script(change, before)
    new_source, _ = rewrite(original)
    assert in_loop(new_source, kept)
    assert losses(new_source) == losses(original)


def test_a_record_class_that_runs_code_on_access_is_not_read_field_by_field():
    extra = (
        "\n    def __setattr__(self, name, value):\n"
        "        object.__setattr__(self, name, value)\n"
        "        if name == 'data' and hasattr(self, 'weights'):\n"
        "            self.weights = [1.0, 1.0, 1.0]\n"
    )
    original = script(class_extra=extra)
    new_source, _ = rewrite(original)
    assert in_loop(new_source, "tok.encode(")  # `cfg.data.max_len += 1` may run code of the class
