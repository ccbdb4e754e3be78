"""A training step that renders each sampled text with the chat template of every model it
trains and tokenizes it (LatentWire's shape): the tokenizer is a Hugging Face tokenizer that
a wrapper class of another module builds in its `__init__`, reached through a field of the
dataclass items of a list of model contexts."""

from __future__ import annotations

import textwrap
from pathlib import Path

import libcst as cst
import pytest

from codemod.analysis.batch_windows import batch_windows
from codemod.analysis.tokenizers import tokenizers
from codemod.config import Settings
from codemod.context import FileContext
from codemod.engine import process_source
from codemod.result import Level

MODELS = """\
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


class LMWrapper(torch.nn.Module):
    def __init__(self, model_id):
        super().__init__()
        self.tokenizer = AutoTokenizer.from_pretrained(model_id, use_fast=True)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.add_special_tokens({"pad_token": "<|pad|>"})
        self.model = AutoModelForCausalLM.from_pretrained(model_id)

    def pad_id(self):
        return getattr(self.tokenizer, "pad_token_id", None) or 0

    def show(self, ids):
        return self.tokenizer.decode(ids, skip_special_tokens=True)
"""

UTILS = """\
def split_user_and_anchor(text, anchor):
    if anchor and text.rstrip().endswith(anchor.strip()):
        return text.rstrip()[: -len(anchor.strip())].rstrip(), anchor
    return text, anchor
"""

TRAIN = """\
from dataclasses import dataclass
from typing import List

import torch

from pkg.models import LMWrapper
from pkg.utils import split_user_and_anchor

SYSTEM_PROMPT = "Answer briefly."


@dataclass
class ModelTrainContext:
    name: str
    wrapper: LMWrapper
    anchor_text: str


def train(texts, steps, batch_size, use_chat_template, anchor, device):
    llama = None
    if steps > 0:
        llama = LMWrapper("llama")
    qwen = LMWrapper("qwen")
    model_contexts: List[ModelTrainContext] = []
    if llama is not None:
        model_contexts.append(ModelTrainContext(name="llama", wrapper=llama, anchor_text="Answer: "))
    model_contexts.append(ModelTrainContext(name="qwen", wrapper=qwen, anchor_text=""))
    adapter = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(adapter.parameters(), lr=0.1)
    for epoch in range(2):
        perm = torch.randperm(len(texts))
        for step in range(steps):
            idx = perm[step * batch_size : (step + 1) * batch_size]
            batch_texts = [texts[i] for i in idx.tolist()]
            if use_chat_template:
                batch_user_texts = [split_user_and_anchor(raw, anchor)[0] for raw in batch_texts]
            else:
                batch_user_texts = batch_texts
            scaffolds = {}
            for ctx in model_contexts:
                if use_chat_template:
                    ids_list = []
                    for user_text in batch_user_texts:
                        messages = [
                            {"role": "system", "content": SYSTEM_PROMPT},
                            {"role": "user", "content": user_text},
                        ]
                        rendered = ctx.wrapper.tokenizer.apply_chat_template(
                            messages, tokenize=False, add_generation_prompt=True
                        )
                        rendered = rendered + ctx.anchor_text
                        toks = ctx.wrapper.tokenizer(rendered, return_tensors="pt", add_special_tokens=False)
                        ids_list.append(toks["input_ids"][0].to(device))
                    scaffolds[ctx.name] = torch.nn.utils.rnn.pad_sequence(ids_list, batch_first=True)
                else:
                    with_anchor = [f"{text}{ctx.anchor_text}" for text in batch_texts]
                    tok = ctx.wrapper.tokenizer(with_anchor, return_tensors="pt", padding=True)
                    scaffolds[ctx.name] = tok["input_ids"].to(device)
            loss = sum(adapter(scaffolds[ctx.name].float()[:, :4]).sum() for ctx in model_contexts)
            loss.backward()
            opt.step()
            opt.zero_grad()
"""


