"""The training program's loops: one model of where a training step runs.

A *step loop* is the loop that steps the optimizer: the innermost loop whose
body, with the functions of this file it calls (`train_step(batch)`,
`self.training_step(batch)`), runs a backward pass and steps an optimizer.
Backward may sit in the loop's own body, in an inner per-sample or micro-batch
loop (gradient accumulation: the step loop is the one around it), or in a
helper. Where a file steps no optimizer that the analysis can see, the
innermost loop that runs a backward pass stands in for it.

The *epoch loops* of a step loop are the loops around it: in its function,
and around the calls that (through other functions of this file) reach it.

Code in the step loop's body runs once per step; code in a function the body
calls runs where that call runs: `runs_in(node)` gives the step loops a node
runs in with the calls that lead there, so a rule can see an `if step % k:`
around a call to an evaluation helper.

A loop in a test that pytest collects (a `test*` function, or method of a `Test*` class, in
a `test_*.py` or `*_test.py` module, pytest's defaults) is no step loop: it trains a few
steps to check the numbers it pins, which a speed rewrite would change and nothing would
repay.

`step_loop_of(node)` stays lexical (the step loop whose body holds the node in
the same function): rules that move code within a loop need the loop the code
is written in.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator
from pathlib import PurePath
from typing import TYPE_CHECKING, NamedTuple

import libcst as cst

from codemod.analysis import match as m
from codemod.analysis.bindings import argument_for
from codemod.analysis.local_calls import local_calls
from codemod.analysis.names import is_main_guard, kwarg, method_name, plain_code, positional, sole_definition
from codemod.analysis.torch_facts import GRAD_SCALER_NAMES, PROCESS_STARTS

if TYPE_CHECKING:
    from codemod.analysis.index import TreeIndex
    from codemod.context import FileContext

# `loss.backward()`, `scaler.scale(loss).backward()`, `accelerator.backward(loss)`
BACKWARD = m.Call(func=m.Attribute(attr=m.Name("backward")))
SCOPES = (cst.FunctionDef, cst.Lambda, cst.ClassDef)
LOOPS = (cst.For, cst.While)
COMPREHENSIONS = (cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)
BACKWARD_EVENT, STEP_EVENT = "backward", "step"
MAX_DEPTH = 8  # how deep a chain of base classes is followed


class _OwnCode(cst.CSTVisitor):
    """Calls under a node that run when it runs: nested function, lambda and
    class bodies run elsewhere, so they are skipped."""

    def __init__(self) -> None:
        self.calls: list[cst.Call] = []

    def visit_Call(self, node: cst.Call) -> None:
        self.calls.append(node)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False


def calls_in(node: cst.CSTNode) -> list[cst.Call]:
    """Calls under `node` that run when it runs (not in nested def, lambda or class bodies).
    For code outside a FileContext; with one, use `TrainingLoops.own`."""
    walker = _OwnCode()
    node.visit(walker)
    return walker.calls


class StepSite(NamedTuple):
    """Where a node runs once per step: in `loop`, through `calls` (the call in the
    loop's body first, each later one in the function the previous one calls; empty
    when the node is in the loop's body itself)."""

    loop: cst.For | cst.While
    calls: tuple[cst.Call, ...] = ()


class TrainingLoops:
    """Step loops, epoch loops and the local calls between them, for one module;
    found once and shared by the rules and the training analysis."""

    def __init__(self, context: FileContext) -> None:
        self.context = context
        index = self._index = context.index
        self._parents = context.parents
        self._callees: dict[cst.Call, cst.FunctionDef | None] = {}
        self._all_callees: dict[cst.Call, tuple[cst.FunctionDef, ...]] = {}
        self._reach: dict[cst.CSTNode, frozenset[str]] = {}
        self._functions_reached: dict[cst.CSTNode, tuple[cst.FunctionDef, ...]] = {}
        self._call_sites: dict[cst.FunctionDef, list[cst.Call]] | None = None
        self._spawned: dict[cst.FunctionDef, list] | None = None
        self._runs: dict[cst.CSTNode, tuple[StepSite, ...]] = {}
        self._once: dict[cst.FunctionDef, bool] = {}
        self._outside: dict[cst.FunctionDef, bool] = {}
        self._codes: dict[cst.CSTNode, str] = {}
        self._step_of: dict[cst.Call, tuple[cst.BaseExpression, bool] | None] = {}
        self._stepped: dict[int, tuple[cst.BaseExpression, list[cst.Call]]] | None = None
        calls = index.find(cst.Call)
        self._zero_grad_receivers = {self.code(c.func.value) for c in calls if method_name(c) == "zero_grad"}
        self._scale_receivers = {self.code(c.func.value) for c in calls if method_name(c) == "scale" and c.args}
        self._function_names = {f.name.value for f in index.find(cst.FunctionDef)}
        loops = index.find(LOOPS)
        self._backward_loops = {loop for loop in loops if BACKWARD_EVENT in self.reach(loop.body)}
        both = [loop for loop in loops if {BACKWARD_EVENT, STEP_EVENT} <= self.reach(loop.body)]
        steps = [loop for loop in both if not any(inner in both for inner in self._loops_under(loop))]
        # Backward with no optimizer step in sight: the innermost backward loop stands in.
        for loop in loops:
            if loop not in self._backward_loops or loop in both:
                continue
            if any(inner in self._backward_loops for inner in self._loops_under(loop)):
                continue
            if any(self._index.inside(loop, step) for step in steps):
                continue  # a per-sample or micro-batch loop inside a step loop
            steps.append(loop)
        self._tests = self._pytest_tests()
        steps = [loop for loop in steps if not self.in_test(loop)]
        self.step_loops: list[cst.CSTNode] = sorted(steps, key=index.order)
        self._steps = set(self.step_loops)

    def in_test(self, node: cst.CSTNode) -> bool:
        """Is `node` in a test pytest collects (see the module's docstring)?"""
        return any(self._index.inside(node, test) for test in self._tests)

    def _pytest_tests(self) -> list[cst.FunctionDef]:
        """The tests pytest collects from this module with its default settings: `test*`
        functions of the module and `test*` methods of its `Test*` classes, where the
        module's file is named `test_*.py` or `*_test.py`."""
        name = PurePath(self.context.path).name
        if not (name.startswith("test_") or name.endswith("_test.py")) or not name.endswith(".py"):
            return []
        tests = []
        for statement in self.context.module.body:
            if isinstance(statement, cst.FunctionDef) and statement.name.value.startswith("test"):
                tests.append(statement)
            elif isinstance(statement, cst.ClassDef) and statement.name.value.startswith("Test"):
                tests += [
                    method
                    for method in statement.body.body
                    if isinstance(method, cst.FunctionDef) and method.name.value.startswith("test")
                ]
        return tests

    # -- code of this function -------------------------------------------------------

    def code(self, node: cst.CSTNode) -> str:
        text = self._codes.get(node)
        if text is None:
            text = plain_code(node)
            if text is None:
                text = self.context.module.code_for_node(node)
            self._codes[node] = text
        return text

    def own(self, types, node: cst.CSTNode) -> list:
        """Nodes of `types` under `node` that run when it runs: not those in nested
        function, lambda or class bodies."""
        return own_nodes(self._index, types, node)

    def own_calls(self, node: cst.CSTNode) -> list[cst.Call]:
        return self.own(cst.Call, node)

    # -- calls between functions of this file ---------------------------------------

    def callee(self, call: cst.Call) -> cst.FunctionDef | None:
        """The function of this file that `call` runs: `helper(...)` for a `def helper`
        that is the name's only binding, `receiver.method(...)` on an instance of a class
        of this file (`Kinds.instance_class`: `self`, a name or attribute that holds one,
        a parameter every call passes one) that defines the method or inherits it from
        its bases in this file; an instance of such a class called (`self("after_step")`:
        its `__call__`); the closure a function of this file returns (`step =
        make_step(model)`, `step(x)`: `Kinds.returned_closure`)."""
        if call in self._callees:
            return self._callees[call]
        found = None
        func = call.func
        name = (
            func.value if isinstance(func, cst.Name) else func.attr.value if isinstance(func, cst.Attribute) else None
        )
        if name in self._function_names:
            if isinstance(func, cst.Name):
                found = sole_definition(self.context.scopes, func, cst.FunctionDef)
            else:
                cls = self.context.kinds.instance_class(func.value)
                found = local_calls(self.context).method(cls, name) if cls is not None else None
        if found is None and "__call__" in self._function_names and isinstance(func, (cst.Name, cst.Attribute)):
            cls = self.context.kinds.instance_class(func)  # `self("after_step")`: its class's `__call__`
            found = local_calls(self.context).method(cls, "__call__") if cls is not None else None
        if found is None:
            found = self.context.kinds.returned_closure(func)
        self._callees[call] = found
        return found

    def callees(self, call: cst.Call) -> tuple[cst.FunctionDef, ...]:
        """The functions of this file `call` may run: its `callee` and the methods that callee
        looks up by a name this call gives it (`_dispatched`); or, for a method called on an
        instance of one of several classes of this file (`cb.on_step_end(...)` in a loop over
        a list of callbacks, `Kinds.instance_classes`), the method of each class that has one."""
        if call not in self._all_callees:
            self._all_callees[call] = self._find_callees(call)
        return self._all_callees[call]

    def _find_callees(self, call: cst.Call) -> tuple[cst.FunctionDef, ...]:
        one = self.callee(call)
        if one is not None:
            return (one, *self._dispatched(call, one))
        func = call.func
        if not (isinstance(func, cst.Attribute) and func.attr.value in self._function_names):
            return ()
        classes = self.context.kinds.instance_classes(func.value) or ()
        methods = (local_calls(self.context).method(cls, func.attr.value) for cls in classes)
        return tuple(dict.fromkeys(method for method in methods if method is not None))

    def _dispatched(self, call: cst.Call, function: cst.FunctionDef) -> tuple[cst.FunctionDef, ...]:
        """The methods `function` runs by name when `call` runs it: where it calls each of its
        callbacks' method named by one of its parameters (`getattr(cb, event)(...)`, `fn =
        getattr(cb, event, None)`), the method of that name, as `call` spells it in a string
        (`self.fire("on_step_end", ...)`), of each class its callbacks may be instances of;
        a lookup under an `if` (or in an `except` handler) of `function` is not followed."""
        found: dict[cst.FunctionDef, None] = {}
        kinds, offset = self.context.kinds, None
        for lookup in self.own_calls(function.body):
            if not (self.context.names.is_(lookup.func, "builtins.getattr") and len(lookup.args) >= 2):
                continue
            named = lookup.args[1].value
            bound = self.context.bindings.param_of(named) if isinstance(named, cst.Name) else None
            if bound is None or bound[0] is not function or self._index.conditions_within(lookup, function) != []:
                continue  # (a lookup under a test of `function` runs only when that holds: not claimed)
            offset = kinds.receiver_offset(call, function) if offset is None else offset
            event = argument_for(call, function, bound[1], offset)
            if not isinstance(event, cst.SimpleString):
                continue
            for cls in kinds.instance_classes(lookup.args[0].value) or ():
                method = local_calls(self.context).method(cls, event.evaluated_value)
                if method is not None:
                    found[method] = None
        return tuple(found)

    def runs(self, call: cst.Call) -> cst.FunctionDef | None:
        """The function of this file running `call` runs: its `callee`, or the function a
        `functools.partial` it calls wraps (`step = partial(train_step, model, opt)`); for
        what running it does, not for what the call passes its parameters."""
        return self.callee(call) or self.context.kinds.partial_callee(call)

    def returned(self, call: cst.Call, index: int | None = None) -> list[cst.BaseExpression] | None:
        """What a call of a function of this file returns: the expressions of its
        `return` statements (element `index` of each, for `a, b = f(...)`); None when
        the callee is not a function of this file or a return gives no such value."""
        function = self.callee(call)
        if function is None:
            return None
        values = [r.value for r in self.own(cst.Return, function.body)]
        if not values or any(v is None for v in values):
            return None
        if index is None:
            return values
        found = []
        for value in values:
            if (
                not isinstance(value, (cst.Tuple, cst.List))
                or index >= len(value.elements)
                or any(isinstance(e, cst.StarredElement) for e in value.elements)
            ):
                return None
            found.append(value.elements[index].value)
        return found

    def spawned_functions(self) -> tuple[cst.FunctionDef, ...]:
        """The functions of this file that a call runs in new processes (`mp.spawn(worker,
        ...)`, `Process(target=worker)`): each is where its processes start. The calls that
        start them do not reach them (`functions_reached`): they run elsewhere."""
        return tuple(self._process_starts())

    def gets_process_index(self, param: cst.Param) -> bool:
        """Is `param` the first parameter of a function of this file that only process starts
        passing the process index first run (`mp.spawn(main, args=(world_size,))` calls
        `main(i, world_size)` in process i, and the name `main` is used nowhere else): an
        int, the process's index?"""
        function = self._parents.get(self._parents.get(param))
        starts = self._process_starts().get(function) if isinstance(function, cst.FunctionDef) else None
        first = [*function.params.posonly_params, *function.params.params][:1] if starts else []
        if not first or first[0] is not param or not all(start.index_first for start, _ in starts):
            return False
        scope = self.context.scopes.get(function)
        bindings = list(scope.assignments[function.name.value]) if scope is not None else []
        handed = {id(arg.value) for _, arg in starts}
        return len(bindings) == 1 and all(id(use.node) in handed for use in bindings[0].references)

    def _process_starts(self) -> dict[cst.FunctionDef, list]:
        """The functions of this file that calls run in new processes, each with the
        (`ProcessStart`, argument) of those calls."""
        if self._spawned is None:
            found: dict[cst.FunctionDef, list] = {}
            names = self.context.names
            for call in self._index.find(cst.Call):
                start = next((PROCESS_STARTS[n] for n in names.of(call.func) if n in PROCESS_STARTS), None)
                if start is None:
                    continue
                arg = kwarg(call, start.keyword) or positional(call, start.position)
                if arg is not None and isinstance(arg.value, cst.Name):
                    function = sole_definition(self.context.scopes, arg.value, cst.FunctionDef)
                    if function is not None:
                        found.setdefault(function, []).append((start, arg))
            self._spawned = found
        return self._spawned

    def call_sites(self, function: cst.FunctionDef) -> list[cst.Call]:
        """The calls of this file that run `function`."""
        if self._call_sites is None:
            self._call_sites = {}
            for call in self._index.find(cst.Call):
                for target in self.callees(call):
                    self._call_sites.setdefault(target, []).append(call)
        return self._call_sites.get(function, [])

    def functions_reached(self, node: cst.CSTNode) -> tuple[cst.FunctionDef, ...]:
        """The functions of this file that running `node` may call, directly or not."""
        if node in self._functions_reached:
            return self._functions_reached[node]
        self._functions_reached[node] = ()  # recursion: what is found so far
        found: dict[cst.FunctionDef, None] = {}
        for call in self.own_calls(node):
            for function in self.callees(call) or _present(self.runs(call)):
                if function in found:
                    continue
                found[function] = None
                for inner in self.functions_reached(function.body):
                    found.setdefault(inner, None)
        result = tuple(found)
        self._functions_reached[node] = result
        return result

    def reached_calls(self, node: cst.CSTNode) -> list[cst.Call]:
        """Calls that running `node` makes: its own, and those of the functions it reaches."""
        calls = list(self.own_calls(node))
        for function in self.functions_reached(node):
            calls.extend(self.own_calls(function.body))
        return calls

    # -- backward and optimizer steps --------------------------------------------------

    def is_backward(self, call: cst.Call) -> bool:
        func = call.func
        if isinstance(func, cst.Attribute) and func.attr.value == "backward":
            return True  # `loss.backward()`, `accelerator.backward(loss)`, `torch.autograd.backward(...)`
        return (
            isinstance(func, cst.Name)
            and func.value == "backward"
            and self.context.names.is_(func, "torch.autograd.backward")
        )

    def step_of(self, call: cst.Call) -> tuple[cst.BaseExpression, bool] | None:
        """(optimizer, through a scaler) for `opt.step()` and `scaler.step(opt)`; None
        for other `.step(...)` calls (learning-rate schedulers, environments)."""
        if method_name(call) != "step":
            return None
        if call in self._step_of:
            return self._step_of[call]
        found = None
        receiver = call.func.value
        first = positional(call, 0)
        if first is not None and len(call.args) == 1 and self._is_scaler(receiver):
            found = first.value, True
        elif not call.args and self.is_optimizer(receiver):
            found = receiver, False
        self._step_of[call] = found
        return found

    def _is_scaler(self, receiver: cst.BaseExpression) -> bool:
        if self.code(receiver) in self._scale_receivers:
            return True
        return any(
            isinstance(v, cst.Call) and self.context.names.is_(v.func, *GRAD_SCALER_NAMES)
            for v in self.values_of(receiver)
        )

    def is_optimizer(self, expr: cst.BaseExpression) -> bool:
        """A torch optimizer, or anything with both `.zero_grad()` and `.step()`
        (learning-rate schedulers have no zero_grad, modules no step)."""
        from codemod.analysis.values import Kind  # kinds imports nothing of ours; lazily, to keep imports light

        values = self.values_of(expr)
        for value in list(values):  # `self.opt = self.configure_optimizers()`: what it returns
            if isinstance(value, cst.Call):
                values.extend(self.returned(value) or ())
        if any(
            isinstance(v, cst.Call) and self.context.names.startswith(v.func, ("torch.optim.lr_scheduler",))
            for v in values
        ):
            return False
        if self.code(expr) in self._zero_grad_receivers:
            return True
        if any(isinstance(v, cst.Call) and self.context.names.startswith(v.func, ("torch.optim",)) for v in values):
            return True
        return self.context.kinds.fact(expr).kind is Kind.OPTIMIZER

    def values_of(self, expr: cst.BaseExpression) -> list[cst.BaseExpression]:
        """What `expr` (a name, or `self.<attribute>` in a method) is assigned, as far as seen;
        for a parameter of a function of this file, what every call of it passes
        (`train(args, model, ...)` gives the caller's `model`), or its default."""
        if isinstance(expr, cst.Name):  # every binding of the name (`Bindings.values`)
            values = self.context.bindings.values(expr)
            if values is not None:
                return values
            found = self.context.bindings.param_of(expr)  # what every call passes (`Kinds.passed`)
            return (self.context.kinds.passed(found[1]) or []) if found is not None else []
        if isinstance(expr, cst.Attribute):
            return self.context.kinds.attribute_values(expr) or []
        return []

    def reach(self, node: cst.CSTNode) -> frozenset[str]:
        """Which of backward and an optimizer step running `node` may do, through the
        functions of this file it calls too."""
        if node in self._reach:
            return self._reach[node]
        self._reach[node] = frozenset()  # recursion: nothing more through this path
        events: set[str] = set()
        for call in self.own_calls(node):
            if self.is_backward(call):
                events.add(BACKWARD_EVENT)
            elif self.step_of(call) is not None:
                events.add(STEP_EVENT)
            function = self.runs(call)
            if function is not None:
                events |= self.reach(function.body)
        result = frozenset(events)
        self._reach[node] = result
        return result

    def _loops_under(self, loop: cst.CSTNode) -> Iterator[cst.CSTNode]:
        """Loops that run inside `loop`: in its body, and in the functions it calls."""
        yield from self.own(LOOPS, loop.body)
        for function in self.functions_reached(loop.body):
            yield from self.own(LOOPS, function.body)

    # -- where code runs ---------------------------------------------------------------

    def step_loop_of(self, node: cst.CSTNode) -> cst.CSTNode | None:
        """The step loop whose body contains `node` in the same function, if any."""
        current = self._parents.get(node)
        child = node
        while current is not None:
            if isinstance(current, SCOPES):
                return None
            if current in self._steps and child is current.body:
                return current
            child, current = current, self._parents.get(current)
        return None

    def is_training_loop(self, loop: cst.CSTNode) -> bool:
        """Does running the loop's body run a backward pass (a step loop, an epoch loop,
        a per-sample loop inside a step)?"""
        return loop in self._backward_loops

    def runs_in(self, node: cst.CSTNode) -> tuple[StepSite, ...]:
        """The step loops `node` runs in once per step (or once per micro-step, or
        under a condition along the way), with the calls that lead there."""
        function = self._index.first_enclosing(node, SCOPES)
        loop = self.step_loop_of(node)
        if loop is not None:
            return (StepSite(loop),)
        if not isinstance(function, cst.FunctionDef):
            return ()
        if function in self._runs:
            return self._runs[function]
        self._runs[function] = ()  # recursion
        sites: list[StepSite] = []
        for call in self.call_sites(function):
            for site in self.runs_in(call):
                if call not in site.calls:
                    sites.append(StepSite(site.loop, (*site.calls, call)))
        result = tuple(sites)
        self._runs[function] = result
        return result

    def guarded_from_import(self, node: cst.CSTNode) -> bool:
        """Does `node` run only when the file runs as a script, not when it is imported (as
        worker processes started by spawn import it): under `if __name__ == "__main__":`, or
        in a function of a module that has that guard? (A function the module calls outside
        the guard is taken as guarded: the usual `main()` call sits in the guard.)"""
        module_level = True
        for ancestor in self._index.ancestors(node):
            if isinstance(ancestor, cst.If) and is_main_guard(ancestor.test):
                return True
            if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef)):
                module_level = False
        return not module_level and any(
            isinstance(statement, cst.If) and is_main_guard(statement.test) for statement in self.context.module.body
        )

    def runs_once(self, node: cst.CSTNode) -> bool:
        """Does `node` run at most once in a run of the program: in no loop or comprehension,
        in module code or in a function of this file every caller of which (seen here, calling
        it by name, never passing it as a value) runs once itself?"""
        child = node
        for ancestor in self._index.ancestors(node):
            if isinstance(ancestor, cst.For) and child is not ancestor.iter:
                return False
            if isinstance(ancestor, (cst.While, cst.Lambda, cst.ClassDef, *COMPREHENSIONS)):
                return False
            if isinstance(ancestor, cst.FunctionDef):
                return self._function_runs_once(ancestor)
            child = ancestor
        return True

    def _function_runs_once(self, function: cst.FunctionDef) -> bool:
        if function not in self._once:
            self._once[function] = False  # a call of itself: more than once
            callers = self.context.kinds.callers(function)
            self._once[function] = len(callers or ()) == 1 and self.runs_once(callers[0][0])
        return self._once[function]

    def outside_steps(self, node: cst.CSTNode) -> bool:
        """Does `node` run only outside the step loops of a program that has some: in no step
        loop, in module code or in a function of this file every caller of which (seen here,
        calling it by name) runs outside them too (an evaluation after each epoch, or after
        training)? False where the file has no step loop, or a caller is not seen."""
        if not self.step_loops:
            return False
        for ancestor in self._index.ancestors(node):
            if ancestor in self._steps or isinstance(ancestor, (cst.Lambda, cst.ClassDef)):
                return False
            if isinstance(ancestor, cst.FunctionDef):
                return self._function_outside_steps(ancestor)
        return True

    def _function_outside_steps(self, function: cst.FunctionDef) -> bool:
        if function not in self._outside:
            self._outside[function] = False  # a call of itself: not shown outside
            callers = self.context.kinds.callers(function)
            self._outside[function] = bool(callers) and all(self.outside_steps(call) for call, _ in callers)
        return self._outside[function]

    def stepped_once(self, build: cst.Call) -> cst.Call | None:
        """The `.step()` of the optimizer `build` constructs, where the file steps it and every
        step of it runs at most once in a run of the program (`runs_once`: a tutorial's single
        step); None when one may run more often, or none is seen (stepped by other code)."""
        if self._stepped is None:  # every optimizer value -> the steps of it, in document order
            self._stepped = {}
            for call in self._index.find(cst.Call):
                step = self.step_of(call)
                if step is None:
                    continue
                for value in self.values_of(step[0]):
                    calls = self._stepped.setdefault(id(value), (value, []))[1]
                    if not calls or calls[-1] is not call:
                        calls.append(call)
        entry = self._stepped.get(id(build))
        found = entry[1] if entry is not None and entry[0] is build else []
        if not found or not all(self.runs_once(call) for call in found):
            return None
        return found[0]

    def epoch_loops(self, loop: cst.CSTNode) -> list[cst.CSTNode]:
        """The loops around a step loop, innermost first: in its function, then around
        the calls that lead to that function (through functions of this file)."""
        found: list[cst.CSTNode] = []
        seen: set[cst.CSTNode] = set()

        def around(node: cst.CSTNode, depth: int) -> None:
            for ancestor in self._index.ancestors(node):
                if isinstance(ancestor, SCOPES):
                    if isinstance(ancestor, cst.FunctionDef) and depth < MAX_DEPTH and ancestor not in seen:
                        seen.add(ancestor)
                        for call in self.call_sites(ancestor):
                            around(call, depth + 1)
                    return
                if isinstance(ancestor, LOOPS) and ancestor not in found:
                    found.append(ancestor)

        around(loop, 0)
        return found


def _present(function: cst.FunctionDef | None) -> tuple[cst.FunctionDef, ...]:
    return (function,) if function is not None else ()


def own_nodes(index: TreeIndex, types, node: cst.CSTNode) -> list:
    """Nodes of `types` under `node` that run when it runs: not those in nested
    function, lambda or class bodies."""
    found = index.find(types, within=node)
    if not found:
        return found
    nested = [n for n in index.find(SCOPES, within=node) if n is not node]
    if not nested:
        return found
    starts: list[int] = []
    ends: list[int] = []
    for scope in nested:  # document order: keep the outermost of nested ones
        start = index.order(scope)
        if ends and start <= ends[-1]:
            continue
        starts.append(start)
        ends.append(index.end(scope))
    kept = []
    for item in found:
        at = index.order(item)
        i = bisect_right(starts, at) - 1
        if i < 0 or at > ends[i]:
            kept.append(item)
    return kept
