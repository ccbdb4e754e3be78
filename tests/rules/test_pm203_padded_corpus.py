"""PM203 on texts of a corpus that a Hugging Face tokenizer pads together on every step
(`tokenizer(texts, padding=True, return_tensors="pt")`): each text is tokenized once, unpadded,
and the step pads its rows with the tokenizer's own `pad`. The rewrite is run against a stand-in
`transformers` written here (the project does not depend on transformers); where transformers is
installed, the same rewrite is run against a real fast tokenizer too."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from codemod.config import Settings
from codemod.engine import process_source
from codemod.result import Level
from tests.package_support import stand_in_module

SCRIPT = """\
import torch
from transformers import AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained(PATH)
tokenizer.padding_side = SIDE
docs = ["a b c", "b c", "c d e f", "d", "e f a b c", "f a", "a a a a", "b"]
torch.manual_seed(0)
model = torch.nn.Embedding(64, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
history = []
for epoch in range(2):
    perm = torch.randperm(len(docs))
    for step in range(3):
        batch = [docs[i] for i in perm[step * 2 : (step + 1) * 2].tolist()]
        suffix = " e"
        with_suffix = [f"{text}{suffix}" for text in batch]
        enc = tokenizer(with_suffix, return_tensors="pt", padding=True, add_special_tokens=False)
        ids = enc["input_ids"]
        loss = (model(ids).sum(-1) * enc["attention_mask"]).sum()
        history.append((ids.clone(), enc["attention_mask"].clone(), loss.item()))
        loss.backward()
        opt.step()
        opt.zero_grad()
"""

STAND_IN = """\
import torch


class WordTokenizer:
    \"\"\"A stand-in for a Hugging Face tokenizer: words to ids, and a `pad` that pads rows as
    the batched call pads them (what transformers' `pad` does, checked against the library
    where it is installed).\"\"\"

    def __init__(self):
        self.padding_side = "right"
        self.pad_token_id = 0

    def __call__(self, texts, return_tensors=None, padding=False, add_special_tokens=True):
        rows = [[1 + sum(map(ord, w)) % 50 for w in t.split()] for t in ([texts] if isinstance(texts, str) else texts)]
        if isinstance(texts, str) and return_tensors is None:
            return {"input_ids": rows[0], "attention_mask": [1] * len(rows[0])}
        return self.pad({"input_ids": rows}, padding=padding, return_tensors=return_tensors)

    def pad(self, encoded, padding=True, return_tensors=None):
        rows = encoded["input_ids"]
        longest = max(map(len, rows)) if padding else 0
        ids, mask = [], []
        for row in rows:
            fill = longest - len(row)
            left = self.padding_side == "left"
            ids.append([0] * fill + row if left else row + [0] * fill)
            mask.append([0] * fill + [1] * len(row) if left else [1] * len(row) + [0] * fill)
        as_tensor = torch.tensor if return_tensors == "pt" else list
        return {"input_ids": as_tensor(ids), "attention_mask": as_tensor(mask)}


class AutoTokenizer:
    @staticmethod
    def from_pretrained(path):
        return WordTokenizer()
"""

UNSAFE = Settings(level=Level.UNSAFE, select=("PM203",))


def _script(side: str = "right", path: str = "'stand-in'") -> str:
    return SCRIPT.replace("PATH", path).replace("SIDE", repr(side))


def _rewrite(source: str):
    result = process_source(source.encode(), "train.py", UNSAFE)
    assert result.error is None, result.error
    return result


def _history(source: str):
    namespace: dict = {}
    exec(compile(source, "train.py", "exec"), namespace)
    return namespace["history"]


def _same_steps(before, after) -> None:
    assert len(before) == len(after) == 6
    for (ids, mask, loss), (ids_after, mask_after, loss_after) in zip(before, after):
        assert torch.equal(ids, ids_after) and torch.equal(mask, mask_after)
        assert loss == loss_after


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    """`transformers` is the stand-in above while the test runs."""
    stand_in_module(tmp_path, monkeypatch, "transformers", STAND_IN)


def test_the_texts_are_tokenized_once_unpadded_and_the_step_pads_its_rows():
    result = _rewrite(_script())
    (finding,) = result.findings
    assert finding.applied and finding.level is Level.UNSAFE
    assert "the step pads its rows with the tokenizer's own `pad`" in finding.message
    ahead, step = result.new_source.decode().split("for epoch")
    # the suffix the texts are made with moves with them; no empty table first: nothing nests it
    assert ahead.endswith(
        'suffix = " e"\ndocs_ids_by_text = {text: tokenizer(f"{text}{suffix}", add_special_tokens=False, '
        'padding=False)["input_ids"] for text in docs}\n'
    )
    assert "suffix" not in step and "with_suffix" not in step
    padded = 'enc=tokenizer.pad({"input_ids":[docs_ids_by_text[text]fortextinbatch]},return_tensors="pt",padding=True,)'
    assert padded in "".join(step.split())


MADE = '        suffix = " e"\n        with_suffix = [f"{text}{suffix}" for text in batch]\n        enc = tokenizer(with_suffix,'
FORMS = {
    "made": MADE,
    # the picked texts tokenized as they are, by name or picked in the call
    "picked": "        enc = tokenizer(batch,",
    "inline": "        enc = tokenizer([docs[i] for i in perm[step * 2 : (step + 1) * 2].tolist()],",
}


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.usefixtures("stand_in")
def test_the_padded_rows_give_every_step_the_same_ids_mask_and_loss(side, form):
    source = _script(side)
    assert MADE in source
    source = source.replace(MADE, FORMS[form])
    rewritten = _rewrite(source).new_source.decode()
    assert "tokenizer.pad(" in rewritten
    _same_steps(_history(source), _history(rewritten))


OWN_TOKENIZER = STAND_IN.split("class AutoTokenizer")[0]


@pytest.mark.parametrize(
    "change, reason",
    [
        # a class of the script: what its `pad` does is not known, even where it has one
        (
            (
                "from transformers import AutoTokenizer\n\ntokenizer = AutoTokenizer.from_pretrained('stand-in')\n",
                OWN_TOKENIZER + "\ntokenizer = WordTokenizer()\n",
            ),
            "`tokenizer` is not known to be a Hugging Face tokenizer, whose `pad` pads texts tokenized one by one",
        ),
        # token type ids: `pad` of the ids alone gives none
        (
            ('enc["attention_mask"]).sum()', 'enc["token_type_ids"]).sum()'),
            "`token_type_ids` of the tokenizer's result is read",
        ),
        # lists: rows that need no padding would be the table's own, shared by every step
        (
            ('return_tensors="pt", padding=True', "padding=True"),
            "the ids are lists",
        ),
        # overflowing tokens make more rows than texts
        (
            ("add_special_tokens=False)", "add_special_tokens=False, return_overflowing_tokens=True)"),
            "perfmod does not know that `return_overflowing_tokens=` tokenizes each text as it is tokenized alone",
        ),
        # the suffix is read elsewhere in the step: it stays there
        (
            ("        loss.backward()\n", "        print(suffix)\n        loss.backward()\n"),
            "`suffix`, which the texts are made with, is used elsewhere too",
        ),
        # the result handed on whole
        (
            ('        ids = enc["input_ids"]\n', '        ids = enc["input_ids"]\n        print(enc)\n'),
            "the tokenizer's result is used whole",
        ),
    ],
)
def test_a_padded_batch_that_cannot_be_tabulated_is_reported_with_the_reason(change, reason):
    source = _script()
    assert change[0] in source
    result = _rewrite(source.replace(*change))
    (finding,) = [f for f in result.findings if "padding=True" in f.message or "padded" in f.message]
    assert not result.changed and not finding.applied
    assert reason in finding.message


def test_a_suffix_that_changes_every_step_is_reported():
    result = _rewrite(_script().replace('suffix = " e"', 'suffix = f" {step}"'))
    assert not result.changed
    (finding,) = result.findings
    assert "padded to the longest of the step (`padding=True`): `step` is re-bound in the loop" in finding.message


def _real_tokenizer(transformers, tokenizers, side: str):
    words = ["a", "b", "c", "d", "e", "f", "[PAD]", "[UNK]"]
    model = tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]")
    backend = tokenizers.Tokenizer(model)
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    made = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]")
    made.padding_side = side
    return made


@pytest.mark.parametrize("side", ["right", "left"])
def test_a_real_fast_tokenizer_pads_rows_of_single_texts_as_its_batched_call(side):
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    tokenizer = _real_tokenizer(transformers, tokenizers, side)
    draw = random.Random(0)
    for options in ({}, {"pad_to_multiple_of": 4}):
        for _ in range(50):
            texts = [" ".join(draw.choices("abcdefg", k=draw.randint(0, 9))) for _ in range(draw.randint(1, 6))]
            batched = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False, **options)
            rows = [tokenizer(t, padding=False, add_special_tokens=False)["input_ids"] for t in texts]
            padded = tokenizer.pad({"input_ids": rows}, return_tensors="pt", padding=True, **options)
            assert torch.equal(batched["input_ids"], padded["input_ids"])
            assert torch.equal(batched["attention_mask"], padded["attention_mask"])


@pytest.mark.parametrize("side", ["right", "left"])
def test_the_rewrite_gives_a_real_tokenizer_the_same_steps(tmp_path, side):
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    _real_tokenizer(transformers, tokenizers, side).save_pretrained(tmp_path / "tok")
    source = _script(side, repr(str(tmp_path / "tok")))
    rewritten = _rewrite(source).new_source.decode()
    assert "tokenizer.pad(" in rewritten
    _same_steps(_history(source), _history(rewritten))


SEED = Path(__file__).resolve().parents[2] / "fixtures" / "scripts" / "seed_latentwire_batching.py"
TOY = SEED.parent / "toy_transformers"


def _printed(path: Path) -> str:
    """What the seed script prints for 8 steps, its model initialised from seed 0."""
    run = f"import runpy, sys, torch; torch.manual_seed(0); sys.argv = ['s', '--samples', '32', '--batch_size', '4']; runpy.run_path({str(path)!r}, run_name='__main__')"
    env = {**os.environ, "PYTHONPATH": str(TOY)}
    return subprocess.run([sys.executable, "-c", run], env=env, capture_output=True, text=True, check=True).stdout


def test_a_tokenizer_a_trained_model_holds_pads_the_rows_of_its_table(tmp_path):
    # the optimizer changes the wrapper's parameters, never the tokenizer it keeps
    result = _rewrite(SEED.read_text())
    (finding,) = [f for f in result.findings if f.code == "PM203"]
    assert finding.applied and "the step pads its rows with the tokenizer's own `pad`" in finding.message
    rewritten = tmp_path / "seed_rewritten.py"
    rewritten.write_text(result.new_source.decode())
    before, after = _printed(SEED), _printed(rewritten)
    assert before.count("loss") == 8 and before == after


@pytest.mark.parametrize(
    "replacing",
    [
        "ctx.wrapper.tokenizer = AutoTokenizer.from_pretrained('toy-lm')",
        "setattr(ctx.wrapper, 'tokenizer', AutoTokenizer.from_pretrained('toy-lm'))",
    ],
)
def test_a_tokenizer_replaced_in_the_loop_is_reported(replacing):
    source = SEED.read_text().replace(
        "            ids = ctx.wrapper.tokenizer(", f"            {replacing}\n            ids = ctx.wrapper.tokenizer("
    )
    result = _rewrite(source)
    assert not result.changed
    (finding,) = [f for f in result.findings if f.code == "PM203"]
    assert "`ctx.wrapper.tokenizer` is assigned in the loop" in finding.message


def test_a_tokenizer_changed_through_its_chain_in_the_loop_is_reported():
    # a new vocabulary size every step gives a text other ids: a table made once would keep the first ones
    source = SEED.read_text().replace(
        "            ids = ctx.wrapper.tokenizer(",
        "            ctx.wrapper.tokenizer.vocab_size = 500 + step\n            ids = ctx.wrapper.tokenizer(",
    )
    result = _rewrite(source)
    assert not result.changed
    (finding,) = [f for f in result.findings if f.code == "PM203"]
    assert "`ctx.wrapper.tokenizer` is changed in place in the loop" in finding.message


def test_an_attribute_assigned_beside_the_tokenizer_leaves_its_table_alone(tmp_path):
    # `ctx.last_loss = ...` changes what holds the tokenizer, not the tokenizer
    source = SEED.read_text().replace(
        "            optimizer.zero_grad()\n",
        "            ctx.last_loss = loss.item()\n            optimizer.zero_grad()\n",
    )
    seed = tmp_path / "seed.py"
    seed.write_text(source)
    result = _rewrite(source)
    (finding,) = [f for f in result.findings if f.code == "PM203"]
    assert finding.applied
    rewritten = tmp_path / "seed_rewritten.py"
    rewritten.write_text(result.new_source.decode())
    before, after = _printed(seed), _printed(rewritten)
    assert before.count("loss") == 8 and before == after
