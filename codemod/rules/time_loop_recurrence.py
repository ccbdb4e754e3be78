from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from codemod.analysis.names import fresh_name, integer_literal, separated
from codemod.analysis.tensor_layout import layouts, read_names
from codemod.analysis.time_loops import (
    Attention,
    Lift,
    Lifter,
    State,
    TimeLoop,
    Unsupported,
    method,
    moved,
    state_rank,
    strip_unsqueeze,
    time_loops,
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
TANH_LOOP = """
def rnn(W, x):
    h = torch.zeros_like(x[:, 0])
    hs = []
    for t in range(x.shape[1]):
        h = torch.tanh(h @ W + x[:, t])
        hs.append(h)
    return torch.stack(hs, dim=1)
"""
CELL_LOOP = """
cell = torch.nn.GRUCell(8, 8)

def rnn(x):
    h = torch.zeros_like(x[:, 0])
    hs = []
    for t in range(x.shape[1]):
        h = cell(x[:, t], h)
        hs.append(h)
    return torch.stack(hs, dim=1)
"""
KERNELS = "runtime.kernels"


@dataclass
class _Plan:
    """How one loop becomes kernel calls."""

    statements: list[cst.BaseStatement] = field(default_factory=list)  # where the loop was
    kernels: set[str] = field(default_factory=set)
    names: dict[str, str] = field(default_factory=dict)  # state -> the name of its lifted states
    fresh: set[str] = field(default_factory=set)  # names the plan made up


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
    `x[:, t:t + 1]`, or `for x_t in x.unbind(1)`); the loop may run backwards,
    `for t in reversed(range(T))` (a discounted return, `running = r[:, t] +
    gamma * running`: the kernel scans in reverse, and a list it appends to
    holds the steps in the order they ran); heads may come before or
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
    linear in it (a nonlinearity around it, `h = tanh(W x_t + U h)` with `U`
    an `nn.Linear`, a product of two states), a
    reshape of a step value (which may mix heads), random numbers drawn in
    the loop, a value that may be a number or a tensor where that decides the
    layout, a temporary or the step index read after the loop, `break` or
    other statements in the body, a linear attention state in a loop that runs
    backwards; and any loop in code TorchScript compiles or
    `torch.jit.trace` records (`@torch.jit.script`, a function or module passed
    to `torch.jit.script`/`trace`, what such code calls: codemod/analysis/
    torchscript.py), which cannot call the kernels; so for every rule whose fix
    calls `runtime`. A state that goes through a module or function that is
    not such math (`nn.GRUCell`, a cell of your own, an embedding of the
    previous step's argmax) is an RNN or a decoder, not a recurrence these
    kernels compute: no finding.
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
            PREAMBLE + CELL_LOOP, "an RNN cell: its state goes through a module that is not math the kernels compute"
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
        Invalid(PREAMBLE + TANH_LOOP, None, "a non-linear recurrence: reported, not fixed"),
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
        if not time_loops(self.context).candidate(node):
            return
        loops = time_loops(self.context)
        try:
            model = loops.read(node)
        except Unsupported as why:
            if loops.looks_like_recurrence(node):
                self.report(node, f"a Python loop over time computes a recurrence, not rewritten: {why}")
            return
        if model is None or not model.states:
            return
        try:
            edits, kernels = self._rewrite(model)
        except Unsupported as why:  # read as a linear recurrence: worth saying why it stays
            self.report(node, f"a Python loop over time computes a recurrence, not rewritten: {why}")
            return
        statements = self.context.index.block_statements(node)
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

    # -- rewriting ---------------------------------------------------------------------

    def _rewrite(self, model: TimeLoop):
        loops = time_loops(self.context)
        loop = model.loop
        order = loops.order(model)
        attention = {name: loops.attention(model, model.states[name]) for name in order}
        attention = {k: v for k, v in attention.items() if v is not None}
        outputs = loops.stacked_outputs(model)
        final_reads = loops.read_after(model)
        lifts: dict[tuple[str, str], Lift] = {}
        plan = _Plan()
        lifter = Lifter(self.context, model.steps, model.time, lifts)
        scope_names = loops.scope_names(loop)
        # the values the loop collects, with read-outs of attention states made Read(state)
        values = {id(o): loops.with_reads(o.value, attention) for o in model.outputs}
        updates = {
            name: (
                loops.with_reads(s.a, attention) if s.a is not None else None,
                loops.with_reads(s.x, attention) if s.x is not None else None,
            )
            for name, s in model.states.items()
        }
        uses = loops.uses(model, values, updates, final_reads)
        for name in order:
            state = model.states[name]
            if name in attention:
                self._plan_attention(name, attention[name], lifter, lifts, plan, uses, scope_names, final_reads)
            else:
                self._plan_scan(name, state, updates[name], lifter, lifts, plan, uses, scope_names, final_reads)
        return self._edits(model, outputs, values, lifter, plan)

    def _plan_attention(
        self, name, plan: Attention, lifter: Lifter, lifts, result: _Plan, uses, scope_names, final_reads
    ) -> None:
        if lifter.steps.reverse:
            raise Unsupported("the loop runs backwards over time, which linear_attention does not")
        vectors = [lifter.lift(s) for s in (plan.r, plan.k, plan.v)]
        if any(lift.constant for lift in vectors):
            raise Unsupported("a constant query, key or value in a linear attention")
        q, k, v = (moved(lift, -2) for lift in vectors)
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
        out_name = fresh_name(f"{name}_out", scope_names)
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
        reverse = lifter.steps.reverse
        if reverse:
            args.append(cst.Arg(cst.Name("True"), keyword=cst.Name("reverse"), equal=_tight()))
        if before:
            args.append(cst.Arg(cst.Name("True"), keyword=cst.Name("before"), equal=_tight()))
            if final:  # the states before each step leave out the last one
                args.append(cst.Arg(cst.Name("True"), keyword=cst.Name("final"), equal=_tight()))
        call = cst.Call(cst.Name("linear_recurrence"), separated(args))
        result.kernels.add("linear_recurrence")
        # A state kept in a tensor's slots has, at each step, the rank of a slot (when the
        # tensor's is known): the loop's slot write would fail for any other.
        lift = Lift(call, time, state_rank(state, from_update=False) if state.initial is not None else None)
        mode = "prev" if before else "new"
        total = sum(n for (s, _), n in uses.items() if s == name)
        if total > 1 or final:
            states_name = fresh_name(f"{name}s" if not name.endswith("s") else f"{name}_all", scope_names)
            result.fresh.add(states_name)
            if before and final:
                result.statements.append(_assign([states_name, name], call))
            else:
                result.statements.append(_assign([states_name], call))
                if final:
                    # the state after the last step run: the first step's, in a loop that runs backwards
                    result.statements.append(_assign([name], _last(cst.Name(states_name), time, reverse)))
            lift = Lift(cst.Name(states_name), time, None)
            result.names[name] = states_name
        lifts[(name, mode)] = lift

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
                inner = strip_unsqueeze(values[id(output)], dim)
                if inner is None:
                    raise Unsupported(
                        f"`{output.name}` is concatenated, not stacked, and its values have no dim of size 1 there"
                    )
                value = lifter.lift(inner)
            value = moved(value, dim)
            if model.steps.reverse:  # the list holds the steps in the order they ran: the last one first
                value = Lift(method(value.code, "flip", integer_literal(dim)), value.time, value.rank, key=value.key)
            placed.append((output, value, init, stack, after, between))
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
            if between is None or any(
                read_names(self.context, value.code) & time_loops(self.context).bound_names(s) for s in between
            ):
                raise Unsupported(f"`{output.name}` is stacked after statements that change what it reads")
            new_statements.append(_assign([output.name], value.code))
            edits.append(Replace(stack, cst.Name(output.name)))
        if not new_statements:
            raise Unsupported("nothing the loop computes is used")
        new_statements = _rename_outputs(new_statements, plan.fresh)
        new_statements[0] = new_statements[0].with_changes(leading_lines=loop.leading_lines)
        edits.append(Replace(loop, cst.FlattenSentinel(new_statements)))
        return edits, plan.kernels

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


def _last(states: cst.BaseExpression, time: int, first: bool = False) -> cst.BaseExpression:
    """The last step of `states` (time at `time`), or its first one."""
    step = integer_literal(0 if first else -1)
    if time >= 0:
        elements = [cst.SubscriptElement(cst.Slice(lower=None, upper=None))] * time + [
            cst.SubscriptElement(cst.Index(step))
        ]
    else:
        elements = [
            cst.SubscriptElement(cst.Index(cst.Ellipsis())),
            cst.SubscriptElement(cst.Index(step)),
        ] + [cst.SubscriptElement(cst.Slice(lower=None, upper=None))] * (-1 - time)
    elements = separated(elements)
    return cst.Subscript(states, elements)
