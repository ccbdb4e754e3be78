"""PM601's fix producer for the process group: `ProcessGroupSetup`."""

from __future__ import annotations

import libcst as cst

from codemod.analysis import distributed as facts
from codemod.analysis.model_sites import model_sites
from codemod.edits import Edit, InsertAfter, InsertBefore, Replace
from codemod.rules.single_process_training.plan import (
    IMPORT_ATEXIT,
    Blocked,
    Producer,
    Setup,
    code_of,
    make_call,
    parse_expr,
    parse_line,
)


class ProcessGroupSetup(Producer):
    """`distributed.setup(...)` where the device is chosen, the `world` variable, and the clean
    shutdown."""

    def _needs(self) -> list[tuple[cst.CSTNode, str]]:
        """Code that needs the process group (or the `world` variable), with what it does."""
        needs = [(self.plan.origin.anchor, "the model is wrapped in DistributedDataParallel")]
        if self.plan.loader is not None:
            needs.append((self.plan.loader.statement, "the DistributedSampler is built"))
        loop = self.plan.loop.loop
        needs.append(([loop, *self.plan.enclosing_loops(loop)][-1], "training starts"))
        return needs

    def site(self) -> Setup:
        """Where the device is chosen: that value becomes `distributed.setup(value)`; where it
        is chosen too late (after the loader or the model), or nowhere, `distributed.setup(...)`
        goes before the first statement that needs it."""
        origin = self.plan.origin
        sites = model_sites(self.context)
        device = sites.moved_to(origin)
        needs = self._needs()
        device = sites.chosen_device(device)
        if device is not None and isinstance(device, (cst.Name, cst.Attribute)):
            statement, value = sites.device_assignment(device)
            if statement is not None:
                zeros = sites.fixed_gpu(value, chosen=True)
                setup = Setup(statement, facts.function_of(self.context, statement), value, None)
                if all(self._after_setup(node, setup) for node, _ in needs):
                    self.plan.cuda_for_zero = value in zeros  # `device = 0`: the value itself
                    self.edits.extend(Replace(zero, parse_expr('"cuda"')) for zero in zeros if zero is not value)
                    return setup
                sites.fixed_gpu(value)
                device = value  # chosen too late: setup() goes earlier, with the same value
        first = origin.setup[0]
        if (
            self.plan.loader is not None
            and facts.function_of(self.context, self.plan.loader.statement) is facts.function_of(self.context, first)
            and self.index.before(self.plan.loader.statement, first)
            and self.index.inside(first, self.parents.get(self.plan.loader.statement))
        ):
            first = self.plan.loader.statement
        if device is None:
            device = parse_expr('"cpu"')
        if not self.plan.visible(device, first):
            raise Blocked(
                first,
                f"the device (`{self.plan.src(device)}`) is chosen after the code that needs the process "
                "group; choose it before the DataLoader and the model are built",
            )
        setup = Setup(first, facts.function_of(self.context, first), None, device)
        for node, what in needs:
            if not self._after_setup(node, setup):
                raise Blocked(
                    node,
                    f"{what} at line {self.context.line(node)}, in code that may run before the "
                    f"device is chosen (line {self.context.line(first)}); PM601 puts "
                    "distributed.setup() where the device is chosen",
                )
        return setup

    def _after_setup(self, node: cst.CSTNode, setup: Setup) -> bool:
        """Does `node` run after setup() (in its function, below it; in another function,
        one called from there after it, or a method of the object `__init__` set up)?"""
        function = facts.function_of(self.context, node)
        if function is setup.function:
            return self.plan.follows_setup(node, setup)
        if setup.function is None:
            return True  # a function of the module, called after its top-level code ran
        seen: set[int] = set()
        init_class = facts.class_of(self.context, setup.function) if setup.function.name.value == "__init__" else None
        while function is not None and id(function) not in seen:
            seen.add(id(function))
            if init_class is not None and facts.class_of(self.context, function) is init_class:
                return True
            calls = self.plan.calls_of(function)
            if len(calls) != 1:
                return False
            caller = facts.function_of(self.context, calls[0])
            if caller is setup.function:
                return self.plan.follows_setup(calls[0], setup)
            function = caller
        return False

    def write(self, hook: cst.BaseStatement | None) -> None:
        """setup() and the `world` variable first among the edits (statements inserted at the
        same place go in the order of their edits), with the atexit hook when there is one."""
        setup = self.plan.setup
        lines: list[cst.BaseStatement] = []
        edits: list[Edit] = []
        if setup.value is not None:
            chosen = parse_expr('"cuda"') if self.plan.cuda_for_zero else None
            edits.append(Replace(setup.value, lambda value: make_call("distributed.setup", chosen or value)))
        else:
            lines.append(cst.SimpleStatementLine([cst.Expr(make_call("distributed.setup", setup.device))]))
        if self.plan.world_uses:
            lines.append(parse_line(f"{self.plan.world_name} = distributed.world()\n"))
        if hook is not None:
            lines.append(hook)
        if lines:
            edits.append(
                InsertBefore(setup.statement, tuple(lines))
                if setup.value is None
                else InsertAfter(setup.statement, tuple(lines))
            )
        self.edits[:0] = edits

    def cleanup(self) -> cst.BaseStatement | None:
        """`try: main() finally: distributed.cleanup()` around the call that runs the
        function holding setup(); at module level, an atexit hook to put after setup()
        (returned)."""
        statement = None
        if self.plan.setup_scope is not None:
            outer: cst.CSTNode = self.plan.setup_scope
            while True:
                enclosing = self.index.first_enclosing(outer, (cst.FunctionDef, cst.ClassDef))
                if enclosing is None:
                    break
                outer = enclosing
            statement = self._entry_statement(outer)
        if statement is not None:
            finally_ = cst.Finally(cst.IndentedBlock([parse_line("distributed.cleanup()\n")]))

            def protected(updated: cst.SimpleStatementLine) -> cst.Try:
                return cst.Try(
                    cst.IndentedBlock([updated.with_changes(leading_lines=[])]),
                    finalbody=finally_,
                    leading_lines=updated.leading_lines,
                )

            self.edits.append(Replace(statement, protected))
            return None
        self.imports.append(IMPORT_ATEXIT)
        return parse_line("atexit.register(distributed.cleanup)\n")

    def _entry_statement(self, outer: cst.FunctionDef | cst.ClassDef) -> cst.SimpleStatementLine | None:
        """The one module-level statement (or one under `if __name__ == "__main__":`) that
        calls `outer` (a function, or a class whose object it makes)."""
        name = outer.name.value
        found = []
        for call in self.index.find(cst.Call):
            func = call.func
            while isinstance(func, (cst.Attribute, cst.Call)):
                func = func.value if isinstance(func, cst.Attribute) else func.func
            if not (isinstance(func, cst.Name) and func.value == name) or facts.function_of(self.context, call):
                continue
            statement = self.index.statement_of(call)
            block = self.parents.get(statement)
            holder = self.parents.get(block)
            if (
                isinstance(statement, cst.SimpleStatementLine)
                and len(statement.body) == 1
                and isinstance(statement.body[0], cst.Expr)
                and (
                    isinstance(block, cst.Module) or (isinstance(holder, cst.If) and "__name__" in code_of(holder.test))
                )
            ):
                if statement not in found:
                    found.append(statement)
                continue
            return None
        return found[0] if len(found) == 1 else None
