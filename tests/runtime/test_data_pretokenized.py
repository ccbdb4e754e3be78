"""PretokenizedDataset + PadCollate as the replacement of per-batch tokenization
that PM203 reports: the LatentWire pattern (random indices into a list of texts,
tokenized with padding every step) gets the same batches, bit for bit, from a
dataset tokenized once, also from DataLoader workers, with the labels alongside."""

import importlib.util
import random
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, StackDataset

from runtime.data import PadCollate, PretokenizedDataset

TOY_TRANSFORMERS = Path(__file__).resolve().parents[2] / "fixtures" / "scripts" / "toy_transformers" / "transformers.py"
QUESTIONS = [f"what is {a} plus {b}?" if a % 3 else f"and {a} minus {b}, please?" for a in range(8) for b in range(8)]
ANSWERS = [a + b if a % 3 else a - b for a in range(8) for b in range(8)]
BATCH = 8


def toy_tokenizer(padding_side):
    spec = importlib.util.spec_from_file_location("toy_transformers", TOY_TRANSFORMERS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.AutoTokenizer.from_pretrained("toy", padding_side=padding_side)


def index_batches(steps, seed=0):
    rng = random.Random(seed)
    return [rng.sample(range(len(QUESTIONS)), BATCH) for _ in range(steps)]


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_latentwire_batches_equal_tokenizing_in_the_loop(padding_side, num_workers):
    tokenizer = toy_tokenizer(padding_side)
    batches = index_batches(12)
    expected = []
    for idx in batches:  # what the loop did on every step
        encoded = tokenizer([QUESTIONS[i] for i in idx], padding=True, return_tensors="pt")
        expected.append((encoded, torch.tensor([ANSWERS[i] for i in idx])))

    dataset = StackDataset(PretokenizedDataset(QUESTIONS, tokenizer), torch.tensor(ANSWERS))
    loader = DataLoader(
        dataset,
        batch_sampler=batches,
        collate_fn=PadCollate.for_tokenizer(tokenizer),
        num_workers=num_workers,
        timeout=60 if num_workers else 0,
    )
    got = list(loader)
    assert len(got) == len(expected)
    for (encoded, answers), (want_encoded, want_answers) in zip(got, expected):
        assert set(encoded) == {"input_ids", "attention_mask"}
        for key in encoded:
            assert encoded[key].dtype == want_encoded[key].dtype and torch.equal(encoded[key], want_encoded[key])
        assert torch.equal(answers, want_answers)


def test_every_text_is_tokenized_once_however_many_epochs():
    tokenizer = toy_tokenizer("right")
    dataset = PretokenizedDataset(QUESTIONS, tokenizer)
    calls = tokenizer.calls
    loader = DataLoader(dataset, batch_size=BATCH, shuffle=True, collate_fn=PadCollate.for_tokenizer(tokenizer))
    for _ in range(3):
        assert sum(len(batch["input_ids"]) for batch in loader) == len(QUESTIONS)
    assert calls == len(QUESTIONS) and tokenizer.calls == calls


def test_tuple_items_collate_the_rest_like_the_default_collate():
    collate = PadCollate(0)
    items = [(torch.tensor([5, 6, 7]), 1, torch.tensor([0.5])), (torch.tensor([8]), 0, torch.tensor([1.5]))]
    padded, labels, weights = collate(items)
    assert torch.equal(padded["input_ids"], torch.tensor([[5, 6, 7], [8, 0, 0]]))
    assert torch.equal(padded["attention_mask"], torch.tensor([[1, 1, 1], [1, 0, 0]]))
    assert torch.equal(labels, torch.tensor([1, 0])) and torch.equal(weights, torch.tensor([[0.5], [1.5]]))


def test_for_tokenizer_takes_pad_id_and_side_and_refuses_a_tokenizer_without_pad():
    tokenizer = toy_tokenizer("left")
    assert PadCollate.for_tokenizer(tokenizer) == PadCollate(tokenizer.pad_token_id, "left")
    tokenizer.pad_token_id = None
    with pytest.raises(ValueError, match="no pad token"):
        PadCollate.for_tokenizer(tokenizer)
