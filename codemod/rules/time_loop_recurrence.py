from __future__ import annotations

from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m

from codemod.analysis.names import names_read
from codemod.edits import InsertAfter, Remove, Replace
from codemod.rule import Invalid, Level, Rule, Valid
from codemod.suppression import suppressed_on

PREAMBLE = "import torch\n"
# Elementwise functions: applied to x[:, t] for each t, or to x once, they give the same values.
ELEMENTWISE = ("torch.exp", "torch.sigmoid", "torch.tanh", "torch.nn.functional.sigmoid")
SCAN_LOOP = """
def ema(a, x):
    h = torch.zeros_like(x[:, 0])
    hs = []
    for t in range(x.shape[1]):
        h = a[:, t] * h + x[:, t]
        hs.append(h)
    return torch.stack(hs, dim=1)
"""
SCAN_FIXED = """from runtime.kernels import linear_scan

def ema(a, x):
    h = torch.zeros_like(x[:, 0])
    return linear_scan(a[:, :x.shape[1]], x, h)
"""
RWKV_LOOP = """
def wkv(r, k, v, w, u, state):
    outs = []
    for t in range(r.size(2)):
        kv = k[:, :, t].unsqueeze(-1) * v[:, :, t].unsqueeze(-2)
        outs.append(torch.einsum("bhk,bhkv->bhv", r[:, :, t], state + u.unsqueeze(-1) * kv))
        state = w[:, :, t].unsqueeze(-1) * state + kv
    o = torch.stack(outs, dim=2)
    return o, state
"""
RWKV_FIXED = """from runtime.kernels import linear_attention

def wkv(r, k, v, w, u, state):
    o, state = linear_attention(r, k[:, :, :r.size(2)], v[:, :, :r.size(2)], w[:, :, :r.size(2)], u=u, initial_state=state)
    return o, state
"""


class _Unsupported(Exception):
    """A time-loop recurrence the rule cannot prove equal to a kernel; the message says what differs."""


@dataclass
class _Recurrence:
    kernel: str  # "linear_scan" or "linear_attention"
    args: list[tuple[str | None, cst.BaseExpression]]  # (keyword or None, value)
    time_dim: int  # 1 for the scan's (B, T, *), 2 for (B, H, T, K)


