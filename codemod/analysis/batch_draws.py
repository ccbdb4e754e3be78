"""Random batches drawn afresh on every training step.

`idx = torch.randint(0, len(X), (bs,))` followed by `X[idx]`, `random.sample(texts, k)`,
`np.random.choice(len(X), k)`, also through a generator object (`rng =
random.Random(0)`, `rng.sample(...)`; `np.random.default_rng()`), in a step loop or in a
function of the file that a step loop runs once per step: each step trains on samples
drawn with replacement across steps, where a DataLoader with `shuffle=True` would visit
every sample once per epoch.

- `batch_draws(context).of(call)`: the BatchDraw `call` is, or None: a draw of the
  table `torch_facts.BATCH_DRAWS` (or a generator's method that works as one) whose
  range is the length of data it picks samples of (`torch.randint(0, T, ...)` draws
  timesteps, not samples), that draws the samples themselves or whose indices pick
  samples of that data (`X[idx]`, `X[i:i + n]` for each `i` of them) where it runs, and
  that runs on every step: in a step loop (`function` None), or in a function whose
  per-step callers `sites` lists (batch_windows' `per_step_sites`). Where the range is
  not spelled as a length, the data are those its indices pick rows of whose first size
  is the range, one of them of two dims or more, and that the indices do nothing else (`torch.randint(0, args.n, (bs,))`, `X =
  torch.randn(args.n, d)`; a vector alone may be a schedule a timestep indexes); the
  indices may be kept as a list (`idx = torch.randint(...).tolist()`).
- `BatchDraw.spelled`: how a message names the draw (`np.random.choice`, `rng.sample`).

Built once per file (FileContext.shared).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import libcst as cst

from codemod.analysis.batch_windows import batch_windows
from codemod.analysis.names import kwarg
from codemod.analysis.sample_loops import sample_loops
from codemod.analysis.tensor_layout import layouts
from codemod.analysis.torch_facts import (
    BATCH_DRAWS,
    GENERATOR_BATCH_DRAWS,
    GENERATOR_CONSTRUCTORS,
    POPULATION_DRAWS,
)

if TYPE_CHECKING:
    from codemod.context import FileContext

KEY = "batch_draws"
RANGE = ("range", "builtins.range")
MAX_DEPTH = 3  # how far a generator object is followed through names and arguments


def batch_draws(context: FileContext) -> BatchDraws:
    return context.shared(KEY, BatchDraws)


class BatchDraw(NamedTuple):
    """`call` draws a new random batch on every step (see the module's docstring)."""

    call: cst.Call
    spelled: str
    function: cst.FunctionDef | None  # the function that draws, when not the step loop itself
    sites: tuple[cst.CSTNode, ...]  # where the step loops run that function


class BatchDraws:
    """The per-step random batch draws of one file (see the module's docstring)."""

    def __init__(self, context: FileContext) -> None:
        self.context = context

    def of(self, call: cst.Call) -> BatchDraw | None:
        key = self.draw_kind(call)
        if key is None:
            return None
        context = self.context
        loop = context.loops.step_loop_of(call)
        function = None
        if loop is None:
            function = context.index.first_enclosing(call, (cst.FunctionDef, cst.Lambda, cst.ClassDef))
            if not isinstance(function, cst.FunctionDef):
                return None
        region = loop.body if loop is not None else function.body
        data, direct = self._sampled_data(call, key)
        if not data:  # `torch.randint(0, args.n, ...)` picking rows of `X = torch.randn(args.n, d)`
            data, direct = self._data_of_size(call, key, region), False
        if not data or not (direct or self._indexes(call, data, region)):
            return None
        spelled = context.source(call.func) if self._method_draw(call) else BATCH_DRAWS[key]
        if loop is not None:
            return BatchDraw(call, spelled, None, ())
        sites = batch_windows(context).per_step_sites(function)
        return BatchDraw(call, spelled, function, tuple(sites)) if sites else None

    def draw_kind(self, call: cst.Call) -> str | None:
        """The key of BATCH_DRAWS that `call` is: a function of `random`, numpy or torch,
        or a method of a generator object (`rng = random.Random(0)`; `rng.sample(...)`)."""
        key = self._method_draw(call)
        if key is not None:
            return key
        names = self.context.names.of(call.func) & BATCH_DRAWS.keys()
        return min(names) if names else None

    def _method_draw(self, call: cst.Call) -> str | None:
        func = call.func
        if not (isinstance(func, cst.Attribute) and func.attr.value in GENERATOR_BATCH_DRAWS):
            return None
        family = self.generator_family(func.value)
        return GENERATOR_BATCH_DRAWS[func.attr.value].get(family) if family is not None else None

    def generator_family(self, expr: cst.BaseExpression, depth: int = 0) -> str | None:
        """The family of the random generator object `expr` is ("random", "numpy"): bound to
        `random.Random(...)` / `np.random.default_rng(...)` / `np.random.RandomState(...)`,
        through names, `self.` attributes and the arguments of this file's calls."""
        if depth > MAX_DEPTH:
            return None
        context = self.context
        if isinstance(expr, cst.Call):
            for family, constructors in GENERATOR_CONSTRUCTORS.items():
                if context.names.is_(expr.func, *constructors):
                    return family
            return None
        values: list[cst.BaseExpression] = []
        if isinstance(expr, cst.Name):
            parameter = context.bindings.param_of(expr)
            if parameter is not None:
                function, param = parameter
                for call, offset in context.kinds.callers(function) or ():
                    passed = context.kinds.argument(call, function, param, offset)
                    if passed is None:
                        return None
                    values.append(passed)
            else:
                values = context.bindings.values(expr) or []
        elif isinstance(expr, cst.Attribute):
            values = context.kinds.attribute_values(expr) or []
        families = {self.generator_family(value, depth + 1) for value in values}
        return families.pop() if len(families) == 1 else None

    def _sampled_data(self, call: cst.Call, key: str) -> tuple[set[str], bool]:
        """(the names of the data `call` draws sample indices for, whether it draws the samples
        themselves): `torch.randint(0, len(X), ...)`, `random.sample(range(len(texts)), k)`,
        `random.sample(texts, k)`, `np.random.choice(len(X), k)`; empty when the range is not
        the length of something (`torch.randint(0, T, ...)`: timesteps, not samples)."""
        args = [a.value for a in call.args if a.keyword is None and not a.star]
        if key in POPULATION_DRAWS:
            population = args[0] if args else None
            if population is None:
                return set(), False
            if isinstance(population, cst.Call) and self.context.names.is_(population.func, *RANGE):
                bound = [a.value for a in population.args]
                return (self._lengths_of(bound[-1] if len(bound) <= 1 else bound[1]) if bound else set()), False
            if isinstance(population, cst.Name):
                lengths = self._lengths_of(population)  # `np.random.choice(n, k)`, n = len(X)
                return (lengths, False) if lengths else ({population.value}, True)
            if isinstance(population, cst.Attribute) and isinstance(population.value, cst.Name):
                return {self.context.source(population)}, True  # `rng.sample(self.examples, k)`
            return self._lengths_of(population), False
        bound = self._high(call, key)
        return (self._lengths_of(bound), False) if bound is not None else (set(), False)

    def _high(self, call: cst.Call, key: str) -> cst.BaseExpression | None:
        """The exclusive upper bound of an integer draw (`torch.randint(0, n, ...)`: n);
        None for a draw from a population."""
        if key in POPULATION_DRAWS:
            return None
        args = [a.value for a in call.args if a.keyword is None and not a.star]
        high = kwarg(call, "high")
        if high is not None:
            return high.value
        if len(args) >= 3 or (key == "numpy.random.randint" and len(args) >= 2 and kwarg(call, "size") is not None):
            return args[1]
        return args[0] if args else None

    def _data_of_size(self, call: cst.Call, key: str, region: cst.CSTNode) -> set[str]:
        """The names that the indices `call` draws (bound to one name) pick rows of in
        `region` (`X[idx]`), and whose first size is the draw's bound (`Layouts.same_size`)."""
        bound, index = self._high(call, key), self._index_name(call)
        if bound is None or index is None:
            return set()
        shapes = layouts(self.context)
        found, samples, picks = set(), False, set()
        for subscript in self.context.index.find(cst.Subscript, within=region):
            part = subscript.slice[0].slice if len(subscript.slice) == 1 else None
            if (
                isinstance(subscript.value, cst.Name)
                and isinstance(part, cst.Index)
                and isinstance(part.value, cst.Name)
                and part.value.value == index
                and shapes.same_size(bound, shapes.leading_size(subscript.value))
            ):
                found.add(subscript.value.value)
                picks.add(id(part.value))
                samples = samples or len(shapes.shape(subscript.value) or ()) >= 2
        reads = [n for n in self.context.index.find(cst.Name, within=region) if n.value == index]
        if any(id(read) not in picks for read in reads if not _bound_here(self.context, read)):
            return set()  # the indices are data too (`y = torch.randint(0, k, ...)`: labels of centers[y])
        # rows of at least one tensor of samples (`X` of (n, d)): a vector alone may be a
        # schedule indexed by timesteps (`alphas_bar[t]` with `t = torch.randint(0, T, (B,))`)
        return found if samples else set()

    def _index_name(self, call: cst.Call) -> str | None:
        """The name the draw's indices are bound to: `idx = torch.randint(...)`, also as a
        list (`idx = torch.randint(...).tolist()`)."""
        parents = self.context.parents
        drawn: cst.CSTNode = call
        parent = parents.get(call)
        if isinstance(parent, cst.Attribute) and parent.attr.value == "tolist":
            outer = parents.get(parent)
            if isinstance(outer, cst.Call) and outer.func is parent and not outer.args:
                drawn, parent = outer, parents.get(outer)
        if (
            isinstance(parent, cst.Assign)
            and parent.value is drawn
            and len(parent.targets) == 1
            and isinstance(parent.targets[0].target, cst.Name)
        ):
            return parent.targets[0].target.value
        return None

    def _lengths_of(self, bound: cst.BaseExpression) -> set[str]:
        """The names whose length `bound` is: `len(X)`, `X.shape[0]`, `X.size(0)`, `len(X) - k`,
        `n` where `n = len(X)`."""
        owner = sample_loops(self.context).batch_of_size(bound, less=True)
        return {owner.value} if isinstance(owner, cst.Name) else set()

    def _indexes(self, call: cst.Call, data: set[str], region: cst.CSTNode) -> bool:
        """Do the indices `call` draws pick samples of `data` in `region`: `X[idx]`, or
        `X[i]` / `X[i:i + n]` for each `i` of them (in a loop or a comprehension)?"""
        context = self.context
        parent = context.parents.get(call)
        if isinstance(parent, cst.Index):  # `X[torch.randint(...)]`
            subscript = context.index.first_enclosing(call, cst.Subscript)
            return subscript is not None and _is_data(subscript.value, data)
        index = self._index_name(call)
        if index is None:
            return False
        if self._subscripted_by(region, index, data, slices=False):
            return True
        for each in context.index.find((cst.CompFor, cst.For), within=region):
            if (
                isinstance(each.iter, cst.Name)
                and each.iter.value == index
                and isinstance(each.target, cst.Name)
                and self._subscripted_by(
                    context.parents.get(each) if isinstance(each, cst.CompFor) else each,
                    each.target.value,
                    data,
                    slices=True,
                )
            ):
                return True
        return False

    def _subscripted_by(self, node: cst.CSTNode, name: str, data: set[str], slices: bool) -> bool:
        """Is one of `data` subscripted under `node` by `name` (`X[name]`), or, with `slices`,
        by a slice that starts from it (`X[name:name + n]`, `X[name + 1:...]`)?"""
        for subscript in self.context.index.find(cst.Subscript, within=node):
            if len(subscript.slice) != 1 or not _is_data(subscript.value, data):
                continue
            part = subscript.slice[0].slice
            if isinstance(part, cst.Index) and isinstance(part.value, cst.Name) and part.value.value == name:
                return True
            if (
                slices
                and isinstance(part, cst.Slice)
                and part.lower is not None
                and any(n.value == name for n in self.context.index.find(cst.Name, within=part.lower))
            ):
                return True
        return False


def _bound_here(context: FileContext, name: cst.Name) -> bool:
    """Is `name` a target the assignment binds (`idx = ...`), not a read of it?"""
    target = context.parents.get(name)
    return isinstance(target, cst.AssignTarget) and target.target is name


def _is_data(expr: cst.BaseExpression, data: set[str]) -> bool:
    return isinstance(expr, cst.Name) and expr.value in data
