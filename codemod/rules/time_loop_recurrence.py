from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from codemod.analysis.names import integer_literal, integer_value, is_dotted_name, separated
from codemod.analysis.tensor_layout import SAME_SHAPE_FUNCTIONS, layouts, read_names
from codemod.analysis.time_loops import (
    ONE,
    Const,
    Lift,
    Lifter,
    LoopReader,
    New,
    Op,
    Prev,
    Read,
    State,
    Sym,
    TimeLoop,
    Unsupported,
    method,
    min_rank,
    moved,
    plus,
    same,
    states_in,
    to_right,
)
from codemod.edits import InsertBefore, Remove, Replace
from codemod.rule import Invalid, Level, Rule, Valid
from codemod.suppression import suppressed_on

PREAMBLE = "import torch\n"
SCAN_LOOP = """
def ema(a, x):
    h = torch.zeros_like(x[:, 0])
    hs = []
    for t in range(x.shape[1]):
        h = a[:, t] * h + x[:, t]
        hs.append(h)
    return torch.stack(hs, dim=1)
"""
SCAN_FIXED = """from runtime.kernels import linear_recurrence

def ema(a, x):
    h = torch.zeros_like(x[:, 0])
    return linear_recurrence(a[:, : x.shape[1]], x, h, dim=1)
"""
RWKV_LOOP = """
def wkv(r, k, v, w, u, state):
    outs = []
    for t in range(r.size(2)):
        kv = torch.einsum("bhk,bhv->bhkv", k[:, :, t], v[:, :, t])
        outs.append(torch.einsum("bhk,bhkv->bhv", r[:, :, t], state + u.unsqueeze(-1) * kv))
        state = w[:, :, t].unsqueeze(-1) * state + kv
    o = torch.stack(outs, dim=2)
    return o, state
"""
RWKV_FIXED = """from runtime.kernels import linear_attention

def wkv(r, k, v, w, u, state):
    o, state = linear_attention(
        r,
        k[:, :, : r.size(2)],
        v[:, :, : r.size(2)],
        w[:, :, : r.size(2)].movedim(2, -2),
        u=u,
        initial_state=state,
    )
    return o, state
"""
KERNELS = "runtime.kernels"
# Calls a state may go through in a loop that is still a (maybe non-linear) elementwise recurrence.
ELEMENTWISE_NAMES = frozenset(n.rsplit(".", 1)[1] for n in SAME_SHAPE_FUNCTIONS) | {
    "einsum",
    "matmul",
    "outer",
    "where",
}
TENSOR_METHODS_OK = frozenset(
    "unsqueeze squeeze transpose sum mean exp sigmoid tanh relu float to type_as mT softmax clamp abs neg sqrt"
    " matmul mul add sub div".split()
)


@dataclass
class _Plan:
    """How one loop becomes kernel calls."""

    statements: list[cst.BaseStatement] = field(default_factory=list)  # where the loop was
    kernels: set[str] = field(default_factory=set)
    names: dict[str, str] = field(default_factory=dict)  # state -> the name of its lifted states
    fresh: set[str] = field(default_factory=set)  # names the plan made up


@dataclass
class _Attention:
    """A state that is decayed linear attention: S = w * S + k^T v, read as r S over its key dim."""

    k: Sym
    v: Sym
    w: Sym | None  # the decay vector along the key dim, or a constant; None: no decay
    r: Sym
    mode: str  # "new" (GLA) or "prev" (RWKV)
    u: Sym | None  # the bonus (prev mode), None: none
    key: int  # where the key dim is in the state: -2 for (..., K, V), -1 for (..., V, K)
    x: Sym  # the update's outer product (a bonus multiplies it)
    rank: int | None = None  # the rank of one step's read-out
    state_rank: int | None = None


