"""Which tests make code of a loop run only on some of its iterations
(codemod.analysis.periodic): a modulo test on a counter of the loop, however it
is spelled, or a helper of the file or project that returns one."""

from __future__ import annotations

import textwrap
from pathlib import Path

import libcst as cst
import pytest

from codemod.analysis.periodic import periodic
from codemod.context import FileContext


def context(code: str, path: str = "<string>") -> FileContext:
    return FileContext.of_source(textwrap.dedent(code), path)


def only(ctx: FileContext, kind):
    found = ctx.index.find(kind)
    assert len(found) == 1
    return found[0]


def marked(ctx: FileContext) -> cst.Call:
    return next(c for c in ctx.index.find(cst.Call) if ctx.source(c.func) == "marked")


def guard_test(code: str, path: str = "<string>") -> str | None:
    """The test of the `if` that makes `marked()` periodic in the file's only `for` loop."""
    ctx = context(code, path)
    loops = ctx.index.find((cst.For, cst.While))
    found = periodic(ctx).guard(marked(ctx), loops[0])
    return None if found is None else ctx.source(found.test)


@pytest.mark.parametrize(
    "test",
    [
        "step % 100 == 0",
        "0 == step % 100",
        "not step % 100",
        "(step + 1) % accum == 0",
        "(step + 1) % accum != 0",
        "step > 0 and step % every == 0",
        "step != 0 and step % every == 0",
        "(step > 0 and step % 250 == 0) or last_step",
        "step % every",
        "step % 2 == 1",
    ],
)
def test_modulo_tests_on_the_loop_target_are_periodic(test):
    code = f"""\
        for step in range(1000):
            train()
            if {test}:
                marked()
        """
    assert guard_test(code) == test


def test_a_counter_the_loop_increments_counts():
    code = """\
        iter_num = 0
        while True:
            train()
            if iter_num % eval_interval == 0:
                marked()
            iter_num += 1
        """
    assert guard_test(code) == "iter_num % eval_interval == 0"


def test_a_flag_the_loop_binds_to_a_periodic_test_is_periodic():
    code = """\
        for step in range(1000):
            train()
            should_log = step % 10 == 0
            if master and should_log:
                marked()
        """
    assert guard_test(code) == "master and should_log"


def test_a_flag_bound_before_the_loop_is_the_same_on_every_iteration():
    code = """\
        should_log = step % 10 == 0
        for step in range(1000):
            if should_log:
                marked()
        """
    assert guard_test(code) is None


def test_an_attribute_counter_counts():
    code = """\
        for batch in loader:
            train()
            if self.global_step % 50 == 0:
                marked()
        """
    assert guard_test(code) == "self.global_step % 50 == 0"


def test_a_name_the_loop_never_binds_is_the_same_on_every_iteration():
    code = """\
        for epoch in range(10):
            for x in loader:
                train()
                if epoch % 2 == 0:
                    marked()
        """
    ctx = context(code)
    inner = ctx.index.find(cst.For)[1]
    outer = ctx.index.find(cst.For)[0]
    assert periodic(ctx).guard(marked(ctx), inner) is None
    assert periodic(ctx).guard(marked(ctx), outer) is not None


@pytest.mark.parametrize(
    "test",
    [
        "step > 0",
        "step == 10",
        "verbose",
        "'%d' % step == '10'",
        "step % 2 < 1",
    ],
)
def test_other_tests_are_not_periodic(test):
    code = f"""\
        for step in range(1000):
            if {test}:
                marked()
        """
    assert guard_test(code) is None


def test_the_else_branch_is_not_periodic():
    code = """\
        for step in range(1000):
            if step % 10 == 0:
                pass
            else:
                marked()
        """
    assert guard_test(code) is None


def test_the_outermost_periodic_if_is_the_guard():
    code = """\
        for step in range(1000):
            if step % 10 == 0:
                if verbose:
                    if step % 100 == 0:
                        marked()
        """
    assert guard_test(code) == "step % 10 == 0"


def test_a_local_helper_returning_a_modulo_test_is_periodic():
    code = """\
        def divisible_by(num, den):
            return (num % den) == 0

        for i in range(1000):
            train()
            if divisible_by(i, validate_every):
                marked()
        """
    ctx = context(code)
    loop = only(ctx, cst.For)
    test = ctx.index.find(cst.If)[0].test
    assert periodic(ctx).guard(marked(ctx), loop) is not None
    assert ctx.source(periodic(ctx).period(test, loop)) == "validate_every"


