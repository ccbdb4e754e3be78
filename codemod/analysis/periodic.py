"""Which tests make code in a loop run only on some of its iterations.

Training loops log, evaluate, sample and step accumulated gradients every few
steps, under a test on the step counter:

    if step % 100 == 0:                          # also `not step % 100`, `== every - 1`
    if (i + 1) % accum_steps == 0:               # also `!= 0` (`continue` the others)
    if step > 0 and step % eval_every == 0:      # and-ed with anything
    if step % 250 == 0 or last_step:             # or-ed with a rare flag
    if divisible_by(i, validate_every):          # a helper returning such a test
    if should_log:                               # a name the loop binds to such a test

- `period(test, loop)`: the `N` of such a test (the right operand of its `%`, in
  the caller's terms when a helper computes it), or None when `test` holds on
  every iteration as far as the code shows;
- `is_periodic(test, loop)`: `period(test, loop) is not None`;
- `period_number(test, loop)`: that `N` as a number, where the script as written tells it;
- `once(test, loop)`: `test` holds on one iteration of `loop` at most (or a few): a
  counter that only grows (the index of `range` / `enumerate`, a name the loop only
  adds a positive number to) equal to a value the loop does not change (`step == 0`,
  `i == warmup`), and-ed with anything, or-ed with another such test, or a name the
  loop binds to one (`first_step = step == 0 or step == resume_step`);
- `guard(node, loop)`: the outermost `if` between `node` and `loop` (not beyond a
  `def`) whose body holds `node` and whose test is periodic: `node` runs only on
  some iterations of `loop`;
- `last_pass(node, loop)`: the `raise` (or `sys.exit()`, or `assert`) that ends
  `loop` for good after `node`: `node` is in a block that ends by raising or by ending
  the program, uncaught before the loop (`if not torch.isfinite(loss): raise
  RuntimeError(f"{loss.item()}")`), so it runs on one iteration at most;
- `sometimes(node)`: the periodic `if` that every way the program reaches `node`
  passes through: `node` is under one in its own function (periodic in the loop
  around that `if`), or is in a function of this file that is called (once at
  least), and every one of its calls is: an evaluation every `N` steps, a sample
  or a save made when a step counter says. None when some way reaches `node`
  on every iteration as far as the code shows (or the function is not called
  here, or is passed as a value and called where the code does not show).

The counter is a name the loop binds (its target, `step += 1`, ...) or an
attribute (`self.step`, `state.global_step`); a name the loop never binds
(`epoch` in a loop over batches) takes the same value on every iteration, so a
test on it holds on all of them or on none. A helper is a function of this file
or of a project module whose body returns such a test of its parameters
(`return (num % den) == 0`). A `%` whose left is a string formats text
(`"%d" % step`): no period.

Built once per file (FileContext.shared).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from codemod.analysis.local_calls import local_calls
from codemod.analysis.names import names_read, number_value
from codemod.analysis.node_types import type_test
from codemod.analysis.project import project_of
from codemod.analysis.torch_facts import PROGRAM_EXITS
from codemod.analysis.values import values

if TYPE_CHECKING:
    from codemod.context import FileContext

KEY = "periodic"
SCOPES = (cst.FunctionDef, cst.Lambda, cst.ClassDef)
_is_scope, _is_if = type_test(*SCOPES), type_test(cst.If)  # (asked of every ancestor: node_types says why)
TEXT = (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString)
MAX_DEPTH = 4


def periodic(context: FileContext) -> Periodic:
    return context.shared(KEY, Periodic)


class Periodic:
    def __init__(self, context: FileContext) -> None:
        self.context = context
        self.index = context.index
        self._bound: dict[int, set[str]] = {}
        self._sometimes: dict[int, cst.If | None] = {}

    def is_periodic(self, test: cst.BaseExpression, loop: cst.CSTNode | None = None) -> bool:
        return self.period(test, loop) is not None

    def once(self, test: cst.BaseExpression, loop: cst.CSTNode, depth: int = 0) -> bool:
        """Does `test` hold on one iteration of `loop` at most (see the module's docstring)?"""
        if depth > MAX_DEPTH:
            return False
        if isinstance(test, cst.BooleanOperation):
            sides = (self.once(test.left, loop, depth + 1), self.once(test.right, loop, depth + 1))
            return any(sides) if isinstance(test.operator, cst.And) else all(sides)
        if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
            comparison = test.comparisons[0]
            if not isinstance(comparison.operator, cst.Equal):
                return False
            return any(
                self._grows(side, loop) and self._steady(other, loop)
                for side, other in ((test.left, comparison.comparator), (comparison.comparator, test.left))
            )
        if isinstance(test, cst.Name):
            values = self.context.bindings.values(test)
            inside = [v for v in values or () if self.index.inside(v, loop)]
            return bool(inside) and len(inside) == len(values) and all(self.once(v, loop, depth + 1) for v in values)
        return False

    def _grows(self, expr: cst.BaseExpression, loop: cst.CSTNode) -> bool:
        """A name that every binding in `loop` makes larger: the loop's own index of
        `range(...)` / `enumerate(...)`, or `name += N` with a positive number N."""
        if not isinstance(expr, cst.Name):
            return False
        bindings = self.context.kinds.bindings_in(loop, expr.value)
        if not bindings:
            return False
        for binding in bindings:
            statement = self.context.bindings.statement(binding.node)
            if statement is loop and isinstance(loop, cst.For):
                if not values(self.context).loop_index(loop, binding.node):
                    return False
            elif not (
                isinstance(statement, cst.AugAssign)
                and isinstance(statement.operator, cst.AddAssign)
                and (number_value(statement.value) or 0) > 0
            ):
                return False
        return True

    def guard(self, node: cst.CSTNode, loop: cst.CSTNode | None) -> cst.If | None:
        """The outermost `if` inside `loop` whose body holds `node` and whose test is periodic."""
        found = None
        child = node
        for ancestor in self.index.ancestors(node):
            if ancestor is loop or _is_scope(ancestor):
                break
            if _is_if(ancestor) and child is ancestor.body and self.is_periodic(ancestor.test, loop):
                found = ancestor
            child = ancestor
        return found

    def last_pass(self, node: cst.CSTNode, loop: cst.CSTNode) -> cst.CSTNode | None:
        """The statement that ends `loop` for good after `node`, when `node` is in a block
        of the loop that ends by raising or by ending the program (`sys.exit()`), or in
        the message of an `assert`: such code runs on one iteration at most (the one that
        fails), never on every one. None when no such block holds it, or when a `try`
        between it and the loop may catch what it raises."""
        found = None
        child = node
        for ancestor in self.index.ancestors(node):
            if ancestor is loop:
                return found
            if isinstance(ancestor, SCOPES) or isinstance(ancestor, cst.Try) and ancestor.handlers:
                return None
            if isinstance(ancestor, cst.TryStar):
                return None
            if found is None and isinstance(ancestor, cst.Assert) and child is ancestor.msg:
                found = ancestor
            if found is None and isinstance(ancestor, (cst.IndentedBlock, cst.SimpleStatementSuite)):
                found = self._ending(ancestor.body[-1] if ancestor.body else None)
            child = ancestor
        return None

    def _ending(self, statement: cst.CSTNode | None) -> cst.CSTNode | None:
        """`statement` when it raises or ends the program, else None."""
        if not isinstance(statement, cst.SimpleStatementLine) or not statement.body:
            return None
        last = statement.body[-1]
        if isinstance(last, cst.Raise):
            return last
        if isinstance(last, cst.Expr) and isinstance(last.value, cst.Call):
            return last if self.context.names.is_(last.value.func, *PROGRAM_EXITS) else None
        return None

    def sometimes(self, node: cst.CSTNode) -> cst.If | None:
        """The periodic `if` every way to `node` passes through (see the module's docstring)."""
        key = id(node)
        if key not in self._sometimes:
            self._sometimes[key] = None  # a function that calls itself: not shown periodic
            self._sometimes[key] = self._sometimes_of(node)
        return self._sometimes[key]

    def _sometimes_of(self, node: cst.CSTNode) -> cst.If | None:
        child = node
        for ancestor in self.index.ancestors(node):
            if isinstance(ancestor, SCOPES):
                break
            if isinstance(ancestor, cst.If) and child is ancestor.body:
                loops = self.index.enclosing_loops(ancestor)
                if self.is_periodic(ancestor.test, loops[0] if loops else None):
                    return ancestor
            child = ancestor
        function = self.index.first_enclosing(node, SCOPES)
        if not isinstance(function, cst.FunctionDef):
            return None
        callers = self.context.kinds.callers(function)  # None where it is also passed as a value
        guards = [self.sometimes(call) for call, _ in callers or ()]
        return guards[0] if guards and all(guard is not None for guard in guards) else None

    def period(self, test: cst.BaseExpression, loop: cst.CSTNode | None = None) -> cst.BaseExpression | None:
        """`N` of `step % N == 0` (and the other spellings above), or None."""
        return self._period(test, loop, None, self.context, 0)

    # -- the test ------------------------------------------------------------------------

    def period_number(self, test: cst.BaseExpression, loop: cst.CSTNode | None = None) -> int | None:
        """The `N` of a periodic test as a number, where the script as written tells it: a
        literal, a name bound to one, an option's default, a config's field
        (`Loaders.setting`); None otherwise."""
        period = self.period(test, loop)
        if period is None:
            return None
        value = number_value(self.context.loaders.setting(period, 0))
        return value if isinstance(value, int) else None

    def _period(self, test, loop, params: dict | None, context: FileContext, depth: int) -> cst.BaseExpression | None:
        if depth > MAX_DEPTH:
            return None
        if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            return self._modulus(test.expression, loop, params)
        if isinstance(test, cst.BooleanOperation):
            # `a and b` holds only where both do; `a or last_step` is taken for a rare extra step.
            left = self._period(test.left, loop, params, context, depth + 1)
            return left if left is not None else self._period(test.right, loop, params, context, depth + 1)
        if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
            comparison = test.comparisons[0]
            if isinstance(comparison.operator, (cst.Equal, cst.NotEqual)):
                for side, other in ((test.left, comparison.comparator), (comparison.comparator, test.left)):
                    if self._steady(other, loop):
                        found = self._modulus(side, loop, params)
                        if found is not None:
                            return found
            return None
        if isinstance(test, cst.BinaryOperation):
            return self._modulus(test, loop, params)  # `if step % N:` every step but one in N
        if isinstance(test, cst.Call) and depth < MAX_DEPTH:
            return self._helper(test, loop, params, context, depth)
        if isinstance(test, cst.Name) and params is None and loop is not None:
            return self._flag(test, loop, depth)
        return None

    def _flag(self, name: cst.Name, loop, depth: int) -> cst.BaseExpression | None:
        """`should_log` bound in the loop, every binding to a periodic test."""
        values = self.context.bindings.values(name)
        if not values or not all(self.index.inside(v, loop) for v in values):
            return None
        found = [self._period(v, loop, None, self.context, depth + 1) for v in values]
        return found[0] if all(f is not None for f in found) else None

    def _modulus(self, expr, loop, params: dict | None) -> cst.BaseExpression | None:
        """`N` of `counter % N` (parentheses, `counter + 1`) on a counter of `loop`."""
        if not (isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Modulo)):
            return None
        if isinstance(expr.left, TEXT):
            return None
        if not self._counts(expr.left, loop, params):
            return None
        right = expr.right
        if isinstance(right, cst.Name) and params is not None and right.value in params:
            return params[right.value]
        return right

    def _counts(self, expr, loop, params: dict | None) -> bool:
        """Does `expr` change from one iteration of `loop` to the next (a counter)?"""
        while isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, (cst.Add, cst.Subtract)):
            if _is_constant(expr.right):
                expr = expr.left
            elif _is_constant(expr.left):
                expr = expr.right
            else:
                break
        if isinstance(expr, cst.Name) and params is not None:
            argument = params.get(expr.value)  # in a helper: what the caller passed
            return argument is not None and self._counts(argument, loop, None)
        if isinstance(expr, (cst.Attribute, cst.Subscript)):
            return True  # `self.step`, `state["step"]`: the code may count anywhere
        if isinstance(expr, cst.Name):
            return loop is None or expr.value in self._bound_in(loop)
        return isinstance(expr, cst.BinaryOperation)  # `epoch * n + i`

    def _steady(self, expr, loop) -> bool:
        """Is `expr` the same on every iteration of `loop` (`0`, `log_every - 1`)?"""
        if loop is None:
            return True
        return not any(name.value in self._bound_in(loop) for name in names_read(expr))

    def _bound_in(self, loop: cst.CSTNode) -> set[str]:
        found = self._bound.get(id(loop))
        if found is None:
            found = self._bound[id(loop)] = self.context.bound_in(loop)
        return found

    # -- helpers -------------------------------------------------------------------------

    def _helper(self, call: cst.Call, loop, params: dict | None, context: FileContext, depth: int):
        """`divisible_by(i, every)` whose function returns `(num % den) == 0`."""
        if any(arg.star or arg.keyword is not None for arg in call.args):
            return None
        function, context_of = None, context
        if context is self.context:
            function = local_calls(context).callee(call)
            if function is None:
                found = project_of(context).function(call.func)
                if found is not None:
                    function, context_of = found.node, found.context
        if not isinstance(function, cst.FunctionDef):
            return None
        returned = _sole_return(function)
        if returned is None:
            return None
        names = [p.name.value for p in function.params.params]
        if len(call.args) > len(names) or function.params.star_arg is not cst.MaybeSentinel.DEFAULT:
            return None
        bound = {name: None for name in names}
        for name, arg in zip(names, call.args, strict=False):
            value = arg.value
            if isinstance(value, cst.Name) and params is not None and value.value in params:
                value = params[value.value]
            bound[name] = value
        return self._period(returned, loop, bound, context_of, depth + 1)


def _is_constant(expr: cst.BaseExpression) -> bool:
    return isinstance(expr, cst.Integer)


def _sole_return(function: cst.FunctionDef) -> cst.BaseExpression | None:
    """The value of a function whose body is one `return <value>` (after a docstring)."""
    body = function.body
    lines = list(body.body) if isinstance(body, cst.IndentedBlock) else [body]
    smalls = []
    for line in lines:
        if not isinstance(line, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
            return None
        smalls.extend(line.body)
    if smalls and isinstance(smalls[0], cst.Expr) and isinstance(smalls[0].value, cst.SimpleString):
        smalls = smalls[1:]
    if len(smalls) == 1 and isinstance(smalls[0], cst.Return) and smalls[0].value is not None:
        return smalls[0].value
    return None
