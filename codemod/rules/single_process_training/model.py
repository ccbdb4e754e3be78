"""PM601's fix producer for the trained model: `ModelWrap`."""

from __future__ import annotations

import libcst as cst

from codemod.analysis.model_sites import model_sites
from codemod.edits import InsertAfter, Replace
from codemod.rules.single_process_training.plan import Producer, around


class ModelWrap(Producer):
    """The trained model: its DistributedDataParallel wrap after it is built, and the reads
    that must see the module itself (`distributed.unwrap`)."""

    def wrap(self) -> None:
        origin = self.plan.origin
        check = self.plan.world_check(origin.anchor)
        wrap = cst.parse_statement(f"if {check}:\n    {origin.code} = DistributedDataParallel({origin.code})\n")
        # Inserted after the anchor, where other rules insert too: PM506's `model.compile()`
        # (a fix of a lower level, kept first) comes before the wrap, the order of an existing
        # compile. DDP's forward still hands dynamo its gradient buckets (DDPOptimizer).
        self.edits.append(InsertAfter(origin.anchor, (wrap,)))
        self.imports.append(("torch.nn.parallel", "DistributedDataParallel"))

    def unwrap(self) -> None:
        """Reads of the model that DDP does not answer as the module would go through
        `distributed.unwrap(model)`; a forward through another method cannot be synchronised."""
        for use in model_sites(self.context).module_reads(self.plan.origin, self.plan.loop.loop):
            self.edits.append(Replace(use, around("distributed.unwrap")))
