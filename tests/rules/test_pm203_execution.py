"""PM203: hoisted tokenization runs once and the scripts train bit for bit as before.

The fixtures import `transformers`; fixtures/scripts/toy_transformers stands in for
it (a deterministic word-level tokenizer that counts its calls), so the tests can
check both the losses and how often each script tokenizes.
"""

import contextlib
import importlib.util
import io
import re
import sys
from pathlib import Path

import pytest
import torch

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level
from codemod.rules.loop_invariant_tokenization import LoopInvariantTokenization
from tests.rules.scripts import one_thread

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures" / "rules" / "PM203"
TOY_TRANSFORMERS = ROOT / "fixtures" / "scripts" / "toy_transformers" / "transformers.py"


@pytest.fixture(autouse=True)
def toy_transformers(monkeypatch):
    spec = importlib.util.spec_from_file_location("transformers", TOY_TRANSFORMERS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "transformers", module)


def run(source: str) -> tuple[torch.Tensor, dict]:
    """The losses a script prints, and its globals (to read its tokenizer's call count)."""
    out, namespace = io.StringIO(), {"__name__": "__main__"}
    with one_thread(), contextlib.redirect_stdout(out):
        exec(compile(source, "<fixture>", "exec"), namespace)
    printed = torch.tensor([float(v) for v in re.findall(r"loss (\S+)", out.getvalue())], dtype=torch.float64)
    return printed, namespace


def rewrite(text: str, level: Level = Level.SAFE) -> str:
    """`text` with PM203's fixes up to `level` applied; every one of them must be (the
    per-batch tokenization of the LatentWire fixture is fixed at the unsafe level only)."""
    settings = Settings(select=("PM203",), level=level)
    result = process_source(text.encode(), "<fixture>", settings, [LoopInvariantTokenization])
    assert result.error is None, result.error
    assert any(f.applied for f in result.findings)
    assert all(f.applied for f in result.findings if f.fixable and f.level <= level)
    return result.new_source.decode()


def source(case: str) -> str:
    return (FIXTURES / f"{case}.in.py").read_text()


@pytest.mark.parametrize(
    "case,tokenizer,calls_before,calls_after",
    [
        # 30 steps x (chat template + scaffold + questions) -> 2 once + 30 question batches
        ("latentwire_chat_scaffold", "tokenizer", 90, 32),
        # 3 epochs x 6 batches x one prefix encode -> once
        ("prefix_and_constants_epochs", "tok", 18, 1),
    ],
)
def test_hoisted_tokenization_runs_once_and_trains_bit_for_bit(case, tokenizer, calls_before, calls_after):
    new_source = rewrite(source(case))
    assert new_source == (FIXTURES / f"{case}.out.py").read_text()
    before, original = run(source(case))
    after, rewritten = run(new_source)
    assert len(before) >= 18
    assert torch.equal(after, before)
    assert (original[tokenizer].calls, rewritten[tokenizer].calls) == (calls_before, calls_after)


def test_the_padded_questions_pretokenized_train_bit_for_bit():
    """At the unsafe level the LatentWire fixture's questions, padded together every step,
    are tokenized once each (64 texts; the scaffold is rendered and tokenized once) and padded by the tokenizer's `pad`."""
    new_source = rewrite(source("latentwire_chat_scaffold"), Level.UNSAFE)
    assert "tokenizer.pad(" in new_source
    before, original = run(source("latentwire_chat_scaffold"))
    after, rewritten = run(new_source)
    assert len(before) >= 18 and torch.equal(after, before)
    assert (original["tokenizer"].calls, rewritten["tokenizer"].calls) == (90, 66)


def test_a_value_changed_in_place_is_not_hoisted_and_hoisting_it_would_change_the_losses():
    """Why the aliasing check matters: `counts` is rebuilt every step and then written
    in place; built once, the writes would pile up across steps."""
    script = (
        "import torch\n"
        "torch.manual_seed(0)\n"
        "model = torch.nn.Linear(3, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for step in range(6):\n"
        "    counts = torch.zeros(1, 3)\n"
        "    counts[0, step % 3] += 1.0\n"
        "    loss = model(counts).pow(2).sum()\n"
        "    opt.zero_grad()\n"
        "    loss.backward()\n"
        "    opt.step()\n"
        "    print(f'step {step} loss {loss.item()!r}')\n"
    )
    result = process_source(script.encode(), "<script>", Settings(select=("PM203",)), [LoopInvariantTokenization])
    assert result.new_source.decode() == script and not result.findings
    hoisted_by_hand = script.replace("    counts = torch.zeros(1, 3)\n", "").replace(
        "for step in range(6):\n", "counts = torch.zeros(1, 3)\nfor step in range(6):\n"
    )
    assert not torch.equal(run(hoisted_by_hand)[0], run(script)[0])


