"""Where the model a step loop trains is built, and where it is read: the facts that
wrap it for data-parallel training (PM601), read from the training program (the step
loop's optimizers and models of `context.training`).

`model_sites(context)` (built once per file, FileContext.shared) answers:

- `site(loop)`: the `ModelSite` of the one model the loop's optimizers train: the scope it
  is built in and how that scope spells it (a name, or `self.x` built in one method of a
  class of the file), the statements before the loop that build, move, load or compile it
  (`setup`; the last, `anchor`, is where a wrap goes, after a compile), and how each
  function the model passes through spells it (`handles`: the training function's
  parameter, a global read by a function called once); `m = model.to(device)` with the
  loop running `m` is followed to `m`. Raises NotDistributable with the true reason: the
  loop trains several models or only tensors made to be trained (no model for DDP to wrap),
  the model is built in a compound statement or in several
  methods, passed through a function called more than once, bound again after it is built,
  or run under a second name too (and, for a loop over batches of a library, not of a
  DataLoader, that those could not be split either);
- `spelled_in(site, function)`: how a function spells the model (None: it does not see it);
  `spellings(site)`: those spellings and the functions of the file the model is handed to
  (one level); `uses(scope, code)`: the reads of a spelling in a scope; `after(use,
  anchor)`: whether a read sees what is bound after `anchor`;
- `module_reads(site, loop)`: the reads that must see the module, not its DDP wrapper (an
  attribute DDP does not answer, the model pickled whole); raises for a training forward
  through another method;
- `saved_whole(use)`: whether the model object itself is what `torch.save` pickles (as it
  is, in a container, or in a container bound to a name that is saved);
- `moved_to(site)`: the device the model's last move puts it on (`"cuda"` for `.cuda()`),
  None when it is not moved; `chosen_device(device)`: that device followed through the
  parameters it is passed as (to what the one call passes); `device_assignment(device)`:
  the one line that binds it; `fixed_gpu(value, chosen)`: raises NotDistributable for a
  GPU every process would use (`"cuda:1"`, `.cuda(1)`, an index), and gives back the `0`s
  of a device chosen as GPU 0, which `"cuda"` names alike.

`step_models` (PM506) asks another question of the same program: the models whose forward
a step runs (every one, a frozen teacher too), and the last statement before the loop, in
a block that runs once, after which a compile covers what the loop trains. Here it is the
one model the optimizers train (DDP wraps that one, and refuses two), and its statements
are looked for in every block around the loop, an epoch loop's body too (a model built
anew every epoch is wrapped anew; compiling it anew would recompile), through globals,
closures and `self.` attributes, with a compile among them (the wrap goes after it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import libcst as cst

from codemod.analysis import distributed as facts
from codemod.analysis.bindings import argument_for
from codemod.analysis.distributed import NotDistributable
from codemod.analysis.names import code_of, compound_keyword, integer_value, kwarg, method_name, positional
from codemod.analysis.step_batches import step_batches
from codemod.analysis.torch_facts import CONFIGURES, DDP_ANSWERS, NOT_FORWARD, TORCH_SAVES, module_of_chain

if TYPE_CHECKING:
    from codemod.context import FileContext

KEY = "model_sites"


def model_sites(context: FileContext) -> ModelSites:
    return context.shared(KEY, ModelSites)


@dataclass
class ModelSite:
    """Where the trained model is built: the scope and its spelling there, the last
    statement that builds or moves it (a wrap goes after it), and the spellings under
    which code of other functions sees it."""

    scope: cst.CSTNode  # FunctionDef, ClassDef (for `self.x`) or Module
    code: str
    anchor: cst.SimpleStatementLine
    setup: list[cst.SimpleStatementLine]
    handles: list[tuple[cst.CSTNode, str, cst.CSTNode | None]] = field(default_factory=list)  # (scope, code, after)


class ModelSites:
    def __init__(self, context: FileContext) -> None:
        self.context = context
        self.index = context.index
        self.parents = context.parents
        self.names = context.names
        self.bindings = context.bindings
        self._sites: dict[int, ModelSite | NotDistributable] = {}

    def _src(self, node: cst.CSTNode) -> str:
        return self.context.module.code_for_node(node).strip()

    def _calls_of(self, function: cst.FunctionDef) -> tuple[cst.Call, ...]:
        return step_batches(self.context).calls_of(function)

    def _step_function(self, loop) -> cst.FunctionDef | None:
        return facts.function_of(self.context, loop.loop)

    def site(self, loop) -> ModelSite:
        """Where the model a step loop (`context.training.loops`) trains is built, following
        the one call of a training function that is given it; raises NotDistributable."""
        found = self._sites.get(id(loop.loop))
        if found is None:
            try:
                found = self._site(loop)
            except NotDistributable as refused:
                found = self._with_batches(loop, refused)
            self._sites[id(loop.loop)] = found
        if isinstance(found, NotDistributable):
            raise found
        return found

    def _with_batches(self, loop, refused: NotDistributable) -> NotDistributable:
        """The reason a loop over batches of a library, not of a DataLoader, has no model
        site also says that its batches could not be split either."""
        statement = loop.loop
        library = self.context.loaders.library_iterable(statement.iter) if isinstance(statement, cst.For) else None
        if library is None:
            return refused
        return NotDistributable(
            refused.node,
            f"{refused.message}; and the batches come from `{library}`, not from a DataLoader, "
            "which PM601 would need to split them over the ranks",
        )

    def _site(self, loop) -> ModelSite:
        code = self._trained_model(loop)
        handles: list[tuple[cst.CSTNode, str, cst.CSTNode | None]] = []
        scope: cst.FunctionDef | None = self._step_function(loop)
        limit: cst.CSTNode = loop.loop
        for _ in range(4):
            if code.startswith("self.") and code[5:].isidentifier():
                return self._attribute_origin(loop, code, scope, handles)
            if not code.isidentifier():
                raise NotDistributable(
                    loop.loop, f"the model is `{code}`; PM601 wraps models held in a variable or `self.` attribute"
                )
            setup = self._setup_statements(code, limit)
            forward = [a for a, _ in self._second_names(setup, code) if self._forwards_through(loop, a) is not None]
            if len(forward) == 1 and self._forwards_through(loop, code) is None:
                # `m = model.to(device)`, the optimizer given `model`'s parameters and the loop
                # running `m`: one module under two names; DDP wraps the name the loop runs.
                code = forward[0]
                setup = self._setup_statements(code, limit)
            if any(self._binds(s, code) for s in setup):
                anchor = setup[-1]  # after the last build, move or compile: the model is compiled, then wrapped
                self._check_not_rebound(code, anchor, scope)
                self._check_second_names(loop, setup, code)
                handles.insert(0, (scope if scope is not None else self.context.module, code, anchor))
                return ModelSite(scope or self.context.module, code, anchor, setup, handles)
            params = {p.name.value: p for p in scope.params.params} if isinstance(scope, cst.FunctionDef) else {}
            outer = self._outer_binding(scope, code) if code not in params else None
            if outer is not None:  # a global (or a closure's variable) set where the function is called
                handles.insert(0, (scope, code, None))
                limit, scope = outer
                continue
            if code not in params:
                built = self.context.bound_in_compound(code, limit)
                if built is not None:
                    raise NotDistributable(
                        loop.loop,
                        f"`{code}` is built inside the `{compound_keyword(built)}` statement at line "
                        f"{self.context.line(built)}, not by one statement PM601 can wrap after; wrap it in "
                        f"DistributedDataParallel after that statement",
                    )
                raise NotDistributable(
                    loop.loop,
                    f"`{code}` is not built in the function that trains it, nor passed to it; "
                    "wrap it in DistributedDataParallel where it is built",
                )
            calls = self._calls_of(scope)
            if len(calls) != 1:
                raise NotDistributable(
                    loop.loop,
                    f"`{scope.name.value}` trains the model it is given and is called "
                    f"{len(calls)} times; PM601 follows one call",
                )
            argument = argument_for(calls[0], scope, params[code], self.context.kinds.receiver_offset(calls[0], scope))
            if argument is None:
                raise NotDistributable(calls[0], f"it cannot tell which model this call passes as `{code}`")
            handles.insert(0, (scope, code, None))
            code = self._src(argument)
            limit = self.index.statement_of(calls[0])
            scope = facts.function_of(self.context, calls[0])
        raise NotDistributable(loop.loop, "the model is passed through too many functions")

    def _outer_binding(self, scope, code: str) -> tuple[cst.CSTNode, cst.FunctionDef | None] | None:
        """For a function that reads `code` without binding it: the statement of its one
        call and the scope around it, when that scope is where `code` lives (the module,
        for a global set in the `__main__` block; the enclosing function, for a closure)."""
        if (
            not isinstance(scope, cst.FunctionDef)
            or facts.class_of(self.context, scope) is not None
            or code in facts.assigned_names(self.context, scope)
        ):
            return None
        calls = self._calls_of(scope)
        if len(calls) != 1:
            return None
        caller = facts.function_of(self.context, calls[0])
        if caller is not facts.function_of(self.context, scope):
            return None  # called from somewhere other than where it is defined
        return self.index.statement_of(calls[0]), caller

    def _trained_model(self, loop) -> str:
        """How the loop spells the one model its optimizers train (not a frozen teacher
        it also calls); raises when they train several (a GAN) or it cannot tell."""
        training = self.context.training
        trained: list[str] = []
        unknown = False
        for optimizer in loop.optimizers:
            found = training.parameter_models(optimizer.params) if optimizer.params is not None else None
            if found is None:
                unknown = True
                continue
            for model in found:
                self._check_own(loop, self._src(model), training.self_class_of(model))
                if self._src(model) not in trained:
                    trained.append(self._src(model))
        if len(trained) > 1:
            raise NotDistributable(
                loop.loop,
                f"the loop trains several models ({', '.join(f'`{t}`' for t in trained)}); wrap "
                "each in DistributedDataParallel by hand (two forwards of one DDP model per "
                "step need `static_graph` or separate wrappers)",
            )
        if len(trained) == 1 and not unknown:
            return trained[0]
        models = [m.expression for m in loop.models]
        if len(models) == 1 or (trained and models and models[0] == trained[0]):
            self._check_own(loop, models[0], loop.models[0].owner)
            return models[0]
        tensors = self._trained_tensors(loop) if not trained and not models else None
        if tensors:
            raise NotDistributable(
                loop.loop,
                f"the optimizer trains tensors ({', '.join(f'`{t}`' for t in tensors)}), not the parameters of "
                "a model: there is no model for DistributedDataParallel to wrap",
            )
        raise NotDistributable(
            loop.loop,
            "it cannot tell which model this loop trains"
            if not models
            else f"it cannot tell which of {', '.join(f'`{m}`' for m in models)} the optimizer trains",
        )

    def _trained_tensors(self, loop) -> list[str]:
        """How the loop spells the tensors its optimizers train, when every part of their
        parameters is a tensor made to be trained (`target.requires_grad_(True)`), none a
        model's; empty otherwise."""
        placement = self.context.training.placement
        found: list[str] = []
        for optimizer in loop.optimizers:
            if optimizer.params is None or optimizer.call is None:
                return []
            parameters = placement.parameters(optimizer.params, optimizer.call)
            if parameters.sites is None or any(part not in parameters.tensors for part, _ in parameters.sites):
                return []
            found += [self._src(part) for part, _ in parameters.sites if self._src(part) not in found]
        return found

    def _check_own(self, loop, code: str, owner: cst.ClassDef | None) -> None:
        """Raises when the model is `self.x` of another class than the one whose method runs
        the loop: the loop reaches it through a call of that class's method."""
        if owner is not None and owner is not facts.class_of(self.context, self._step_function(loop)):
            raise self._outside(loop, code, owner)

    @staticmethod
    def _outside(loop, code: str, owner: cst.ClassDef) -> NotDistributable:
        return NotDistributable(
            loop.loop,
            f"`{code}` is an attribute of `{owner.name.value}`, whose methods the loop calls from outside "
            "the class; PM601 rewrites a trainer class whose own method runs the training loop",
        )

    def _attribute_origin(self, loop, code: str, scope, handles) -> ModelSite:
        classdef = facts.class_of(self.context, scope)
        if classdef is None:
            owner = self._optimizer_class(loop)
            if owner is not None:  # `trainer.step(...)` called by a loop outside the class
                raise self._outside(loop, code, owner)
            raise NotDistributable(loop.loop, f"`{code}` is not an attribute of a class this file defines")
        owners = self._setting_up(classdef, code)
        if not owners:
            # `self` is another class's: a trainer's `fit(module)` runs the step methods of
            # `module`, which read the model as `self.model`
            others = [c for c in self.index.find(cst.ClassDef) if c is not classdef and self._setting_up(c, code)]
            if len(others) == 1:
                raise NotDistributable(
                    loop.loop,
                    f"`{code}` is an attribute of `{others[0].name.value}`, whose methods the loop calls from "
                    "outside the class; PM601 rewrites a trainer class whose own method runs the training loop",
                )
        building = [(m, s) for m, s in owners.values() if any(self._binds(x, code) for x in s)]
        if len(building) != 1 or len(owners) != 1:
            raise NotDistributable(
                loop.loop,
                f"`{code}` is built or moved in {len(owners) or 'no'} methods; PM601 wraps a model built in one",
            )
        method, setup = building[0]
        anchor = setup[-1]  # after the last build, move or compile: the model is compiled, then wrapped
        handles.insert(0, (classdef, code, anchor))
        return ModelSite(classdef, code, anchor, setup, handles)

    def _setting_up(self, classdef: cst.ClassDef, code: str) -> dict[int, tuple[cst.FunctionDef, list]]:
        """The methods of `classdef` that build, move or load `code` (`self.model = ...`), with those statements."""
        owners: dict[int, tuple[cst.FunctionDef, list]] = {}
        for method in classdef.body.body:
            if not isinstance(method, cst.FunctionDef):
                continue
            for statement in method.body.body:
                if isinstance(statement, cst.SimpleStatementLine) and any(
                    self._sets_up(s, code) for s in statement.body
                ):
                    owners.setdefault(id(method), (method, []))[1].append(statement)
        return owners

    def _optimizer_class(self, loop) -> cst.ClassDef | None:
        """The class one of whose methods builds an optimizer of the loop (`self.opt = ...`)."""
        for optimizer in loop.optimizers:
            if optimizer.call is not None:
                found = facts.class_of(self.context, facts.function_of(self.context, optimizer.call))
                if found is not None:
                    return found
        return None

    @staticmethod
    def _sets_up(small: cst.BaseSmallStatement, code: str) -> bool:
        """`code = ...`, `code: T = ...`, or `code.method(...)` that moves or loads it (`.to(device)`,
        `.cuda()`, `.load_state_dict(...)`)."""
        if isinstance(small, cst.Assign):
            return any(code_of(t.target) == code for t in small.targets) or ModelSites._moved_copy(small, code)
        if isinstance(small, cst.AnnAssign):
            return (code_of(small.target) == code and small.value is not None) or ModelSites._moved_copy(small, code)
        return (
            isinstance(small, cst.Expr)
            and isinstance(small.value, cst.Call)
            and isinstance(small.value.func, cst.Attribute)
            and code_of(module_of_chain(small.value.func.value)) == code
            and small.value.func.attr.value in CONFIGURES
        )

    @staticmethod
    def _moved_copy(small: cst.Assign | cst.AnnAssign, code: str) -> bool:
        """`m = code.to(device)` / `m = code.cuda()`: a module moves in place, so this moves
        `code` and gives it a second name."""
        value = small.value
        return (
            isinstance(value, cst.Call)
            and isinstance(value.func, cst.Attribute)
            and value.func.attr.value in ("to", "cuda")
            and code_of(module_of_chain(value.func.value)) == code
        )

    @staticmethod
    def _binds(statement: cst.SimpleStatementLine, code: str) -> bool:
        for small in statement.body:
            if isinstance(small, cst.Assign) and any(code_of(t.target) == code for t in small.targets):
                return True
            if isinstance(small, cst.AnnAssign) and code_of(small.target) == code and small.value is not None:
                return True
        return False

    def _second_names(self, setup: list, code: str) -> list[tuple[str, cst.CSTNode]]:
        """The other names that `m = code.to(device)` statements among `setup` give the model."""
        found = []
        for statement in setup:
            for small in statement.body:
                if isinstance(small, (cst.Assign, cst.AnnAssign)) and self._moved_copy(small, code):
                    targets = [t.target for t in small.targets] if isinstance(small, cst.Assign) else [small.target]
                    found.extend(
                        (code_of(t), small) for t in targets if code_of(t) != code and code_of(t).isidentifier()
                    )
        return found

    def _forwards_through(self, loop, name: str) -> cst.Call | None:
        """A call of the model under `name` (`name(x)`, `name.forward(x)`) in the step loop."""
        for call in self.index.find(cst.Call, within=loop.loop):
            func = call.func.value if method_name(call) == "forward" else call.func
            if isinstance(func, cst.Name) and func.value == name:
                return call
        return None

    def _check_second_names(self, loop, setup: list, code: str) -> None:
        """`m = model.to(device)` before the wrap of `model`: `m` stays the bare module, so a
        training forward through `m` would skip DDP's gradient synchronisation."""
        for alias, small in self._second_names(setup, code):
            call = self._forwards_through(loop, alias)
            if call is not None:
                raise NotDistributable(
                    call,
                    f"`{alias} = {code_of(small.value)}` gives the model a second name, and the loop runs "
                    f"it as both `{code}` and `{alias}`; the DDP wrap would rebind only one: use one name",
                )

    def _setup_statements(self, code: str, limit: cst.CSTNode) -> list[cst.SimpleStatementLine]:
        """Statements before `limit`, in the blocks around it up to its function, that build
        or move the model `code`, in code order."""
        found = []
        child, parent = limit, self.parents.get(limit)
        while parent is not None:
            if isinstance(parent, (cst.IndentedBlock, cst.Module)):
                for statement in parent.body:
                    if statement is child:
                        break
                    if isinstance(statement, cst.SimpleStatementLine) and any(
                        self._sets_up(s, code) for s in statement.body
                    ):
                        found.append(statement)
            if isinstance(parent, facts.SCOPES):
                break
            child, parent = parent, self.parents.get(parent)
        return sorted(found, key=self.index.order)

    def _is_compile(self, statement: cst.SimpleStatementLine, code: str) -> bool:
        for small in statement.body:
            value = small.value if isinstance(small, (cst.Assign, cst.AnnAssign, cst.Expr)) else None
            if isinstance(value, cst.Call) and (
                self.names.is_(value.func, "torch.compile")
                or (method_name(value) == "compile" and code_of(value.func.value) == code)
            ):
                return True
        return False

    def _check_not_rebound(self, code: str, anchor: cst.SimpleStatementLine, scope) -> None:
        owner = scope if scope is not None else self.context.module
        for name in self.index.find(cst.Name, within=owner):
            if name.value != code or not self.index.before(anchor, name) or self.index.inside(name, anchor):
                continue
            if facts.function_of(self.context, name) is not scope:
                continue
            parent = self.parents.get(name)
            if isinstance(parent, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign, cst.For)) and parent.target is name:
                statement = self.index.statement_of(name)
                if not (isinstance(statement, cst.SimpleStatementLine) and self._is_compile(statement, code)):
                    raise NotDistributable(
                        statement,
                        f"`{code}` is bound again after line {self.context.line(anchor)}; "
                        "the DDP wrap would not be the model trained",
                    )

    def saved_whole(self, use: cst.CSTNode, container: bool = True) -> bool:
        """Is the model object itself what `torch.save` pickles (`torch.save(model, path)`,
        `torch.save({"model": model}, path)`, or such a container bound to a name that is
        saved: `state = {"model": model}` then `torch.save(state, path)`)? After the wrap
        that would be the DDP wrapper."""
        current, parent = use, self.parents.get(use)
        while container and isinstance(parent, (cst.Element, cst.DictElement, cst.List, cst.Tuple, cst.Dict)):
            if isinstance(parent, cst.DictElement) and parent.value is not current:
                return False  # a key
            current, parent = parent, self.parents.get(parent)
        if current is not use and isinstance(parent, cst.Assign) and parent.value is current:
            # `state = {"model": model, ...}` and then `torch.save(state, path)`
            targets = [t.target for t in parent.targets]
            if len(targets) != 1 or not isinstance(targets[0], cst.Name):
                return False
            scope = self.context.scopes.get(targets[0])
            bindings = [a for a in (scope.assignments[targets[0].value] if scope else ()) if a.node is targets[0]]
            return any(
                self.saved_whole(read, container=False)
                for b in bindings
                for read in self.context.kinds.reached_reads(b)
            )
        call = self.parents.get(parent) if isinstance(parent, cst.Arg) and parent.value is current else None
        return isinstance(call, cst.Call) and self.names.is_(call.func, *TORCH_SAVES)

    def after(self, use: cst.CSTNode, anchor: cst.CSTNode) -> bool:
        """Does `use` see the wrapped model: after the DDP wrap in its function, or in another method."""
        method = facts.function_of(self.context, anchor)
        if facts.function_of(self.context, use) is not method:
            return True
        return self.index.before(anchor, use) and not self.index.inside(use, anchor)

    def spellings(self, site: ModelSite) -> list[tuple[cst.CSTNode, str, cst.CSTNode | None]]:
        """The model's spellings (scope, code, the statement after which it is the wrapped
        model there, or None), with the functions of this file it is passed to (one level)."""
        handles = list(site.handles)
        for scope, code, _ in list(handles):
            for use in self.uses(scope, code):
                parent = self.parents.get(use)
                call = self.parents.get(parent) if isinstance(parent, cst.Arg) else None
                if not isinstance(call, cst.Call) or parent.value is not use:
                    continue
                helper = self.bindings.local_function(call.func) if isinstance(call.func, cst.Name) else None
                if helper is None or any(h[0] is helper for h in handles):
                    continue
                for param in helper.params.params:
                    if argument_for(call, helper, param) is use:
                        handles.append((helper, param.name.value, None))
        return handles

    def spelled_in(self, site: ModelSite, function: cst.FunctionDef | None) -> str | None:
        """How `function` (None: module level) spells the model, from `site.handles`."""
        for scope, code, _ in site.handles:
            if scope is function:
                return code
            if isinstance(scope, cst.ClassDef) and function is not None and self.index.inside(function, scope):
                return code
            if isinstance(scope, cst.Module) and function is None:
                return code
        return None

    def module_reads(self, site: ModelSite, loop: cst.CSTNode) -> list[cst.CSTNode]:
        """The reads of the model, once wrapped, that must see the module itself: an
        attribute DDP does not answer as the module would (`model.state_dict()`), or the
        model object pickled whole (`saved_whole`). Raises NotDistributable for a training
        forward in `loop` through another method than `model(...)`, which DDP would not
        synchronise."""
        found = []
        for scope, code, after in self.spellings(site):
            for use in self.uses(scope, code):
                if after is not None and not self.after(use, after):
                    continue
                parent = self.parents.get(use)
                if isinstance(parent, cst.Attribute) and parent.value is use:
                    attribute = parent.attr.value
                    if attribute in DDP_ANSWERS:
                        continue
                    call = self.parents.get(parent)
                    if (
                        self.index.inside(use, loop)
                        and attribute not in NOT_FORWARD
                        and isinstance(call, cst.Call)
                        and call.func is parent
                    ):
                        raise NotDistributable(
                            call,
                            f"the training forward runs through `{code}.{attribute}(...)`; DDP "
                            f"synchronises gradients only for calls of `{code}(...)` itself",
                        )
                    found.append(use)
                elif self.saved_whole(use):
                    found.append(use)
        return found

    def uses(self, scope: cst.CSTNode, code: str) -> list[cst.CSTNode]:
        """Reads of `code` (a name or `self.x`) in `scope`."""
        found = []
        if code.startswith("self."):
            attribute = code[5:]
            for node in self.index.find(cst.Attribute, within=scope):
                if (
                    node.attr.value == attribute
                    and isinstance(node.value, cst.Name)
                    and node.value.value == "self"
                    and not self._is_target(node)
                ):
                    found.append(node)
            return found
        function = scope if isinstance(scope, cst.FunctionDef) else None
        for node in self.index.find(cst.Name, within=scope):
            if node.value != code:
                continue
            if facts.function_of(self.context, node) is not function and not (
                function is None and facts.reads_module_binding(self.context, node)
            ):
                continue  # another function's own `code`
            parent = self.parents.get(node)
            if isinstance(parent, cst.Attribute) and parent.attr is node:
                continue
            if isinstance(parent, (cst.Arg, cst.Param)) and getattr(parent, "keyword", None) is node:
                continue
            if isinstance(parent, cst.Param) or self._is_target(node):
                continue
            found.append(node)
        return found

    def _is_target(self, node: cst.CSTNode) -> bool:
        parent = self.parents.get(node)
        return isinstance(parent, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign)) and parent.target is node

    # -- the device it is moved to -----------------------------------------------------------

    def chosen_device(self, device: cst.BaseExpression | None) -> cst.BaseExpression | None:
        """The device as the code chooses it: a parameter (`self.gpu_id = gpu_id` in `__init__`,
        `main(device, ...)`) followed to what the one call of its function passes."""
        for _ in range(6):
            if isinstance(device, cst.Attribute):
                values = self.context.kinds.attribute_values(device)
                if not values or len(values) != 1 or not isinstance(values[0], cst.Name):
                    return device
                if self.bindings.param_of(values[0]) is None:
                    return device
                device = values[0]
            if not isinstance(device, cst.Name):
                return device
            parameter = self.bindings.param_of(device)
            if parameter is None:
                return device
            function, param = parameter
            calls = self._calls_of(function)
            passed = facts.argument_of(self.context, calls[0], function, param) if len(calls) == 1 else None
            if passed is None:
                return device
            device = passed
        return device

    def moved_to(self, site: ModelSite) -> cst.BaseExpression | None:
        """The device the model's last move puts it on (`"cuda"` for `.cuda()`), None when
        it is not moved (a CPU script); raises for a fixed GPU or a move it cannot read."""
        moves = [
            call
            for statement in site.setup
            for call in self.index.find(cst.Call, within=statement)
            if method_name(call) in ("to", "cuda")
        ]
        for call in reversed(moves):
            if method_name(call) == "cuda":
                if call.args:
                    raise NotDistributable(
                        call, "the model is placed on a fixed GPU (`.cuda(N)`); every rank would use it"
                    )
                return cst.SimpleString('"cuda"')
            found = kwarg(call, "device") or positional(call, 0)
            if found is not None and not self.context.kinds.is_dtype(found.value):
                self.fixed_gpu(found.value)
                return found.value
        if self.context.training.cuda_use is not None:
            if self._given_to_class(site):
                raise NotDistributable(
                    site.anchor,
                    f"`{site.code}` holds the model its class is given when it is constructed, moved where it "
                    "is built; PM601 wraps a model where the function that trains it builds it: wrap it in "
                    "DistributedDataParallel before it is handed over",
                )
            raise NotDistributable(site.anchor, "it cannot tell which device the model is moved to")
        return None

    def _given_to_class(self, site: ModelSite) -> bool:
        """Does the attribute `site` builds hold only what its class's `__init__` is given?"""
        if not isinstance(site.scope, cst.ClassDef):
            return False
        held = [a for a in self.index.find(cst.Attribute, within=site.anchor) if self.context.source(a) == site.code]
        return bool(held) and self.context.training.init_parameter(held[0]) is not None

    def fixed_gpu(self, value: cst.BaseExpression, chosen: bool = False) -> list[cst.Integer]:
        """Raises for a fixed GPU, which every rank would use. GPU 0 where the script chooses
        its one device (`chosen`: the value setup() gets, which every use reads) is the GPU a
        single process uses by default; those indices come back, to become "cuda", which
        setup() makes each process's own GPU and which, alone, is still GPU 0."""
        zeros = []
        for string in self.index.find(cst.SimpleString, within=value):
            text = string.evaluated_value
            if isinstance(text, str) and text.startswith("cuda:"):
                raise NotDistributable(
                    string,
                    f'the device is the fixed GPU {text!r}; every rank would use it (write "cuda": '
                    "setup() gives each process its own)",
                )
        if isinstance(value, cst.Call) and self.names.is_(value.func, "torch.device") and len(value.args) > 1:
            raise NotDistributable(value, "the device is a fixed GPU; every rank would use it")
        branches = [value.body, value.orelse] if isinstance(value, cst.IfExp) else [value]
        for branch in branches:
            if isinstance(branch, cst.Integer) and chosen and integer_value(branch) == 0:
                zeros.append(branch)
            elif isinstance(branch, cst.Integer):
                raise NotDistributable(
                    branch,
                    f"the device is GPU {branch.value} (an index is a CUDA device); every rank would use it "
                    '(write "cuda": setup() gives each process its own)',
                )
        return zeros

    def device_assignment(self, device: cst.Name | cst.Attribute):
        """(statement, value) of the one line that binds the device: `device = value`, or
        `self.device = value` in the class; (None, None) when there is not one."""
        if isinstance(device, cst.Name):
            return self._single_assignment(device)
        return self._attribute_assignment(device)

    def _single_assignment(self, name: cst.Name):
        """(statement, value) of the one plain `name = value` line that binds `name`."""
        found = facts.bindings_of(self.context, name)
        if len(found) != 1:
            return None, None
        value = self.bindings.assigned_value(found[0])
        statement = self.index.statement_of(found[0].node)
        if (
            value is None
            or not isinstance(statement, cst.SimpleStatementLine)
            or len(statement.body) != 1
            or not isinstance(self.parents.get(statement), (cst.IndentedBlock, cst.Module))
        ):
            return None, None
        return statement, value

    def _attribute_assignment(self, attribute: cst.Attribute):
        """(statement, value) of the one `self.device = value` line of the class."""
        if not (isinstance(attribute.value, cst.Name) and attribute.value.value == "self"):
            return None, None
        classdef = self.index.first_enclosing(attribute, cst.ClassDef)
        if classdef is None:
            return None, None
        code = code_of(attribute)
        found = [
            a
            for a in self.index.find(cst.Assign, within=classdef)
            if len(a.targets) == 1 and code_of(a.targets[0].target) == code
        ]
        if len(found) != 1:
            return None, None
        statement = self.index.statement_of(found[0])
        if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
            return None, None
        return statement, found[0].value
