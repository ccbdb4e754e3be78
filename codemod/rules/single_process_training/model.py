"""PM601's fix producer for the trained model: `ModelWrap`."""

from __future__ import annotations

import libcst as cst

from codemod.analysis.model_sites import ModelSite, model_sites
from codemod.analysis.torch_facts import DDP_ANSWERS, NOT_FORWARD
from codemod.edits import InsertAfter, Replace
from codemod.rules.single_process_training.plan import (
    IMPORT_DDP,
    Blocked,
    Producer,
    make_call,
    parse_line,
)


class ModelWrap(Producer):
    """The trained model: its DistributedDataParallel wrap after it is built, and the reads
    that must see the module itself (`distributed.unwrap`)."""

    def origin(self, loop) -> ModelSite:
        return model_sites(self.context).site(loop)

    def wrap(self) -> None:
        origin = self.plan.origin
        check = self.plan.world_check(origin.anchor)
        wrap = cst.If(
            check, cst.IndentedBlock([parse_line(f"{origin.code} = DistributedDataParallel({origin.code})\n")])
        )
        # Inserted after the anchor, where other rules insert too: PM506's `model.compile()`
        # (a fix of a lower level, kept first) comes before the wrap, the order of an existing
        # compile. DDP's forward still hands dynamo its gradient buckets (DDPOptimizer).
        self.edits.append(InsertAfter(origin.anchor, (wrap,)))
        self.imports.append(IMPORT_DDP)

    def unwrap(self) -> None:
        """Reads of the model that DDP does not answer as the module would go through
        `distributed.unwrap(model)`; a forward through another method cannot be synchronised."""
        sites = model_sites(self.context)
        step_loop = self.plan.loop.loop
        for scope, code, after in sites.spellings(self.plan.origin):
            for use in sites.uses(scope, code):
                if after is not None and not sites.after(use, after):
                    continue
                parent = self.parents.get(use)
                if isinstance(parent, cst.Attribute) and parent.value is use:
                    attribute = parent.attr.value
                    if attribute in DDP_ANSWERS:
                        continue
                    call = self.parents.get(parent)
                    if (
                        self.index.inside(use, step_loop)
                        and attribute not in NOT_FORWARD
                        and isinstance(call, cst.Call)
                        and call.func is parent
                    ):
                        raise Blocked(
                            call,
                            f"the training forward runs through `{code}.{attribute}(...)`; DDP "
                            f"synchronises gradients only for calls of `{code}(...)` itself",
                        )
                    self.edits.append(Replace(use, lambda value: make_call("distributed.unwrap", value)))
                elif sites.saved_whole(use):
                    self.edits.append(Replace(use, lambda value: make_call("distributed.unwrap", value)))
