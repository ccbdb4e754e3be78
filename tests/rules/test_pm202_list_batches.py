"""PM202 on batches of texts looked up in a Python list through a per-epoch
permutation (LatentWire's train.py: `perm = torch.randperm(N, generator=g)`,
`idx = perm[step * bs:(step + 1) * bs]`, `batch_texts = [texts[i] for i in
idx.tolist()]`, tokenized in the step). Reported with the reason it is not
rewritten and the expert's alternative; never rewritten. The must-nots: the same
look-up in an evaluation loop, and texts that go to the model as they are."""

import contextlib
import io
import re
from collections import Counter
from pathlib import Path

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level
from tests.rules.scripts import one_thread

REPO = Path(__file__).resolve().parents[2]
SEED = REPO / "fixtures" / "scripts" / "seed_latentwire_batching.py"

HEAD = """\
import torch
import torch.nn as nn
import torch.nn.functional as F

texts = [f"question {i} answer {i % 10}" for i in range(64)]
vocab = sorted({c for t in texts for c in t})
model = nn.Sequential(nn.EmbeddingBag(len(vocab) + 1, 16), nn.Linear(16, len(vocab) + 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
bs = 8
N = len(texts)
"""
ENCODE = """

def encode(batch):
    ids = [[vocab.index(c) + 1 for c in text] for text in batch]
    width = max(len(row) for row in ids)
    return torch.tensor([row + [0] * (width - len(row)) for row in ids])

"""
LOOP = """\
for epoch in range(2):
    perm = torch.randperm(N)
    for step in range(N // bs):
        idx = perm[step * bs:(step + 1) * bs]
        batch_texts = [texts[i] for i in idx.tolist()]
        ids = encode(batch_texts)
        loss = F.cross_entropy(model(ids), ids[:, 0])
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def findings(source: str, code: str, path: str = "train.py"):
    """`code`'s findings on `source` at level unsafe, which leaves the source as it is."""
    result = process_source(source.encode(), path, Settings(level=Level.UNSAFE, select=(code,)))
    assert result.error is None, result.error
    assert result.new_source in (None, source.encode())
    return [f for f in result.findings if f.code == code]


def line_of(source: str, text: str) -> int:
    (number,) = [n for n, line in enumerate(source.splitlines(), 1) if line.strip().startswith(text)]
    return number


def test_latentwire_shaped_script_reports_the_permutation_batches_and_their_own_generator():
    source = SEED.read_text(encoding="utf-8")
    (finding,) = findings(source, "PM202", str(SEED))
    assert finding.line == line_of(source, "for step in range(steps_per_epoch):")
    assert not finding.fixable
    message = finding.message
    assert "`texts`, a Python list" in message
    assert "`perm[step * args.batch_size : (step + 1) * args.batch_size]`" in message
    assert f"runs `ctx.wrapper.tokenizer(...)` (from line {line_of(source, 'ids = ctx.wrapper')})" in message
    assert "collate_fn" in message and "num_workers" in message
    # the tokenizer a wrapper of the file builds is a known one, pure: what stays is the order
    assert message.endswith(
        "not rewritten because the permutation is drawn with its own generator, and a DataLoader would draw "
        "its order from another"
    )


def test_a_tokenizer_function_that_reads_a_module_variable_is_reported_not_moved():
    """`encode` reads `vocab`, a module-level list: worker processes would see the value
    it had when they started, so perfmod does not take the function as pure."""
    source = HEAD + ENCODE + LOOP
    (finding,) = findings(source, "PM202")
    assert finding.line == line_of(source, "for step in range(N // bs):")
    assert "runs `encode(...)`" in finding.message
    assert finding.message.endswith("not rewritten because perfmod cannot tell that `encode` is pure")


def test_a_pure_tokenizer_of_the_module_becomes_the_collate_fn_and_trains_alike():
    """The fixture's rewrite (fixtures/rules/PM202/permuted_texts_collate) run beside the
    original: as many steps per epoch (a shorter last batch kept), a DataLoader over the
    whole list with `encode` as its collate_fn, and a loss curve close to the original's
    (another shuffle: not the same batches)."""
    original = (REPO / "fixtures" / "rules" / "PM202" / "permuted_texts_collate.in.py").read_text()
    rewritten = (REPO / "fixtures" / "rules" / "PM202" / "permuted_texts_collate.out.py").read_text()
    before, _ = run(original)
    after, namespace = run(rewritten)
    assert steps_per_epoch(before) == steps_per_epoch(after) == {0: 8, 1: 8, 2: 8}
    loader = namespace["loader"]
    assert loader.dataset is namespace["texts"] and loader.collate_fn is namespace["encode"]
    assert not loader.drop_last and loader.batch_size == 8
    last = [loss for (epoch, _), loss in after.items() if epoch == 2]
    want = [loss for (epoch, _), loss in before.items() if epoch == 2]
    assert abs(sum(last) / len(last) - sum(want) / len(want)) < 0.25 * sum(want) / len(want)