class TimeLoopRecurrence(Rule):
    """
    ## What it does
    Finds a Python loop over time steps that computes a linear recurrence, one
    step per iteration, and replaces it with one call of a `runtime.kernels`
    kernel (`linear_scan` or `linear_attention`) that computes all steps at once.

    Two recurrences are recognised:

    - the elementwise recurrence `h = a[:, t] * h + x[:, t]` with `hs.append(h)`
      and `torch.stack(hs, dim=1)` becomes `linear_scan(a, x, h)`;
    - the matrix-state decayed linear attention of GLA / RWKV-6 on (B, H, T, K)
      tensors: `kv = k_t.unsqueeze(-1) * v_t.unsqueeze(-2)`,
      `S = w_t.unsqueeze(-1) * S + kv`, the output `einsum("bhk,bhkv->bhv", r_t, S)`
      (read after the update: GLA) or `r_t` against `S + u.unsqueeze(-1) * kv`
      (read before it: RWKV-6's bonus u), stacked at dim 2, becomes
      `o, S = linear_attention(r, k, v, w, u=u, initial_state=S)`.

    ## Why is this bad?
    The loop launches a handful of small kernels per time step: at T = 2048
    that is ten thousand launches per layer and per direction, each on a
    (B, D) or (B, H, K, V) slice too small to fill a GPU, and autograd stores
    every step's state. The kernels do the same work in O(sqrt(T)) or
    O(log T) sequential steps (a chunked parallel scan; chunked linear
    attention whose chunks are matmuls), with a backward that does not store
    every state.

    torch has no eager scan (`torch._higher_order_ops.associative_scan` needs
    torch.compile), so the fix calls `runtime.kernels`, which run on CPU and on
    CUDA without extra packages. A cumulative-product shortcut
    (h_t = P_t cumsum(x / P)) is wrong in float32 once the decays multiply below
    1e-38; the runtime's scan only multiplies and adds. On GPUs such loops are
    launch-bound, and chunked kernels are reported one to two orders of
    magnitude faster at T in the thousands (flash-linear-attention, Yang et
    al. 2024); `python -m benchmarks.bench_kernels` and
    `python -m benchmarks.bench_rwkv` measure the loop against the kernels on
    your device.

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
    y = linear_scan(a[:, :x.shape[1]], x, h)  # a sliced to the steps the loop read
    ```

    ## Fix safety
    Numeric: the kernels sum in another order (within 1e-15 of the loop in
    float64, 1e-6 in float32 relative to the largest value, for outputs and
    gradients; tests/runtime/test_scan.py, test_linear_attention.py,
    tests/rules/test_pm505_execution.py), and compute float16/bfloat16 inputs
    in float32. The loop must match exactly: `for t in range(T)` with no
    `break`/`else`, only temporaries, the update and the `append` in its
    body, the list made empty just before the loop and stacked at the time dim
    right after it, time indexed as `[:, t]` (scan) or `[:, :, t]` (linear
    attention), and the decay broadcast over the state's last dim. When the
    range is not the tensors' own length (`range(T)` with `T` from elsewhere),
    the tensors are sliced `[:, :T]`, so the kernel sees exactly the steps the
    loop did. The state left after the loop is assigned as the loop left it
    when later code reads it. The kernels check shapes: a state or input whose
    shape the loop only broadcast raises a ValueError instead of running.

    Reported without a fix: a loop whose update has this linear form but
    something else differs (the output read before the update without the
    bonus form, a temporary used after the loop, a time-invariant decay, the
    list used elsewhere); what differs is in the message.
    """

    CODE = "PM505"
    NAME = "time-loop-recurrence"
    LEVEL = Level.NUMERIC
    REQUIRES = ("append",)
    MESSAGE = "a Python loop over time computes a linear recurrence; use a runtime.kernels kernel"
    GAIN = "O(sqrt T) sequential steps instead of T: reported 10-100x for such loops on GPUs at T in the thousands"

    VALID = [
        Valid(PREAMBLE + """
def rnn(W, x):
    h = torch.zeros_like(x[:, 0])
    hs = []
    for t in range(x.shape[1]):
        h = torch.tanh(h @ W + x[:, t])
        hs.append(h)
    return torch.stack(hs, dim=1)
""", "a non-linear recurrence"),
        Valid(PREAMBLE + """
def train(model, opt, batches):
    ema = 0.0
    losses = []
    for step in range(100):
        loss = model(batches[step]).mean()
        ema = 0.9 * ema + 0.1 * loss.item()
        losses.append(ema)
    return losses
""", "a loss average, not a recurrence over a tensor's time dim"),
    ]
    INVALID = [
        Invalid(PREAMBLE + SCAN_LOOP, PREAMBLE + SCAN_FIXED),
        Invalid(PREAMBLE + RWKV_LOOP, RWKV_FIXED, "torch's import goes with its last use"),
        Invalid(PREAMBLE + """
def ema(a, x):
    h = torch.zeros_like(x[:, 0])
    hs = []
    for t in range(x.shape[1]):
        hs.append(h)
        h = a[:, t] * h + x[:, t]
    return torch.stack(hs, dim=1)
""", None, "collects the state before each update"),
    ]

    def visit_For(self, node: cst.For) -> None:
        if not self._looks_like_recurrence(node):
            return
        block = self.context.parents.get(node)
        if not isinstance(block, (cst.IndentedBlock, cst.Module)):
            return
        statements = list(block.body)
        index = next(i for i, s in enumerate(statements) if s is node)
        try:
            fix = self._match(node, statements, index)
        except _Unsupported as why:
            self.report(node, f"a Python loop over time computes a linear recurrence, not rewritten: {why}")
            return
        edits, kernel = fix
        if any(suppressed_on(s, self.CODE) for s in statements[max(index - 1, 0):index + 2]):
            return
        self.report(node, f"{self.MESSAGE} (it becomes runtime.kernels.{kernel})",
                    edits=edits, imports=[("runtime.kernels", kernel)], at=node)

    # -- matching ----------------------------------------------------------

    def _looks_like_recurrence(self, loop: cst.For) -> bool:
        """`for t in range(...)` whose body updates a name as `name = <...> * name + <...>`
        with the loop variable as a subscript index: the loops this rule is about."""
        if not (isinstance(loop.target, cst.Name) and m.matches(loop.iter, m.Call(func=m.Name("range")))):
            return False
        time = loop.target.value
        body = _small_statements(loop.body)
        temporaries = {s.targets[0].target.value: s.value for s in body
                       if m.matches(s, m.Assign(targets=[m.AssignTarget(m.Name())]))}
        # the time step indexes a tensor's dim 1 or 2 (`x[:, t]`, `k[:, :, t]`) in the update, maybe via a temporary
        full = m.SubscriptElement(m.Slice(lower=None, upper=None, step=None))
        step = m.SubscriptElement(m.Index(m.Name(time)))
        time_indexed = m.Subscript(slice=[full, step, m.ZeroOrMore()]) | m.Subscript(slice=[full, full, step, m.ZeroOrMore()])
        for statement in body:
            update = self._linear_update(statement)
            if update is None:
                continue
            parts = [update[1], update[2]]
            parts += [temporaries[n.value] for part in parts for n in names_read(part) if n.value in temporaries]
            if any(m.matches(node, time_indexed) for part in parts
                   for node in self.context.index.find(cst.Subscript, within=part)):
                return True
        return False

    def _linear_update(self, statement) -> tuple[str, cst.BaseExpression, cst.BaseExpression] | None:
        """(name, factor, addend) for `name = factor * name + addend` (either order of either operation)."""
        if not m.matches(statement, m.Assign(targets=[m.AssignTarget(m.Name())], value=m.BinaryOperation(operator=m.Add()))):
            return None
        name = statement.targets[0].target.value
        total = statement.value
        for product, addend in ((total.left, total.right), (total.right, total.left)):
            if isinstance(product, cst.BinaryOperation) and isinstance(product.operator, cst.Multiply) \
                    and not product.lpar:
                for factor, state in ((product.left, product.right), (product.right, product.left)):
                    if m.matches(state, m.Name(name)) and name not in {n.value for n in names_read(factor)} \
                            and name not in {n.value for n in names_read(addend)}:
                        return name, factor, addend
        return None

    def _match(self, loop: cst.For, statements, index: int):
        time = loop.target.value
        if loop.orelse is not None or self.context.index.find((cst.Break, cst.Continue, cst.Return, cst.Yield), within=loop.body):
            raise _Unsupported("the loop has break / continue / return / else")
        if len(loop.iter.args) != 1 or loop.iter.args[0].keyword or loop.iter.args[0].star:
            raise _Unsupported("the loop is not `for t in range(T)`")
        steps = loop.iter.args[0].value
        self._steps = steps
        body = _small_statements(loop.body)
        if any(not isinstance(s, (cst.Assign, cst.Expr)) for s in body) or \
                len(body) != sum(len(line.body) for line in loop.body.body if isinstance(line, cst.SimpleStatementLine)) \
                or any(not isinstance(line, cst.SimpleStatementLine) for line in loop.body.body):
            raise _Unsupported("the loop body holds more than assignments and an append")
        appends = [s for s in body if m.matches(s, m.Expr(m.Call(func=m.Attribute(value=m.Name(), attr=m.Name("append")),
                                                                 args=[m.Arg(keyword=None, star="")])))]
        updates = [u for u in (self._linear_update(s) for s in body) if u is not None]
        if len(appends) != 1 or len(updates) != 1:
            raise _Unsupported("expected one `outs.append(...)` and one state update in the loop")
        state, _, _ = updates[0]
        outs = appends[0].value.func.value.value
        temporaries = {}
        for s in body:
            if isinstance(s, cst.Assign) and s is not self._update_statement(body, state):
                if not m.matches(s, m.Assign(targets=[m.AssignTarget(m.Name())])):
                    raise _Unsupported("an assignment in the loop that is not to one name")
                name = s.targets[0].target.value
                if name in (state, outs, time) or name in temporaries:
                    raise _Unsupported(f"`{name}` is assigned twice in the loop")
                temporaries[name] = s.value
        order = [("append" if s is appends[0] else "update" if s is self._update_statement(body, state) else "temp")
                 for s in body]
        update_first = order.index("update") < order.index("append")

        def resolve(expr):
            """A temporary's value for its name (`kv` -> `k[:, :, t].unsqueeze(-1) * ...`)."""
            return temporaries[expr.value] if isinstance(expr, cst.Name) and expr.value in temporaries else expr

        _, factor, addend = updates[0]
        collected = appends[0].value.args[0].value
        if self._strip(addend, resolve, time, 1) is not None:
            recurrence = self._scan(resolve, factor, addend, collected, state, time, update_first)
        else:
            recurrence = self._linear_attention(resolve, factor, addend, collected, state, time, update_first, body)
        for name in temporaries:
            uses = [n for s in body for n in names_read(s) if n.value == name]
            if not uses:
                raise _Unsupported(f"the temporary `{name}` is not used by the recurrence")
        for arg_name, value in recurrence.args:
            if {n.value for n in names_read(value)} & (set(temporaries) | {time, state, outs}) - (
                    {state} if arg_name in ("h0", "initial_state") else set()):
                raise _Unsupported(f"`{self.context.module.code_for_node(value)}` changes inside the loop")
        return self._rewrite(statements, index, loop, outs, state, steps, recurrence, temporaries)

    def _update_statement(self, body, state):
        return next(s for s in body if self._linear_update(s) is not None and self._linear_update(s)[0] == state)

    def _time_index(self, expr, time: str, dim: int) -> cst.BaseExpression | None:
        """X for `X[:, t]` (dim 1) or `X[:, :, t]` (dim 2), trailing full slices allowed."""
        if not isinstance(expr, cst.Subscript) or len(expr.slice) < dim + 1:
            return None
        full = m.SubscriptElement(m.Slice(lower=None, upper=None, step=None))
        if not all(m.matches(e, full) for i, e in enumerate(expr.slice) if i != dim):
            return None
        if not m.matches(expr.slice[dim], m.SubscriptElement(m.Index(m.Name(time)))):
            return None
        if time in {n.value for n in names_read(expr.value)}:
            return None
        return expr.value

    def _scan(self, resolve, factor, addend, collected, state, time, update_first) -> _Recurrence:
        a = self._strip(factor, resolve, time, 1)
        x = self._strip(addend, resolve, time, 1)
        if a is None:
            raise _Unsupported(f"the decay `{self.context.module.code_for_node(factor)}` is not an elementwise "
                               "expression of tensors indexed `[:, t]`")
        if not m.matches(collected, m.Name(state)):
            raise _Unsupported(f"the loop collects `{self.context.module.code_for_node(collected)}`, not the state `{state}`")
        if not update_first:
            raise _Unsupported(f"the loop appends `{state}` before updating it: the states before each step, "
                               "not after (linear_scan returns the states after)")
        return _Recurrence("linear_scan", [(None, a), (None, x), ("h0", cst.Name(state))], 1)

    def _linear_attention(self, resolve, factor, addend, collected, state, time, update_first, body) -> _Recurrence:
        code = self.context.module.code_for_node
        kv_outer = self._outer(resolve(addend), resolve, time)
        if kv_outer is None:
            raise _Unsupported(f"the state's addend `{code(addend)}` is neither x[:, t] nor "
                               "k_t.unsqueeze(-1) * v_t.unsqueeze(-2) with (B, H, T, *) tensors indexed [:, :, t]")
        k, v = kv_outer
        w = self._time_index(resolve(_unsqueezed_last(resolve(factor))), time, 2)
        if w is None:
            raise _Unsupported(f"the decay `{code(factor)}` is not w[:, :, t].unsqueeze(-1) (a decay per step and key)")
        read = self._read_out(resolve(collected))
        if read is None:
            raise _Unsupported(f"the output `{code(collected)}` is not einsum('bhk,bhkv->bhv', r_t, ...)")
        r_t, source = read
        r = self._time_index(resolve(r_t), time, 2)
        if r is None:
            raise _Unsupported(f"the query `{code(r_t)}` is not r[:, :, t]")
        args = [(None, self._slice(r, 2)), (None, k), (None, v), (None, self._slice(w, 2))]
        if update_first and m.matches(source, m.Name(state)):
            pass  # GLA: the current token is in the state it reads
        elif not update_first and isinstance(source, cst.BinaryOperation) and isinstance(source.operator, cst.Add) \
                and m.matches(source.left, m.Name(state)):
            bonus = self._bonus(source.right, resolve, addend, time)
            if bonus is None:
                raise _Unsupported(f"the bonus term `{code(source.right)}` is not u.unsqueeze(-1) * k_t v_t")
            args.append(("u", bonus))
        else:
            raise _Unsupported("the output reads the state neither after the update (GLA) nor before it "
                               "with the bonus term S + u.unsqueeze(-1) * kv (RWKV-6)")
        args.append(("initial_state", cst.Name(state)))
        return _Recurrence("linear_attention", args, 2)

    def _outer(self, expr, resolve, time) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
        """(k, v) for k[:, :, t].unsqueeze(-1) * v[:, :, t].unsqueeze(-2) or einsum('bhk,bhv->bhkv', k_t, v_t)."""
        if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Multiply):
            k = self._time_index(resolve(_unsqueezed_last(resolve(expr.left))), time, 2)
            v = self._time_index(resolve(_unsqueezed(resolve(expr.right), "-2")), time, 2)
            return (self._slice(k, 2), self._slice(v, 2)) if k is not None and v is not None else None
        if self._einsum(expr, "abc,abd->abcd"):
            k, v = (self._time_index(resolve(a.value), time, 2) for a in expr.args[1:])
            return (self._slice(k, 2), self._slice(v, 2)) if k is not None and v is not None else None
        return None

    def _read_out(self, expr) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
        """(r_t, S) for einsum('bhk,bhkv->bhv', r_t, S)."""
        if self._einsum(expr, "abc,abcd->abd"):
            return expr.args[1].value, expr.args[2].value.with_changes(lpar=[], rpar=[])
        return None

    def _bonus(self, expr, resolve, addend, time) -> cst.BaseExpression | None:
        """u for `u.unsqueeze(-1) * kv` where kv is the state's addend (the same k_t v_t outer product)."""
        if not (isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Multiply)):
            return None
        u = _unsqueezed_last(expr.left)
        code = self.context.module.code_for_node
        if u is None or code(resolve(expr.right)) != code(resolve(addend)) or time in {n.value for n in names_read(u)}:
            return None
        return u

    def _einsum(self, expr, canonical: str) -> bool:
        """An einsum call whose equation has `canonical`'s structure (letters renamed, no spaces or ellipsis)."""
        if not (isinstance(expr, cst.Call) and self.context.names.is_(expr.func, "torch.einsum") and len(expr.args) == 3
                and isinstance(expr.args[0].value, cst.SimpleString) and all(not a.keyword and not a.star for a in expr.args)):
            return False
        equation = expr.args[0].value.evaluated_value.replace(" ", "")
        if len(equation) != len(canonical) or "." in equation:
            return False
        renamed = {}
        for got, want in zip(equation, canonical):
            if got in ",->" or want in ",->":
                if got != want:
                    return False
            elif renamed.setdefault(got, want) != want:
                return False
        return len(set(renamed.values())) == len(renamed)

    # -- rewriting ---------------------------------------------------------

    def _rewrite(self, statements, index, loop, outs, state, steps, recurrence: _Recurrence, temporaries):
        code = self.context.module.code_for_node
        before = [i for i in range(index) if self._binds(statements[i], outs)]
        if not before or not m.matches(statements[before[-1]], m.SimpleStatementLine(
                body=[m.Assign(targets=[m.AssignTarget(m.Name(outs))], value=m.List(elements=[]))])):
            raise _Unsupported(f"`{outs}` is not made an empty list before the loop")
        start = before[-1]
        if any(outs in {n.value for n in names_read(s)} for s in statements[start + 1:index]):
            raise _Unsupported(f"`{outs}` is used between its creation and the loop")
        if index + 1 >= len(statements):
            raise _Unsupported(f"`{outs}` is not stacked right after the loop")
        after = statements[index + 1]
        stacks = [c for c in self.context.index.find(cst.Call, within=after) if self.context.names.is_(c.func, "torch.stack")
                  and c.args and m.matches(c.args[0].value, m.Name(outs))]
        dim_ok = len(stacks) == 1 and len(stacks[0].args) == 2 and \
            (stacks[0].args[1].keyword is None or stacks[0].args[1].keyword.value == "dim") and \
            code(stacks[0].args[1].value) in (str(recurrence.time_dim), f"-{4 - recurrence.time_dim}" if recurrence.time_dim == 2 else "")
        if not dim_ok:
            raise _Unsupported(f"the statement after the loop does not stack `{outs}` at dim {recurrence.time_dim}")
        scope = self.context.scopes.get(loop)
        later_reads = [] if scope is None else sorted(
            (access.node for name in (outs, state, *temporaries, loop.target.value) for access in scope.accesses[name]
             if isinstance(access.node, cst.Name) and self._after(access.node, loop)), key=self.context.index.order)
        for name in (outs, *temporaries, loop.target.value):
            uses = [n for n in later_reads if n.value == name and not self.context.inside(n, stacks[0].args[0])]
            if uses:
                raise _Unsupported(f"`{name}` is read after the loop (line {self.context.line(uses[0])})")
        tight = cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))
        args = [cst.Arg(v, keyword=None) if kw is None else
                cst.Arg(v) if kw == "h0" else cst.Arg(v, keyword=cst.Name(kw), equal=tight)
                for kw, v in recurrence.args]
        if recurrence.kernel == "linear_scan" and self._zero_literal_state(statements[:index], state):
            args = args[:2]
        call = cst.Call(func=cst.Name(recurrence.kernel), args=args)
        reads_state_after = any(n.value == state for n in later_reads if not self.context.inside(n, after))
        edits = [Remove(statements[start]), Remove(loop), Replace(stacks[0], call)]
        assign = after.body[0] if isinstance(after, cst.SimpleStatementLine) and len(after.body) == 1 else None
        stack_assigned = m.matches(assign, m.Assign(targets=[m.AssignTarget(m.Name())])) and assign.value is stacks[0]
        if recurrence.kernel == "linear_attention":
            if not stack_assigned:
                raise _Unsupported(f"the stacked `{outs}` is not assigned to one name right after the loop")
            target = assign.targets[0].target
            edits.append(Replace(target, cst.Tuple([cst.Element(target), cst.Element(cst.Name(state))], lpar=[], rpar=[])))
        elif reads_state_after or any(n.value == state for n in names_read(after)
                                      if not self.context.inside(n, stacks[0])):
            if not stack_assigned:
                raise _Unsupported(f"the state `{state}` is read after the loop, and the stack is not assigned to one name")
            if state in {n.value for n in names_read(after)} - {n.value for n in names_read(stacks[0])}:
                raise _Unsupported(f"the statement after the loop reads the state `{state}` beside the stack")
            edits.append(InsertAfter(after, (cst.parse_statement(f"{state} = {assign.targets[0].target.value}[:, -1]\n"),)))
        first = statements[start]
        if not any(line.comment is not None for line in first.leading_lines):
            # the blank lines above the list go above the kernel call (comments are carried by the removal)
            edits.append(Replace(after, lambda updated: updated.with_changes(leading_lines=first.leading_lines)))
        return edits, recurrence.kernel

    def _slice(self, tensor: cst.BaseExpression, dim: int) -> cst.BaseExpression:
        """`X[:, :T]` (dim 1) or `X[:, :, :T]` (dim 2): the steps the loop read, unless T is X.size(dim) / X.shape[dim]."""
        code = self.context.module.code_for_node
        steps = code(self._steps)
        if steps in (f"{code(tensor)}.size({dim})", f"{code(tensor)}.shape[{dim}]"):
            return tensor
        return cst.parse_expression(f"{code(_parenthesized(tensor))}[{':, ' * dim}:{steps}]")

    def _strip(self, expr, resolve, time: str, dim: int) -> cst.BaseExpression | None:
        """`expr` over all steps: each `X[:, t]` made `X` (sliced to the loop's steps), for an elementwise
        expression of such tensors and numbers (+ - * /, unary -, torch.exp / sigmoid / tanh) that holds
        at least one of them; None otherwise."""
        stripped = self._stripped(expr, resolve, time, dim)
        return None if stripped is None or isinstance(stripped, (cst.Integer, cst.Float)) else stripped

    def _stripped(self, expr, resolve, time: str, dim: int) -> cst.BaseExpression | None:
        expr = resolve(expr)
        if isinstance(expr, cst.Subscript):
            tensor = self._time_index(expr, time, dim)
            return None if tensor is None else self._slice(tensor, dim)
        if isinstance(expr, (cst.Integer, cst.Float)):
            return expr
        if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus):
            inner = self._stripped(expr.expression, resolve, time, dim)
            return None if inner is None else expr.with_changes(expression=inner)
        if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, (cst.Add, cst.Subtract, cst.Multiply, cst.Divide)):
            left, right = self._stripped(expr.left, resolve, time, dim), self._stripped(expr.right, resolve, time, dim)
            return None if left is None or right is None else expr.with_changes(left=left, right=right)
        if isinstance(expr, cst.Call) and len(expr.args) == 1 and not expr.args[0].keyword and not expr.args[0].star \
                and self.context.names.is_(expr.func, *ELEMENTWISE):
            inner = self._strip(expr.args[0].value, resolve, time, dim)
            return None if inner is None else expr.with_changes(args=[expr.args[0].with_changes(value=inner)])
        return None

    def _zero_literal_state(self, before, state: str) -> bool:
        binds = [s for s in before if self._binds(s, state)]
        return bool(binds) and m.matches(binds[-1], m.SimpleStatementLine(
            body=[m.Assign(value=m.Integer("0") | m.Float(m.MatchIfTrue(lambda v: float(v) == 0.0)))]))

    def _binds(self, statement, name: str) -> bool:
        return any(m.matches(t.target, m.Name(name))
                   for s in self.context.index.find(cst.Assign, within=statement) for t in s.targets)

    def _after(self, node, loop) -> bool:
        return self.context.index.order(node) > self.context.index.end(loop)

