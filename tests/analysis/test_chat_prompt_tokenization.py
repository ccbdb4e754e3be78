"""A training step that renders each sampled text with the chat template of every model it
trains and tokenizes it (LatentWire's shape): the tokenizer is a Hugging Face tokenizer that
a wrapper class of another module builds in its `__init__`, reached through a field of the
dataclass items of a list of model contexts."""

from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path

import libcst as cst
import pytest
import torch

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


def train(examples, steps, batch_size, use_chat_template, anchor, device):
    texts = [e["source"] for e in examples]
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


def _recording(train: str) -> str:
    """`train` keeping every step's scaffolds and loss, and returning them."""
    recorded = train.replace("    for epoch in range(2):\n", "    history = []\n    for epoch in range(2):\n")
    recorded = recorded.replace(
        "            loss.backward()\n",
        "            history.append(({k: v.clone() for k, v in scaffolds.items()}, loss.item()))\n"
        "            loss.backward()\n",
    )
    return recorded + "    return history\n"


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


def _lines(train: Path) -> dict[int, str]:
    """The lines of `train` that call the tokenizer, by number: the call's text."""
    return {
        n + 1: line.strip().split("=", 1)[-1].strip()
        for n, line in enumerate(train.read_text().splitlines())
        if "ctx.wrapper.tokenizer" in line
    }


def test_per_step_chat_prompts_made_by_a_function_that_is_not_pure_are_reported_with_the_reasons(tmp_path):
    # a `split_user_and_anchor` that logs what it splits is not pure: the texts it gives are a reason
    utils = UTILS.replace("    if anchor and", "    print(text)\n    if anchor and")
    train = _write(tmp_path, utils=utils)
    result = process_source(train.read_bytes(), str(train), Settings(level=Level.UNSAFE, select=("PM203",)))
    findings = {f.line: f for f in result.findings if f.code == "PM203"}
    lines = _lines(train)
    assert sorted(findings) == sorted(lines)
    for line, finding in findings.items():
        chat = "padding=True" not in lines[line]
        # the plain prompts, padded together, are made of the picked texts alone: tabulated
        assert finding.applied is not chat
        if not chat:
            assert "the step pads its rows with the tokenizer's own `pad`" in finding.message
            continue
        message = finding.message
        assert "`ctx.wrapper.tokenizer` is the Hugging Face tokenizer built in `LMWrapper.__init__`" in message
        assert "(pkg/models.py:8)" in message
        # the chat prompts are made of the texts `split_user_and_anchor` returns
        impure = "`split_user_and_anchor` (pkg/utils.py:1), a function of another module that is not known to be pure"
        assert impure in message
        assert (
            "one at a time in the statements of `for user_text in batch_user_texts:`, which perfmod cannot" in message
        )


def test_per_step_chat_prompts_and_padded_batches_are_tabulated_once_per_model_context(tmp_path):
    train = _write(tmp_path)
    result = process_source(train.read_bytes(), str(train), Settings(level=Level.UNSAFE, select=("PM203",)))
    assert result.changed and result.error is None
    findings = {f.line: f for f in result.findings if f.code == "PM203"}
    lines = _lines(train)
    (chat,) = [line for line, text in lines.items() if "apply_chat_template" in text]
    (plain,) = [line for line, text in lines.items() if "padding=True" in text]
    # one fix for the chat template and the tokenizer call after it, one for the padded batch
    assert sorted(findings) == [chat, plain]
    assert findings[chat].applied and "once for each item of `model_contexts`" in findings[chat].message
    assert findings[plain].applied and "once for each item of `model_contexts`" in findings[plain].message
    rewritten = result.new_source.decode()
    ahead, step = rewritten.split("    for epoch")
    assert "if not use_chat_template:\n" in ahead
    assert (
        '{text: ctx.wrapper.tokenizer(f"{text}{ctx.anchor_text}", padding=False)["input_ids"] for text in texts}'
        in ahead
    )
    assert "with_anchor" not in step
    padded = 'tok=ctx.wrapper.tokenizer.pad({"input_ids":[texts_ids_by_text[id(ctx)][text]fortextinbatch_texts]},'
    assert padded + 'return_tensors="pt",padding=True,)' in "".join(step.split())


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