def test_full_batches_only_keep_drop_last():
    original = (REPO / "fixtures" / "rules" / "PM202" / "permuted_texts_collate.in.py").read_text()
    original = original.replace("range((N + bs - 1) // bs)", "range(N // bs)")
    result = process_source(original.encode(), "t.py", Settings(level=Level.UNSAFE, select=("PM202",)))
    assert [f.applied for f in result.findings] == [True]
    rewritten = result.new_source.decode()
    assert "DataLoader(texts,batch_size=bs,shuffle=True,drop_last=True,collate_fn=encode)" in re.sub(
        r"\s", "", rewritten
    )
    before, _ = run(original)
    after, _ = run(rewritten)
    assert steps_per_epoch(before) == steps_per_epoch(after) == {0: 7, 1: 7, 2: 7}


def test_must_not_rewrite_a_permutation_with_its_own_generator():
    original = (REPO / "fixtures" / "rules" / "PM202" / "permuted_texts_collate.in.py").read_text()
    original = original.replace("perm = torch.randperm(N)", "perm = torch.randperm(N, generator=g)").replace(
        "for epoch in range(3):\n", "for epoch in range(3):\n    g = torch.Generator().manual_seed(epoch)\n"
    )
    (finding,) = findings(original, "PM202")
    assert finding.message.endswith(
        "not rewritten because the permutation is drawn with its own generator, and a DataLoader would draw its "
        "order from another"
    )


def test_the_window_of_a_counter_stepping_by_the_batch_size_is_a_batch_too():
    loop = LOOP.replace("for step in range(N // bs):", "for start in range(0, N, bs):").replace(
        "perm[step * bs:(step + 1) * bs]", "perm[start:start + bs]"
    )
    source = HEAD + ENCODE + loop
    (finding,) = findings(source, "PM202")
    assert "`perm[start:start + bs]`" in finding.message


def test_must_not_an_evaluation_loop_over_the_same_batches():
    loop = LOOP.replace(
        "        opt.zero_grad()\n        loss.backward()\n        opt.step()\n", "        print(loss.item())\n"
    )
    assert findings(HEAD + ENCODE + "with torch.no_grad():\n" + _indent(loop), "PM202") == []


def test_must_not_texts_that_go_to_the_model_as_they_are():
    """The model takes the strings itself (a byte-level encoder inside it): looking up a
    list costs microseconds, and a DataLoader would only move that."""
    source = (
        HEAD
        + """

class ByteModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.EmbeddingBag(256, 16)
        self.head = nn.Linear(16, 2)

    def forward(self, batch):
        ids = [torch.tensor(list(text.encode())) for text in batch]
        return self.head(self.embed(torch.cat(ids), torch.tensor([0] + [len(i) for i in ids[:-1]]).cumsum(0)))


model = ByteModel()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
"""
        + LOOP.replace("        ids = encode(batch_texts)\n", "").replace(
            "F.cross_entropy(model(ids), ids[:, 0])", "F.cross_entropy(model(batch_texts), idx % 2)"
        )
    )
    assert findings(source, "PM202") == []


def test_latentwire_shaped_script_reports_its_default_batch_size_of_one():
    source = SEED.read_text(encoding="utf-8")
    (finding,) = findings(source, "PM204", str(SEED))
    assert finding.line == line_of(source, 'ap.add_argument("--batch_size"')
    assert not finding.fixable
    assert "`args.batch_size`" in finding.message
    assert f"used on line {line_of(source, 'idx = perm[')}" in finding.message


def run(source: str) -> tuple[dict[tuple[int, int], float], dict]:
    """The loss of each (epoch, step) a script prints, and its globals."""
    out, namespace = io.StringIO(), {"__name__": "__main__"}
    with one_thread(), contextlib.redirect_stdout(out):
        exec(compile(source, "<fixture>", "exec"), namespace)
    found = re.findall(r"epoch (\d+) step (\d+) loss (\S+)", out.getvalue())
    return {(int(e), int(s)): float(v) for e, s, v in found}, namespace


def steps_per_epoch(losses: dict[tuple[int, int], float]) -> dict[int, int]:
    return dict(Counter(epoch for epoch, _ in losses))


def _indent(code: str) -> str:
    return "".join("    " + line if line.strip() else line for line in code.splitlines(keepends=True))


def test_indices_that_also_pick_targets_are_named_for_the_loader_items_to_carry():
    """LatentWire's step also reads `ctx.token_ids[idx]`: the DataLoader's items must carry it."""
    source = (
        HEAD.replace("bs = 8\n", "bs = 8\nlabels = torch.arange(64) % 3\n")
        + ENCODE
        + LOOP.replace("ids[:, 0])", "labels[idx])")
    )
    (finding,) = findings(source, "PM202")
    assert (
        f"its items also carrying what the indices pick elsewhere (`labels[idx]`, line {line_of(source, 'loss =')})"
        in (finding.message)
    )


def test_must_not_rewrite_one_permutation_reused_by_every_epoch():
    original = (REPO / "fixtures" / "rules" / "PM202" / "permuted_texts_collate.in.py").read_text()
    original = original.replace("    perm = torch.randperm(N)\n", "").replace(
        "for epoch in range(3):\n", "perm = torch.randperm(N)\nfor epoch in range(3):\n"
    )
    (finding,) = findings(original, "PM202")
    assert not finding.fixable
    assert finding.message.endswith(
        "not rewritten because the permutation is not drawn anew for each pass of the loop (a DataLoader would draw one per pass)"
    )