def test_unprovable_tokenization_is_reported_and_the_script_left_as_it_is():
    case = "tokenizer_not_provable"
    result = process_source(source(case).encode(), case, Settings(select=("PM203",)), [LoopInvariantTokenization])
    assert result.new_source.decode() == source(case)
    messages = sorted(f.message for f in result.findings)
    assert len(messages) == 2 and not any(f.fixable for f in result.findings)
    assert "inside the model's forward" in messages[0]
    # its `encode` grows `self.vocab`: the ids depend on what was encoded before, so no advice to move it
    assert "each call may change `words.vocab`" in messages[1]
    assert "move the call" not in messages[1] and "tokenize them once" not in messages[1]
    assert len(run(source(case))[0]) == 5  # the fixture itself runs


def encode_calls(source_text: str) -> tuple[torch.Tensor, int]:
    """The losses a script prints and how many times a function named `encode` of the
    script ran (not one of a library the run happens to import or call first, such as
    json's encoder)."""
    calls = 0

    def count(frame, event, arg):
        nonlocal calls
        if event == "call" and frame.f_code.co_name == "encode" and frame.f_code.co_filename == "<fixture>":
            calls += 1

    sys.setprofile(count)
    try:
        losses, _ = run(source_text)
    finally:
        sys.setprofile(None)
    return losses, calls


def test_texts_of_a_corpus_are_tokenized_once_and_train_bit_for_bit():
    """Texts sampled from a list each step, then a chunk per step over epochs: both
    pretokenized once before their loop (at --level unsafe), the ids picked per step."""
    case = "pretokenize_corpus.unsafe"
    settings = Settings(select=("PM203",), level=Level.UNSAFE)
    result = process_source(source(case).encode(), case, settings, [LoopInvariantTokenization])
    new_source = result.new_source.decode()
    assert new_source == (FIXTURES / f"{case}.out.py").read_text()
    assert sorted(f.applied for f in result.findings) == [True, True]
    before, calls_before = encode_calls(source(case))
    after, calls_after = encode_calls(new_source)
    assert len(before) == 20 + 2 * 5
    assert torch.equal(after, before)
    assert (calls_before, calls_after) == (20 * 4 + 2 * 40, 40 + 40)
    # a level below unsafe leaves it (an encode that raises on a text the steps never draw now raises)
    safe = process_source(source(case).encode(), case, Settings(select=("PM203",)), [LoopInvariantTokenization])
    assert safe.new_source.decode() == source(case) and all(f.fixable and not f.applied for f in safe.findings)


def test_an_encode_that_draws_random_numbers_is_not_pretokenized_and_doing_it_would_change_the_losses():
    """Why the purity check matters: an encode that drops words at random gives other
    ids each time it runs; tokenized once, every step would see the same dropout."""
    script = source("pretokenize_corpus.unsafe").replace(
        "        ids = [self.vocab.get(w, 1) for w in text.split()][:max_len]\n",
        "        ids = [self.vocab.get(w, 1) for w in text.split() if random.random() > 0.2][:max_len]\n",
    )
    settings = Settings(select=("PM203",), level=Level.UNSAFE)
    result = process_source(script.encode(), "<script>", settings, [LoopInvariantTokenization])
    assert result.new_source.decode() == script
    assert len(result.findings) == 2 and not any(f.fixable for f in result.findings)
    assert all("`tok.encode` is not known to be pure" in f.message for f in result.findings)
    by_hand = script.replace(
        "for step in range(20):\n", "docs_ids = [tok.encode(t, seq + 1) for t in docs]\nfor step in range(20):\n"
    ).replace("[tok.encode(t, seq + 1) for t in texts]", "[docs_ids[i] for i in batch_idx]")
    assert by_hand != script
    assert not torch.equal(run(by_hand)[0], run(script)[0])


def test_each_model_context_gets_its_own_table_of_ids_and_trains_bit_for_bit():
    """Each item of the step's `for ctx in contexts:` brings its own tokenizer and context
    length: the corpus is tokenized once per item, keyed by the item, and each step picks
    its rows from its item's table (at --level unsafe)."""
    case = "pretokenize_per_context.unsafe"
    settings = Settings(select=("PM203",), level=Level.UNSAFE)
    result = process_source(source(case).encode(), case, settings, [LoopInvariantTokenization])
    new_source = result.new_source.decode()
    assert new_source == (FIXTURES / f"{case}.out.py").read_text()
    assert [f.applied for f in result.findings] == [True]
    assert "once for each item of `contexts`" in result.findings[0].message
    before, calls_before = encode_calls(source(case))
    after, calls_after = encode_calls(new_source)
    assert len(before) == 20
    assert torch.equal(after, before)
    assert (calls_before, calls_after) == (20 * 2 * 4, 2 * 40)


def test_a_collection_of_contexts_changed_in_the_loop_keeps_the_tokenization_per_step():
    """A collection the loop changes in place (an item added during training would find no
    table) is refused, whatever the change: reported, not pretokenized."""
    case = "pretokenize_per_context.unsafe"
    script = source(case).replace(
        "    opt.zero_grad()\n",
        "    if step == 10:\n        contexts.reverse()\n    opt.zero_grad()\n",
    )
    settings = Settings(select=("PM203",), level=Level.UNSAFE)
    result = process_source(script.encode(), case, settings, [LoopInvariantTokenization])
    assert result.new_source.decode() == script
    assert [f.fixable for f in result.findings] == [False]
    assert "not pretokenized before the loop" in result.findings[0].message