class TimeLoopRecurrence(Rule):
    """
    ## What it does
    Finds a Python loop over time steps that computes a linear recurrence, one
    step per iteration, and replaces it with one call of a `runtime.kernels`
    kernel that computes all steps at once: `linear_attention` for a matrix
    state updated by outer products and read by a query (GLA, RWKV-6, linear
    attention), `linear_recurrence` for any other state updated as
    `S = a * S + x` (EMAs, RWKV-4-style and selective-scan (Mamba) states).

    The loop is read as math, not matched as text: its step index may pick
    time on any dim (`x[t]`, `x[:, t]`, `k[:, :, t]`, `x[..., t]`,
    `x[:, t:t + 1]`, or `for x_t in x.unbind(1)`); heads may come before or
    after time; outer products may be written `k.unsqueeze(-1) *
    v.unsqueeze(-2)`, with `einsum` or as `k.mT @ v`; the state may be
    (B, H, K, V) or (B, H, V, K); read-outs may be `einsum`, `@` or
    `(r.unsqueeze(-1) * S).sum(-2)`, read before the update (with RWKV's bonus
    `u`, or none) or after it; decays may be constant, per channel or per
    step (`exp(-exp(w))`); the step's values may be collected with `append`
    and `torch.stack(..., dim=d)` or written into a preallocated tensor
    (`out[:, t] = ...`); the state itself may live in such a tensor, each
    step's slot computed from the one before (`h[:, t] = h[:, t - 1] * w +
    x[:, t]`, from the slot before the loop's first step, copied before the
    slots are written); and anything computed from the states and inputs
    elementwise, with sums over dims, `einsum`, `@` or `nn.Linear` is computed
    for all steps at once. The kernel gets its operands with the transposes
    their layout needs.

    ## Why is this bad?
    The loop launches a handful of small kernels per time step: at T = 2048
    that is ten thousand launches per layer and per direction, each on a
    (B, D) or (B, H, K, V) slice too small to fill a GPU, and autograd stores
    every step's state. The kernels do the same work in O(sqrt(T))
    sequential steps (a chunked scan; chunked linear attention whose chunks
    are matmuls), with a backward that does not keep every intermediate.
    A decay that is the same at every step (one per channel) takes a faster
    form, chunks of up to 64 steps whose decays are two scaled copies of the
    query and key and one matmul, as hand-written RWKV kernels do.
    torch has no eager scan (`torch._higher_order_ops.associative_scan` needs
    torch.compile), so the fix calls `runtime.kernels`, which run on CPU and on
    CUDA without extra packages. A cumulative-product shortcut
    (h_t = P_t cumsum(x / P)) is wrong in float32 once the decays multiply below
    1e-38; the runtime's scan only multiplies and adds. On GPUs such loops are
    launch-bound, and chunked kernels are reported one to two orders of
    magnitude faster at T in the thousands (flash-linear-attention, Yang et
    al. 2024). Measured on 2 CPU threads (`python -m benchmarks.bench_kernels
    --device cpu`, T = 512, forward + backward, fp32): linear attention
    (B=4, H=8, K=V=64) 21x faster than the loop, the scan (B=4, D=1024) 52x.

    ## Example
    ```python
    h = torch.zeros_like(x[:, 0])
    hs = []
    for t in range(x.shape[1]):
        h = a[:, t] * h + x[:, t]
        hs.append(h)
    y = torch.stack(hs, dim=1)
    ```
    Use instead:
    ```python
    h = torch.zeros_like(x[:, 0])
    y = linear_recurrence(a[:, :x.shape[1]], x, h, dim=1)  # a cut to the steps the loop read
    ```

    ## Fix safety
    Numeric: the kernels sum in another order (within 1e-15 of the loop in
    float64, 1e-6 in float32 relative to the largest value, for outputs and
    gradients; tests/runtime/test_scan.py, test_linear_attention.py,
    tests/rules/test_pm505_*), and compute float16/bfloat16 inputs in float32.
    The rewrite is exact math, proven from the code: every state's update
    must be affine in it (S = a * S + x with a and x free of S), the order of
    reads and updates is kept (a value read before the update is the state
    the step starts from), dims are followed through every operation, and
    where the rank of a tensor is not known the time dim is moved next to the
    dims an operation names (`movedim`), which holds for any rank. When the
    loop runs over fewer steps than the tensors hold (`range(T)` with T from
    elsewhere), the tensors are cut to those steps. The loop must run only
    assignments, the appends and slot writes; the list must be made empty
    just before the loop and read after it only by one `torch.stack`. A state
    read after the loop gets its last value. An empty loop (T = 0) raises in
    the kernel instead of doing nothing.

    Reported without a fix, with what differs: a state whose update is not
    linear in it (a nonlinearity around it, a product of two states), a
    reshape of a step value (which may mix heads), random numbers drawn in
    the loop, a value that may be a number or a tensor where that decides the
    layout, a temporary or the step index read after the loop, `break` or
    other statements in the body; and any loop in code TorchScript compiles or
    `torch.jit.trace` records (`@torch.jit.script`, a function or module passed
    to `torch.jit.script`/`trace`, what such code calls: codemod/analysis/
    torchscript.py), which cannot call the kernels; so for every rule whose fix
    calls `runtime`.
    """

    CODE = "PM505"
    NAME = "time-loop-recurrence"
    LEVEL = Level.NUMERIC
    REQUIRES = ("for",)
    MESSAGE = "a Python loop over time computes a linear recurrence; use a runtime.kernels kernel"
    GAIN = (
        "O(sqrt T) sequential steps instead of T: 21-52x on 2 CPU threads at T = 512 (bench_kernels), "
        "reported 10-100x on GPUs at T in the thousands"
    )

    VALID = [
        Valid(
            PREAMBLE
            + """
def rnn(W, x):
    h = torch.zeros_like(x[:, 0])
    hs = []
    for t in range(x.shape[1]):
        h = torch.tanh(h @ W + x[:, t])
        hs.append(h)
    return torch.stack(hs, dim=1)
""",
            "a non-linear recurrence",
        ),
        Valid(
            PREAMBLE
            + """
def train(model, opt, batches):
    ema = 0.0
    losses = []
    for step in range(100):
        loss = model(batches[step]).mean()
        ema = 0.9 * ema + 0.1 * loss.item()
        losses.append(ema)
    return losses
""",
            "a loss average, not a recurrence over a tensor's time dim",
        ),
    ]
    INVALID = [
        Invalid(PREAMBLE + SCAN_LOOP, PREAMBLE + SCAN_FIXED),
        Invalid(
            PREAMBLE + "\n@torch.jit.script" + SCAN_LOOP,
            None,
            "a scripted function: TorchScript cannot compile the kernel",
        ),
        Invalid(
            PREAMBLE
            + SCAN_LOOP.replace("def ema(a, x):", "def ema(a, x):\n    return _scan(a, x)\n\n\ndef _scan(a, x):")
            + "\nfast_ema = torch.jit.script(ema)\n",
            None,
            "a helper of a function passed to torch.jit.script",
        ),
        Invalid(
            PREAMBLE
            + "\n\nclass Decay(torch.nn.Module):\n"
            + SCAN_LOOP.replace("def ema(a, x):", "def forward(self, a, x):").replace("\n", "\n    ").rstrip(" ")
            + "\nmodel = torch.jit.script(Decay())\n",
            None,
            "a method of a module scripted as an instance",
        ),
        Invalid(
            PREAMBLE + SCAN_LOOP + "\ntraced = torch.jit.trace(ema, (torch.rand(2, 5), torch.rand(2, 5)))\n",
            None,
            "a traced function: the trace would freeze the kernel to one run",
        ),
        Invalid(PREAMBLE + RWKV_LOOP, RWKV_FIXED, "torch's import goes with its last use"),
        Invalid(
            PREAMBLE
            + """
def ema(a, x):
    h = torch.zeros_like(x[:, 0])
    hs = []
    for t in range(x.shape[1]):
        h = torch.tanh(a[:, t] * h + x[:, t])
        hs.append(h)
    return torch.stack(hs, dim=1)
""",
            None,
            "a nonlinearity around the update",
        ),
    ]

    def visit_For(self, node: cst.For) -> None:
        if not self._candidate(node):
            return
        reader = LoopReader(self.context)
        try:
            model = reader.read(node)
        except Unsupported as why:
            if self._looks_like_recurrence(node):
                self.report(node, f"a Python loop over time computes a recurrence, not rewritten: {why}")
            return
        if model is None or not model.states:
            return
        try:
            edits, kernels = self._rewrite(model)
        except Unsupported as why:  # read as a linear recurrence: worth saying why it stays
            self.report(node, f"a Python loop over time computes a recurrence, not rewritten: {why}")
            return
        block = self.context.parents.get(node)
        statements = list(block.body) if isinstance(block, (cst.IndentedBlock, cst.Module)) else [node]
        index = next(i for i, s in enumerate(statements) if s is node)
        if any(suppressed_on(s, self.CODE) for s in statements[max(index - 1, 0) : index + 2]):
            return
        names = ", ".join(f"runtime.kernels.{k}" for k in sorted(kernels))
        self.report(
            node,
            f"{self.MESSAGE} (it becomes {names})",
            edits=edits,
            imports=[(KERNELS, k) for k in sorted(kernels)],
            at=node,
        )

    # -- which loops -----------------------------------------------------------------

    def _candidate(self, loop: cst.For) -> bool:
        """A loop whose body assigns a name, or a slot of a tensor, it reads (a state), and
        that is not a training loop."""
        if not isinstance(loop.body, cst.IndentedBlock) or self.context.loops.is_training_loop(loop):
            return False
        assigned = set()
        for line in loop.body.body:
            if isinstance(line, cst.SimpleStatementLine):
                for small in line.body:
                    if isinstance(small, cst.Assign) and len(small.targets) == 1:
                        target = small.targets[0].target
                        if isinstance(target, cst.Subscript):
                            target = target.value
                        if isinstance(target, cst.Name):
                            assigned.add(target.value)
                    elif isinstance(small, cst.AugAssign) and isinstance(small.target, cst.Name):
                        assigned.add(small.target.value)
        return bool(assigned & read_names(self.context, loop.body))

    def _looks_like_recurrence(self, loop: cst.For) -> bool:
        """Worth reporting when not rewritten: a loop over a tensor's time dim (indexed
        `[:, t]`, `[..., t]`, or iterated with `unbind`) of simple statements, where a state
        is updated from its own value as `a * state (+ ...)`, with `a` free of the states (an
        RNN, whose gates read its state, is not a linear recurrence at all), or as
        `state + <outer product>`, and no state goes into a module or function call (an RNN
        cell)."""
        time = loop.target.value if isinstance(loop.target, cst.Name) else None
        if not isinstance(loop.body, cst.IndentedBlock) or not self._over_time(loop, time):
            return False
        if any(not isinstance(line, cst.SimpleStatementLine) for line in loop.body.body):
            return False
        assigned: dict[str, cst.BaseExpression] = {}
        for line in loop.body.body:
            for small in line.body:
                if (
                    isinstance(small, cst.Assign)
                    and len(small.targets) == 1
                    and isinstance(small.targets[0].target, cst.Name)
                ):
                    assigned.setdefault(small.targets[0].target.value, small.value)
        states = {name for name, value in assigned.items() if name in read_names(self.context, value)}
        if not states:
            return False
        for call in self.context.index.find(cst.Call, within=loop.body):
            if self._feeds_state(call, states, assigned):
                return False
        for name in sorted(states):
            value = assigned[name]
            for op in self.context.index.find(cst.BinaryOperation, within=value):
                sides = [op.left, op.right]
                if not any(isinstance(side, cst.Name) and side.value == name for side in sides):
                    continue
                other = op.right if isinstance(op.left, cst.Name) and op.left.value == name else op.left
                if isinstance(op.operator, cst.Multiply) and not self._reads_states(other, states, assigned):
                    return True
                if (
                    isinstance(op.operator, cst.Add)
                    and self._has_outer_or_decay(other)
                    and not self._reads_states(other, states - {name}, assigned)
                ):
                    return True
        return False

    def _reads_states(self, expr, states: set[str], assigned: dict, depth: int = 0) -> bool:
        """Does `expr` read a state, directly or through the loop's temporaries?"""
        names = read_names(self.context, expr) if expr in self.context.index else set()
        if names & states:
            return True
        return depth < 4 and any(
            self._reads_states(assigned[n], states, assigned, depth + 1)
            for n in names
            if n in assigned and n not in states
        )

    def _feeds_state(self, call: cst.Call, states: set[str], assigned: dict) -> bool:
        """Is a state (maybe through temporaries) an argument of a call that is not an
        elementwise torch function or tensor method?"""
        func = call.func
        names = self.context.names.of(func) if is_dotted_name(func) else set()
        if any(n.startswith("torch.") and n.rsplit(".", 1)[1] in ELEMENTWISE_NAMES for n in names):
            return False
        if isinstance(func, cst.Attribute) and not names and func.attr.value in TENSOR_METHODS_OK:
            return False
        if isinstance(func, cst.Attribute) and func.attr.value == "append":
            return False
        args = [a.value for a in call.args]
        if isinstance(func, cst.Attribute) and not names and not isinstance(func.value, cst.Name):
            args.append(func.value)
        return any(self._reads_states(a, states, assigned) for a in args)

    def _over_time(self, loop: cst.For, time: str | None) -> bool:
        """Does the loop index a tensor by its step (`x[:, t]`, `x[..., t]`, `x[t]` of a tensor),
        or iterate over one with `unbind`?"""
        if "unbind" in self.context.source(loop.iter):
            return True
        if time is None:
            return False
        layout = layouts(self.context)
        for subscript in self.context.index.find(cst.Subscript, within=loop.body):
            for position, element in enumerate(subscript.slice):
                stepped = (
                    isinstance(element.slice, cst.Index)
                    and isinstance(element.slice.value, cst.Name)
                    and element.slice.value.value == time
                    or isinstance(element.slice, cst.Slice)
                    and isinstance(element.slice.lower, cst.Name)
                    and element.slice.lower.value == time
                )
                if stepped and (position > 0 or layout.shape(subscript.value) is not None):
                    return True
        return False

    def _has_outer_or_decay(self, value: cst.BaseExpression) -> bool:
        """An outer product of step vectors, as people spell one."""
        code = self.context.source(value) if value in self.context.index else ""
        return "unsqueeze" in code or "einsum" in code or "None" in code or "@" in code or "outer" in code

    # -- rewriting ---------------------------------------------------------------------

    def _rewrite(self, model: TimeLoop):
        _LAYOUTS[0] = layouts(self.context)
        loop = model.loop
        order = self._order(model)
        attention = {name: self._attention(model, model.states[name]) for name in order}
        attention = {k: v for k, v in attention.items() if v is not None}
        outputs = self._outputs(model)
        final_reads = self._read_after(model)
        lifts: dict[tuple[str, str], Lift] = {}
        plan = _Plan()
        lifter = Lifter(self.context, model.steps, model.time, lifts)
        scope_names = self._scope_names(loop)
        # the values the loop collects, with read-outs of attention states made Read(state)
        values = {id(o): self._with_reads(o.value, attention) for o in model.outputs}
        updates = {
            name: (
                self._with_reads(s.a, attention) if s.a is not None else None,
                self._with_reads(s.x, attention) if s.x is not None else None,
            )
            for name, s in model.states.items()
        }
        uses = self._uses(model, values, updates, final_reads)
        for name in order:
            state = model.states[name]
            if name in attention:
                self._plan_attention(name, attention[name], lifter, lifts, plan, uses, scope_names, final_reads)
            else:
                self._plan_scan(name, state, updates[name], lifter, lifts, plan, uses, scope_names, final_reads)
        return self._edits(model, outputs, values, lifter, plan)

    def _order(self, model: TimeLoop) -> list[str]:
        """The states in an order where each comes after those its update reads."""
        needs = {name: {s for s, _ in states_in(state.update)} - {name} for name, state in model.states.items()}
        order: list[str] = []
        while len(order) < len(needs):
            ready = [n for n in sorted(needs) if n not in order and needs[n] <= set(order)]
            if not ready:
                raise Unsupported("the states' updates read each other")
            order.extend(ready)
        return order

    def _outputs(self, model: TimeLoop) -> dict[int, tuple]:
        """For each list output: (init statement, stack call, stack dim, cat) after the checks."""
        loop = model.loop
        found = {}
        block = self.context.parents.get(loop)
        statements = list(block.body) if isinstance(block, (cst.IndentedBlock, cst.Module)) else []
        index = next((i for i, s in enumerate(statements) if s is loop), None)
        if index is None:
            raise Unsupported("the loop is not in a block of statements")
        for output in model.outputs:
            if output.kind == "slot":
                if output.name in model.states or output.name in read_names(self.context, loop.body) - {output.name}:
                    pass
                continue
            init = None
            for j in range(index - 1, -1, -1):
                statement = statements[j]
                if output.name in read_names(self.context, statement):
                    raise Unsupported(f"`{output.name}` is used between its creation and the loop")
                if self._binds(statement, output.name):
                    init = statement
                    break
            if init is None or not (
                isinstance(init, cst.SimpleStatementLine)
                and len(init.body) == 1
                and isinstance(init.body[0], cst.Assign)
                and isinstance(init.body[0].value, cst.List)
                and not init.body[0].value.elements
            ):
                raise Unsupported(f"`{output.name}` is not made an empty list just before the loop")
            reads_in_loop = [
                n
                for n in self.context.index.find(cst.Name, within=loop.body)
                if n.value == output.name and not self.context.inside(n, output.statement)
            ]
            if reads_in_loop:
                raise Unsupported(f"`{output.name}` is read in the loop")
            kinds = self.context.kinds
            later = sorted(
                (
                    read
                    for binding in kinds.bindings_in(init, output.name)
                    for read in kinds.reached_reads(binding)
                    if self.context.index.order(read) > self.context.index.end(loop)
                ),
                key=self.context.index.order,
            )
            if len(later) != 1:
                raise Unsupported(f"`{output.name}` is read {'more than once' if later else 'nowhere'} after the loop")
            stack = self.context.parents.get(self.context.parents.get(later[0]))
            if not (
                isinstance(stack, cst.Call)
                and stack.args
                and stack.args[0].value is later[0]
                and self.context.names.is_(stack.func, "torch.stack", "torch.cat")
            ):
                raise Unsupported(f"`{output.name}` is used after the loop other than by torch.stack")
            dim_arg = stack.args[1] if len(stack.args) > 1 else None
            if len(stack.args) > 2 or (
                dim_arg is not None and dim_arg.keyword is not None and dim_arg.keyword.value != "dim"
            ):
                raise Unsupported("torch.stack with other arguments than the list and dim")
            dim = integer_value(dim_arg.value) if dim_arg is not None else 0
            if dim is None:
                raise Unsupported("the stack's dim is not a number")
            cat = self.context.names.is_(stack.func, "torch.cat")
            after = self.context.index.statement_of(stack)
            if self.context.index.order(after) <= self.context.index.end(loop):
                raise Unsupported("the stack is inside the loop")
            between = self._between(statements, loop, after)
            found[id(output)] = (init, stack, dim, cat, after, between)
        for name in model.temporaries | ({model.time} if model.time else set()):
            if name in {o.name for o in model.outputs}:
                continue
            for binding in self.context.kinds.bindings_in(loop, name):
                for node in self.context.kinds.reached_reads(binding):
                    if self.context.index.order(node) > self.context.index.end(loop):
                        raise Unsupported(f"`{name}` is read after the loop (line {self.context.line(node)})")
        return found

    def _between(self, statements, loop, after) -> list:
        """The statements of the loop's block between the loop and the one holding `after`, or
        None when `after` is not in that block."""
        block_after = after
        while block_after is not None and block_after not in statements:
            block_after = self.context.parents.get(block_after)
        if block_after is None:
            return None
        i, j = statements.index(loop), statements.index(block_after)
        return statements[i + 1 : j]

    def _binds(self, statement, name: str) -> bool:
        for assign in self.context.index.find((cst.Assign, cst.AugAssign, cst.AnnAssign), within=statement):
            targets = [t.target for t in assign.targets] if isinstance(assign, cst.Assign) else [assign.target]
            for target in targets:
                if any(n.value == name for n in self.context.index.find(cst.Name, within=target)):
                    return True
        return False

    def _read_after(self, model: TimeLoop) -> set[str]:
        """States whose value after the loop is read later (a state kept in a tensor's slots
        has its values there, written by the loop's slot write)."""
        loop, kinds, index = model.loop, self.context.kinds, self.context.index
        return {
            name
            for name, state in model.states.items()
            if state.initial is None
            and any(
                node in index and index.order(node) > index.end(loop)
                for binding in kinds.bindings_in(loop, name)
                for node in kinds.reached_reads(binding)
            )
        }

    def _scope_names(self, loop) -> set[str]:
        scope = self.context.scopes.get(loop)
        if scope is None:
            return set()
        return {a.name for a in scope.assignments} | {
            a.node.value for a in scope.accesses if isinstance(a.node, cst.Name)
        }

    def _uses(self, model, values, updates, final_reads) -> dict[tuple[str, str], int]:
        count: dict[tuple[str, str], int] = {}

        def walk(sym):
            if sym is None:
                return
            for pair in states_in(sym):
                count[pair] = count.get(pair, 0) + _occurrences(sym, pair)

        for value in values.values():
            walk(value)
        for a, x in updates.values():
            walk(a)
            walk(x)
        for name in final_reads:
            count[(name, "final")] = 1
        return count

    # -- linear attention -------------------------------------------------------------

    def _attention(self, model: TimeLoop, state: State) -> _Attention | None:
        """The decayed-linear-attention reading of a state, if every use of it fits."""
        rank = _state_rank(state)
        outer = _outer(state.x, self.context.module.code_for_node, rank) if state.x is not None else None
        if outer is None:
            return None
        first, second = outer  # the vectors along the state's dims -2 and -1
        decay = _decay(state.a, rank)
        if decay is False:
            return None
        reads: list[tuple] = []
        code = self.context.module.code_for_node
        uses = (
            [o.value for o in model.outputs]
            + [s.a for s in model.states.values() if s is not state and s.a]
            + [s.x for s in model.states.values() if s is not state and s.x]
        )
        for value in uses:
            if not _collect_reads(value, state, reads, code):
                return None
        if not reads:
            return None
        r, mode, key, u, _ = reads[0]
        if any(
            not (same(r, other[0], code) and mode == other[1] and key == other[2] and same(u, other[3], code))
            for other in reads[1:]
        ):
            return None
        axis, w = decay
        if axis is not None and axis != key:
            return None  # a decay along the value dim is not this kernel's
        k, v = (first, second) if key == -2 else (second, first)
        ranks = {read[4] for read in reads if read[4] is not None}
        rank = ranks.pop() if len(ranks) == 1 else r.rank
        return _Attention(k, v, w, r, mode, u, key, state.x, rank, _state_rank(state))

    def _with_reads(self, sym: Sym | None, attention: dict[str, _Attention]) -> Sym | None:
        if sym is None or not attention:
            return sym
        code = self.context.module.code_for_node
        for name, plan in attention.items():
            sym = _replace_reads(sym, model_state(name), plan, code)
        return sym

    def _plan_attention(
        self, name, plan: _Attention, lifter: Lifter, lifts, result: _Plan, uses, scope_names, final_reads
    ) -> None:
        q, k, v = (moved(self._vector(lifter.lift(s), s), -2) for s in (plan.r, plan.k, plan.v))
        args = [cst.Arg(q.code), cst.Arg(k.code), cst.Arg(v.code)]
        if plan.w is None:
            w = cst.Float("1.0")
        else:
            lifted = lifter.lift(plan.w)
            if lifted.constant:
                if lifted.kind == "number" or lifted.rank == 0:
                    w = lifted.code
                elif lifted.rank is not None:
                    w = method(lifted.code, "unsqueeze", integer_literal(-2))
                else:
                    raise Unsupported(f"the decay `{self.context.source(lifted.code)}` is constant but of unknown rank")
            else:
                w = moved(lifted, -2).code
        args.append(cst.Arg(w))
        keywords = []
        if plan.mode == "prev":
            keywords.append(("u", cst.Float("0.0") if plan.u is None else lifter.lift(plan.u).code))
        initial = cst.Name(name)
        if plan.key == -1:
            initial = method(initial, "transpose", integer_literal(-1), integer_literal(-2))
        keywords.append(("initial_state", initial))
        for key, value in keywords:
            args.append(cst.Arg(value, keyword=cst.Name(key), equal=_tight()))
        call = cst.Call(cst.Name("linear_attention"), separated(args))
        result.kernels.add("linear_attention")
        out_name = self._fresh(f"{name}_out", scope_names)
        result.statements.append(_assign([out_name, name], call))
        if plan.key == -1:
            result.statements.append(
                _assign([name], method(cst.Name(name), "transpose", integer_literal(-1), integer_literal(-2)))
            )
        result.names[name] = out_name
        result.fresh.add(out_name)
        lifts[(name, "read")] = Lift(cst.Name(out_name), -2, plan.rank)
        if uses.get((name, "new"), 0) or uses.get((name, "prev"), 0):
            raise Unsupported(f"the state `{name}` is used other than by its read-out")

    def _vector(self, lift: Lift, sym: Sym) -> Lift:
        if lift.constant:
            raise Unsupported("a constant query, key or value in a linear attention")
        return lift

    # -- scans ---------------------------------------------------------------------------

    def _plan_scan(
        self, name, state: State, update, lifter: Lifter, lifts, result: _Plan, uses, scope_names, final_reads
    ) -> None:
        a, x = update
        before = uses.get((name, "prev"), 0) > 0
        after = uses.get((name, "new"), 0) > 0
        if before and after:
            raise Unsupported(f"the state `{name}` is read both before and after its update")
        lifted = [
            lifter.lift(a) if a is not None else Lift(cst.Float("0.0"), None, 0, "number"),
            lifter.lift(x) if x is not None else Lift(cst.Float("0.0"), None, 0, "number"),
        ]
        if all(l.constant for l in lifted):
            raise Unsupported(f"the update of `{name}` does not change over time")
        (a_lift, x_lift), time = lifter.kernel_operands(lifted)
        args = [
            cst.Arg(a_lift.code),
            cst.Arg(x_lift.code),
            cst.Arg(state.initial if state.initial is not None else cst.Name(name)),
            cst.Arg(integer_literal(time), keyword=cst.Name("dim"), equal=_tight()),
        ]
        final = name in final_reads
        if before:
            args.append(cst.Arg(cst.Name("True"), keyword=cst.Name("before"), equal=_tight()))
            if final:  # the states before each step leave out the last one
                args.append(cst.Arg(cst.Name("True"), keyword=cst.Name("final"), equal=_tight()))
        call = cst.Call(cst.Name("linear_recurrence"), separated(args))
        result.kernels.add("linear_recurrence")
        # A state kept in a tensor's slots has, at each step, the rank of a slot (when the
        # tensor's is known): the loop's slot write would fail for any other.
        lift = Lift(call, time, _state_rank(state, from_update=False) if state.initial is not None else None)
        mode = "prev" if before else "new"
        total = sum(n for (s, _), n in uses.items() if s == name)
        if total > 1 or final:
            states_name = self._fresh(f"{name}s" if not name.endswith("s") else f"{name}_all", scope_names)
            result.fresh.add(states_name)
            if before and final:
                result.statements.append(_assign([states_name, name], call))
            else:
                result.statements.append(_assign([states_name], call))
                if final:
                    result.statements.append(_assign([name], _last(cst.Name(states_name), time)))
            lift = Lift(cst.Name(states_name), time, None)
            result.names[name] = states_name
        lifts[(name, mode)] = lift

    def _fresh(self, base: str, taken: set[str]) -> str:
        name, number = base, 2
        while name in taken:
            name, number = f"{base}{number}", number + 1
        taken.add(name)
        return name

    # -- edits -----------------------------------------------------------------------------

    def _edits(self, model: TimeLoop, outputs, values, lifter: Lifter, plan: _Plan):
        loop = model.loop
        edits = []
        new_statements = list(plan.statements)
        placed = []
        for output in model.outputs:
            value = lifter.lift(values[id(output)])
            if value.constant:
                raise Unsupported(f"the value collected in `{output.name}` does not change over time")
            if output.kind == "slot":
                new_statements.append(self._slot_write(model, output, value))
                continue
            init, stack, dim, cat, after, between = outputs[id(output)]
            if cat:
                inner = _strip_unsqueeze(values[id(output)], dim)
                if inner is None:
                    raise Unsupported(
                        f"`{output.name}` is concatenated, not stacked, and its values have no dim of size 1 there"
                    )
                value = lifter.lift(inner)
            placed.append((output, moved(value, dim), init, stack, after, between))
        edits += [Remove(init) for _, _, init, _, _, _ in placed]
        slots = any(o.kind == "slot" for o in model.outputs)
        if len(placed) == 1 and not slots and placed[0][5] == []:
            # one output, stacked right after the loop: the kernel calls go where the stack was
            output, value, init, stack, after, _ = placed[0]
            edits.append(Remove(loop))
            leading = [] if any(line.comment is not None for line in init.leading_lines) else list(init.leading_lines)
            pure = (
                isinstance(after, cst.SimpleStatementLine)
                and len(after.body) == 1
                and isinstance(after.body[0], cst.Assign)
                and len(after.body[0].targets) == 1
                and isinstance(after.body[0].targets[0].target, cst.Name)
                and after.body[0].value is stack
            )
            if not new_statements:
                edits.append(Replace(stack, value.code))
                if leading or not init.leading_lines:
                    edits.append(Replace(after, lambda updated: updated.with_changes(leading_lines=leading)))
            elif pure:
                target = after.body[0].targets[0].target.value
                made = _rename_outputs([*new_statements, _assign([target], value.code)], plan.fresh)
                made[0] = made[0].with_changes(leading_lines=leading + list(after.leading_lines))
                made[-1] = made[-1].with_changes(trailing_whitespace=after.trailing_whitespace)
                edits.append(Replace(after, cst.FlattenSentinel(made)))
            else:
                new_statements[0] = new_statements[0].with_changes(leading_lines=leading)
                edits.append(InsertBefore(after, tuple(new_statements)))
                edits.append(Replace(stack, value.code))
            return edits, plan.kernels
        for output, value, _init, stack, _after, between in placed:
            if between is None or any(read_names(self.context, value.code) & self._bound_names(s) for s in between):
                raise Unsupported(f"`{output.name}` is stacked after statements that change what it reads")
            new_statements.append(_assign([output.name], value.code))
            edits.append(Replace(stack, cst.Name(output.name)))
        if not new_statements:
            raise Unsupported("nothing the loop computes is used")
        new_statements = _rename_outputs(new_statements, plan.fresh)
        new_statements[0] = new_statements[0].with_changes(leading_lines=loop.leading_lines)
        edits.append(Replace(loop, cst.FlattenSentinel(new_statements)))
        return edits, plan.kernels

    def _bound_names(self, statement) -> set[str]:
        found = set()
        for assign in self.context.index.find((cst.Assign, cst.AugAssign, cst.AnnAssign, cst.For), within=statement):
            targets = [t.target for t in assign.targets] if isinstance(assign, cst.Assign) else [assign.target]
            for target in targets:
                found |= {n.value for n in self.context.index.find(cst.Name, within=target)}
        return found

    def _slot_write(self, model: TimeLoop, output, value: Lift) -> cst.BaseStatement:
        """`out[:, :T] = <values>` for `out[:, t] = ...` in the loop."""
        steps = model.steps
        target = output.slot
        out_rank = layouts(self.context).rank(target.value)
        bound = cst.Slice(lower=steps.start, upper=steps.stop)
        if out_rank is not None:
            time = output.slot_time - out_rank  # from the right
            if value.rank is not None and value.rank + 1 < -time:
                raise Unsupported(f"the values written into `{output.name}` have fewer dims than its slots")
            placed = moved(to_right(value), time)
            elements = [cst.SubscriptElement(cst.Slice(lower=None, upper=None))] * output.slot_time + [
                cst.SubscriptElement(bound)
            ]
            receiver = target.value
        else:
            placed = moved(to_right(value), -1)
            receiver = method(target.value, "movedim", integer_literal(output.slot_time), integer_literal(-1))
            elements = [cst.SubscriptElement(cst.Index(cst.Ellipsis())), cst.SubscriptElement(bound)]
        elements = separated(elements)
        slot = cst.Subscript(receiver, elements)
        return cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(slot)], placed.code)])