def _small_statements(block) -> list[cst.BaseSmallStatement]:
    return [s for line in block.body if isinstance(line, cst.SimpleStatementLine) for s in line.body]




def _unsqueezed(expr, dim: str) -> cst.BaseExpression | None:
    """x for x.unsqueeze(dim), and for dim -1 x[..., None]; dim -2: x[..., None, :]."""
    if m.matches(expr, m.Call(func=m.Attribute(attr=m.Name("unsqueeze")), args=[m.Arg(keyword=None)])) and \
            cst.Module([]).code_for_node(expr.args[0].value) == dim:
        return expr.func.value
    none = m.SubscriptElement(m.Index(m.Name("None")))
    full = m.SubscriptElement(m.Slice(lower=None, upper=None, step=None))
    ellipsis = m.SubscriptElement(m.Index(m.Ellipsis()))
    pattern = [ellipsis, none] if dim == "-1" else [ellipsis, none, full]
    if m.matches(expr, m.Subscript(slice=pattern)):
        return expr.value
    return None


def _unsqueezed_last(expr) -> cst.BaseExpression | None:
    return _unsqueezed(expr, "-1")


def _parenthesized(expr: cst.BaseExpression) -> cst.BaseExpression:
    if isinstance(expr, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) or expr.lpar:
        return expr
    return expr.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
