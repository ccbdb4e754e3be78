"""The lengths of the lists a function of the file returns (analysis/lengths.py)."""

import libcst as cst
import pytest

from codemod.analysis.lengths import Lengths
from codemod.context import FileContext

PADDED = """\
def encode(vocab, text, max_len):
    ids = [vocab.get(w, 1) for w in text.split()][:max_len]
    return ids + [0] * (max_len - len(ids))
"""


def returned_length(code: str) -> str | None:
    context = FileContext.of_source(code)
    function = next(n for n in context.module.body if isinstance(n, cst.FunctionDef) and n.name.value == "encode")
    param = context.shared("lengths", Lengths).returned_length(function)
    return None if param is None else param.name.value


@pytest.mark.parametrize(
    "code,expected",
    [
        (PADDED, "max_len"),
        (
            PADDED.replace("return ids + [0] * (max_len - len(ids))", "return [0] * (max_len - len(ids)) + ids"),
            "max_len",
        ),
        # not truncated: a long text gives more than max_len ids
        (PADDED.replace("][:max_len]", "]"), None),
        # not padded
        (PADDED.replace("return ids + [0] * (max_len - len(ids))", "return ids"), None),
        # truncated to one length, padded to another
        (PADDED.replace("[:max_len]", "[:8]"), None),
        # the length re-bound in the function
        (PADDED.replace("    ids = [", "    max_len = len(text)\n    ids = ["), None),
        # a `len` of the file's own
        ("def len(x):\n    return 0\n" + PADDED, None),
    ],
)
def test_returned_length(code, expected):
    assert returned_length(code) == expected