# -- matching helpers ----------------------------------------------------------------------


def model_state(name: str) -> str:
    return name


def _state_rank(state, from_update: bool = True) -> int | None:
    """The rank of the state's values: the rank its Prev reads were given, else (with
    `from_update`) its update's."""
    if isinstance(state, _StateView):
        return state.rank
    found = []

    def walk(sym):
        if isinstance(sym, Prev) and sym.state == state.name and sym.rank is not None:
            found.append(sym.rank)
        elif isinstance(sym, Op):
            for a in sym.args:
                walk(a)

    walk(state.update)
    if found:
        return found[0]
    return state.update.rank if from_update else None


def _occurrences(sym: Sym, pair) -> int:
    name, mode = pair
    kind = {"prev": Prev, "new": New, "read": Read}[mode]
    if isinstance(sym, kind) and sym.state == name:
        return 1
    if isinstance(sym, Op):
        return sum(_occurrences(a, pair) for a in sym.args)
    return 0


def _unsq(sym: Sym, dim: int, rank: int | None = None) -> Sym | None:
    """x for `x.unsqueeze(dim)` (as read: `x[..., None]` too), also of a constant, and through
    an elementwise function (`x[..., None].exp()` is `x.exp()[..., None]`); `rank` is the rank
    the value must have (the state's), which makes an unsqueeze at a dim counted from the
    left one counted from the right."""
    if isinstance(sym, Op) and sym.op in ("map", "neg") and len(sym.args) == 1:
        inner = _unsq(sym.args[0], dim, rank)
        return None if inner is None else Op(plus(inner.rank, 0), sym.op, (inner,), sym.params, sym.node)
    if isinstance(sym, Op) and sym.op == "unsqueeze" and sym.params[0] == dim:
        return sym.args[0]
    if (
        isinstance(sym, Op)
        and sym.op == "unsqueeze"
        and sym.params[0] >= 0
        and sym.rank is None
        and rank is not None
        and sym.params[0] - rank == dim
        and min_rank(sym) >= rank
    ):
        return sym.args[0]
    if isinstance(sym, Const) and sym.kind != "number":
        node = sym.node
        inner = None
        if isinstance(node, cst.Name) and _LAYOUTS[0] is not None and node in _LAYOUTS[0].index:
            value = _LAYOUTS[0].value_of(node)  # `u = self.bonus.unsqueeze(-1)` before the loop
            if isinstance(value, (cst.Call, cst.Subscript)) and value in _LAYOUTS[0].index:
                shape = _LAYOUTS[0].shape(value)
                return _unsq(Const(len(shape) if shape is not None else sym.rank, value, sym.kind), dim, rank)
        if (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and node.func.attr.value == "unsqueeze"
            and len(node.args) == 1
            and node.args[0].keyword is None
        ):
            d = integer_value(node.args[0].value)
            if d == dim or (d is not None and d >= 0 and sym.rank is not None and d - sym.rank == dim):
                inner = node.func.value
        elif isinstance(node, cst.Subscript) and dim in (-1, -2):
            kinds = [_element_kind(e) for e in node.slice]
            pattern = ["...", "None"] if dim == -1 else ["...", "None", ":"]
            if kinds == pattern:
                inner = node.value
            elif (
                sym.rank is not None
                and kinds.count("None") == 1
                and set(kinds) <= {":", "None"}
                and len(kinds) <= sym.rank
                and kinds.index("None") - sym.rank == dim
            ):
                inner = node.value
            elif (
                rank is not None
                and "..." not in kinds
                and set(kinds) <= {":", "None"}
                and len(kinds) == rank
                and dim + len(kinds) >= 0
                and kinds[dim + len(kinds)] == "None"
            ):
                # `u[None, :, None, :]` in a value of the state's rank: its dims are those written
                rest = [e for i, e in enumerate(node.slice) if i != dim + len(kinds)]
                if all(_element_kind(e) == ":" for e in rest):
                    inner = node.value
                else:
                    inner = node.with_changes(slice=separated(rest))
                return Const(len(kinds) - 1, inner, sym.kind)
        if inner is not None:
            return Const(plus(sym.rank, -1), inner, sym.kind)
    return None