FAKE_TRANSFORMERS = """\
import torch


class FakeTokenizer:
    \"\"\"Word-level and pure, as a Hugging Face tokenizer is: its ids depend on the text alone.\"\"\"

    def __init__(self, name):
        self.offset = sum(map(ord, name)) % 50
        self.padding_side = "right"
        self.pad_token_id = None

    def add_special_tokens(self, tokens):
        self.pad_token_id = 0

    def apply_chat_template(self, messages, tokenize=True, add_generation_prompt=False):
        text = "".join(f"<{m['role']}> {m['content']} </{m['role']}> " for m in messages)
        return text + ("<assistant> " if add_generation_prompt else "")

    def __call__(self, text, return_tensors=None, padding=False, add_special_tokens=True):
        rows = [[1 + (self.offset + sum(map(ord, w))) % 97 for w in t.split()] for t in ([text] if isinstance(text, str) else text)]
        if isinstance(text, str) and return_tensors is None:
            return {"input_ids": rows[0]}
        return self.pad({"input_ids": rows}, padding=padding, return_tensors=return_tensors)

    def pad(self, encoded, padding=True, return_tensors=None):
        \"\"\"Pads rows as the batched call pads them (what a Hugging Face tokenizer's `pad` does).\"\"\"
        rows = encoded["input_ids"]
        if padding:
            longest = max(map(len, rows))
            pads = [[self.pad_token_id] * (longest - len(row)) for row in rows]
            rows = [p + r if self.padding_side == "left" else r + p for r, p in zip(rows, pads)]
        return {"input_ids": torch.tensor(rows) if return_tensors == "pt" else rows}


class AutoTokenizer:
    @staticmethod
    def from_pretrained(name, **kwargs):
        return FakeTokenizer(name)


class AutoModelForCausalLM:
    @staticmethod
    def from_pretrained(name):
        return torch.nn.Linear(2, 2)
"""

EXAMPLES = [
    {"source": f"question {i} about item {i * 7 % 5} Answer: " if i % 2 else f"plain question {i} on topic {i % 3}"}
    for i in range(12)
]


def _train(root: Path, module: str, use_chat_template: bool):
    """Each step's scaffolds (per model context) and loss, from `pkg.<module>.train`."""
    loaded = importlib.import_module(f"pkg.{module}")
    torch.manual_seed(0)
    return loaded.train(EXAMPLES, 3, 4, use_chat_template, "Answer: ", "cpu")


@pytest.fixture
def project_imports():
    """The temporary project's `pkg` and stand-in `transformers`: imported by the test, gone after it."""

    def drop():
        for name in [n for n in sys.modules if n.split(".")[0] in ("pkg", "transformers")]:
            del sys.modules[name]

    drop()
    yield
    drop()


@pytest.mark.parametrize("use_chat_template", [True, False])
@pytest.mark.usefixtures("project_imports")
def test_the_tabulated_chat_prompts_give_every_step_the_same_ids_and_losses(tmp_path, monkeypatch, use_chat_template):
    train = _write(tmp_path, train=_recording(TRAIN))
    (tmp_path / "transformers.py").write_text(FAKE_TRANSFORMERS)
    result = process_source(train.read_bytes(), str(train), Settings(level=Level.UNSAFE, select=("PM203",)))
    assert result.changed and result.error is None
    rewritten = result.new_source.decode()
    assert "toks_by_text[id(ctx)][user_text]" in rewritten and "apply_chat_template" in rewritten.split("for epoch")[0]
    (tmp_path / "pkg" / "train_rewritten.py").write_text(rewritten)
    monkeypatch.syspath_prepend(str(tmp_path))
    before = _train(tmp_path, "train", use_chat_template)
    after = _train(tmp_path, "train_rewritten", use_chat_template)
    assert len(before) == len(after) == 6
    for (ids_before, loss_before), (ids_after, loss_after) in zip(before, after):
        assert sorted(ids_before) == sorted(ids_after) == ["llama", "qwen"]
        assert all(torch.equal(ids_before[name], ids_after[name]) for name in ids_before)
        assert loss_before == loss_after


