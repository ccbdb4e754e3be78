from __future__ import annotations

import libcst as cst

from codemod.analysis.loop_edits import unwrap
from codemod.analysis.loop_totals import collected_list
from codemod.analysis.position_losses import NotBatched, PositionLoop, Term, position_losses
from codemod.analysis.torch_facts import FUNCTIONAL, LOSS_FUNCTIONS, LOSS_MODULES, functional_alias
from codemod.analysis.torch_ops import short
from codemod.edits import Remove, Replace
from codemod.rule import Invalid, Level, Rule, Valid

LINE_LENGTH = 100  # a longer rewritten line is split after the per-position sums

PREAMBLE = """\
import torch
import torch.nn.functional as F
logits = torch.randn(4, 6, 10, requires_grad=True)
targets = torch.randint(10, (4, 6))
loss = 0.0
"""
PER_POSITION_MEAN = (
    "(\n    F.cross_entropy(\n"
    '        logits[:, :6].flatten(0, 1), targets[:, :6].flatten(0, 1), reduction="none"\n'
    "    )\n    .view_as(targets[:, :6])\n    .sum(0)\n    / (targets[:, :6] != -100).sum(0)\n).sum()"
)


class PerPositionLossLoop(Rule):
    """
    ## What it does
    Finds a Python loop over sequence positions that adds up one loss per
    position, cross-entropy (or NLL) first,

        for t in range(T):
            loss += F.cross_entropy(logits[:, t], targets[:, t])

    and replaces it with one call over all the positions at once. The loop
    may be written in many ways: `logits[:, t, :]`; `range(start, T)`,
    `range(T - 1)`; shifted positions such as `targets[:, t + 1]`,
    `logits[:, prefix + t]` or the last K positions (`logits[:, -K + k]`,
    `logits[:, -k]`); the slice first assigned to a name in the loop;
    `loss = loss + ...`; a constant factor (`... / T`); an
    `nn.CrossEntropyLoss` or `nn.NLLLoss` module; `ignore_index=`,
    `label_smoothing=`, or class weights with a summed loss; a loop over
    `zip(logits.unbind(1), labels.unbind(1))`; the per-position losses
    appended to a list that is then `torch.stack`ed or `sum`med; or a
    generator, `sum(F.cross_entropy(logits[:, t], y[:, t]) for t in range(T))`.
    Time-major tensors are read the same way, their positions along dim 0:
    `logits[t]` where `logits` is computed from the output of an `nn.LSTM`,
    `nn.GRU` or `nn.RNN` in its default layout (time first, `batch_first`
    not set), through layers on the last dim (`nn.Linear`) and the
    `forward` of a model class of the file. An index `x[t]` of a tensor not
    known to be time-major is a loop over samples, and no finding.

    Losses other than cross-entropy are batched the same way: every torch
    loss with one value an element (`F.kl_div`, `F.mse_loss`, `F.l1_loss`,
    `F.smooth_l1_loss`, the binary cross-entropies, and their modules),
    their inputs any pointwise expression of position slices (knowledge
    distillation's `F.log_softmax(student[:, t] / T, -1)` against
    `F.softmax(teacher[:, t] / T, -1)`, through names assigned in the loop).
    So is a masked loss: each position's unreduced loss
    (`reduction="none"`) in a pointwise expression with other position
    slices, summed, `(l * mask[:, t]).sum()`, becomes one unreduced loss
    over all positions times the mask, summed; what the loop's sum is
    divided by after it (`loss / mask.sum()`) is left as written.

    A loop whose positions each run the whole model (teacher forcing,
    `model(x[:, :t])[:, -1]`) is reported with the batched alternative: a
    causal model gives every position's logits in one call, `model(x[:, :-1])`.

    ## Why is this bad?
    Each iteration launches its own softmax, gather and reduction over a
    `(batch, vocab)` slice, plus the autograd nodes for them; with T positions
    that is T times the kernel launches and Python overhead of one call over a
    `(batch, vocab, T)` tensor, and the backward pass replays them one by one.
    Measured on a CPU (torch 2.13, one thread, a 2-layer transformer LM,
    batch 8, a loop over all 64 positions, vocabulary 512, `python -m
    benchmarks.bench_batching`): 1.3-2.1x tokens/s for the whole training
    step over five runs on a busy two-core machine. On a GPU each position's
    three or more kernels are tiny launches, so the gap grows with the
    number of positions. A teacher-forced loop runs the model T times
    instead of once: the cost grows with T.

    The sum over positions of per-position means is not the mean over all
    tokens: with `reduction="mean"` (the default) each position is divided by
    its own count of targets that are not `ignore_index` (-100 by default), so
    `F.cross_entropy(logits.flatten(0, 1), targets.flatten())` would give a
    different loss, and a different gradient scale, unless every position has
    the same count. The fix keeps the per-position means: it computes every
    token's loss with `reduction="none"`, sums over the batch, and divides by
    each position's count of targets that are not ignored. With
    `reduction="sum"` the loop is one summed call over the flattened
    positions. Every token's loss is computed over the flattened positions,
    the classes the last dimension as in the loop, and laid out again as the
    targets (`.view_as`): a softmax over a middle dimension
    (`logits.transpose(1, 2)`) gives the same numbers 1.6-4x slower for the
    loss's forward and backward on a CPU (batch 8 x 128, vocabulary 4,002;
    32 x 128, vocabulary 65).

    ## Example
    ```python
    loss = 0.0
    for t in range(T):
        loss += F.cross_entropy(logits[:, t], targets[:, t])
    ```
    Use instead:
    ```python
    loss = 0.0
    tokens = F.cross_entropy(logits[:, :T].flatten(0, 1), targets[:, :T].flatten(0, 1), reduction="none")
    loss += (tokens.view_as(targets[:, :T]).sum(0) / (targets[:, :T] != -100).sum(0)).sum()
    ```

    ## Fix safety
    Numeric: the same per-position means and their sum, added in another
    order, so the loss and the gradients agree within floating-point rounding
    (the execution tests see 2e-16 relative in float64). The fix assumes
    what the loop's indexing implies: `logits[:, t]` is `(batch, classes)` and
    `targets[:, t]` holds class indices; a `logits[:, t]` with more dimensions
    (K-dimensional cross-entropy), or probability targets, would make the fix
    raise or differ. Names the loop assigns (the loop variable, the slices)
    must not be read after it.

    Positions become a slice where its bounds are known not to wrap around
    (numbers, sizes, lengths); a loop over the last K positions becomes
    `[-K:]` only when K is a positive number, and is counted from the length
    otherwise (`[-0:]` would be every position, while the loop adds nothing).
    Other positions are gathered with the loop's own index arithmetic,
    `logits[:, torch.arange(K, device=logits.device) + prefix - 1]`, which
    wraps negative positions and raises on positions out of range as the
    loop does. A `range` past the sequence end raises `IndexError` in the
    loop; its slice is clipped instead. `zip(a.unbind(1), b.unbind(1))`
    stops at the shorter of the two; the fix needs them to have the same
    number of positions (it raises otherwise).

    For the other losses, each position's reduction is kept: `"sum"` is one
    summed call; `"batchmean"` (KL divergence) divides each position's sum
    by the batch size, `input.size(0)`, so the sum over positions is one
    summed call divided by it; `"mean"` divides by each position's number of
    elements, the same for every position, so the sum over K positions is
    the mean over all of them times K (or, where the loop's range does not
    show K, each position's mean, summed). Every position slice of the term
    becomes the same positions of its tensor; a Python number in the term
    stays as written, and another name is refused, since a tensor could
    broadcast against one position and not against all of them.

    Reported without a fix: `reduction="none"` not summed in the loop (a
    per-sample result the loop combines in its own way), `weight=` together with the mean (each position
    is divided by its own sum of class weights), constructor arguments of the
    loss module that are not literals, `size_average`/`reduce`, a loop that
    does more than add one loss per position, and teacher-forced loops.
    """

    CODE = "PM503"
    NAME = "per-position-loss-loop"
    LEVEL = Level.NUMERIC
    REQUIRES = tuple(sorted(short(LOSS_FUNCTIONS | LOSS_MODULES)))  # every loss of one value an element
    MESSAGE = "cross-entropy computed one sequence position at a time in a Python loop; compute it over all positions in one call"
    GAIN = "T softmax/gather launches and their backward nodes become one call: 1.3-2.1x per step on CPU (T=64, benchmarks/bench_batching.py)"

    VALID = [
        Valid(
            PREAMBLE + "emb, cell, head = torch.nn.Embedding(10, 8), torch.nn.GRUCell(8, 8), torch.nn.Linear(8, 10)\n"
            "h, token = torch.zeros(4, 8), targets[:, 0]\nfor t in range(1, 6):\n    h = cell(emb(token), h)\n"
            "    step_logits = head(h)\n    loss += F.cross_entropy(step_logits, targets[:, t])\n"
            "    token = step_logits.argmax(-1)\n",
            "free-running decoding: each position feeds on the one before",
        ),
        Valid(
            PREAMBLE + "for t in range(6):\n    loss += F.cross_entropy(logits[t], targets[t])\n",
            "a loop over samples, not positions",
        ),
        Valid(
            PREAMBLE + "def cross_entropy(a, b):\n    return (a - b).sum()\nfor t in range(6):\n"
            "    loss += cross_entropy(logits[:, t], targets[:, t])\n",
            "a local function of the same name",
        ),
        Valid(
            PREAMBLE + "heads = [logits, logits]\nfor k, head in enumerate(heads):\n"
            "    loss += F.cross_entropy(head[:, : 6 - k].flatten(0, 1), targets[:, k:].flatten())\n",
            "one loss per prediction head, over all positions each",
        ),
    ]
    INVALID = [
        Invalid(
            PREAMBLE + "for t in range(6):\n    loss += F.cross_entropy(logits[:, t], targets[:, t])\n",
            PREAMBLE + f"loss += {PER_POSITION_MEAN}\n",
        ),
        Invalid(
            PREAMBLE + "mask = (targets != 0).float()\nfor t in range(6):\n"
            '    l = F.cross_entropy(logits[:, t], targets[:, t], reduction="none")\n'
            "    loss = loss + (l * mask[:, t]).sum()\nloss = loss / mask.sum()\n",
            PREAMBLE + "mask = (targets != 0).float()\nloss = (\n    loss\n    + (\n        F.cross_entropy(\n"
            '            logits[:, :6].flatten(0, 1), targets[:, :6].flatten(0, 1), reduction="none"\n'
            "        ).view_as(targets[:, :6])\n        * mask[:, :6]\n    ).sum()\n)\nloss = loss / mask.sum()\n",
            "a masked loss: each position's unreduced loss times its mask, summed",
        ),
        Invalid(
            PREAMBLE + "teacher = torch.randn(4, 6, 10)\nK, T = 4, 2.0\nfor k in range(K):\n"
            "    loss += F.kl_div(F.log_softmax(logits[:, k] / T, -1), F.softmax(teacher[:, k] / T, -1), "
            'reduction="batchmean") * T**2\n',
            PREAMBLE + "teacher = torch.randn(4, 6, 10)\nK, T = 4, 2.0\nloss += (\n    F.kl_div(\n"
            "        F.log_softmax(logits[:, :K] / T, -1),\n        F.softmax(teacher[:, :K] / T, -1),\n"
            '        reduction="sum",\n    )\n    / logits.size(0)\n    * (T**2)\n)\n',
            "distillation over the first K positions: batchmean is each position's sum over the batch size",
        ),
        Invalid(
            PREAMBLE + "for t in range(6):\n    loss += F.mse_loss(logits[:, t], logits[:, t].detach() * 0.5)\n",
            PREAMBLE + "loss += F.mse_loss(logits[:, :6], logits[:, :6].detach() * 0.5) * 6\n",
            "a mean squared error per position: as many elements each, so the mean times the positions",
        ),
        Invalid(
            PREAMBLE
            + 'for t in range(1, 5):\n    loss = loss + F.cross_entropy(logits[:, t - 1, :], targets[:, t], reduction="sum") / 4\n',
            PREAMBLE + "loss = (\n    loss\n    + F.cross_entropy(\n"
            '        logits[:, :4].flatten(0, 1), targets[:, 1:5].flatten(0, 1), reduction="sum"\n'
            "    )\n    / 4\n)\n",
            "shifted targets, a summed loss and a constant factor",
        ),
        Invalid(
            PREAMBLE + "criterion = torch.nn.CrossEntropyLoss(ignore_index=0, label_smoothing=0.1)\n"
            "for t in range(6):\n    loss += criterion(logits[:, t], targets[:, t])\n",
            PREAMBLE + "loss += (\n    F.cross_entropy(\n        logits[:, :6].flatten(0, 1),\n"
            '        targets[:, :6].flatten(0, 1),\n        reduction="none",\n        ignore_index=0,\n'
            "        label_smoothing=0.1,\n    )\n    .view_as(targets[:, :6])\n    .sum(0)\n"
            "    / (targets[:, :6] != 0).sum(0)\n).sum()\n",
            "a loss module: its arguments carried over, the module itself no longer needed",
        ),
        Invalid(
            PREAMBLE + "K = 3\nfor k in range(K):\n    step_logits = logits[:, -K + k, :]\n"
            '    loss += F.cross_entropy(step_logits, targets[:, k], reduction="sum")\n',
            PREAMBLE
            + "K = 3\nloss += F.cross_entropy(\n"
            + '    logits[:, -K:].flatten(0, 1), targets[:, :K].flatten(0, 1), reduction="sum"\n)\n',
            "the last K positions, through a name assigned in the loop",
        ),
        Invalid(
            PREAMBLE + "T = logits.size(1)\nlosses = []\nfor t in range(T):\n"
            "    losses.append(F.cross_entropy(logits[:, t], targets[:, t]))\nloss = torch.stack(losses).mean()\n",
            PREAMBLE
            + "T = logits.size(1)\nlosses = (\n"
            + '    F.cross_entropy(\n        logits.flatten(0, 1), targets[:, :T].flatten(0, 1), reduction="none"\n'
            "    )\n    .view_as(targets[:, :T])\n    .sum(0)\n    / (targets[:, :T] != -100).sum(0)\n)\n"
            "loss = losses.mean()\n",
            "per-position losses collected in a list: one vector of them",
        ),
        Invalid(
            PREAMBLE
            + 'loss = sum(F.cross_entropy(logits[:, t], targets[:, t], reduction="sum") for t in range(6)) / 6\n',
            PREAMBLE
            + "loss = (\n    F.cross_entropy(\n"
            + '        logits[:, :6].flatten(0, 1), targets[:, :6].flatten(0, 1), reduction="sum"\n'
            + "    )\n    / 6\n)\n",
            "a generator summed",
        ),
        Invalid(
            PREAMBLE + "K = 3\nfor k in range(K):\n    step_logits = logits[:, -K + k, :]\n"
            "    loss += F.cross_entropy(step_logits, targets[:, k])\nprint(step_logits)\n",
            None,
            "a name the loop assigns is read after it",
        ),
        Invalid(
            PREAMBLE
            + 'for t in range(6):\n    loss += F.cross_entropy(logits[:, t], targets[:, t], reduction="none")\n',
            None,
            "a per-sample result",
        ),
        Invalid(
            PREAMBLE
            + "w = torch.ones(10)\nfor t in range(6):\n    loss += F.cross_entropy(logits[:, t], targets[:, t], weight=w)\n",
            None,
            "class weights with the mean",
        ),
        Invalid(
            PREAMBLE + "for t in range(6):\n    loss += F.cross_entropy(logits[:, t], targets[:, t])\nprint(t)\n",
            None,
            "the loop variable is read after the loop",
        ),
        Invalid(
            PREAMBLE + "for t in range(6):\n    loss += F.cross_entropy(logits[:, t], targets[:, t])\n    print(t)\n",
            None,
            "the loop does more than add losses",
        ),
        Invalid(
            PREAMBLE + "model = torch.nn.Linear(6, 10)\nx = torch.randn(4, 6)\nfor t in range(1, 6):\n"
            "    loss = loss + F.cross_entropy(model(x[:, :t].sum(1, keepdim=True).expand(4, 6)), targets[:, t])\n",
            None,
            "each position runs the model (teacher forcing)",
        ),
    ]

    # -- loops ---------------------------------------------------------------------

    @property
    def _positions(self):
        """Per-position loss loops and their terms (the shared analysis)."""
        return position_losses(self.context)

    def visit_For(self, node: cst.For) -> None:
        positions = self._positions
        loop = positions.loop(node)
        if loop is None:
            return
        losses = positions.losses(node.body, loop)
        if not losses or positions.recurrent(node):
            return
        try:
            try:
                edits, imports = self._rewrite_loop(node, loop)
            except NotBatched as reason:
                if positions.teacher_forced(node.body, loop):
                    raise
                try:
                    edits, imports = self._general_rewrite(node, loop)
                except NotBatched as general:
                    raise (reason if positions.cross_entropy(losses) else general) from None
        except NotBatched as reason:
            self.report(node, f"{self._message(node.body, loop)}; not rewritten: {reason}")
            return
        self.report(node, self._message(node.body, loop), edits=edits, imports=imports)

    def _message(self, body: cst.CSTNode, loop: PositionLoop) -> str:
        positions = self._positions
        cross_entropy = positions.cross_entropy(positions.losses(body, loop))
        loss = "cross-entropy" if cross_entropy else "the loss"
        if positions.teacher_forced(body, loop):
            return (
                f"the model runs its forward once per sequence position (teacher forcing) and {loss} is computed per "
                "position; a causal model gives every position's logits in one call (`logits = model(x[:, :-1])`), "
                f"then one {'cross-entropy' if cross_entropy else 'loss'} over all positions"
            )
        return self.MESSAGE if cross_entropy else self.MESSAGE.replace("cross-entropy", "a loss", 1)

    def _rewrite_loop(self, node: cst.For, loop: PositionLoop):
        """The edits that turn a loop of cross-entropy terms into one call."""
        found = self._positions.cross_entropy_loop(node, loop)
        edits: list = [Remove(self.context.index.holding_line(assign)) for assign in found.temporaries.values()]
        imports = self._imports(found.term)
        if found.appended:
            edits += self._list_edits(node, found.statement, found.term, loop)
        else:
            head = self.context.source(found.statement).split(self.context.source(found.value))[0]  # `loss += `
            indent = self.context.positions[node].start.column
            edits.append(Replace(found.value, self._expression(found.term, loop, "total", indent + len(head), indent)))
        edits.append(unwrap(node))
        return edits, imports

    def _general_rewrite(self, node: cst.For, loop: PositionLoop):
        """The edits that turn a loop adding any loss reduced per position (or a masked
        loss) into its sum over the positions."""
        found = self._positions.summed_loop(node, loop)
        edits: list = [Remove(self.context.index.holding_line(assign)) for assign in found.temporaries.values()]
        sums = [found, *found.others]  # `kd += ...; ce += ...`: each total on its own
        edits += [Replace(term.value, cst.parse_expression(term.batched)) for term in sums]
        imports = [pair for term in sums for pair in term.imports]
        return [*edits, unwrap(node)], list(dict.fromkeys(imports))

    def _list_edits(self, node: cst.For, statement: cst.Expr, term: Term, loop: PositionLoop) -> list:
        """`L = []` before the loop, `L.append(term)` in it, and one `torch.stack(L)` or
        `sum(L)` after it: L becomes the vector of per-position losses."""
        collected = collected_list(self.context, node, statement.value.func.value)
        if collected.problem is not None:
            raise NotBatched(collected.problem)
        name = collected.name.value
        replacement = cst.Name(name) if collected.stacked else cst.parse_expression(f"{name}.sum()")
        indent = self.context.positions[node].start.column
        vector = self._expression(term, loop, "vector", indent + len(name) + 3, indent)
        assign = cst.Assign(targets=[cst.AssignTarget(cst.Name(name))], value=vector)
        return [Remove(collected.line), Replace(statement, assign), Replace(collected.call, replacement)]

    # -- comprehensions ------------------------------------------------------------

    def visit_GeneratorExp(self, node: cst.GeneratorExp) -> None:
        self._comprehension(node)

    def visit_ListComp(self, node: cst.ListComp) -> None:
        self._comprehension(node)

    def _comprehension(self, node: cst.GeneratorExp | cst.ListComp) -> None:
        """`sum(<loss of t> for t in range(...))` and `torch.stack([<loss of t> for t in ...])`."""
        positions = self._positions
        loop = positions.loop(node)
        if loop is None or not positions.losses(node.elt, loop):
            return
        argument = self.context.index.argument_of(node)
        try:
            if node.for_in.ifs:
                raise NotBatched("the positions are filtered")
            call, arg = argument or (None, None)
            if call is None or len(call.args) != 1 or arg.keyword is not None or arg.star:
                raise NotBatched("the per-position losses are not summed or stacked")
            if self.context.names.is_(call.func, "sum", "builtins.sum"):
                kind = "total"
            elif self.context.names.is_(call.func, "torch.stack") and isinstance(node, cst.ListComp):
                kind = "vector"
            else:
                raise NotBatched("the per-position losses are not summed or stacked")
            term = positions.term(node.elt, loop, {})
        except NotBatched as reason:
            self.report(node, f"{self.MESSAGE}; not rewritten: {reason}")
            return
        statement = self.context.index.statement_of(call)
        indent = self.context.positions[statement].start.column
        column = self.context.positions[call].start.column
        expression = self._expression(term, loop, kind, column, indent, parenthesize=term.factor is not None)
        self.report(node, edits=[Replace(call, expression)], imports=self._imports(term))

    # -- the batched expression -----------------------------------------------------

    def _expression(
        self, term: Term, loop: PositionLoop, kind: str, column: int, indent: int, parenthesize: bool = False
    ) -> cst.BaseExpression:
        """The loss over all positions: their sum (`kind` "total"), or the vector of
        per-position losses ("vector"), for an expression that starts at `column` of a
        statement indented by `indent`."""
        code = self.context.module.code_for_node
        inputs, targets = self._positions.operands(term, loop)
        loss = term.loss
        alias = functional_alias(self.context.module) or FUNCTIONAL
        function = code(term.call.func) if loss.module is None else f"{alias}.{loss.function}"
        if loss.reduction == "sum" and kind == "total":
            if loss.module is not None:
                text = f"{code(loss.module)}({inputs}.flatten(0, 1), {targets}.flatten(0, 1))"
            else:
                extra = "".join(f", {k}={v}" for k, v in loss.keywords.items())
                text = f"{function}({inputs}.flatten(0, 1), {targets}.flatten(0, 1){extra})"
            lines = [text]
        else:
            keywords = {"reduction": '"none"', **{k: v for k, v in loss.keywords.items() if k != "reduction"}}
            extra = "".join(f", {k}={v}" for k, v in keywords.items())
            # every token's loss over the flattened positions (the classes stay the last,
            # contiguous dimension: a class dimension moved to the middle costs a strided
            # softmax), laid out again as the targets to sum over the batch
            tokens = f"{function}({inputs}.flatten(0, 1), {targets}.flatten(0, 1){extra}).view_as({targets})"
            batch = loop.batch_dim
            if loss.reduction == "sum":  # the vector of per-position sums
                lines = [f"{tokens}.sum({batch})"]
            else:
                close = ".sum()" if kind == "total" else ""
                lines = [f"({tokens}.sum({batch})", f"/ ({targets} != {loss.ignore_index}).sum({batch})){close}"]
        if term.factor is not None:
            operator, operand = term.factor
            lines[-1] = f"{lines[-1]} {operator} {code(operand)}"
        if parenthesize:
            lines[0] = f"({lines[0]}"
            lines[-1] = f"{lines[-1]})"
        text = " ".join(lines)
        if len(lines) > 1 and column + len(text) > LINE_LENGTH:
            # libcst puts the block's indentation in front of the continuation line itself
            text = f"{lines[0]}\n{' ' * (column - indent + 1)}{lines[1]}"
        return cst.parse_expression(text)

    def _imports(self, term: Term) -> list[tuple[str, str | None]]:
        if term.loss.module is not None and functional_alias(self.context.module) is None:
            return [(FUNCTIONAL, None)]
        return []