_LAYOUTS: list = [None]  # the file's Layouts while a loop is matched (for constants bound by name)


def _element_kind(element: cst.SubscriptElement) -> str:
    s = element.slice
    if isinstance(s, cst.Index) and isinstance(s.value, cst.Ellipsis):
        return "..."
    if isinstance(s, cst.Index) and isinstance(s.value, cst.Name) and s.value.value == "None":
        return "None"
    if isinstance(s, cst.Slice) and s.lower is None and s.upper is None and s.step is None:
        return ":"
    return "?"


def _norm(sym: Sym, rank: int | None) -> Sym:
    """`x.unsqueeze(-2).mT` is `x.unsqueeze(-1)` (and the other way round), also for an
    unsqueeze at a dim counted from the left that is that dim in a value of `rank` dims."""
    if isinstance(sym, Op) and sym.op == "transpose" and sym.params == (-2, -1):
        inner = sym.args[0]
        for before, after in ((-2, -1), (-1, -2)):
            x = _unsq(inner, before, rank)
            if x is not None:
                return Op(sym.rank, "unsqueeze", (x,), (after,), None)
    return sym


def _outer(sym: Sym, code, rank: int | None = None) -> tuple[Sym, Sym] | None:
    """(vector along dim -2, vector along dim -1) for an outer product of two step vectors."""
    if isinstance(sym, Op) and sym.op in ("mul", "matmul") and len(sym.args) == 2:
        a, b = (_norm(arg, rank) for arg in sym.args)
        if _unsq(a, -1, rank) is not None and _unsq(b, -2, rank) is not None:
            return _unsq(a, -1, rank), _unsq(b, -2, rank)
        if sym.op == "mul" and _unsq(b, -1, rank) is not None and _unsq(a, -2, rank) is not None:
            return _unsq(b, -1, rank), _unsq(a, -2, rank)
    if isinstance(sym, Op) and sym.op == "einsum" and len(sym.args) == 2:
        spec = sym.params[0]
        (x, y), out = spec.inputs, spec.output
        if len(x) < 1 or len(y) < 1 or x[:-1] != y[:-1] or x[-1] == y[-1] or x[-1] in x[:-1] or y[-1] in y[:-1]:
            return None
        batch = x[:-1]
        if out == (*batch, x[-1], y[-1]):
            return sym.args[0], sym.args[1]
        if out == (*batch, y[-1], x[-1]):
            return sym.args[1], sym.args[0]
    return None


