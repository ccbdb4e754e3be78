"""The precision benchmark's contract: its labels file, the join of findings to labels,
--check, and a run over the wild corpus."""

import json
import os
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks.precision import (
    FIX_LABELS,
    LABELS,
    REPORT_LABELS,
    WILD,
    changed,
    collect,
    file_items,
    join,
    load_labels,
    main,
    measure,
    rows,
    wild_source,
)
from codemod.rules import ALL_RULES

PROGRAM = textwrap.dedent("""\
    import torch
    x = torch.randn(4, pin_memory=True)
    y = x.to(torch.device("cuda"))
""")


def _labels_file(path, fixes=(), reports=(), sources=None):
    path.write_text(json.dumps({"sources": sources or {}, "fixes": list(fixes), "reports": list(reports)}))
    return path


def test_the_labels_file_parses_and_names_known_rules_labels_and_repos():
    sources, labels = load_labels(LABELS)
    codes = {rule.CODE for rule in ALL_RULES}
    assert labels
    for label in labels:
        assert label.item.code in codes
        assert label.label in (FIX_LABELS if label.item.kind == "fix" else REPORT_LABELS)
        assert label.reason
        assert label.item.source == WILD or label.item.source in sources
    for name, pin in sources.items():
        assert len(pin["commit"]) == 40 and pin["paths"], name


@pytest.mark.parametrize(
    "change, error",
    [
        ({"label": "GOOD"}, "is not one of"),
        ({"code": "PM999"}, "unknown rule code"),
        ({"reason": " "}, "no reason"),
        ({"basis": "guess"}, "basis"),
    ],
)
def test_a_malformed_label_is_refused(tmp_path, change, error):
    entry = {"source": WILD, "path": "a.py", "code": "PM101", "site": "x", "hunk": [], "label": "CORRECT"}
    entry = {**entry, "reason": "r", **change}
    with pytest.raises(ValueError, match=error):
        load_labels(_labels_file(tmp_path / "labels.json", fixes=[entry]))


def test_the_same_item_labeled_twice_is_refused(tmp_path):
    entry = {
        "source": WILD,
        "path": "a.py",
        "code": "PM101",
        "site": "x",
        "hunk": [],
        "label": "CORRECT",
        "reason": "r",
    }
    with pytest.raises(ValueError, match="labeled twice"):
        load_labels(_labels_file(tmp_path / "labels.json", fixes=[entry, {**entry, "label": "NOISY"}]))


def test_items_join_by_text_not_line_and_unlabeled_and_stale_are_listed(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "p.py").write_text(PROGRAM)
    items, error = file_items(WILD, corpus, "p.py")
    assert not error
    fix = next(i for i in items if i.kind == "fix" and i.code == "PM101")
    assert fix.site == 'y = x.to(torch.device("cuda"))'
    assert '-y = x.to(torch.device("cuda"))' in fix.detail and any("non_blocking=True" in t for t in fix.detail)

    labeled = {
        "source": WILD,
        "path": "p.py",
        "code": "PM101",
        "site": fix.site,
        "hunk": list(fix.detail),
        "label": "NOISY",
        "reason": "nothing to overlap",
    }
    stale = {**labeled, "site": "z = x.to('cuda')", "label": "CORRECT"}
    labels_path = _labels_file(tmp_path / "labels.json", fixes=[labeled, stale])
    _sources, labels = load_labels(labels_path)

    # Lines added above the copy move it; the label still finds it by its text.
    (corpus / "p.py").write_text("# a comment\n\n" + PROGRAM)
    moved, _ = file_items(WILD, corpus, "p.py")
    joined = join(moved, labels, {WILD})
    assert [(i.code, label.label) for i, label in joined.labeled] == [("PM101", "NOISY")]
    assert [label.item.site for label in joined.stale] == ["z = x.to('cuda')"]
    assert joined.unlabeled == [i for i in moved if i.code != "PM101"]
    total = rows(joined, "code")[-1]
    assert (total.counts["NOISY"], total.fixes, total.noisy_share) == (1, 1, 1.0)
    # Labels of a source that was not measured are not stale.
    assert join(moved, labels, set()).stale == []


