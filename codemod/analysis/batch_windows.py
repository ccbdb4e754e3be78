"""Batches cut by hand from data held in memory, window by window, in a loop over a counter.

`for i in range(0, n, bs): xb = X[i:i + bs]` (also `range(n // bs)` with `X[i * bs:(i +
1) * bs]`, `range(steps)` with those windows over `steps * bs` samples, through `enumerate`/`tqdm`/`zip`, and through a permutation drawn each epoch:
`perm = torch.randperm(n)`, `X[perm[i:i + bs]]` or `idx = perm[i:i + bs]; X[idx]`) visits
the batches that `DataLoader(TensorDataset(X, ...), batch_size=bs, shuffle=...)` gives
when it is proven that:

- every use of the counter is a window `[i:i + bs]` along the first dimension (not along
  a later one, not of a width that varies, not picked through an index array other than
  a per-epoch `torch.randperm`), and the counter is used for nothing else;
- the data are tensors in host memory (on the device a slice is already the fastest
  batch: not one to rewrite), neither re-bound in the loop nor written in place, nor the
  items of something an outer loop walks (micro-batches of a batch);
- the range covers the data: `len(X)`, `X.size(0)`, `X.shape[0]`, the size `X` was made
  with, or the `n` of `X = T[:n]` for an `n` at most `len(T)`; a permutation is drawn
  anew in a loop around the step loop, over that length;
- no state is carried from one window to the next (a truncated-BPTT hidden state): such
  windows are the consecutive pieces of one stream that must stay in order, not a set
  of samples a DataLoader batches, and are not read as batches to rewrite;
- the batches are not written in place (they would no longer change the data) and the
  names a loader needs mean torch's classes.

API (`batch_windows(context)`):

- `counter(loop)`: the `range(...)` a `for` iterates and the name its items bind.
- `of(loop)`: the WindowPlan of a step loop (None when its counter gives no windows);
  `WindowPlan.problem` is None when a DataLoader gives the same batches, "" when the
  loop is not one to report (no window, tensors on the device, micro-batches, state
  carried from window to window), otherwise the reason, in words.
- `in_generator(function)`: (WindowPlan, sites) for a generator of the file whose loop
  cuts windows (of `self.X` too) and that step loops iterate once per step (`sites`).
- `per_step_sites(function)`: where a training loop runs `function` once per step: its
  calls in a step loop, or in a function run that way; for a generator, the step loops
  that iterate it and their `next(it)` calls on it.
- `rebinding(plan, taken)`: for a plan without a problem, the Rebinding the loader's
  items take: the loop variable of each tensor (the name its batch was bound to, or a
  fresh one), the statements that only bound batches (they go), the expressions a
  variable replaces.
- `anchor_for(loop, needed)`: the outermost loop around `loop` in which none of `needed`
  is re-bound (a loader is built before it); `unused_permutation(plan, anchor)`: the
  `perm = torch.randperm(n)` line that only the windows read.
- `loader_gains_nothing(tensors, batch_size)`: why a DataLoader over those tensors would
  buy nothing (batches known to be too small for overlapped copies to matter), or None;
  `tensors_read(plan)`: the reads of a plan's tensors.
- `loader_blocked(targets)`: why batches bound to `targets` cannot come from a
  DataLoader over a TensorDataset (one is written in place, a name is taken), or None.
- `list_batch(batch)`: for a loaders.ListBatch (a permutation of a Python list, looked
  up item by item and worked on in the step), the ListBatchPlan of the DataLoader over
  the list whose collate_fn is the step's work, or the reason there is none;
  `opaque_work(batch)`: the first call of that work perfmod cannot follow.

Built once per file (FileContext.shared); each loop's plan once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import libcst as cst
from libcst.metadata import Assignment, ImportAssignment

from codemod.analysis import match as m
from codemod.analysis.names import fresh_name, integer_value, names_read, number_value, positional
from codemod.analysis.project import project_of
from codemod.analysis.sizes import MIN_COPY_BYTES, sizes_of, small_copy
from codemod.analysis.tensor_layout import layouts
from codemod.analysis.tensor_splits import bound_in
from codemod.analysis.tokenizers import tokenizers
from codemod.analysis.torch_facts import METADATA_ATTRIBUTES, METADATA_METHODS
from codemod.analysis.values import Kind, Place, number_is

if TYPE_CHECKING:
    from codemod.analysis.loaders import ListBatch
    from codemod.context import FileContext

KEY = "batch_windows"
RANGE = ("range", "builtins.range")
NEXT = ("next", "builtins.next")
MAX_HELPER_DEPTH = 2  # how many calls away from the step loop a batch helper may be
SCOPES = (cst.FunctionDef, cst.ClassDef, cst.Lambda)


def batch_windows(context: FileContext) -> BatchWindows:
    return context.shared(KEY, BatchWindows)


@dataclass
class Window:
    """How the loop variable `i` of `for i in range(...)` picks one batch."""

    n: cst.BaseExpression  # the number of samples the loop covers
    drop_last: bool  # the last partial batch is skipped
    matches: m.BaseMatcher  # the slice `[i:i + bs]` (or `[i * bs:(i + 1) * bs]`)
    exact: m.BaseMatcher  # its upper bound when the window is exactly one step wide


@dataclass
class WindowPlan:
    """The windows a loop over a counter cuts (see the module's docstring)."""

    loop: cst.For
    batch_size: cst.BaseExpression
    window: Window
    counter: cst.Call  # the `range(...)` the loop (or a wrapper such as enumerate) iterates
    index: cst.Name  # the name its items bind
    tensors: list[str] = field(default_factory=list)  # dataset tensors, in order of first use
    uses: dict[int, str] = field(default_factory=dict)  # id(Subscript) -> tensor it batches
    permutation: str | None = None  # `perm` of `perm = torch.randperm(n)`: shuffled batches
    permutation_reads: set[int] = field(default_factory=set)  # id(Name) of `perm` in the windows
    dimension: tuple[cst.Subscript, int] | None = None  # a window along another dimension than the first
    shorter: cst.Subscript | None = None  # a window `i:i + w` whose width is at most the step
    index_array: str | None = None  # `order` of `X[order[i:i + bs]]` when it is no per-epoch randperm
    windows: list[cst.Subscript] = field(default_factory=list)  # every window of the loop's counter
    problem: str | None = None


class Rebinding(NamedTuple):
    """The loop variables a loader's items take in place of the windows."""

    variables: dict[str, str]  # tensor -> the name its batch is bound to
    removed: list[cst.CSTNode]  # statements that only bound batches (or `idx = perm[...]`)
    replaced: list[tuple[cst.CSTNode, str]]  # expression -> the variable that replaces it


class ListBatchPlan(NamedTuple):
    """`DataLoader(corpus, batch_size=width, shuffle=True, drop_last=..., collate_fn=work)`
    iterated by the step loop in place of the permutation's windows."""

    corpus: str
    width: cst.BaseExpression
    drop_last: bool
    work: str  # the function of the module the collate_fn is
    target: str  # the name the work's result was bound to: the loop's item
    step: str | None  # the counter, when the loop still reads it (`enumerate(loader)`)
    removed: list[cst.CSTNode]  # the look-up, the work, `idx = perm[...]`, the permutation's line
    anchor: cst.CSTNode  # the loader is built before it


class BatchWindows:
    """The hand-cut batch windows of one file (see the module's docstring)."""

    def __init__(self, context: FileContext) -> None:
        self.context = context
        self._plans: dict[tuple[int, bool], WindowPlan | None] = {}
        self._sites: dict[tuple[int, int], list[cst.CSTNode]] = {}
        self._step_loops: set[int] | None = None

    # -- public ------------------------------------------------------------------------

    def counter(self, loop: cst.For) -> tuple[cst.Call, cst.Name] | None:
        """`range(...)` and the name its items bind: `for i in range(...)`, also through
        `enumerate`, `tqdm`, `zip`."""
        found = [
            (iterable, target)
            for iterable, target in self.context.loaders.iterated(loop.iter, loop.target)
            if isinstance(iterable, cst.Call) and self.context.names.is_(iterable.func, *RANGE)
        ]
        if len(found) != 1 or not isinstance(found[0][1], cst.Name):
            return None
        return found[0]

    def of(self, loop: cst.For, attributes: bool = False) -> WindowPlan | None:
        key = (id(loop), attributes)
        if key not in self._plans:
            self._plans[key] = self._plan(loop, attributes)
        return self._plans[key]

    def in_generator(self, function: cst.FunctionDef) -> tuple[WindowPlan, list[cst.CSTNode]] | None:
        _, yields = self.context.kinds.exits(function)
        loops: list[cst.For] = []
        for found in yields:
            loop = self.context.index.first_enclosing(found, (cst.For, *SCOPES))
            if isinstance(loop, cst.For) and loop not in loops:
                loops.append(loop)
        for loop in loops:
            plan = self.of(loop, attributes=True)
            if plan is None or plan.problem == "":
                continue  # no windows, or windows of tensors on the device
            sites = self.per_step_sites(function)
            return (plan, sites) if sites else None
        return None

    def per_step_sites(self, function: cst.FunctionDef, depth: int = 0) -> list[cst.CSTNode]:
        key = (id(function), depth)
        if key in self._sites:
            return self._sites[key]
        self._sites[key] = []  # recursion: not through this path
        sites: list[cst.CSTNode] = []
        generator = bool(self.context.kinds.exits(function)[1])
        index, loops = self.context.index, self.context.loops
        for call, _ in self.context.kinds.callers(function) or ():
            if generator:
                sites.extend(self._consumers(call))
            elif loops.step_loop_of(call) is not None:
                sites.append(call)
            elif depth < MAX_HELPER_DEPTH:
                # a call in a function that runs once per step (`train_step()`), not in a loop
                # of its own there (`estimate_loss()` draws its evaluation batches in one)
                outer = index.first_enclosing(call, (cst.For, cst.While, *SCOPES))
                if isinstance(outer, cst.FunctionDef) and self.per_step_sites(outer, depth + 1):
                    sites.append(call)
        self._sites[key] = sites
        return sites

    def rebinding(self, plan: WindowPlan, taken: set[str]) -> Rebinding:
        parents, index = self.context.parents, self.context.index
        variables: dict[str, str] = {}
        removed: list[cst.CSTNode] = []
        for tensor, statement in self._batch_statements(plan).items():
            variables[tensor] = statement.targets[0].target.value
            removed.append(parents.get(statement))
        for line in _lines(plan.loop.body):
            if _unpacks_only_batches(line, plan.uses):
                for element, value in zip(line.body[0].targets[0].target.elements, line.body[0].value.elements):
                    variables.setdefault(plan.uses[id(value.value)], element.value.value)
                removed.append(line)
        for tensor, name in self._copied_batches(plan, variables).items():
            variables[tensor] = name  # `xb = X[idx].to(device)`: `for xb, ... in loader: xb = xb.to(device)`
        for tensor in plan.tensors:
            if tensor not in variables:
                variables[tensor] = fresh_name(f"{tensor}_batch", taken)
        replaced: list[tuple[cst.CSTNode, str]] = []
        for node in index.find((cst.Subscript, cst.Assign), within=plan.loop.body):
            tensor = plan.uses.get(id(node))
            if tensor == "":  # `idx = perm[i:i + bs]`
                removed.append(parents.get(node))
            elif tensor is not None and not any(index.inside(node, line) for line in removed):
                replaced.append((node, variables[tensor]))
        return Rebinding(variables, removed, replaced)

    def anchor_for(self, loop: cst.For, needed: set[str]) -> cst.CSTNode:
        anchor: cst.CSTNode = loop
        for current in self.context.index.ancestors(loop):
            if isinstance(current, SCOPES):
                break
            if isinstance(current, (cst.For, cst.While)):
                if any(bound_in(self.context, name, current) for name in needed):
                    break
                anchor = current
        return anchor

    def unused_permutation(self, plan: WindowPlan, anchor: cst.CSTNode) -> cst.CSTNode | None:
        scope = self.context.scopes.get(plan.loop)
        assignments = list(scope.assignments[plan.permutation])
        parents = self.context.parents
        line = parents.get(parents.get(parents.get(assignments[0].node)))
        if not (
            isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 and self.context.inside(line, anchor)
        ):
            return None
        reads = {id(access.node) for access in scope.accesses[plan.permutation]}
        return line if reads <= plan.permutation_reads else None

    def tensors_read(self, plan: WindowPlan) -> list[cst.BaseExpression]:
        """The reads of the plan's tensors in its windows, one per tensor, in order."""
        return [self._a_use(plan, name).value for name in plan.tensors]

    def loader_gains_nothing(self, tensors: list[cst.BaseExpression], batch_size: cst.BaseExpression) -> str | None:
        """Why a DataLoader over `tensors`, held in memory, buys nothing, when that is known:
        its batches of `batch_size` rows are too small for the pinned, overlapped copies it
        allows to hide anything, and it costs more host time per batch than a slice."""
        size = sizes_of(self.context).rows_batch_bytes(tensors, batch_size)
        if size is None or size >= MIN_COPY_BYTES:
            return None
        return (
            f"{small_copy(size)}, so the pinned, overlapped copies a DataLoader allows (PM102, PM103) would hide next "
            "to nothing, while it fetches rows of tensors already in memory one by one and stacks them, more host "
            "time per batch than one slice"
        )

    def loader_blocked(self, targets: list[cst.BaseExpression]) -> str | None:
        for target in targets:
            if isinstance(target, cst.Name) and self.context.kinds.is_mutated_in_place(target):
                return f"the batch `{target.value}` is written in place, which changes the data it is a view of"
        for name in ("DataLoader", "TensorDataset"):
            if not self.free_or_torch(name):
                return f"the name `{name}` means something else in this file"
        return None

    def free_or_torch(self, name: str) -> bool:
        """Is `name` unbound in the module, or bound only by an import of torch's class of that name?"""
        module = self.context.module
        scope = self.context.scopes.get(module.body[0]) if module.body else None
        if scope is None or name not in scope.globals:
            return True
        spellings = {
            f"torch.utils.data.{name}",
            f"torch.utils.data.dataloader.{name}",
            f"torch.utils.data.dataset.{name}",
        }
        for assignment in scope.globals.assignments[name]:
            if not isinstance(assignment, ImportAssignment):
                return False
            if not any(q.name in spellings for q in assignment.get_qualified_names_for(name)):
                return False
        return True

    def opaque_work(self, batch: ListBatch) -> cst.Call | None:
        """The first call of the step's work on the items that is neither a function or
        method of this file nor of the project, nor a tokenizer a known library built."""
        known = tokenizers(self.context)
        for call in batch.work:
            if (
                self.context.kinds.local_callee(call) is None
                and project_of(self.context).called(call) is None
                and not known.tokenizer_call(call)[0]
            ):
                return call
        return None

    def list_batch(self, batch: ListBatch) -> ListBatchPlan | str:
        source, loop = self.context.source, batch.loop
        problem = self._list_order_problem(batch)
        if problem is not None:
            return problem
        n = positional(batch.permutation, 0).value
        counter = self.counter(loop)
        if counter is None or loop.iter is not counter[0]:
            return "the loop's counter is not a plain `range(...)`"
        drop_last = self._drops_last(counter[0], n, batch.window.width)
        if drop_last is None:
            return f"perfmod cannot tell that `{source(counter[0])}` counts the batches of `{source(batch.corpus)}`"
        work = self._list_work(batch)
        if work is None:
            return "perfmod moves into a collate_fn only one call of a function of this module given the batch alone"
        function = self.context.kinds.local_callee(work)
        if not self.context.purity.is_pure(function):
            return f"perfmod cannot tell that `{function.name.value}` is pure"
        target = _name_bound_to(work, self.context.parents)
        lines = self._own_lines(batch, work)
        if target is None or lines is None:
            return "the look-up and the work on the batch are not statements of their own in the loop"
        reads = names_read(loop.body)
        if sum(read.value == batch.batch.value for read in reads) != 1:
            return f"`{batch.batch.value}` is used for more than `{source(work)}`"
        step = counter[1]
        counted = [
            read for read in reads if read.value == step.value and not self.context.inside(read, batch.window.subscript)
        ]
        if counted and len(counter[0].args) != 1:
            return f"`{step.value}` is used for more than cutting the batch"
        if not self.free_or_torch("DataLoader"):
            return "the name `DataLoader` means something else in this file"
        needed = {batch.corpus.value, function.name.value} | {name.value for name in names_read(batch.window.width)}
        anchor = self.anchor_for(loop, needed)
        perm_line = self._permutation_line(batch, anchor)
        removed = lines + ([perm_line] if perm_line is not None else [])
        return ListBatchPlan(
            batch.corpus.value,
            batch.window.width,
            drop_last,
            function.name.value,
            target.value,
            step.value if counted else None,
            removed,
            anchor,
        )

    def _list_order_problem(self, batch: ListBatch) -> str | None:
        """Why a DataLoader shuffling the list would not draw the order the loop draws: the
        indices used otherwise, a permutation not drawn per pass, with its own generator or
        not of the list's length, the list changed in place."""
        context, source = self.context, self.context.source
        if batch.other_reads:
            return "the indices are also used besides looking the items up"
        loops = (cst.For, cst.While)
        if not batch.per_epoch or context.index.first_enclosing(batch.permutation, loops) is not (
            context.index.first_enclosing(context.parents.get(batch.loop), loops)
        ):
            return "the permutation is not drawn anew for each pass of the loop (a DataLoader would draw one per pass)"
        if context.kinds.is_mutated_in_place(batch.corpus):
            return f"`{source(batch.corpus)}` is changed in place"
        n = positional(batch.permutation, 0)
        if n is None or len(batch.permutation.args) != 1:
            return "the permutation is drawn with its own generator, and a DataLoader would draw its order from another"
        if not self._is_length_of(n.value, batch.corpus):
            return f"perfmod cannot tell that `{source(n.value)}` is the length of `{source(batch.corpus)}`"
        return None

    def _is_length_of(self, n: cst.BaseExpression, corpus: cst.BaseExpression) -> bool:
        """Is `n` (or the value it is bound to once) `len(corpus)`, `corpus` a name?"""
        length = self._single_value(n)
        return (
            isinstance(corpus, cst.Name)
            and isinstance(length, cst.Call)
            and self.context.names.is_(length.func, "len", "builtins.len")
            and len(length.args) == 1
            and length.args[0].value.deep_equals(corpus)
        )

    def _list_work(self, batch: ListBatch) -> cst.Call | None:
        """The work on the batch a collate_fn can take: the one call, given the batch alone,
        of a function of this module."""
        (work,) = batch.work if len(batch.work) == 1 else (None,)
        function = self.context.kinds.local_callee(work) if work is not None else None
        if (
            work is None
            or not isinstance(work.func, cst.Name)
            or len(work.args) != 1
            or not _is_name(work.args[0].value, batch.batch.value)
            or function is None
            or not isinstance(self.context.parents.get(function), cst.Module)
        ):
            return None
        return work

    def _own_lines(self, batch: ListBatch, work: cst.Call) -> list[cst.CSTNode] | None:
        """The statements of the loop's body that look the items up, cut the indices and do
        the work, each a line of its own; None when one is not."""
        parents = self.context.parents
        lines = [parents.get(parents.get(node)) for node in (batch.picks, work)]
        if _name_bound_to(batch.window.subscript, parents) is not None:
            lines.append(parents.get(parents.get(batch.window.subscript)))
        body = _lines(batch.loop.body)
        if all(isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 and line in body for line in lines):
            return lines
        return None

    # -- the plan of one loop ------------------------------------------------------------

    def _plan(self, loop: cst.For, attributes: bool) -> WindowPlan | None:
        counter = self.counter(loop)
        if counter is None:
            return None
        batch_size, window = self._window(*counter, loop)
        if window is None:
            return None
        plan = WindowPlan(loop, batch_size, window, *counter)
        problem = self._find_batches(plan, attributes)
        plan.problem = self._check(plan) if problem is None else problem
        return plan

    def _window(
        self, call: cst.Call, index: cst.Name, loop: cst.For
    ) -> tuple[cst.BaseExpression | None, Window | None]:
        if any(a.keyword is not None or a.star for a in call.args):
            return None, None
        i, args = index.value, [a.value for a in call.args]
        one = number_is(self.context, 1)
        if len(args) == 3 and m.matches(args[0], number_is(self.context, 0)):
            n, bs = args[1], args[2]
            drop_last = False
            # range(0, n - bs + 1, bs): only full batches
            if m.matches(
                n,
                m.BinaryOperation(left=m.BinaryOperation(operator=m.Subtract()), operator=m.Add(), right=one),
            ) and n.left.right.deep_equals(bs):
                n, drop_last = n.left.left, True
            exact = m.BinaryOperation(left=m.Name(i), operator=m.Add(), right=_equal_to(bs)) | m.BinaryOperation(
                left=_equal_to(bs), operator=m.Add(), right=m.Name(i)
            )
            # `i:i + w` with `w = min(bs, ...)`: windows no longer than the step (a shorter last one)
            shorter = m.BinaryOperation(
                left=m.Name(i), operator=m.Add(), right=m.MatchIfTrue(lambda w: self._at_most(w, bs))
            )
            return bs, Window(n, drop_last, m.Slice(lower=m.Name(i), upper=exact | shorter, step=None), exact)
        if len(args) == 1 and m.matches(args[0], m.BinaryOperation(operator=m.FloorDivide())):
            n, bs = args[0].left, args[0].right
            lower, upper = _step_bounds(i, bs, one)
            return bs, Window(n, True, m.Slice(lower=lower, upper=upper, step=None), upper)
        if len(args) == 1:  # `range(steps)` and `X[i * bs:(i + 1) * bs]`: steps * bs samples
            bs = self._step_width(loop, i)
            if bs is None:
                return None, None
            steps = args[0]
            if isinstance(steps, cst.BinaryOperation) and not steps.lpar:
                steps = steps.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
            n = cst.BinaryOperation(left=steps, operator=cst.Multiply(), right=bs)
            lower, upper = _step_bounds(i, bs, one)
            return bs, Window(n, False, m.Slice(lower=lower, upper=upper, step=None), upper)
        return None, None

    def _step_width(self, loop: cst.For, i: str) -> cst.BaseExpression | None:
        """`bs` of the first window `[i * bs:...]` in `loop`'s body; None where there is none."""
        for part in self.context.index.find(cst.Slice, within=loop.body):
            lower = part.lower
            if m.matches(lower, m.BinaryOperation(left=m.Name(i), operator=m.Multiply())):
                return lower.right
        return None

    def _at_most(self, width: cst.CSTNode, step: cst.BaseExpression, depth: int = 0) -> bool:
        """Is `width` never more than `step`: `min(step, ...)`, or a name bound only to that?"""
        if isinstance(width, cst.Call) and self.context.names.is_(width.func, "min", "builtins.min"):
            return any(arg.value.deep_equals(step) for arg in width.args if arg.keyword is None and not arg.star)
        if isinstance(width, cst.Name) and depth < 2:
            values = self.context.bindings.values(width)
            return bool(values) and all(self._at_most(value, step, depth + 1) for value in values)
        return False

    def _find_batches(self, plan: WindowPlan, attributes: bool) -> str | None:
        """Fill plan.tensors/uses; "" when the loop does not batch by hand, a reason when it
        does but cannot be rewritten, None when every use of `i` is understood. With
        `attributes`, windows of `self.X` count too (reported, never rewritten)."""
        loop, i = plan.loop, plan.index.value
        for s in self.context.index.find(cst.Subscript, within=loop.body):
            if isinstance(s.value, cst.Name) or (attributes and isinstance(s.value, cst.Attribute)):
                dimension = self._window_dimension(s, plan.window)
                if dimension is not None:
                    plan.windows.append(s)
                    if dimension:
                        plan.dimension = plan.dimension or (s, dimension)
        if not plan.windows:
            return ""
        understood: set[int] = set()
        for window in plan.windows:
            understood.update(id(n) for n in self._names(window, i) if not self.context.inside(n, window.value))
            source = self.context.source(window.value)
            if not m.matches(_window_part(window).slice, m.Slice(upper=plan.window.exact)):
                plan.shorter = plan.shorter or window
            permutation = self._permutation(source, loop) if isinstance(window.value, cst.Name) else None
            if permutation is None and self._selects_rows(plan, window):
                plan.index_array = source  # `order[i:i + bs]` picks rows of the data: not a randperm
            elif permutation is None:
                plan.uses[id(window)] = source
                _append_once(plan.tensors, source)
                continue
            plan.permutation = permutation
            plan.permutation_reads.add(id(window.value))
            problem = self._permuted_uses(plan, window)
            if problem is not None:
                return problem
        if any(self._on_device(plan, name) for name in plan.tensors):
            return ""  # batches of tensors already on the device: a slice is the fastest batch
        if any(self._loop_item(self._a_use(plan, name).value, 0) for name in plan.tensors):
            return ""  # micro-batches of a batch that an outer loop takes (gradient accumulation)
        if self._carried_state(plan) is not None:
            return ""  # consecutive windows of one stream, state carried from one to the next: kept in order
        unlike = self._unlike_a_loader(plan)
        if unlike is not None:
            return unlike
        others = [n for n in self._names(loop.body, i) if id(n) not in understood]
        if others:
            return self._shifted_window(plan, others[0]) or (
                f"`{i}` is used for more than slicing (line {self.context.line(others[0])})"
            )
        return None

    def _shifted_window(self, plan: WindowPlan, use: cst.Name) -> str | None:
        """Why the windows are no batches of rows when `use` (of the counter) bounds a slice of
        a tensor the batches are cut from, at another offset: `data[i + 1:i + 51]` beside the
        batch `data[i:i + 50]`, the next-token targets of its inputs."""
        subscript = self.context.index.first_enclosing(use, cst.Subscript)
        if subscript is None or not any(
            isinstance(element.slice, cst.Slice) and self.context.inside(use, element.slice)
            for element in subscript.slice
        ):
            return None
        tensor = self.context.source(subscript.value)
        batch = next((w for w in plan.windows if plan.uses.get(id(w)) == tensor), None)
        if batch is None:
            return None
        source = self.context.source
        return (
            f"`{source(subscript)}` (line {self.context.line(subscript)}) is a second window of `{tensor}` at "
            f"another offset than the batch `{source(batch)}` (inputs and their shifted targets from one stream), "
            "which a TensorDataset cannot express: its batches take the same rows of every tensor"
        )

    def _selects_rows(self, plan: WindowPlan, window: cst.Subscript) -> bool:
        """Does the window pick rows of other data: `X[order[i:i + bs]]`, or `idx = order[i:i + bs]`
        and then `X[idx]`?"""
        parents = self.context.parents
        if isinstance(parents.get(parents.get(window)), cst.SubscriptElement):
            return True
        target = _name_bound_to(window, parents)
        if target is None:
            return False
        return any(
            isinstance(parents.get(read), cst.Index)
            for read in self._names(plan.loop.body, target.value)
            if read is not target
        )

    def _unlike_a_loader(self, plan: WindowPlan) -> str | None:
        """Why the windows are not what a DataLoader over the data gives, if they are not."""
        source = self.context.source
        if plan.dimension is not None:
            subscript, dimension = plan.dimension
            return (
                f"`{source(subscript)}` cuts windows along dimension {dimension}, not batches of samples "
                "along the first"
            )
        if plan.index_array is not None:
            return (
                f"the rows of {' / '.join(f'`{t}`' for t in plan.tensors)} are picked through `{plan.index_array}`, "
                "which perfmod cannot tell is a fresh `torch.randperm(n)` each epoch (the order a "
                "DataLoader(shuffle=True) gives)"
            )
        if plan.shorter is not None:
            return (
                f"the windows `{source(plan.shorter)}` are not all `{source(plan.batch_size)}` long, "
                "unlike a DataLoader's batches"
            )
        return None

    def _loop_item(self, expr: cst.BaseExpression, depth: int) -> bool:
        """Is `expr` one item of something a loop walks (`for xb, yb in loader`, `xb, yb =
        next(it)`, `x = batch[0]`), so that slicing it cuts a batch, not a dataset? A
        generator's parameter is one when every call passes one."""
        if not isinstance(expr, cst.Name) or depth > 3:
            return False
        context = self.context
        parameter = context.bindings.param_of(expr)
        if parameter is not None:
            function, param = parameter
            callers = context.kinds.callers(function) or ()
            passed = [context.kinds.argument(call, function, param, offset) for call, offset in callers]
            return bool(passed) and all(p is not None and self._loop_item(p, depth + 1) for p in passed)
        assignments = context.bindings.assignments(expr)
        if not assignments:
            return False
        for assignment in assignments:
            if isinstance(context.bindings.statement(assignment.node), (cst.For, cst.CompFor)):
                continue
            value = context.bindings.assigned_value(assignment)
            if value is None:
                unpacked = context.bindings.unpacked(assignment)
                value = unpacked[0] if unpacked is not None else None
            if isinstance(value, cst.Subscript):
                value = value.value
            if isinstance(value, cst.Call) and context.names.is_(value.func, *NEXT):
                continue
            if not self._loop_item(value, depth + 1):
                return False
        return True

    def _window_dimension(self, subscript: cst.Subscript, window: Window) -> int | None:
        """The dimension `subscript` cuts a window along (`X[i:i + bs]`: 0, `X[:, i:i + n]`:
        1), the other dimensions taken whole; None when it is no window."""
        found = None
        for position, element in enumerate(subscript.slice):
            part = element.slice
            if m.matches(part, window.matches):
                if found is not None:
                    return None
                found = position
            elif not (isinstance(part, cst.Slice) and part.lower is None and part.upper is None and part.step is None):
                return None
        return found

    def _permutation(self, name: str, loop: cst.For) -> str | None:
        """`name` when it is bound once, by `torch.randperm(n)`, before the step loop."""
        values = self._values(name, loop)
        if values is None or len(values) != 1:
            return None
        value = values[0]
        if isinstance(value, cst.Call) and self.context.names.is_(value.func, "torch.randperm"):
            return name
        return None

    def _permuted_uses(self, plan: WindowPlan, window: cst.Subscript) -> str | None:
        """`X[perm[i:i + bs]]`, or `idx = perm[i:i + bs]` and then only `X[idx]`."""
        parents = self.context.parents
        holder = _holder(window, parents)
        if holder is not None:
            plan.uses[id(holder)] = holder.value.value
            _append_once(plan.tensors, holder.value.value)
            return None
        target = _name_bound_to(window, parents)
        if target is None:
            return "a slice of the permutation is used in a way the rule does not follow"
        statement = parents[window]
        if not (isinstance(parents.get(statement), cst.SimpleStatementLine) and len(parents.get(statement).body) == 1):
            return "the permutation is sliced on a line that does more"
        index = target.value
        plan.uses[id(statement)] = ""  # the `idx = perm[...]` statement goes
        for read in self._names(plan.loop.body, index):
            if read is target:
                continue
            holder = _holder(read, parents)
            if holder is None:
                return f"the batch indices `{index}` are used for more than indexing (line {self.context.line(read)})"
            plan.uses[id(holder)] = holder.value.value
            _append_once(plan.tensors, holder.value.value)
        return None

    def _on_device(self, plan: WindowPlan, name: str) -> bool:
        fact = self.context.kinds.fact(self._a_use(plan, name).value)
        return fact.kind is Kind.TENSOR and fact.place in (Place.CUDA, Place.DEVICE)

    def _check(self, plan: WindowPlan) -> str | None:
        kinds = self.context.kinds
        for name in plan.tensors:
            if self._on_device(plan, name):
                return ""
        for name in plan.tensors:
            use = self._a_use(plan, name)
            fact = kinds.fact(use.value)
            if fact.kind is not Kind.TENSOR or fact.place is not Place.HOST:
                return f"`{name}` is not known to be a tensor in host memory"
            if not isinstance(use.value, cst.Name):
                continue  # `self.X` in a generator: reported, never rewritten
            if bound_in(self.context, name, plan.loop):
                return f"`{name}` is re-bound inside the loop"
            if kinds.is_mutated_in_place(use.value):
                return f"`{name}` is written in place, and its batches would no longer be views of it"
        if plan.permutation is not None and not self._drawn_per_epoch(plan):
            epoch = self._epoch_function(plan)
            if epoch is not None:
                return (
                    f"the permutation is drawn on each call of `{epoch.name.value}`, which its callers make once "
                    "an epoch: the DataLoader that replaces it belongs where those calls are, outside the function"
                )
            return (
                "the permutation is drawn once and reused in every epoch, and a DataLoader with shuffle=True "
                "would draw a new one each epoch"
            )
        if not self._covers(plan):
            return (
                f"the range `{self.context.source(plan.window.n)}` is not the length of "
                f"{' / '.join(f'`{t}`' for t in plan.tensors)}, so the batches may not cover the data"
            )
        targets = [statement.targets[0].target for statement in self._batch_statements(plan).values()]
        for line in _lines(plan.loop.body):
            if _unpacks_only_batches(line, plan.uses):
                targets += [element.value for element in line.body[0].targets[0].target.elements]
        return self.loader_blocked(targets)

    def _drawn_per_epoch(self, plan: WindowPlan) -> bool:
        """Is `perm = torch.randperm(n)` inside a loop around the step loop (a new one per epoch)?"""
        scope = self.context.scopes.get(plan.loop)
        binding = next(iter(scope.assignments[plan.permutation])).node
        for current in self.context.index.ancestors(plan.loop):
            if isinstance(current, SCOPES):
                break
            if isinstance(current, (cst.For, cst.While)) and self.context.inside(binding, current):
                return True
        return False

    def _epoch_function(self, plan: WindowPlan) -> cst.FunctionDef | None:
        """The function around the step loop (`train_one_epoch`) when every caller calls it in
        a loop: its permutation is drawn anew for each pass over the data, by each call."""
        function = self.context.index.first_enclosing(plan.loop, cst.FunctionDef)
        calls = self.context.loops.call_sites(function) if function is not None else []
        return function if calls and all(self.context.index.enclosing_loops(call) for call in calls) else None

    def _a_use(self, plan: WindowPlan, name: str) -> cst.Subscript:
        for node in self.context.index.find(cst.Subscript, within=plan.loop.body):
            if plan.uses.get(id(node)) == name:
                return node
        raise AssertionError(name)

    def _covers(self, plan: WindowPlan) -> bool:
        """Is n the length of one of the tensors: spelled so (directly or through one name),
        or the size the tensor was made with?"""
        n, source = plan.window.n, self.context.source
        candidates = [n]
        if isinstance(n, cst.Name):
            values = self._values(n.value, plan.loop)
            if values is not None and len(values) == 1:
                candidates.append(values[0])
        if plan.permutation is not None:
            perm_n = positional(self._values(plan.permutation, plan.loop)[0], 0)
            if perm_n is None or not perm_n.value.deep_equals(n):
                return False
        lengths = {spelled for t in plan.tensors for spelled in _lengths(t)}
        if any(_normalized(source(c)) in lengths for c in candidates):
            return True
        return self._made_with_length(plan) or self._first_rows_of_longer(plan, candidates)

    def _made_with_length(self, plan: WindowPlan) -> bool:
        """`n = 100` and `X = torch.randn(n, 7)`: is n the size one of the tensors was made with?"""
        n, shapes = plan.window.n, layouts(self.context)
        spellings = [n]
        if isinstance(n, cst.BinaryOperation) and isinstance(n.operator, cst.Multiply):
            spellings.append(n.with_changes(left=n.right, right=n.left))  # `STEPS * B` is `B * STEPS`
        for tensor in plan.tensors:
            shape = shapes.shape(self._a_use(plan, tensor).value)
            if shape and any(shapes.same_size(spelled, shape[0]) for spelled in spellings):
                return True
        return False

    def _first_rows_of_longer(self, plan: WindowPlan, candidates: list[cst.BaseExpression]) -> bool:
        """`X = T[:n]` holds the first n rows when n is at most len(T): `n = int(0.9 * len(T))`,
        `len(T) - k`."""
        source = self.context.source
        spelled = {_normalized(source(c)) for c in candidates}
        for tensor in plan.tensors:
            values = self._values(tensor, plan.loop)
            value = values[0] if values is not None and len(values) == 1 else None
            upper = _first_rows_bound(value)
            if upper is None or _normalized(source(upper)) not in spelled:
                continue
            if any(self._at_most_length(c, value.value) for c in candidates):
                return True
        return False

    def _at_most_length(self, n: cst.BaseExpression, owner: cst.BaseExpression) -> bool:
        """Is `n` at most the length of `owner`: `int(0.9 * len(T))`, `len(T) - k`, `len(T) // 2`?"""
        length = _lengths(self.context.source(owner))
        if isinstance(n, cst.Call) and self.context.names.is_(n.func, "int", "builtins.int") and len(n.args) == 1:
            n = n.args[0].value
        if isinstance(n, cst.BinaryOperation):
            left, right = _normalized(self.context.source(n.left)), _normalized(self.context.source(n.right))
            if isinstance(n.operator, cst.Multiply):
                factor = n.left if right in length else n.right if left in length else None
                fraction = number_value(factor)
                return fraction is not None and 0 <= fraction <= 1
            if isinstance(n.operator, cst.Subtract):
                return left in length and isinstance(n.right, cst.Integer)
            if isinstance(n.operator, cst.FloorDivide):
                return left in length and (integer_value(n.right) or 0) >= 1
        return False

    def _carried_state(self, plan: WindowPlan) -> str | None:
        """A value carried from the previous iteration (read before the body binds it,
        or computed from such a value) that meets this batch in one statement:
        `hidden = hidden.detach(); out, hidden = model(xb, hidden)`. Counters and
        running sums (`total = total + loss.item()`) never meet the batch itself."""
        lines = _flat(_lines(plan.loop.body))
        batch_names = {s.targets[0].target.value for s in self._batch_statements(plan).values()}
        for line in lines:
            if _unpacks_only_batches(line, plan.uses):
                batch_names |= {e.value.value for e in line.body[0].targets[0].target.elements}
            elif _copies_a_batch(line, plan.uses):  # `data = X[:, i:i + n].to(device)`
                batch_names.add(line.body[0].targets[0].target.value)
        bound_in_body = set().union(*(self._bound_names(line) for line in lines))
        bound_so_far: set[str] = _target_names(plan.loop.target)
        carried: set[str] = set()
        for line in lines:
            read_nodes = names_read(line)
            reads = {n.value for n in read_nodes}
            carried |= (reads - bound_so_far) & bound_in_body - batch_names
            binds = self._bound_names(line)
            hit = reads & carried
            if hit and (
                {n.value for n in read_nodes if not self._reads_metadata(n)} & batch_names
                or any(id(n) in plan.uses for n in self.context.index.find(cst.Subscript, within=line))
            ):
                return sorted(hit)[0]
            carried = carried | binds if hit else carried - binds
            bound_so_far |= binds
        return None

    def _reads_metadata(self, name: cst.Name) -> bool:
        """Does this read of `name` take only what a tensor tells of itself without its
        values (`x.size(0)`, `x.shape`, `len(x)`): a count of samples, no state of them?"""
        parent = self.context.parents.get(name)
        if isinstance(parent, cst.Attribute) and parent.value is name:
            return parent.attr.value in METADATA_ATTRIBUTES | METADATA_METHODS
        call = self.context.parents.get(parent) if isinstance(parent, cst.Arg) else None
        return isinstance(call, cst.Call) and self.context.names.is_(call.func, "len", "builtins.len")

    def _batch_statements(self, plan: WindowPlan) -> dict[str, cst.Assign]:
        """tensor -> `xb = X[...]` statement whose value is exactly one use (its name becomes the loop variable)."""
        found: dict[str, cst.Assign] = {}
        parents = self.context.parents
        for node in self.context.index.find(cst.Subscript, within=plan.loop.body):
            tensor = plan.uses.get(id(node))
            if not tensor or tensor in found:
                continue
            statement = parents.get(node)
            if (
                isinstance(statement, cst.Assign)
                and len(statement.targets) == 1
                and isinstance(statement.targets[0].target, cst.Name)
                and isinstance(parents.get(statement), cst.SimpleStatementLine)
                and len(parents.get(statement).body) == 1
                and parents.get(parents.get(statement)) is plan.loop.body
            ):
                found[tensor] = statement
        return found

    def _copied_batches(self, plan: WindowPlan, variables: dict[str, str]) -> dict[str, str]:
        """tensor -> `xb` for a tensor used once, in `xb = X[...].to(device)` or
        `xb, yb = X[...].to(device), Y[...].to(device)` (method calls only) on the body's
        own level, where `xb` is not read before: the loop binds the batch to `xb` and the
        line copies it in place, as a prefetcher expects."""
        found: dict[str, str] = {}
        once = {t for t in plan.tensors if sum(1 for u in plan.uses.values() if u == t) == 1}
        read_before: set[str] = set()
        for line in _lines(plan.loop.body):
            for target, value in _assigned_pairs(line):
                tensor = plan.uses.get(id(_receiver(value)))
                name = target.value
                taken = name in variables.values() or name in found.values() or name in read_before
                if tensor in once and tensor not in variables and tensor not in found and not taken:
                    found[tensor] = name
            read_before |= {n.value for n in names_read(line)}
        return found

    def _drops_last(self, counter: cst.Call, n: cst.BaseExpression, width: cst.BaseExpression) -> bool | None:
        """Whether the loop `counter` counts the full batches only (`range(n // bs)`), or
        every batch with a shorter last one (`range((n + bs - 1) // bs)`, `range(0, n, bs)`);
        None when it counts something else."""
        args = [a.value for a in counter.args]
        if len(args) == 3:
            return (
                False if integer_value(args[0]) == 0 and args[1].deep_equals(n) and args[2].deep_equals(width) else None
            )
        if len(args) != 1:
            return None
        count = self._single_value(args[0])
        if not (isinstance(count, cst.BinaryOperation) and isinstance(count.operator, cst.FloorDivide)):
            return None
        if not count.right.deep_equals(width):
            return None
        top = count.left
        if top.deep_equals(n):
            return True
        source = self.context.source
        ceiling = _normalized(f"({source(n)}+{source(width)}-1)")
        parenthesized = top.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        return False if _normalized(source(parenthesized)) == ceiling else None

    def _permutation_line(self, batch: ListBatch, anchor: cst.CSTNode) -> cst.CSTNode | None:
        """The line `perm = torch.randperm(n)` when the window was its only read and it runs
        inside the rewritten code; None to keep it."""
        parents = self.context.parents
        name = _name_bound_to(batch.permutation, parents)
        line = parents.get(parents.get(batch.permutation))
        if name is None or not (
            isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 and self.context.inside(line, anchor)
        ):
            return None
        reads = [read for read in names_read(anchor) if read.value == name.value]
        return line if len(reads) == 1 and reads[0] is batch.window.sequence else None

    # -- names and values ----------------------------------------------------------------

    def _names(self, node: cst.CSTNode, name: str) -> list[cst.Name]:
        """The Name nodes spelled `name` under `node` (not an attribute's name: `opt.step`)."""
        parents = self.context.parents
        return [
            n
            for n in self.context.index.find(cst.Name, within=node)
            if n.value == name and not (isinstance(parents.get(n), cst.Attribute) and parents[n].attr is n)
        ]

    def _bound_names(self, line: cst.CSTNode) -> set[str]:
        """Names that the assignments of `line` bind (`a.b = ...` and `a[i] = ...` bind none)."""
        names: set[str] = set()
        for statement in self.context.index.find((cst.AssignTarget, cst.AugAssign, cst.AnnAssign), within=line):
            names |= _target_names(statement.target)
        return names

    def _values(self, name: str, loop: cst.CSTNode) -> list[cst.BaseExpression] | None:
        """The values of every plain assignment to `name` in the scope of `loop`, the element
        of a literal for `a, b = x, y`."""
        scope = self.context.scopes.get(loop)
        if scope is None or name not in scope:
            return None
        values = []
        bindings = self.context.bindings
        for assignment in scope.assignments[name]:
            if type(assignment) is not Assignment:
                return None
            value = bindings.assigned_value(assignment)
            if value is None:
                unpacked = bindings.unpacked(assignment)
                if (
                    unpacked is None
                    or not isinstance(unpacked[0], (cst.Tuple, cst.List))
                    or unpacked[1] >= len(unpacked[0].elements)
                    or not isinstance(unpacked[0].elements[unpacked[1]], cst.Element)
                ):
                    return None
                value = unpacked[0].elements[unpacked[1]].value
            values.append(value)
        return values

    def _single_value(self, expr: cst.BaseExpression) -> cst.BaseExpression:
        """The value a name is bound to when it is bound once, else the expression itself."""
        if isinstance(expr, cst.Name):
            bound = self.context.bindings.values(expr)
            if bound is not None and len(bound) == 1:
                return bound[0]
        return expr

    def _consumers(self, call: cst.Call) -> list[cst.CSTNode]:
        """The step loops that iterate the generator `call` makes (`for b in batches(...)`,
        through enumerate/zip/tqdm), or the `next(it)` calls of step loops on it (`it =
        batches(...)`)."""
        context = self.context
        loaders, parents = context.loaders, context.parents
        if self._step_loops is None:
            self._step_loops = {id(loop) for loop in context.loops.step_loops}
        loop = context.index.first_enclosing(call, (cst.For, *SCOPES))
        if isinstance(loop, cst.For) and context.inside(call, loop.iter):
            iterated = any(iterable is call for iterable, _ in loaders.iterated(loop.iter, loop.target))
            return [loop] if iterated and id(loop) in self._step_loops else []
        target = _name_bound_to(call, parents)
        scope = context.scopes.get(target) if target is not None else None
        if scope is None:
            return []
        found: list[cst.CSTNode] = []
        for assignment in scope.assignments[target.value]:
            if assignment.node is not target:
                continue
            for access in assignment.references:
                user = parents.get(parents.get(access.node))
                if (
                    isinstance(user, cst.Call)
                    and context.names.is_(user.func, *NEXT)
                    and context.loops.step_loop_of(user) is not None
                ):
                    found.append(user)
                loop = parents.get(access.node)
                if isinstance(loop, cst.For) and loop.iter is access.node and id(loop) in self._step_loops:
                    found.append(loop)
        return found


def names_in(code: str) -> set[str]:
    """Every word of `code`: the names a new name must not take."""
    return set(re.findall(r"\w+", code))


def _lengths(tensor: str) -> set[str]:
    return {_normalized(f"len({tensor})"), _normalized(f"{tensor}.size(0)"), _normalized(f"{tensor}.shape[0]")}


def _holder(node: cst.CSTNode, parents) -> cst.Subscript | None:
    """`X` of `X[node]`: a Name subscripted by `node` alone."""
    element = parents.get(parents.get(node))
    holder = parents.get(element) if isinstance(element, cst.SubscriptElement) else None
    if isinstance(holder, cst.Subscript) and isinstance(holder.value, cst.Name) and len(holder.slice) == 1:
        return holder
    return None


def _receiver(value: cst.BaseExpression) -> cst.BaseExpression:
    """`X[...]` of `X[...].to(device).float()`: the value under a chain of method calls."""
    while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
        value = value.func.value
    return value


def _window_part(subscript: cst.Subscript) -> cst.SubscriptElement:
    return next(e for e in subscript.slice if not (isinstance(e.slice, cst.Slice) and e.slice.lower is None))


def _first_rows_bound(value: cst.BaseExpression | None) -> cst.BaseExpression | None:
    """`n` of `T[:n]` (or `T[0:n]`): the count of first rows a slice takes; None for another value."""
    if not (isinstance(value, cst.Subscript) and len(value.slice) == 1 and isinstance(value.slice[0].slice, cst.Slice)):
        return None
    part = value.slice[0].slice
    if part.lower is not None and integer_value(part.lower) != 0:
        return None
    return part.upper if part.step is None else None


def _is_name(node: cst.CSTNode, name: str) -> bool:
    return isinstance(node, cst.Name) and node.value == name


def _step_bounds(i: str, bs: cst.BaseExpression, one: m.BaseMatcher):
    """Matchers of `i * bs` and `(i + 1) * bs`: the bounds of the `i`-th window of `bs`."""
    lower = m.BinaryOperation(left=m.Name(i), operator=m.Multiply(), right=_equal_to(bs))
    upper = m.BinaryOperation(
        left=m.BinaryOperation(left=m.Name(i), operator=m.Add(), right=one),
        operator=m.Multiply(),
        right=_equal_to(bs),
    )
    return lower, upper


def _equal_to(expr: cst.BaseExpression) -> m.BaseMatcher:
    return m.MatchIfTrue(lambda node: node.deep_equals(expr))


def _normalized(code: str) -> str:
    return re.sub(r"\s+", "", code)


def _append_once(items: list[str], item: str) -> None:
    if item not in items:
        items.append(item)


def _flat(lines: list[cst.CSTNode]) -> list[cst.CSTNode]:
    """The statements of `lines` in the order they run, `with` blocks opened (their body
    runs once, in order); other compound statements stay whole."""
    flat = []
    for line in lines:
        if isinstance(line, cst.With) and isinstance(line.body, cst.IndentedBlock):
            flat.extend(_flat(list(line.body.body)))
        else:
            flat.append(line)
    return flat


def _lines(block: cst.BaseSuite) -> list[cst.CSTNode]:
    return list(block.body) if isinstance(block, cst.IndentedBlock) else [block]


def _target_names(target: cst.BaseExpression) -> set[str]:
    if isinstance(target, cst.Name):
        return {target.value}
    if isinstance(target, (cst.Tuple, cst.List)):
        return set().union(*(_target_names(element.value) for element in target.elements))
    return set()


def _unpacks_only_batches(line: cst.CSTNode, uses: dict[int, str]) -> bool:
    """`xb, yb = X[i:i + bs], Y[i:i + bs]`: a tuple of names from a tuple of batch uses."""
    if not (isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 and isinstance(line.body[0], cst.Assign)):
        return False
    assign = line.body[0]
    if len(assign.targets) != 1:
        return False
    target, value = assign.targets[0].target, assign.value
    if not (
        isinstance(target, cst.Tuple) and isinstance(value, cst.Tuple) and len(target.elements) == len(value.elements)
    ):
        return False
    return all(isinstance(t.value, cst.Name) and uses.get(id(v.value)) for t, v in zip(target.elements, value.elements))


def _copies_a_batch(line: cst.CSTNode, uses: dict[int, str]) -> bool:
    """`name = X[i:i + bs]` followed by method calls only (`.to(device)`, `.float()`)."""
    pairs = _assigned_pairs(line)
    return (
        len(pairs) == 1 and isinstance(line.body[0].targets[0].target, cst.Name) and id(_receiver(pairs[0][1])) in uses
    )


def _name_bound_to(value: cst.CSTNode, parents) -> cst.Name | None:
    """`name` of a plain `name = value` statement whose value is `value`."""
    statement = parents.get(value)
    if (
        isinstance(statement, cst.Assign)
        and len(statement.targets) == 1
        and isinstance(statement.targets[0].target, cst.Name)
    ):
        return statement.targets[0].target
    return None


def _assigned_pairs(line: cst.CSTNode) -> list[tuple[cst.Name, cst.BaseExpression]]:
    """(name, value) of `a = v` and `a, b = v, w`: one target, names only, no starred items."""
    if not (isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 and isinstance(line.body[0], cst.Assign)):
        return []
    assign = line.body[0]
    if len(assign.targets) != 1:
        return []
    target, value = assign.targets[0].target, assign.value
    if isinstance(target, cst.Name):
        return [(target, value)]
    if not (isinstance(target, (cst.Tuple, cst.List)) and isinstance(value, (cst.Tuple, cst.List))):
        return []
    if len(target.elements) != len(value.elements):
        return []
    pairs = []
    for t, v in zip(target.elements, value.elements):
        if not isinstance(t, cst.Element) or not isinstance(v, cst.Element) or not isinstance(t.value, cst.Name):
            return []
        pairs.append((t.value, v.value))
    return pairs