def _decay(sym: Sym | None, rank: int | None = None):
    """(axis, w) for a decay that varies along one dim of the state (axis -2 or -1) given
    by w, or (None, w) for one that does not (a constant, None for 1); False otherwise."""
    if sym is None:
        return False  # no state term: not a recurrence this kernel runs
    if sym is ONE:
        return None, None
    if _unsq(sym, -1, rank) is not None:
        return -2, _unsq(sym, -1, rank)
    if _unsq(sym, -2, rank) is not None:
        return -1, _unsq(sym, -2, rank)
    if isinstance(sym, Const) and (sym.kind == "number" or sym.rank == 0):
        return None, sym
    return False


def _state_term(sym: Sym, state: State, code):
    """("new" | "prev", u) when `sym` is the state after / before its update, the latter
    maybe plus the bonus `u * x` (u along the key dim, x the update's outer product)."""
    if isinstance(sym, New) and sym.state == state.name:
        return "new", None, None
    if isinstance(sym, Prev) and sym.state == state.name:
        return "prev", None, None
    if isinstance(sym, Op) and sym.op == "add":
        for first, second in (sym.args, sym.args[::-1]):
            if isinstance(first, Prev) and first.state == state.name and isinstance(second, Op) and second.op == "mul":
                for u_side, x_side in (second.args, second.args[::-1]):
                    if same(x_side, state.x, code):
                        for axis in (-1, -2):
                            u = _unsq(u_side, axis, _state_rank(state))
                            if u is not None and isinstance(u, Const):
                                return "prev", u, -2 if axis == -1 else -1
    return None


