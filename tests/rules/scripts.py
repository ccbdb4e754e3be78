"""Run small training scripts in this process and read back the losses they print.

The fixtures print one `... loss <repr>` line per step; running them with
`exec` (instead of a subprocess) saves a torch import per run, which keeps the
execution tests at a few seconds.
"""

from __future__ import annotations

import contextlib
import io
import re

import torch

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level, Rule


def rewrite(source: str, rules: list[type[Rule]], **config) -> str:
    """`source` with the fixes of `rules` applied, at level numeric; every finding must be fixed."""
    settings = Settings(select=tuple(r.CODE for r in rules), level=Level.NUMERIC).with_overrides(**config)
    result = process_source(source.encode(), "<fixture>", settings, rules)
    assert result.error is None, result.error
    assert result.findings and all(f.applied for f in result.findings), result.findings
    return result.new_source.decode()


@contextlib.contextmanager
def one_thread():
    """Run torch on one thread: these models are so small that waking more
    threads costs more than it saves, and on a busy machine much more (a tiny
    MLP's step took about 1 ms on one thread and over 100 ms on two under load)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def losses(source: str) -> torch.Tensor:
    """The losses a script prints, in order, as float64."""
    out = io.StringIO()
    with one_thread(), contextlib.redirect_stdout(out):
        exec(compile(source, "<fixture>", "exec"), {"__name__": "__main__"})
    return torch.tensor([float(v) for v in re.findall(r"loss (\S+)", out.getvalue())], dtype=torch.float64)


def max_relative_difference(got: torch.Tensor, want: torch.Tensor) -> float:
    assert got.shape == want.shape and len(want) > 0
    return ((got - want).abs() / want.abs()).max().item()


def f_string_quotes_reused(source: str) -> list[str]:
    """The f-strings of `source` whose braces hold a string literal in the f-string's own
    quote: valid only from Python 3.12 (PEP 701), a SyntaxError on 3.10 and 3.11, which
    perfmod supports, whatever Python runs the test."""
    import libcst as cst
    import libcst.matchers as m

    module = cst.parse_module(source)
    reused = []
    for string in m.findall(module, m.FormattedString()):
        quote = string.start[-1]
        inner = [
            s
            for part in string.parts
            if isinstance(part, cst.FormattedStringExpression)
            for s in m.findall(part, m.SimpleString() | m.FormattedString())
        ]
        if any((s.quote if isinstance(s, cst.SimpleString) else s.start)[-1] == quote for s in inner):
            reused.append(module.code_for_node(string))
    return reused
