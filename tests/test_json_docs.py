"""docs/json.md names every key that the JSON outputs hold: a key added to a
document without its line in the docs fails here (the verify and profile
documents are checked where their tests produce them: test_verify.py,
test_profile.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.cli_support import perfmod, write

DOCS = Path(__file__).resolve().parents[1] / "docs" / "json.md"
SECTIONS = {"check": "## `perfmod check`", "verify": "## `perfmod verify", "profile": "## `perfmod profile"}
# Keys whose names are values: levels, categories and the like, documented as such.
VALUE_KEYS = {"safe", "numeric", "unsafe", "python", "ops", "sync", "data", "handoff", "untraced"}


def keys_of(document) -> set[str]:
    if isinstance(document, dict):
        return set(document) | {key for value in document.values() for key in keys_of(value)}
    if isinstance(document, list):
        return {key for value in document for key in keys_of(value)}
    return set()


def undocumented(document: dict, section: str) -> set[str]:
    """The keys of `document` that the docs section of `section` does not name."""
    text = DOCS.read_text(encoding="utf-8")
    start = text.index(SECTIONS[section])
    following = [text.find(heading, start + 1) for heading in SECTIONS.values()]
    end = min([index for index in following if index > start], default=len(text))
    named = set(re.findall(r'"(\w+)"', text[start:end]))
    return keys_of(document) - named - VALUE_KEYS


def test_check_json_keys_are_documented(tmp_path):
    write(
        tmp_path / "train.py",
        "import torch\nfrom torch.utils.data import DataLoader\n"
        "loader = DataLoader(list(range(8)), batch_size=2, pin_memory=True)\nmodel = torch.nn.Linear(2, 1).cuda()\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor x in loader:\n    x = x.cuda()\n"
        "    loss = model(x.float().unsqueeze(1)).sum()\n    loss.backward()\n    opt.step()\n"
        "    opt.zero_grad()\n    print(loss.item())\n",
    )
    write(tmp_path / "broken.py", "def f(:\n")
    result = perfmod("check", "--no-cache", "--select", "ALL", "--level", "unsafe", "--format", "json", tmp_path)
    document = json.loads(result.stdout)
    assert document["findings"] and any(f["changes"] for f in document["findings"])
    assert any(f["error"] for f in document["files"])
    assert undocumented(document, "check") == set()


def test_the_check_of_undocumented_keys_can_fail():
    assert undocumented({"schema": 1, "brand_new_key": {"device": 1}}, "profile") == {"brand_new_key"}
    assert undocumented({"version": 2}, "profile") == {"version"}  # a key of another document's section