def _read_out(sym: Sym, state: State, code):
    """(r, mode, key axis, u, wrap) for a read-out of the state by a query r; wrap is the
    unsqueeze (dim) around the result that the form leaves, or None."""
    if isinstance(sym, Op) and sym.op == "einsum" and len(sym.args) == 2:
        spec = sym.params[0]
        for s_at in (0, 1):
            term = _state_term(sym.args[s_at], state, code)
            if term is None:
                continue
            mode, u, u_key = term
            s_letters, r_letters = spec.inputs[s_at], spec.inputs[1 - s_at]
            if len(s_letters) < 2 or len(r_letters) < 1:
                return None
            batch = s_letters[:-2]
            if r_letters[:-1] != batch or spec.output[:-1] != batch:
                return None
            contracted = r_letters[-1]
            if contracted == s_letters[-2] and spec.output[-1] == s_letters[-1]:
                key = -2
            elif contracted == s_letters[-1] and spec.output[-1] == s_letters[-2]:
                key = -1
            else:
                return None
            if contracted in batch or len(set(s_letters)) != len(s_letters):
                return None
            if u is not None and u_key != key:
                return None
            return sym.args[1 - s_at], mode, key, u, None
    if (
        isinstance(sym, Op)
        and sym.op == "reduce"
        and sym.params[0] in ((-2,), (-1,))
        and not sym.params[1]
        and sym.params[2] == "sum"
    ):
        key = sym.params[0][0]
        inner = sym.args[0]
        if isinstance(inner, Op) and inner.op == "mul":
            for s_side, r_side in (inner.args, inner.args[::-1]):
                term = _state_term(s_side, state, code)
                r = _unsq(r_side, -1 if key == -2 else -2)
                if term is not None and r is not None and (term[1] is None or term[2] == key):
                    return r, term[0], key, term[1], None
    if isinstance(sym, Op) and sym.op == "matmul":
        a, b = (_norm(arg, _state_rank(state)) for arg in sym.args)
        term = _state_term(b, state, code)
        r = _unsq(a, -2)
        if term is not None and r is not None and (term[1] is None or term[2] == -2):
            return r, term[0], -2, term[1], -2
        term = _state_term(a, state, code)
        r = _unsq(b, -1)
        if term is not None and r is not None and (term[1] is None or term[2] == -1):
            return r, term[0], -1, term[1], -1
    return None


