"""PM601's fix producer for the process group: `ProcessGroupSetup`."""

from __future__ import annotations

import libcst as cst

from codemod.analysis import process_group
from codemod.analysis.names import code_of
from codemod.edits import Edit, InsertAfter, InsertBefore, Replace
from codemod.rules.single_process_training.plan import Producer, around, moved_into


class ProcessGroupSetup(Producer):
    """`distributed.setup(...)` where the device is chosen, the `world` variable, and the clean
    shutdown."""

    def site(self) -> process_group.SetupSite:
        loader = self.plan.loader.statement if self.plan.loader is not None else None
        setup = process_group.setup_site(self.context, self.plan.origin, loader, self.plan.loop.loop)
        self.edits.extend(Replace(zero, cst.parse_expression('"cuda"')) for zero in setup.zeros)
        return setup

    def write(self, hook: cst.BaseStatement | None) -> None:
        """setup() and the `world` variable first among the edits (statements inserted at the
        same place go in the order of their edits), with the atexit hook when there is one."""
        setup = self.plan.setup
        lines: list[cst.BaseStatement] = []
        edits: list[Edit] = []
        if setup.value is not None:
            chosen = cst.SimpleString('"cuda"') if setup.cuda_for_zero else None  # GPU 0 written `0`
            edits.append(Replace(setup.value, lambda value: around("distributed.setup")(chosen or value)))
        else:
            lines.append(cst.parse_statement(f"distributed.setup({code_of(setup.device)})\n"))
        if self.plan.world_uses:
            lines.append(cst.parse_statement(f"{self.plan.world_name} = distributed.world()\n"))
        if hook is not None:
            lines.append(hook)
        if lines:
            insert = InsertBefore if setup.value is None else InsertAfter
            edits.append(insert(setup.statement, tuple(lines)))
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
        self.imports.append(("atexit", None))
        return cst.parse_statement("atexit.register(distributed.cleanup)\n")