def test_a_changed_fix_is_paired_with_its_old_label(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "p.py").write_text(PROGRAM)
    items, _ = file_items(WILD, corpus, "p.py")
    fix = next(i for i in items if i.kind == "fix" and i.code == "PM101")
    old = {
        "source": WILD,
        "path": "p.py",
        "code": "PM101",
        "site": fix.site,
        "hunk": ["-y = x.to(torch.device('cuda'))", "+y = x.cuda()"],
        "label": "WRONG",
        "reason": "an older rewrite",
    }
    _, labels = load_labels(_labels_file(tmp_path / "labels.json", fixes=[old]))
    joined = join(items, labels, {WILD})
    assert [(label.reason, item.key) for label, item in changed(joined)] == [("an older rewrite", fix.key)]


def test_check_fails_until_every_item_is_labeled(tmp_path, capsys):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "p.py").write_text(PROGRAM)
    labels_path = _labels_file(tmp_path / "labels.json")
    todo = tmp_path / "todo.json"
    args = ["--corpus", str(corpus), "--labels", str(labels_path), "--check"]
    assert main([*args, "--unlabeled", str(todo)]) == 1
    assert "UNLABELED" in capsys.readouterr().out
    entries = json.loads(todo.read_text())
    assert entries["fixes"]
    for entry in entries["fixes"]:
        entry["label"], entry["reason"] = "CORRECT", "test"
    for entry in entries["reports"]:
        entry["label"], entry["reason"] = "RIGHT", "test"
    _labels_file(labels_path, entries["fixes"], entries["reports"])
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "UNLABELED" not in out and "STALE" not in out


def test_a_messages_line_numbers_do_not_key_it(tmp_path):
    report = {"source": WILD, "path": "a.py", "code": "PM404", "site": "x", "label": "RIGHT", "reason": "r"}
    _, labels = load_labels(
        _labels_file(tmp_path / "l.json", reports=[{**report, "message": "`x.item()` is logged (`print`, line 12)"}])
    )
    assert labels[0].item.detail == ("`x.item()` is logged (`print`, line N)",)


def test_the_wild_corpus_joins_its_labels():
    """Static only, every third file of the corpus (the benchmark runs all of it): most
    findings find their labels (a rule change may leave some unlabeled, to be labeled
    again; a broken key would lose them all)."""
    corpus = wild_source()
    items, errors = collect([replace(corpus, paths=corpus.paths[::3])])
    assert not errors
    joined = join(items, load_labels(LABELS)[1], {WILD})
    items = len(joined.labeled) + len(joined.unlabeled)
    assert items > 150
    assert len(joined.labeled) >= 0.5 * items
    for item, label in joined.labeled:
        assert label.label in (FIX_LABELS if item.kind == "fix" else REPORT_LABELS)


def test_the_pinned_public_repos_are_all_labeled():
    """Only where the checkouts are at hand: PERFMOD_PRECISION_REPOS names a folder of
    them (owner+name, at the pinned commits). Every finding there has a label."""
    folder = os.environ.get("PERFMOD_PRECISION_REPOS")
    if not folder or not Path(folder).is_dir():
        pytest.skip("no checkouts of the public repos (set PERFMOD_PRECISION_REPOS)")
    sources, joined, errors = measure(LABELS, None, Path(folder))
    assert sources and not errors
    assert [s.note for s in sources if s.note] == []
    assert [(i.source, i.path, i.line, i.code) for i in joined.unlabeled] == []
    assert [(s.item.source, s.item.path, s.item.code) for s in joined.stale] == []


def test_a_fix_settled_by_another_rules_fix_is_that_fixs_item(tmp_path):
    """The copies of a loop that PM103 prefetches go with PM103's fix, which does their work:
    one item (PM103's), not one more per copy for PM101."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "p.py").write_text(
        textwrap.dedent("""\
            import torch
            from torch.utils.data import DataLoader, TensorDataset
            device = torch.device("cuda")
            data = TensorDataset(torch.randn(8192, 1024), torch.randn(8192, 1))
            loader = DataLoader(data, batch_size=512, pin_memory=True)
            model = torch.nn.Linear(1024, 1).to(device)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for x, y in loader:
                x = x.to(device)
                y = y.to(device)
                loss = (model(x) - y).pow(2).mean()
                loss.backward()
                opt.step()
        """)
    )
    items, error = file_items(WILD, corpus, "p.py")
    assert not error
    fixes = [i.code for i in items if i.kind == "fix"]
    assert "PM103" in fixes and "PM101" not in fixes
    assert not [i for i in items if i.code == "PM101"]