def _collect_reads(sym: Sym | None, state: State, found: list, code) -> bool:
    """Collect the read-outs of `state` in `sym`; False if the state is used otherwise."""
    if sym is None:
        return True
    read = _read_out(sym, state, code)
    if read is not None:
        rank = sym.rank if read[4] is None else plus(sym.rank, -1)
        found.append((*read[:4], rank))
        return _collect_reads(read[0], state, found, code)
    if isinstance(sym, (Prev, New)) and sym.state == state.name:
        return False
    if isinstance(sym, Op):
        return all(_collect_reads(a, state, found, code) for a in sym.args)
    return True


def _replace_reads(sym: Sym, name: str, plan: _Attention, code) -> Sym:
    if isinstance(sym, Op):
        read = _read_out(sym, _StateView(name, plan), code)
        if read is not None:
            result: Sym = Read(plan.rank, name)
            if read[4] is not None:
                result = Op(plus(plan.rank, 1), "unsqueeze", (result,), (read[4],), None)
            return result
        args = tuple(_replace_reads(a, name, plan, code) for a in sym.args)
        if any(n is not o for n, o in zip(args, sym.args)):
            if (
                sym.op == "squeeze"
                and isinstance(args[0], Op)
                and args[0].op == "unsqueeze"
                and args[0].params[0] == sym.params[0]
                and isinstance(args[0].args[0], Read)
            ):
                return args[0].args[0]
            return Op(sym.rank, sym.op, args, sym.params, sym.node)
    return sym