def _write(root: Path, models: str = MODELS, train: str = TRAIN, utils: str = UTILS) -> Path:
    files = {"pkg/__init__.py": "", "pkg/models.py": models, "pkg/utils.py": utils, "pkg/train.py": train}
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    (root / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    return root / "pkg" / "train.py"


def _receivers(train: Path) -> tuple[FileContext, list[cst.BaseExpression]]:
    context = FileContext.of_source(train.read_text(), path=str(train))
    found = [
        node
        for node in context.index.find(cst.Attribute)
        if context.module.code_for_node(node) == "ctx.wrapper.tokenizer"
    ]
    assert len(found) == 3
    return context, found


def test_a_tokenizer_a_class_of_another_module_builds_is_known_through_a_dataclass_field(tmp_path):
    context, receivers = _receivers(_write(tmp_path))
    known = tokenizers(context)
    assert all(known.is_known(receiver) for receiver in receivers)
    assert known.origin(receivers[0]) == ("the Hugging Face tokenizer built in `LMWrapper.__init__` (pkg/models.py:8)")


@pytest.mark.parametrize(
    "change",
    [
        # another method adds tokens: the ids of a text may change between steps
        (
            "    def show(self, ids):\n",
            "    def grow(self, words):\n        self.tokenizer.add_tokens(words)\n\n    def show(self, ids):\n",
        ),
        # another method sets one of its attributes
        (
            "    def show(self, ids):\n",
            "    def trim(self):\n        self.tokenizer.truncation_side = 'left'\n\n    def show(self, ids):\n",
        ),
        # another name for it, which perfmod does not follow
        (
            "    def show(self, ids):\n",
            "    def alias(self):\n        tok = self.tokenizer\n        return tok\n\n    def show(self, ids):\n",
        ),
        # handed to a function that may change it
        (
            "    def show(self, ids):\n",
            "    def hand(self, f):\n        f(self.tokenizer)\n\n    def show(self, ids):\n",
        ),
        # not a tokenizer a known library builds
        ("AutoTokenizer.from_pretrained(model_id, use_fast=True)", "object()"),
    ],
)
def test_a_tokenizer_another_method_may_change_is_not_known(tmp_path, change):
    context, receivers = _receivers(_write(tmp_path, models=MODELS.replace(*change)))
    assert not any(tokenizers(context).is_known(receiver) for receiver in receivers)


@pytest.mark.parametrize(
    "change",
    [
        ("    adapter = torch.nn.Linear", "    model_contexts.extend(more())\n    adapter = torch.nn.Linear"),
        ("    adapter = torch.nn.Linear", "    register(model_contexts)\n    adapter = torch.nn.Linear"),
        ("    adapter = torch.nn.Linear", "    model_contexts[0] = other()\n    adapter = torch.nn.Linear"),
    ],
)
def test_a_list_of_contexts_filled_otherwise_than_by_append_is_not_followed(tmp_path, change):
    context, receivers = _receivers(_write(tmp_path, train=TRAIN.replace(*change)))
    assert not any(tokenizers(context).is_known(receiver) for receiver in receivers)


@pytest.mark.parametrize("split_pure", [True, False])
def test_the_per_step_chat_prompts_are_reported_with_the_tokenizer_and_what_keeps_them_per_step(tmp_path, split_pure):
    # a `split_user_and_anchor` that logs what it splits is not pure: the texts it gives are a reason
    utils = UTILS if split_pure else UTILS.replace("    if anchor and", "    print(text)\n    if anchor and")
    train = _write(tmp_path, utils=utils)
    result = process_source(train.read_bytes(), str(train), Settings(level=Level.UNSAFE, select=("PM203",)))
    assert not result.changed
    messages = {f.line: f.message for f in result.findings if f.code == "PM203"}
    lines = {
        n + 1: line.strip().split("=", 1)[-1].strip()
        for n, line in enumerate(train.read_text().splitlines())
        if "ctx.wrapper.tokenizer" in line
    }
    assert sorted(messages) == sorted(lines)
    for line, message in messages.items():
        assert "`ctx.wrapper.tokenizer` is the Hugging Face tokenizer built in `LMWrapper.__init__`" in message
        assert "(pkg/models.py:8)" in message
        assert "one table of ids per item" in message and "`model_contexts`" in message
        chat = "padding=True" not in lines[line]
        # the chat prompts are made of the texts `split_user_and_anchor` returns: a reason where it is not pure
        impure = "`split_user_and_anchor` (pkg/utils.py:1), a function of another module that is not known to be pure"
        assert (impure in message) is (chat and not split_pure)
        # the chat prompts are tokenized one by one in a loop of statements, not a comprehension
        one_by_one = "one at a time in the statements of `for user_text in batch_user_texts:`"
        assert (one_by_one in message) is chat
        # the plain prompts go to the tokenizer as one padded batch
        assert ("padded to the longest of the step (`padding=True`)" in message) is not chat


SAME_FILE = """\
from dataclasses import dataclass

import torch
from transformers import AutoTokenizer


class LMWrapper(torch.nn.Module):
    def __init__(self, name):
        super().__init__()
        self.tokenizer = AutoTokenizer.from_pretrained(name)
        self.head = torch.nn.Linear(4, 4)


@dataclass
class ModelContext:
    name: str
    wrapper: LMWrapper


ctx = ModelContext("tiny", LMWrapper("toy-lm").to("cpu"))
ids = ctx.wrapper.tokenizer(["a b"], padding=True)
"""


@pytest.mark.parametrize("own_to", [False, True])
def test_a_tokenizer_a_class_of_this_file_builds_is_known_through_a_field_given_a_moved_model(own_to):
    head = "        self.head = torch.nn.Linear(4, 4)\n"
    own = head + "\n    def to(self, device):\n        return object()\n"
    source = SAME_FILE.replace(head, own) if own_to else SAME_FILE
    context = FileContext.of_source(source)
    (receiver,) = [n for n in context.index.find(cst.Attribute) if context.source(n) == "ctx.wrapper.tokenizer"]
    known = tokenizers(context)
    # a class whose own `to` may return anything is not followed through `.to(...)`
    assert known.is_known(receiver) is not own_to
    if not own_to:
        assert known.origin(receiver) == "the Hugging Face tokenizer built in `LMWrapper.__init__` (line 10)"


@pytest.mark.parametrize(
    "built, opaque",
    [
        ("from transformers import AutoTokenizer\ntokenizer = AutoTokenizer.from_pretrained('gpt2')\n", None),
        ("from mytok import WordTokenizer\ntokenizer = WordTokenizer()\n", "tokenizer(batch, padding=True)"),
    ],
)
def test_a_known_tokenizer_is_no_work_perfmod_cannot_follow_on_a_list_batch(built, opaque):
    source = (
        "import torch\n" + built + "texts = ['a b', 'c d', 'e f', 'g h']\nmodel = torch.nn.Embedding(50, 2)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for epoch in range(2):\n    perm = torch.randperm(len(texts))\n    for step in range(2):\n"
        "        idx = perm[step * 2:(step + 1) * 2]\n        batch = [texts[i] for i in idx.tolist()]\n"
        "        ids = tokenizer(batch, padding=True)\n        loss = model(ids).sum()\n"
        "        loss.backward()\n        opt.step()\n"
    )
    context = FileContext.of_source(source)
    (found,) = context.loaders.list_batches
    call = batch_windows(context).opaque_work(found)
    assert (context.source(call) if call is not None else None) == opaque
