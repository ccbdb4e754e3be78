"""`TrainingLoops.runs_once`: code that runs at most once in a run of the program
(PM101 leaves such copies alone: there is no later step for them to overlap with)."""

import libcst as cst
import pytest

from codemod.context import FileContext

CASES = [
    ("x = MARK()\n", True),
    ("for i in range(3):\n    x = MARK()\n", False),
    ("while True:\n    x = MARK()\n", False),
    ("xs = [MARK() for _ in range(3)]\n", False),
    ("for x in MARK():\n    pass\n", True),  # the iterable is built once
    ("def main():\n    x = MARK()\nif __name__ == '__main__':\n    main()\n", True),
    ("def main():\n    x = MARK()\nfor _ in range(2):\n    main()\n", False),
    ("def main():\n    x = MARK()\nmain()\nmain()\n", False),
    ("def helper():\n    return MARK()\ndef main():\n    helper()\nmain()\n", True),
    ("def helper():\n    return MARK()\ndef main():\n    for _ in range(3):\n        helper()\nmain()\n", False),
    ("def main():\n    x = MARK()\n", False),  # never called here: called from elsewhere, any number of times
    ("def main():\n    x = MARK()\ncallbacks = [main]\n", False),  # passed as a value
    ("f = lambda: MARK()\nf()\n", False),
    ("class Net:\n    def forward(self):\n        return MARK()\n", False),
]


@pytest.mark.parametrize("code,once", CASES, ids=range(len(CASES)))
def test_runs_once(code, once):
    context = FileContext.of_source(code)
    (mark,) = [c for c in context.index.find(cst.Call) if isinstance(c.func, cst.Name) and c.func.value == "MARK"]
    assert context.loops.runs_once(mark) is once