class _StateView:
    """What `_read_out` needs of a state: its name, rank and its update's outer product."""

    def __init__(self, name: str, plan: _Attention) -> None:
        self.name = name
        self.x = plan.x
        self.update = None
        self.rank = plan.state_rank


def _strip_unsqueeze(sym: Sym, dim: int) -> Sym | None:
    if (
        isinstance(sym, Op)
        and sym.op == "unsqueeze"
        and (sym.params[0] == dim or (sym.rank is not None and dim >= 0 and sym.params[0] == dim - sym.rank))
    ):
        return sym.args[0]
    return None


# -- code helpers ----------------------------------------------------------------------------


def _rename_outputs(statements: list, fresh: set[str]) -> list:
    """`o_out, S = kernel(...); ...; o = o_out` becomes `o, S = kernel(...); ...` (o_out renamed o
    throughout), where only the plan's own statements read o_out and none reads o."""
    statements = list(statements)
    last = statements[-1].body[0] if isinstance(statements[-1], cst.SimpleStatementLine) else None
    if not (
        isinstance(last, cst.Assign)
        and isinstance(last.value, cst.Name)
        and last.value.value in fresh
        and len(last.targets) == 1
        and isinstance(last.targets[0].target, cst.Name)
    ):
        return statements
    made, target = last.value.value, last.targets[0].target.value
    if any(target in _names_of(s) or target in _targets_of(s) for s in statements[:-1]):
        return statements
    renamer = _Rename(made, target)
    return [s.visit(renamer) for s in statements[:-1]]


class _Rename(cst.CSTTransformer):
    def __init__(self, old: str, new: str) -> None:
        super().__init__()
        self.old, self.new = old, new

    def leave_Name(self, original_node, updated_node):
        return updated_node.with_changes(value=self.new) if updated_node.value == self.old else updated_node


def _targets_of(statement) -> set[str]:
    found = set()
    for small in statement.body:
        if isinstance(small, cst.Assign):
            for target in small.targets:
                found |= (
                    {e.value.value for e in target.target.elements}
                    if isinstance(target.target, cst.Tuple)
                    else {target.target.value}
                    if isinstance(target.target, cst.Name)
                    else set()
                )
    return found


def _names_of(statement) -> set[str]:
    from codemod.analysis.names import names_read

    return {n.value for n in names_read(statement)}


def _tight() -> cst.AssignEqual:
    return cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))


def _assign(targets: list[str], value: cst.BaseExpression) -> cst.SimpleStatementLine:
    if len(targets) == 1:
        target = cst.Name(targets[0])
    else:
        target = cst.Tuple([cst.Element(cst.Name(t)) for t in targets], lpar=[], rpar=[])
    return cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(target)], value)])


def _last(states: cst.BaseExpression, time: int) -> cst.BaseExpression:
    """The last step of `states` (time at `time`)."""
    if time >= 0:
        elements = [cst.SubscriptElement(cst.Slice(lower=None, upper=None))] * time + [
            cst.SubscriptElement(cst.Index(integer_literal(-1)))
        ]
    else:
        elements = [
            cst.SubscriptElement(cst.Index(cst.Ellipsis())),
            cst.SubscriptElement(cst.Index(integer_literal(-1))),
        ] + [cst.SubscriptElement(cst.Slice(lower=None, upper=None))] * (-1 - time)
    elements = separated(elements)
    return cst.Subscript(states, elements)
