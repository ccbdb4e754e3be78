"""What callers pass a parameter is answered once (`Kinds.arguments`, one call at a time
`passed_by`): the kinds, the loops' `values_of`, `Kinds.value_sources`
and the package's callers all read that answer."""

from __future__ import annotations

import textwrap

import libcst as cst

from codemod.analysis.bindings import passed_by
from codemod.context import FileContext


def context(code: str) -> FileContext:
    return FileContext.of_source(textwrap.dedent(code))


def param(ctx: FileContext, name: str) -> cst.Param:
    return next(p for p in ctx.index.find(cst.Param) if p.name.value == name)


def read(ctx: FileContext, name: str) -> cst.Name:
    """The read of `name` inside a `print(...)` call."""
    return next(
        n
        for call in ctx.index.find(cst.Call)
        if ctx.source(call.func) == "print"
        for n in ctx.index.find(cst.Name, within=call)
        if n.value == name
    )


def spelled(ctx: FileContext, values) -> list[str | None]:
    return [ctx.source(v) if v is not None else None for v in values]


PLAIN = """
def run(model, lr=0.1, steps=3):
    print(model, lr, steps)

run(m1, 0.5)
run(m2, steps=7)
"""


def test_every_follower_reads_one_answer_for_a_plain_function():
    ctx = context(PLAIN)
    lr = param(ctx, "lr")
    found = ctx.kinds.arguments(lr)
    assert [ctx.line(call) for call, _ in found] == [5, 6]
    assert spelled(ctx, [value for _, value in found]) == ["0.5", "0.1"]  # the default where a call passes none
    assert spelled(ctx, ctx.kinds.passed(lr)) == ["0.5", "0.1"]
    assert spelled(ctx, ctx.loops.values_of(read(ctx, "lr"))) == ["0.5", "0.1"]
    assert spelled(ctx, ctx.kinds.value_sources(read(ctx, "lr"))) == ["0.5", "0.1"]
    assert spelled(ctx, ctx.kinds.value_sources(read(ctx, "steps"))) == ["3", "7"]


def test_a_call_whose_star_arguments_may_pass_the_parameter_is_not_told():
    ctx = context(PLAIN + "run(m3, *rest)\n")
    lr = param(ctx, "lr")
    assert spelled(ctx, [value for _, value in ctx.kinds.arguments(lr)]) == ["0.5", "0.1", None]
    assert ctx.kinds.passed(lr) is None
    assert ctx.loops.values_of(read(ctx, "lr")) == []
    assert spelled(ctx, ctx.kinds.value_sources(read(ctx, "lr"))) == ["0.5", "0.1", None]


def test_a_function_handed_on_as_a_value_may_be_called_with_anything():
    ctx = context(
        """
        def work(n):
            print(n)

        work(2)
        pool.map(work, range(8))
        """
    )
    n = param(ctx, "n")
    assert ctx.kinds.arguments(n) is None
    assert ctx.kinds.passed(n) is None
    assert ctx.loops.values_of(read(ctx, "n")) == []
    assert ctx.kinds.value_sources(read(ctx, "n")) == [None]


def test_what_the_constructions_of_a_class_pass_its_init():
    ctx = context(
        """
        class Trainer:
            def __init__(self, model, device="cpu"):
                self.model = model
                print(device)

        a = Trainer(net, "cuda")
        b = Trainer(model=net)
        """
    )
    device = param(ctx, "device")
    assert spelled(ctx, [value for _, value in ctx.kinds.arguments(device)]) == ['"cuda"', '"cpu"']
    assert spelled(ctx, ctx.kinds.value_sources(read(ctx, "device"))) == ['"cuda"', '"cpu"']
    assert ctx.kinds.arguments(param(ctx, "self")) == [(c, None) for c, _ in ctx.kinds.arguments(device)]


def test_a_subclassed_class_is_built_where_this_file_cannot_see():
    ctx = context(
        """
        class Trainer:
            def __init__(self, device):
                print(device)

        class Other(Trainer):
            pass

        Trainer("cuda")
        """
    )
    assert ctx.kinds.arguments(param(ctx, "device")) is None
    assert ctx.kinds.value_sources(read(ctx, "device")) == [None]


def test_passed_by_one_call():
    module = cst.parse_module("def f(a, b=2, *, c=3):\n    pass\n")
    function = module.body[0]
    a, b = function.params.params
    (c,) = function.params.kwonly_params

    def call(code: str) -> cst.Call:
        return cst.parse_expression(code)

    assert passed_by(call("f(1)"), function, a).value == "1"
    assert passed_by(call("f(1)"), function, b).value == "2"  # the default
    assert passed_by(call("f(b=5, a=1)"), function, b).value == "5"
    assert passed_by(call("f(1, **kw)"), function, c) is None  # `**kw` may pass it
    assert passed_by(call("f(*xs)"), function, b) is None
    assert passed_by(call("f(1, c=4)"), function, c).value == "4"
    assert passed_by(call("self.f(1)"), function, b, offset=1).value == "1"  # `self` fills `a`


def test_one_number_question_for_host_reads_and_the_training_facts():
    from codemod.analysis.values import INT, NUMBER, values

    ctx = context(
        """
        import argparse
        import torch

        parser = argparse.ArgumentParser()
        parser.add_argument("--bs", type=int, choices=[16, 32])
        args = parser.parse_args()

        def scale(x, factor=2):
            print(x, factor)

        n = 0
        total = 0
        ratio = 1
        for i in range(10):
            n += 1
            ratio /= 2
            total = total + len(data) * i
        a, b = 3, 0.5
        t = torch.ones(4)
        rows = t.shape[0]
        first = t.size(0)
        mean = t.mean().item()
        shape = t.size()
        scale(t, 3)
        print(n, total, ratio, a, b, rows, first, mean, shape, args.bs, i)
        """
    )
    number = values(ctx).number
    told = {name: number(read(ctx, name)) for name in ("n", "total", "a", "rows", "first", "i")}
    assert told == dict.fromkeys(told, INT)
    assert number(read(ctx, "b")) == NUMBER
    assert number(read(ctx, "mean")) == NUMBER  # `.item()`: an int or a float
    assert number(read(ctx, "ratio")) is None  # `/=` is not followed
    assert number(read(ctx, "shape")) is None  # a torch.Size
    assert number(read(ctx, "factor")) == INT  # the default and every argument
    assert number(read(ctx, "x")) is None
    bs = next(a for a in ctx.index.find(cst.Attribute) if ctx.source(a) == "args.bs")
    assert number(bs) == INT  # an option's choices
    # the training facts and the host reads ask the same question
    assert ctx.training.is_int(read(ctx, "total")) and not ctx.training.is_int(read(ctx, "mean"))
    assert ctx.training.is_int(bs)


def test_the_last_source_of_a_read_is_the_last_binding_that_reaches_it():
    ctx = context(
        """
        import torch

        opt = torch.optim.SGD(params, lr=0.1)
        print(opt)
        opt = torch.optim.Adam(params)
        if flag:
            opt = torch.optim.AdamW(params)
        print(opt)
        """
    )
    first, second = [call.args[0].value for call in ctx.index.find(cst.Call) if ctx.source(call.func) == "print"]
    # the last binding that reaches the read, not the last of the file
    assert ctx.source(ctx.training._last_source(first)) == "torch.optim.SGD(params, lr=0.1)"
    assert ctx.source(ctx.training._last_source(second)) == "torch.optim.AdamW(params)"