def test_a_helper_given_something_that_does_not_count_is_not_periodic():
    code = """\
        def divisible_by(num, den):
            return (num % den) == 0

        for i in range(1000):
            if divisible_by(epoch, 2):
                marked()
        """
    assert guard_test(code) is None


@pytest.mark.parametrize(
    "helper",
    [
        "def every(num, den):\n    print(num)\n    return num % den == 0\n",
        "def every(num, den):\n    return num > den\n",
        "def every(*args):\n    return args[0] % args[1] == 0\n",
    ],
)
def test_helpers_that_do_more_or_test_otherwise_are_not_periodic(helper):
    code = helper + textwrap.dedent("""\

        for i in range(1000):
            if every(i, 10):
                marked()
        """)
    assert guard_test(code) is None


def test_a_project_helper_is_followed(tmp_path: Path):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "helpers.py").write_text(
        'def divisible_by(num, den):\n    """Every den-th num."""\n    return (num % den) == 0\n'
    )
    code = """\
        from pkg.helpers import divisible_by

        for i in range(1000):
            if divisible_by(i, 100):
                marked()
        """
    train = tmp_path / "pkg" / "train.py"
    train.write_text(textwrap.dedent(code))
    assert guard_test(code, str(train)) == "divisible_by(i, 100)"


# -- sometimes: every way to a node passes a periodic test --------------------------------------

EVALUATE = """\
def evaluate(model, loader):
    for x in loader:
        marked(x)

for step in range(1000):
    train()
    if step > 0 and step % 500 == 0:
        evaluate(model, val_loader)
    CALL
"""


def sometimes_line(code: str) -> int | None:
    ctx = context(code)
    found = periodic(ctx).sometimes(marked(ctx))
    return None if found is None else ctx.line(found)


def test_a_function_called_only_under_a_periodic_test_runs_sometimes():
    # makemore: `evaluate(...)` under `if step > 0 and step % 500 == 0:`, and never else
    assert sometimes_line(EVALUATE.replace("CALL", "pass")) == 7


def test_a_function_also_called_every_step_or_passed_as_a_value_runs_every_step():
    assert sometimes_line(EVALUATE.replace("CALL", "evaluate(model, train_loader)")) is None
    assert sometimes_line(EVALUATE.replace("CALL", "callbacks.append(evaluate)")) is None
    assert sometimes_line(EVALUATE.replace("CALL", "pass").replace("evaluate(model, val_loader)", "pass")) is None


def test_a_callback_testing_a_counter_attribute_runs_sometimes():
    # minGPT's adder: the evaluation runs in a callback, under `trainer.iter_num % 500 == 0`
    code = (
        "def eval_split(trainer):\n    for x in loader:\n        marked(x)\n"
        "def batch_end_callback(trainer):\n    if trainer.iter_num % 500 == 0:\n        eval_split(trainer)\n"
    )
    assert sometimes_line(code) == 5


def once_test(code: str) -> bool:
    """Whether the test of the `if` around `marked()` holds once at most in the file's loop."""
    ctx = context(code)
    loop = ctx.index.find((cst.For, cst.While))[0]
    guard = next(a for a in ctx.index.ancestors(marked(ctx)) if isinstance(a, cst.If))
    return periodic(ctx).once(guard.test, loop)


@pytest.mark.parametrize(
    "head, test, expected",
    [
        ("for step in range(1000):", "step == 0", True),
        ("for step, batch in enumerate(loader):", "step == warmup", True),
        ("for step in range(1000):", "step == 0 and use_gc", True),
        ("for step in range(1000):", "step == 0 or step == resume_step", True),
        ("for step in range(1000):", "step == 0 or use_gc", False),  # `use_gc` may hold on every step
        ("for step in range(1000):", "step != 0", False),
        ("for step in range(1000):", "step % 100 == 0", False),  # periodic: many times
        ("for batch in loader:", "batch == 0", False),  # not a counter
        ("for step in range(1000):", "step == last", False),  # `last` changes in the loop
    ],
)
def test_a_test_of_a_growing_counter_against_a_steady_value_holds_once(head, test, expected):
    code = f"""\
        {head}
            train()
            if {test}:
                marked()
            last = step
        """
    assert once_test(code) is expected


def test_a_counter_the_loop_adds_to_grows_and_a_flag_bound_to_its_test_holds_once():
    code = """\
        step = start
        while True:
            train()
            first_step_of_run = (step == 0) or (resuming and step == resume_from_step)
            step += 1
            if first_step_of_run:
                marked()
        """
    assert once_test(code)
    assert not once_test(code.replace("step += 1", "step = step * 2"))
    assert not once_test(code.replace("step += 1\n", "step += 1\n            step -= 1\n"))
