from __future__ import annotations

import libcst as cst

from codemod.analysis.periodic import periodic
from codemod.analysis.torch_facts import MEMORY_CLEANUPS
from codemod.edits import Remove
from codemod.rule import Invalid, Level, Rule, Valid

COSTS = {
    "gc.collect()": "walks every tracked Python object",
    "torch.cuda.empty_cache()": (
        "hands the allocator's cached blocks back to the driver, so the next steps "
        "cudaMalloc them again (which synchronizes)"
    ),
}

# A period from which a clean-up costs nothing measurable: a full collection of a large
# script (half a second at worst) spread over 1000 steps is under a millisecond a step.
RARE_ENOUGH = 1000
PREAMBLE = """\
import gc
import torch
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = [(torch.randn(4, 8), torch.randn(4, 1)) for _ in range(3)]
"""
# PREAMBLE once the fix has removed the last use of gc: its import goes too.
WITHOUT_GC = PREAMBLE.replace("import gc\n", "")
STEP = (
    "    loss = torch.nn.functional.mse_loss(model(x), y)\n    loss.backward()\n    opt.step()\n    opt.zero_grad()\n"
)


class MemoryCleanupInStepLoop(Rule):
    """
    ## What it does
    Finds `gc.collect()` and `torch.cuda.empty_cache()` called on every step of
    a training loop and removes them.

    ## Why is this bad?
    Both are whole-process clean-ups that cost far more than a step's worth of
    work when run every step. `gc.collect()` runs a full collection of all
    three generations: it walks every object the collector tracks (the model's
    modules, every tensor wrapper, the dataset's Python objects), milliseconds
    to hundreds of milliseconds in a large script, while the GPU waits for the
    next kernels. `torch.cuda.empty_cache()` releases every unused block the
    caching allocator holds back to the driver; the next step then allocates
    them again with `cudaMalloc`, which is slow and synchronizes the device, so
    the CPU can no longer run ahead of the GPU. Neither frees memory that is
    still referenced, so neither lowers the peak memory of the step itself.
    Python's own collector runs when it needs to, and the caching allocator
    already frees its cache and retries before it reports out-of-memory.
    Typical gain: from a few percent to more than half of the step time in
    small-model loops.

    A clean-up in a function of the file that the step loop calls on every
    step (`free_memory()`) counts as in the step: it is removed there when
    every call of that function is such a call, and reported when the
    function also runs elsewhere. Calls in the epoch loop (outside the step
    loop) run once per epoch and are left alone, as are calls on one step
    of the run only (`if step == 0: gc.collect(); gc.freeze()`) and calls in an
    `except` handler (recovery after an out-of-memory error). Calls under a periodic
    condition (`if step % 100 == 0:`, also around the call of the function
    that cleans up) or another condition the rule cannot see through are
    reported without a fix: their author chose when they run. A period of
    1000 steps or more, as the script is written, is left alone: spread over
    that many steps, even a collection of half a second costs under a
    millisecond a step. Conditions that
    only ask whether CUDA is in use (`torch.cuda.is_available()`,
    `device.type == "cuda"`, a flag assigned from those) hold on every step
    on a GPU.

    ## Example
    ```python
    for x, y in loader:
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        gc.collect()
        torch.cuda.empty_cache()
    ```
    Use instead:
    ```python
    for x, y in loader:
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    ```

    ## Fix safety
    Safe: no value the script computes depends on when garbage is collected or
    on whether freed CUDA blocks stay cached, so losses and weights are the same
    bit for bit. What can change is timing and memory that other code observes:
    `__del__` methods and weakref callbacks of objects in reference cycles run
    later, and `nvidia-smi` (or another process sharing the GPU) sees the
    cached memory as still in use. The fix removes the statement (a block left
    empty gets `pass`; an `if` whose body it empties and that has an `else`
    becomes `if not ...:` over the `else` body), and removes a CUDA check
    around it (`if torch.cuda.is_available():`, `if device.type == "cuda":`)
    when that was all the block did. A call whose result is used is reported
    without a fix.
    """

    CODE = "PM403"
    NAME = "memory-cleanup-in-step-loop"
    LEVEL = Level.SAFE
    REQUIRES = ("collect", "empty_cache")
    MESSAGE = "gc.collect() / torch.cuda.empty_cache() on every training step; remove it"
    GAIN = "a few % to over half of step time in small-model loops; the GPU no longer waits on the host"

    VALID = [
        Valid(PREAMBLE + "gc.collect()\nfor x, y in data:\n" + STEP, "outside the loop"),
        Valid(
            PREAMBLE
            + "for epoch in range(2):\n    for x, y in data:\n"
            + STEP.replace("    ", "        ")
            + "    gc.collect()\n    torch.cuda.empty_cache()\n",
            "once per epoch",
        ),
        Valid(
            PREAMBLE
            + "for x, y in data:\n    try:\n"
            + STEP.replace("    ", "        ")
            + "    except torch.cuda.OutOfMemoryError:\n        torch.cuda.empty_cache()\n",
            "recovery after an out-of-memory error",
        ),
        Valid(PREAMBLE + "for x in range(3):\n    gc.collect()\n", "not a training loop"),
        Valid(
            PREAMBLE + "def cleanup():\n    gc.collect()\nfor x, y in data:\n" + STEP,
            "a function body is not the loop body",
        ),
        Valid(
            PREAMBLE
            + "class Cache:\n    def collect(self):\n        pass\ncache = Cache()\nfor x, y in data:\n"
            + STEP
            + "    cache.collect()\n",
            "not gc's collect",
        ),
        Valid(
            PREAMBLE
            + "LONG_RUN_EVERY = 5000\nfor step, (x, y) in enumerate(data):\n"
            + STEP
            + "    if step % LONG_RUN_EVERY == 0:\n        gc.collect()\n",
            "once every 5000 steps: spread over them, a collection costs nothing measurable",
        ),
    ]
    INVALID = [
        Invalid(
            PREAMBLE + "for x, y in data:\n" + STEP + "    gc.collect()\n    torch.cuda.empty_cache()\n",
            WITHOUT_GC + "for x, y in data:\n" + STEP,
        ),
        Invalid(
            PREAMBLE.replace(
                "import gc\n", "import gc as g\nfrom gc import collect\nfrom torch.cuda import empty_cache\n"
            )
            + "for x, y in data:\n    g.collect()\n"
            + STEP
            + "    collect(); empty_cache()\n",
            WITHOUT_GC + "for x, y in data:\n" + STEP,
            "aliases, and two calls on one line",
        ),
        Invalid(
            PREAMBLE + "for x, y in data:\n" + STEP + "    x = None; gc.collect()\n",
            WITHOUT_GC + "for x, y in data:\n" + STEP + "    x = None\n",
            "the last statement of a line",
        ),
        Invalid(
            PREAMBLE
            + "for x, y in data:\n"
            + STEP
            + "    if torch.cuda.is_available():\n        torch.cuda.empty_cache()\n",
            PREAMBLE + "for x, y in data:\n" + STEP,
            "the guard goes with the call",
        ),
        Invalid(
            PREAMBLE
            + "for x, y in data:\n"
            + STEP
            + "    if torch.cuda.is_available():\n        torch.cuda.empty_cache()\n"
            "    else:\n        gc.collect()\n",
            WITHOUT_GC + "for x, y in data:\n" + STEP,
            "both branches clean up",
        ),
        Invalid(
            PREAMBLE + "batches = iter(data)\nwhile True:\n    x, y = next(batches)\n" + STEP + "    gc.collect()\n",
            WITHOUT_GC + "batches = iter(data)\nwhile True:\n    x, y = next(batches)\n" + STEP,
            "a while loop",
        ),
        Invalid(
            PREAMBLE + "for x, y in data:\n    for half in (x[:2], x[2:]):\n"
            "        torch.nn.functional.mse_loss(model(half), y[:2]).backward()\n        torch.cuda.empty_cache()\n"
            "    opt.step()\n    opt.zero_grad()\n",
            PREAMBLE + "for x, y in data:\n    for half in (x[:2], x[2:]):\n"
            "        torch.nn.functional.mse_loss(model(half), y[:2]).backward()\n"
            "    opt.step()\n    opt.zero_grad()\n",
            "every micro-step of gradient accumulation",
        ),
        Invalid(
            PREAMBLE + "for x, y in data:\n" + STEP + "    with torch.no_grad():\n        gc.collect()\n",
            WITHOUT_GC + "for x, y in data:\n" + STEP + "    with torch.no_grad():\n        pass\n",
            "a block left empty gets pass",
        ),
        Invalid(
            PREAMBLE
            + "for step, (x, y) in enumerate(data):\n"
            + STEP
            + "    if step % 100 == 0:\n        gc.collect()\n",
            None,
            "periodic: the author chose when",
        ),
        Invalid(
            PREAMBLE + "low_memory = True\nfor x, y in data:\n" + STEP + "    if low_memory:\n        gc.collect()\n",
            None,
            "a condition the rule cannot see through",
        ),
        Invalid(PREAMBLE + "for x, y in data:\n" + STEP + "    freed = gc.collect()\n", None, "result used"),
    ]

    def __init__(self, context) -> None:
        super().__init__(context)
        # Any spelling of these calls (an alias too) names them in its import; without
        # that, skip resolving the qualified name of every call.
        code = context.code
        self.enabled = "collect" in code or "empty_cache" in code

    def visit_Call(self, node: cst.Call) -> None:
        if not self.enabled:
            return
        names = self.context.names.of(node.func) & MEMORY_CLEANUPS.keys()
        if not names:
            return
        spelled = MEMORY_CLEANUPS[min(names)]
        step_loop = self.context.loops.step_loop_of(node)
        if step_loop is not None:
            conditions = self.context.index.conditions_within(node, step_loop)
            through, held = "", [node]  # held: what the conditions hold (or hold a call of)
        else:
            reached = self._reached_through_calls(node, spelled)
            if reached is None:
                return
            conditions, through, held = reached
        if conditions is None:
            return  # clean-up after an error, not on every step
        if self._chosen_when(node, spelled, conditions, through, held, step_loop):
            return
        self._remove(node, spelled, through)

    def _reached_through_calls(
        self, node: cst.Call, spelled: str
    ) -> tuple[list[cst.If], str, list[cst.CSTNode]] | None:
        """For a clean-up in a function of this file that the step loop calls (where it runs
        is where its calls run): the conditions on the way from the loop, how the message
        names that way, and the clean-up with the calls on it. None where no step loop
        calls it, where a call is in an `except` handler, or after reporting a function
        also called outside the training loop."""
        steps = self.context.loops
        sites = steps.runs_in(node)
        function = self.context.index.first_enclosing(node, (cst.FunctionDef, cst.Lambda, cst.ClassDef))
        if not sites or not isinstance(function, cst.FunctionDef):
            return None
        conditions = self.context.index.conditions_within(node, function)
        if conditions is None:
            return None  # in an `except` handler of the function: clean-up after an error
        for site in sites:
            for number, call in enumerate(site.calls):
                stop = site.loop if number == 0 else self.context.index.first_enclosing(call, cst.FunctionDef)
                found = self.context.index.conditions_within(call, stop)
                if found is None:
                    return None  # called from an `except` handler
                conditions += found
        first = sites[0].calls[0]
        through = f" (through `{self.context.source(first.func)}` at line {self.context.line(first)})"
        callers = {call for site in sites for call in site.calls}
        if not set(steps.call_sites(function)) <= callers:
            self.report(
                node,
                f"{spelled} runs on every training step{through} and {COSTS[spelled]}; left in place "
                f"because `{function.name.value}` is also called outside the training loop",
            )
            return None
        return conditions, through, [node, *callers]

    def _chosen_when(
        self,
        node: cst.Call,
        spelled: str,
        conditions: list[cst.If],
        through: str,
        held: list[cst.CSTNode],
        step_loop: cst.CSTNode | None,
    ) -> bool:
        """Does a condition decide when the clean-up runs (once in the run, a period, or a
        test other than "is CUDA in use")? Reports the last two."""
        guards = [c for c in conditions if any(self.context.inside(h, c.body) for h in held)]  # not their `else`
        if any(periodic(self.context).once(c.test, step_loop) for c in guards):
            return True  # once in the run (`if step == 0:` before `gc.freeze()`), as at the end of an epoch
        # In a function the loop calls, the counter is a parameter: any counter will do.
        period = next((p for c in guards if (p := periodic(self.context).period(c.test, step_loop)) is not None), None)
        steps = [n for c in guards if (n := periodic(self.context).period_number(c.test, step_loop)) is not None]
        if steps and max(steps) >= RARE_ENOUGH:
            return True  # its cost spread over that many steps is nothing measurable
        if period is not None:
            every = "every few steps" if through else f"every `{self.context.source(period)}` steps"
            self.report(
                node,
                f"{spelled} runs {every} in the training loop{through} and {COSTS[spelled]}; "
                "left in place because its period was chosen: make it rarer or move it to the end of the epoch",
            )
            return True
        opaque = [c for c in conditions if not self._is_cuda_check(c.test)]
        if opaque:
            condition = self.context.source(opaque[0].test)
            self.report(
                node,
                f"{spelled} in the training step loop{through} runs on every step where `{condition}` holds "
                f"and {COSTS[spelled]}; remove it if that is every step",
            )
            return True
        return False

    def _remove(self, node: cst.Call, spelled: str, through: str) -> None:
        """Remove the clean-up that runs on every step, with an `if` around it that only
        cleans up; a clean-up whose result is used is reported."""
        statement = self.context.index.expression_statement(node)
        message = f"{spelled} on every training step{through} {COSTS[spelled]}; remove it"
        if statement is None:
            self.report(
                node,
                f"{spelled} in the training step loop{through} {COSTS[spelled]}; its result is used, so it is not removed",
            )
            return
        own = self.context.index.conditions_within(
            node, self.context.index.first_enclosing(node, (cst.FunctionDef, cst.For, cst.While)) or node
        )
        guard = own[0] if own else None
        if guard is not None and self._only_cleans_up(guard):
            self.report(guard, message, edits=[Remove(guard)], at=node)
            return
        self.report(statement, message, edits=[Remove(statement)], at=node)

    def _only_cleans_up(self, guard: cst.If) -> bool:
        """`if torch.cuda.is_available():` whose branches (one, or `else` too) only clean up."""
        branches = [guard.body]
        if isinstance(guard.orelse, cst.Else):
            branches.append(guard.orelse.body)
        elif guard.orelse is not None:
            return False  # an `elif` tests something else
        return all(self._is_cleanup(s) for branch in branches for s in _statements(branch))

    def _is_cuda_check(self, test: cst.BaseExpression, depth: int = 0) -> bool:
        """A test that only asks whether CUDA is in use: `torch.cuda.is_available()`,
        `device.type == "cuda"`, `x.is_cuda`, `a and b` of those, or a flag assigned
        only such tests (`args.cuda = not args.no_cuda and torch.cuda.is_available()`)."""
        if depth > 4:
            return False
        if isinstance(test, cst.Call):
            if self.context.names.is_(test.func, "torch.cuda.is_available"):
                return True
            func = test.func
            return (
                isinstance(func, cst.Attribute)
                and func.attr.value == "startswith"
                and _is_cuda_string(positional_value(test))
            )
        if (
            isinstance(test, cst.Comparison)
            and len(test.comparisons) == 1
            and isinstance(test.comparisons[0].operator, cst.Equal)
        ):
            return _is_cuda_string(test.left) or _is_cuda_string(test.comparisons[0].comparator)
        if isinstance(test, cst.Attribute) and test.attr.value == "is_cuda":
            return True
        if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
            return self._is_cuda_check(test.left, depth + 1) or self._is_cuda_check(test.right, depth + 1)
        if isinstance(test, (cst.Name, cst.Attribute)):
            values = self._flag_values(test)
            return bool(values) and all(self._is_cuda_check(v, depth + 1) for v in values)
        return False

    def _flag_values(self, expr: cst.BaseExpression) -> list[cst.BaseExpression]:
        """The values assigned to a flag: a name's bindings, or every `x.attr = ...` of
        the file for an attribute such as `args.cuda`."""
        values = self.context.loops.values_of(expr)
        if values or not isinstance(expr, cst.Attribute):
            return values
        return self.context.bindings.attribute_assignments(expr)

    def _is_cleanup(self, statement: cst.BaseSmallStatement) -> bool:
        return (
            isinstance(statement, cst.Expr)
            and isinstance(statement.value, cst.Call)
            and bool(self.context.names.of(statement.value.func) & MEMORY_CLEANUPS.keys())
        )


def _is_cuda_string(expr: cst.BaseExpression | None) -> bool:
    return isinstance(expr, cst.SimpleString) and str(expr.evaluated_value).startswith("cuda")


def positional_value(call: cst.Call) -> cst.BaseExpression | None:
    return call.args[0].value if call.args and call.args[0].keyword is None else None


def _statements(block: cst.BaseSuite) -> list[cst.CSTNode]:
    """The small statements of a block, or the compound statements it holds as they are."""
    found: list[cst.CSTNode] = []
    lines = block.body if isinstance(block, cst.IndentedBlock) else [block]
    for line in lines:
        if isinstance(line, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
            found.extend(line.body)
        else:
            found.append(line)
    return found
