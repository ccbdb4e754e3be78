"""How many parameters a call of a function of the file fills before its own arguments
(`Kinds.receiver_offset`): a method's `self`, and nothing for a static method or a function."""

from __future__ import annotations

import textwrap

import libcst as cst

from codemod.context import FileContext

CODE = textwrap.dedent(
    """\
    class Trainer:
        def fit(self, module):
            return module

        @staticmethod
        def build(width):
            return width


    def train(module):
        return module


    trainer = Trainer()
    trainer.fit(1)
    trainer.build(2)
    train(3)
    """
)


def offsets() -> dict[str, int]:
    ctx = FileContext.of_source(CODE)
    functions = {f.name.value: f for f in ctx.index.find(cst.FunctionDef)}
    found = {}
    for call in ctx.index.find(cst.Call):
        name = call.func.attr.value if isinstance(call.func, cst.Attribute) else call.func.value
        if name in functions:
            found[name] = ctx.kinds.receiver_offset(call, functions[name])
    return found


def test_a_method_called_on_an_object_fills_self_and_nothing_else_does():
    assert offsets() == {"fit": 1, "build": 0, "train": 0}