@pytest.mark.parametrize(
    "change, reason",
    [
        # the rendered prompt is read after training: the step's last one, not the table's
        (
            ("            opt.zero_grad()\n", "            opt.zero_grad()\n    print(rendered)\n"),
            "`rendered`, bound in the statements that make the ids, is read after them",
        ),
        # a prefix kept from the text before when the anchor is empty
        (
            (
                "                        rendered = rendered + ctx.anchor_text\n",
                "                        if ctx.anchor_text:\n                            prefix = ctx.anchor_text\n"
                "                        rendered = rendered + prefix\n",
            ),
            "`prefix` may keep its value from the text before",
        ),
        # the ids are written in place: a table's would be changed for every later step
        (
            (
                '                        ids_list.append(toks["input_ids"][0].to(device))\n',
                '                        toks["input_ids"][0, 0] = step\n'
                '                        ids_list.append(toks["input_ids"][0].to(device))\n',
            ),
            "`toks` shares what the tokenizer gives and is changed in place in the step",
        ),
        # a text added to the step's texts is none of the corpus's
        (
            (
                "            scaffolds = {}\n",
                "            batch_user_texts.append('one more question')\n            scaffolds = {}\n",
            ),
            "`batch_user_texts` is changed in place in the step: it may hold a text the table does not",
        ),
        # the step's texts depend on the batch as a whole, not text by text
        (
            (
                "[split_user_and_anchor(raw, anchor)[0] for raw in batch_texts]",
                "sorted(split_user_and_anchor(raw, anchor)[0] for raw in batch_texts)",
            ),
            "`batch_user_texts` is not made text by text from the texts the step picks",
        ),
    ],
)
def test_chat_prompts_whose_table_would_differ_from_the_step_are_reported_with_the_reason(tmp_path, change, reason):
    train = _write(tmp_path, train=TRAIN.replace(*change))
    assert train.read_text() != textwrap.dedent(TRAIN)
    result = process_source(train.read_bytes(), str(train), Settings(level=Level.UNSAFE, select=("PM203",)))
    (chat,) = [f for f in result.findings if "apply_chat_template" in f.message.split(" ", 1)[0]]
    assert not chat.applied
    assert "which perfmod cannot tabulate ahead: " + reason in chat.message


@pytest.mark.usefixtures("project_imports")
def test_a_padded_batch_in_the_else_of_a_compound_test_is_tabulated_under_its_negation(tmp_path, monkeypatch):
    test = "                if use_chat_template:\n                    ids_list = []\n"
    compound = "                if use_chat_template and batch_size > 0:\n                    ids_list = []\n"
    train = _write(tmp_path, train=_recording(TRAIN.replace(test, compound)))
    (tmp_path / "transformers.py").write_text(FAKE_TRANSFORMERS)
    result = process_source(train.read_bytes(), str(train), Settings(level=Level.UNSAFE, select=("PM203",)))
    rewritten = result.new_source.decode()
    assert "        if not (use_chat_template and batch_size > 0):\n" in rewritten.split("for epoch")[0]
    (tmp_path / "pkg" / "train_rewritten.py").write_text(rewritten)
    monkeypatch.syspath_prepend(str(tmp_path))
    steps, rewritten_steps = _train(tmp_path, "train", False), _train(tmp_path, "train_rewritten", False)
    assert len(steps) == len(rewritten_steps) == 6
    for before, after in zip(steps, rewritten_steps):
        assert all(torch.equal(before[0][name], after[0][name]) for name in before[0]) and before[1] == after[1]
