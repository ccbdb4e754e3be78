"""PM601's fix producer for the process group: `ProcessGroupSetup`."""

from __future__ import annotations

import libcst as cst

from codemod.analysis import process_group
from codemod.edits import Edit, InsertAfter, InsertBefore, Replace
from codemod.rules.single_process_training.plan import (
    IMPORT_ATEXIT,
    Producer,
    code_of,
    make_call,
    moved_into,
    parse_expr,
    parse_line,
)


class ProcessGroupSetup(Producer):
    """`distributed.setup(...)` where the device is chosen, the `world` variable, and the clean
    shutdown."""

    def site(self) -> process_group.SetupSite:
        loader = self.plan.loader.statement if self.plan.loader is not None else None
        setup = process_group.setup_site(self.context, self.plan.origin, loader, self.plan.loop.loop)
        self.edits.extend(Replace(zero, parse_expr('"cuda"')) for zero in setup.zeros)
        return setup

    def write(self, hook: cst.BaseStatement | None) -> None:
        """setup() and the `world` variable first among the edits (statements inserted at the
        same place go in the order of their edits), with the atexit hook when there is one."""
        setup = self.plan.setup
        lines: list[cst.BaseStatement] = []
        edits: list[Edit] = []
        if setup.value is not None:
            chosen = parse_expr('"cuda"') if setup.cuda_for_zero else None
            edits.append(Replace(setup.value, lambda value: make_call("distributed.setup", chosen or value)))
        else:
            lines.append(parse_line(f"distributed.setup({code_of(setup.device)})\n"))
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
        function = self.plan.setup.function
        statement = process_group.entry_statement(self.context, function) if function is not None else None
        if statement is not None:
            protected = moved_into("try:\n    pass\nfinally:\n    distributed.cleanup()\n")
            self.edits.append(Replace(statement, protected))
            return None
        self.imports.append(IMPORT_ATEXIT)
        return parse_line("atexit.register(distributed.cleanup)\n")
