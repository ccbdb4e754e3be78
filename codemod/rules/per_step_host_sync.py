from __future__ import annotations

import libcst as cst

from codemod.analysis.host_reads import (
    AS_COUNT,
    AS_DETACHED,
    AS_DOUBLE,
    AS_FLOAT,
    AS_INT,
    CARRIED,
    LISTED,
    MOVED,
    SUMMED,
    Deferral,
    HostReads,
    Kept,
    StepReads,
    detached,
    host_reads,
    read_tensor,
)
from codemod.edits import Edit, InsertAfter, InsertBefore, Remove, Replace
from codemod.rule import Invalid, Level, Rule, Valid
from codemod.suppression import suppressed_on

PREAMBLE = """\
import torch
import torch.nn.functional as F
model = torch.nn.Linear(8, 1).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = [(torch.randn(4, 8).cuda(), torch.randn(4, 1).cuda()) for _ in range(100)]
"""
STEP = """\
    loss = F.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


ANYWAY = (
    "the loop waits for the device on every step anyway at `{read}` (line {line}), a read that stays, so "
    "reading this value later would not let the step run ahead"
)
IN_ANOTHER_FUNCTION = (
    "it is in another function; call that function only at log time, or return the tensor and read it there"
)


class PerStepHostSync(Rule):
    """
    ## What it does
    Finds `.item()`, `.tolist()`, `.cpu()` and `float(t)` in a training step loop
    whose values are only read when the loop logs (under `if step % N == 0:`, or
    after the loop), and moves the read to log time: a value assigned every step
    is assigned under the log condition instead, and a running sum kept in a
    Python float is kept on the device (in float64) and read at log time.

    ## Why is this bad?
    These calls copy a value from the GPU to the host, so the CPU waits for every
    kernel queued so far before it can queue the next step: the GPU runs dry at
    each step boundary while Python catches up. Reading only on log steps lets
    the CPU run ahead and keep the GPU queue full. The gain is largest for small
    models whose steps take a few milliseconds and are bound by kernel launches
    (up to 10-20% of step time), small for long steps, and none while another
    sync stays in the step (a value printed every step, a blocking copy).

    ## Example
    ```python
    running = 0.0
    for step, (x, y) in enumerate(loader):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        lr_now = lr.item()
        running += loss.item()
        if step % 100 == 99:
            print(f"step {step} lr {lr_now} loss {running / 100:.4f}")
            running = 0.0
    ```
    Use instead:
    ```python
    running = 0.0
    for step, (x, y) in enumerate(loader):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        running += loss.detach().double()
        if step % 100 == 99:
            lr_now = lr.item()
            print(f"step {step} lr {lr_now} loss {float(running) / 100:.4f}")
            running = 0.0
    ```

    ## Fix safety
    Safe: the printed values are the same bit for bit.
    `loss.item()` gives the float32 loss converted exactly to a Python float (a
    double), and `loss.detach().double()` converts it exactly the same way; a
    Python `+=` and a float64 tensor add are both one IEEE 754 double addition,
    correctly rounded, so adding the same values in the same order gives the same
    sum on the CPU and on CUDA (CUDA's double add and divide round correctly; each
    eager tensor operation is its own kernel, so nothing is fused into an FMA, as
    `torch.compile` could do if it compiled the accumulation itself). The
    same holds for `*` and `/` by Python numbers (a division only by a number
    that cannot be zero: a non-zero literal, or a name or parameter only ever
    given non-zero literals, since a tensor divided by zero gives inf where
    Python raises). Accumulating in float32 on the device instead would round
    differently, so the fix always uses float64. Integer sums
    (`correct += (pred == y).sum().item()`) stay int64 tensors; an int64 count
    in the arithmetic of a float sum (`total += loss.item() * n`, `acc +=
    (pred == y).sum().item() / bs`) is converted to double first, where `+ - *
    /` with Python numbers round as Python's do on the int (exact as doubles
    below 2**53; an int64 tensor divided on the device would give float32).
    `float(total)` (`int(correct)`) at the read gives back the Python number.

    A value is moved under the log condition only when the move cannot change it:
    its expression only reads values computed in this step (not parameters or
    other state that the optimizer changes in place), nothing between the old and
    the new place re-binds, changes in place, aliases or hands those values to a
    call, and every use is in the log branch. The rule reports without a fix,
    saying why, when the value decides control flow every step (early stopping,
    NaN checks), is stored or printed every step, is used after the loop, or
    when the file may run on MPS or XLA, which have no float64. Where the loop
    waits for the device every step anyway, at a `torch.cuda.synchronize()`
    (timing code) or at another read that stays (a loss printed every step),
    the step's other reads are reported with that wait as the reason and left
    where they are: reading them later would not let the step run ahead.

    Values are followed through the file's own code: sums started together
    (`total, correct = 0.0, 0` or `n_tok = n_correct = 0`), values a function
    of the file returns (`loss, dice = compute_loss(...)`, a step method's
    `return loss, logits`). Sums kept in the items of a dict
    (`stats["reg"] += reg_loss.item()`) are kept on the device when the dict is
    a local dict literal with constant keys and number values (or a
    `defaultdict(float)`), every item is added to or read with a constant key,
    and the dict is read only that way or in a loop over `stats.items()` /
    `stats.values()`, where every item is such a sum. A dict returned, handed to
    a function or indexed with a variable stays as it is. A count read once per
    step only to be added to sums (`n = mask.sum().item()`, then
    `tokens += n` and `total += loss.item() * n`) keeps its tensor, together
    with those sums.

    A step function of the file that returns a sync (`return loss.item()`),
    called once in the loop to add to a running sum
    (`running += self.train_step(batch)`), returns the tensor instead when its
    name appears nowhere else in the file and no other module of the package
    calls it. That fix is safe for a private (`_train_step`) or nested
    function and unsafe otherwise: code in other files that calls the function
    would get a tensor. Any other sync in a
    function the step loop calls on every step (an evaluation helper) is
    reported where it is, with the call that runs it; one called only under
    the log condition runs at log time and is not reported.

    A value appended to a list every step (`losses.append(loss.item())`, or
    `history["loss"].append(loss.item())` for a dict literal whose item starts
    as `[]`) is appended as a tensor (`loss.detach()`), and the list becomes
    numbers once, right after the loop that fills it:
    `losses = torch.stack(losses).tolist() if losses else []`, one wait for
    the device instead of one a step. The numbers are the same bit for bit
    (`.tolist()` converts each value exactly as `.item()` does). This is done
    when the list starts empty before that loop, in the same block, and
    nothing reads it until the loop ends (a moving average of the last values,
    a list handed to a logger or stored elsewhere first, an exception handler
    around the loop): there it would hold tensors, so the rule reports why.
    """

    CODE = "PM404"
    NAME = "per-step-host-sync"
    LEVEL = Level.SAFE
    REQUIRES = ("backward",)
    MESSAGE = "host sync every step: the CPU waits for the GPU to read a value that is only logged"
    GAIN = "up to 10-20% of step time for short, launch-bound steps once no other sync is left in the step"

    VALID = [
        Valid(
            "import torch\nimport torch.nn.functional as F\ndevice = torch.device('cpu')\n"
            "model = torch.nn.Linear(4, 1).to(device)\nmodel.compile()\n"
            "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nrunning = 0.0\n"
            "for x, y in [(torch.randn(8, 4), torch.randn(8, 1))] * 4:\n"
            "    loss = F.mse_loss(model(x.to(device)), y.to(device))\n    loss.backward()\n    opt.step()\n"
            "    opt.zero_grad()\n    running += loss.item()\n",
            "the model stays on the CPU: compiling it in place does not move it",
        ),
        Valid(
            PREAMBLE
            + "for step, (x, y) in enumerate(loader):\n"
            + STEP
            + "    if step % 10 == 0:\n        print(loss.item())\n",
            "already read at log time",
        ),
        Valid(
            PREAMBLE + "for x, y in loader:\n    loss = F.mse_loss(model(x), y)\n    print(loss.item())\n",
            "not a training loop (no backward)",
        ),
        Valid(
            PREAMBLE + "x = torch.randn(4)\nfor step in range(10):\n    loss = (x * step).sum()\n"
            "    loss.backward()\n    v = x.sum().item()\n",
            "host tensor: nothing to wait for",
        ),
        Valid(
            PREAMBLE
            + "for step, (x, y) in enumerate(loader):\n"
            + STEP
            + "    v = loss.item()  # perfmod: ignore[PM404]\n    if step % 10 == 0:\n        print(v)\n",
            "suppressed on the line of the sync",
        ),
        Valid(
            PREAMBLE
            + "def train():\n    for step, (x, y) in enumerate(loader):\n"
            + STEP.replace("    ", "        ")
            + "        def show():\n            print(loss.item())\n",
            "nested function: runs elsewhere",
        ),
        Valid(
            PREAMBLE
            + "def divisible_by(num, den):\n    return (num % den) == 0\n"
            + "for i, (x, y) in enumerate(loader):\n"
            + STEP
            + "    if divisible_by(i, 10):\n        print(f'validation loss: {loss.item():.4f}')\n",
            "read every 10 steps, under a helper that tests the counter",
        ),
        Valid(
            PREAMBLE
            + "for i, (x, y) in enumerate(loader):\n"
            + STEP
            + "    if i != 0 and i % 10 == 0:\n        print(loss.item())\n",
            "read every 10 steps but the first",
        ),
    ]
    INVALID = [
        Invalid(
            PREAMBLE
            + "for step, (x, y) in enumerate(loader):\n"
            + STEP
            + '    loss_val = loss.item()\n    if step % 10 == 0:\n        print(f"step {step} loss {loss_val:.4f}")\n',
            PREAMBLE
            + "for step, (x, y) in enumerate(loader):\n"
            + STEP
            + '    if step % 10 == 0:\n        loss_val = loss.item()\n        print(f"step {step} loss {loss_val:.4f}")\n',
            "value read only under the log condition: moved there",
        ),
        Invalid(
            PREAMBLE
            + "for step, (x, y) in enumerate(loader):\n"
            + STEP
            + "    # the loss of this step\n    v = float(loss)\n\n    if step % 10 == 0: print(v)\n",
            PREAMBLE
            + "for step, (x, y) in enumerate(loader):\n"
            + STEP
            + "\n    if step % 10 == 0:\n        # the loss of this step\n        v = float(loss)\n        print(v)\n",
            "one-line branch becomes a block; comments move with the statement",
        ),
        Invalid(
            PREAMBLE
            + "running = 0.0\nfor step, (x, y) in enumerate(loader):\n"
            + STEP
            + '    running += loss.item()\n    if step % 10 == 9:\n        print(f"loss {running / 10:.4f}")\n'
            "        running = 0.0\n",
            PREAMBLE
            + "running = 0.0\nfor step, (x, y) in enumerate(loader):\n"
            + STEP
            + "    running += loss.detach().double()\n    if step % 10 == 9:\n"
            '        print(f"loss {float(running) / 10:.4f}")\n        running = 0.0\n',
            "running sum: float64 on the device, read at log time",
        ),
        Invalid(
            PREAMBLE
            + "for epoch in range(3):\n    total, correct = 0.0, 0\n    for x, y in loader:\n"
            + STEP.replace("    ", "        ")
            + "        total += loss.item() * x.size(0)\n        correct += (model(x) > 0).eq(y > 0).sum().item()\n"
            "    print(epoch, total / 400, correct)\n",
            PREAMBLE
            + "for epoch in range(3):\n    total, correct = 0.0, 0\n    for x, y in loader:\n"
            + STEP.replace("    ", "        ")
            + "        total += loss.detach().double() * x.size(0)\n        correct += (model(x) > 0).eq(y > 0).sum()\n"
            "    print(epoch, float(total) / 400, int(correct))\n",
            "accumulators started by one tuple assignment of numbers",
        ),
        Invalid(
            PREAMBLE
            + "for epoch in range(3):\n    total = 0.0\n    correct = 0\n    for x, y in loader:\n"
            + STEP.replace("    ", "        ")
            + "        total += loss.item() * x.size(0)\n        correct += (model(x) > 0).eq(y > 0).sum().item()\n"
            "    print(epoch, total / 400, correct)\n",
            PREAMBLE
            + "for epoch in range(3):\n    total = 0.0\n    correct = 0\n    for x, y in loader:\n"
            + STEP.replace("    ", "        ")
            + "        total += loss.detach().double() * x.size(0)\n        correct += (model(x) > 0).eq(y > 0).sum()\n"
            "    print(epoch, float(total) / 400, int(correct))\n",
            "epoch sums read after the step loop; counts stay integers",
        ),
        Invalid(
            PREAMBLE
            + "smooth = 0.0\nfor step, (x, y) in enumerate(loader):\n"
            + STEP
            + "    smooth = 0.9 * smooth + 0.1 * loss.item()\n    if step % 10 == 0:\n        print(smooth)\n",
            PREAMBLE
            + "smooth = 0.0\nfor step, (x, y) in enumerate(loader):\n"
            + STEP
            + "    smooth = 0.9 * smooth + 0.1 * loss.detach().double()\n    if step % 10 == 0:\n"
            "        print(float(smooth))\n",
            "exponential moving average: the same double operations in the same order",
        ),
        Invalid(
            PREAMBLE
            + "total = 0\nfor step, (x, y) in enumerate(loader):\n"
            + STEP
            + "    total += loss.item()\n    if step % 10 == 9:\n        print(total)\n        total = 0\n",
            PREAMBLE
            + "total = 0\nfor step, (x, y) in enumerate(loader):\n"
            + STEP
            + "    total += loss.detach().double()\n    if step % 10 == 9:\n        print(float(total))\n"
            "        total = 0\n",
            "int start, but every read comes after an addition in the same step",
        ),
        Invalid(
            PREAMBLE
            + "total = 0\nfor epoch in range(2):\n    for x, y in loader:\n"
            + STEP.replace("    ", "        ")
            + "        total += loss.item()\n    print(total)\n",
            None,
            "int start printed where no step may have added to it: 0 would print as 0.0",
        ),
        Invalid(
            PREAMBLE
            + "for step, (x, y) in enumerate(loader):\n"
            + STEP
            + "    v = loss.item()\n    if v < 0.01:\n        break\n",
            None,
            "early stopping: the value decides control flow every step",
        ),
        Invalid(
            PREAMBLE
            + "for step, (x, y) in enumerate(loader):\n"
            + STEP
            + "    if not torch.isfinite(loss).item():\n        raise RuntimeError('nan')\n",
            None,
            "NaN check every step",
        ),
        Invalid(
            PREAMBLE
            + "losses = []\nfor step, (x, y) in enumerate(loader):\n"
            + STEP
            + "    losses.append(loss.item())\nprint(sum(losses) / len(losses))\n",
            PREAMBLE
            + "losses = []\nfor step, (x, y) in enumerate(loader):\n"
            + STEP
            + "    losses.append(loss.detach())\nlosses = torch.stack(losses).tolist() if losses else []\n"
            + "print(sum(losses) / len(losses))\n",
            "stored every step, read after the loop",
        ),
        Invalid(
            PREAMBLE
            + "losses = []\nfor step, (x, y) in enumerate(loader):\n"
            + STEP
            + "    losses.append(loss.item())\n    if len(losses) > 10 and losses[-1] > max(losses[-10:-1]):\n"
            + "        break\n",
            None,
            "stored every step and read in the loop",
        ),
        Invalid(
            PREAMBLE
            + "for step, (x, y) in enumerate(loader):\n"
            + STEP
            + "    v = loss.item()\n    if step % 10 == 0:\n        print(v)\nprint('last', v)\n",
            None,
            "also used after the loop",
        ),
        Invalid(
            PREAMBLE
            + "for step, (x, y) in enumerate(loader):\n"
            + STEP
            + "    w = model.weight.norm().item()\n    optimizer.step()\n    if step % 10 == 0:\n        print(w)\n",
            None,
            "reads parameters that the optimizer changes in place",
        ),
        Invalid(
            PREAMBLE
            + "total = 0.0\nfor step, (x, y) in enumerate(loader):\n"
            + STEP
            + '    total += loss.item()\n    if step % 10 == 0:\n        print(f"{total=}")\n',
            None,
            "f-string `=` prints the expression's text",
        ),
        Invalid(
            PREAMBLE.replace(".cuda()", '.to("mps")')
            + "total = 0.0\nfor step, (x, y) in enumerate(loader):\n"
            + STEP
            + "    total += loss.item()\n    if step % 10 == 0:\n        print(total)\n",
            None,
            "MPS has no float64",
        ),
        Invalid(
            PREAMBLE
            + "for epoch in range(2):\n    stats = {'loss': 0.0}\n    for x, y in loader:\n"
            + STEP.replace("    ", "        ")
            + "        stats['loss'] += loss.item()\n    print(stats['loss'] / 100)\n",
            PREAMBLE
            + "for epoch in range(2):\n    stats = {'loss': 0.0}\n    for x, y in loader:\n"
            + STEP.replace("    ", "        ")
            + "        stats['loss'] += loss.detach().double()\n    print(float(stats['loss']) / 100)\n",
            "a sum in a dict item with a constant key",
        ),
        Invalid(
            PREAMBLE
            + "for epoch in range(2):\n    stats = {'loss': 0.0}\n    for x, y in loader:\n"
            + STEP.replace("    ", "        ")
            + "        stats['loss'] += loss.item()\n    wandb_log(stats)\n",
            None,
            "the dict is handed to a function",
        ),
        Invalid(
            PREAMBLE
            + "def performance(out, y):\n    loss = F.mse_loss(out, y)\n    return loss, (out.sign() == y.sign()).sum().item()\n"
            + "total, hits = 0.0, 0\nfor x, y in loader:\n    loss, n = performance(model(x), y)\n"
            + "    loss.backward()\n    optimizer.step()\n    optimizer.zero_grad()\n"
            + "    hits += n\n    total += loss.item()\n",
            None,
            "a helper the step calls still reads a count every step: reading the loss later gains nothing",
        ),
    ]

    def visit_Module(self, node: cst.Module) -> None:
        self._fixed_in_functions: set[int] = set()  # reads a function returns into a sum that is fixed
        self._kept_returned: dict[int, str] = {}  # a step call whose returned reads stay in their sum: why
        if self.context.training.accelerator_use is None:
            return  # every tensor stays on the host: reading one waits for no device
        reads = host_reads(self.context)
        for loop in self.context.loops.step_loops:
            self._check_loop(reads.loop(loop, self._kept), loop, reads)
        self._check_helpers(reads)

    def _kept(self, statement: cst.CSTNode | None) -> bool:
        return suppressed_on(statement, self.CODE)

    def _code(self, node: cst.CSTNode) -> str:
        return self.context.loops.code(node).strip()

    def _check_helpers(self, reads: HostReads) -> None:
        """Reads in functions of this file that a step loop calls on every step: reported
        where they are, with the call that runs them."""
        seen: set[cst.CSTNode] = set()
        for loop in self.context.loops.step_loops:
            for read, call in reads.in_functions(loop, self._kept):
                if read in seen or id(read) in self._fixed_in_functions:
                    continue
                seen.add(read)
                why = self._kept_returned.get(id(call)) or reads.needed_where_read(read) or IN_ANOTHER_FUNCTION
                self.report(
                    read,
                    f"`{self._code(read)}` waits for the GPU every step: `{self._code(call.func)}` "
                    f"runs it on every step of the loop at line {self.context.line(loop)} (line "
                    f"{self.context.line(call)}); not rewritten: {why}",
                )

    def _check_loop(self, scan: StepReads, loop: cst.CSTNode, reads: HostReads) -> None:
        fixes: list[Deferral] = []
        kept = [sync for sync in scan.reads() if id(sync) in scan.suppressed]
        for sync in scan.reads():
            if id(sync) in scan.suppressed or self.context.training.synchronized_before(sync, loop) is not None:
                continue  # suppressed, or the step already waited for the device: this read waits for nothing
            try:
                fixes.extend(scan.defer(sync))
            except Kept as why:
                kept.append(sync)
                self.report(sync, f"`{self._code(sync)}` waits for the GPU every step; not rewritten: {why}")
        for call, _ in scan.returning_calls():
            fixes.extend(scan.defer_returned(call))
            self._kept_returned[id(call)] = scan.returned_kept(call) or IN_ANOTHER_FUNCTION
        # A read of another function that a fix here rewrites is not reported there again.
        self._fixed_in_functions.update(id(fix.read) for fix in fixes)
        # (a read in a function the step calls, that no fix rewrites, stays as well)
        kept += [read for read, _ in reads.in_functions(loop, self._kept) if id(read) not in self._fixed_in_functions]
        waits = scan.waits_every_step(kept)
        if waits is not None:
            why = ANYWAY.format(read=self._code(waits), line=self.context.line(waits))
            for read in dict.fromkeys(fix.read for fix in fixes):
                self.report(read, f"`{self._code(read)}` waits for the GPU every step; not rewritten: {why}")
            return
        # Edits that several fixes need (a statement two reads move, the statements moved
        # into one log branch, the reads of one running sum) are one edit they share.
        shared: dict[object, Edit] = {}
        into: dict[cst.If, list[cst.SimpleStatementLine]] = {}
        for fix in fixes:
            for branch, statement in fix.moves:
                if statement not in into.setdefault(branch, []):  # two reads of one statement move it once
                    into[branch].append(statement)
        for statements in into.values():
            statements.sort(key=self.context.index.order)  # in the order they ran before
        for fix in fixes:
            edits: list[Edit] = []
            for branch, statement in fix.moves:
                edits.append(shared.setdefault(("remove", statement), Remove(statement, keep_comments=False)))
                edits.append(shared.setdefault(("into", branch), _prepend(branch, into[branch])))
            for node, change in fix.changes:
                edits.append(shared.setdefault(("replace", node), Replace(node, _change(node, change))))
            if fix.way == LISTED:
                label, flat = fix.holder, "" if fix.scalar else ".flatten()"
                conversion = f"{label} = torch.stack({label}){flat}.tolist() if {label} else []\n"
                edits.append(InsertAfter(fix.after, (cst.parse_statement(conversion),)))
            imports = [("torch", None)] if fix.way == LISTED else []
            level = Level.UNSAFE if fix.exported else None
            self.report(fix.read, self._message(fix), edits=list(dict.fromkeys(edits)), level=level, imports=imports)

    def _message(self, fix: Deferral) -> str:
        code, line = self._code, self.context.line
        waits = f"`{code(fix.read)}` (line {line(fix.read)}) waits for the GPU every step"
        if fix.way == MOVED:
            conditions = " / ".join(f"`{code(branch.test)}`" for branch, _ in fix.moves)
            return f"{waits}, but `{fix.holder}` is only read when {conditions}; moved under that condition"
        if fix.way == LISTED:
            return (
                f"`{code(fix.read)}` waits for the GPU every step to store a number in `{fix.holder}`; it now keeps "
                f"the tensor, and the list becomes numbers once, after the loop (line {line(fix.after)})"
            )
        if fix.way == CARRIED:
            sums = [f"`{total}`" for total in fix.sums]
            sums = " and ".join([", ".join(sums[:-1]), sums[-1]] if len(sums) > 2 else sums)
            return (
                f"{waits}, but `{fix.holder}` is only added to {sums}; it keeps the tensor "
                f"({'int64' if fix.int_sum else 'float64'}) and those sums stay on the device"
            )
        how = "kept as an int64 tensor" if fix.int_sum else "kept in float64 on the device (the same sums, bit for bit)"
        where = f"read {' and '.join(fix.places)}" if fix.places else "never read"
        if fix.way == SUMMED:
            return f"{waits} to add to `{fix.holder}`; {how} and {where}"
        message = (
            f"{waits}: `{code(fix.call.func)}` (line {line(fix.call)}) returns it to add to `{fix.holder}`; "
            f"it returns the tensor instead, {how}, {where}"
        )
        if fix.exported:
            name = fix.function.name.value
            message += f"; unsafe: `{name}` now returns a tensor, which code in other files that calls it would get"
        return message


def _change(node: cst.CSTNode, change: str):
    """The function of an expression's updated version that makes `change` to it."""
    if change == AS_DETACHED:
        return lambda _: _detached(read_tensor(node)).with_changes(lpar=node.lpar, rpar=node.rpar)
    if change == AS_DOUBLE:
        return lambda updated: cst.Call(cst.Attribute(updated, cst.Name("double")))
    if change in (AS_FLOAT, AS_INT):
        return lambda updated: cst.Call(cst.Name(change), [cst.Arg(updated)])
    return lambda updated: _device_value(updated, change == AS_COUNT)


def _parenthesized(tensor: cst.BaseExpression) -> cst.BaseExpression:
    if not isinstance(tensor, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) and not tensor.lpar:
        return tensor.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return tensor


def _detached(tensor: cst.BaseExpression) -> cst.BaseExpression:
    tensor = _parenthesized(tensor)
    return tensor if detached(tensor) else cst.Call(cst.Attribute(tensor, cst.Name("detach")))


def _device_value(sync: cst.Call, int_sum: bool) -> cst.BaseExpression:
    """What the running sum adds instead of `sync`: the tensor itself, detached (a sum kept
    across steps must not hold on to their autograd graphs) and in float64, or as it
    is for int64 counts (which have no graph)."""
    tensor = _parenthesized(read_tensor(sync))
    value = tensor if int_sum else cst.Call(cst.Attribute(_detached(tensor), cst.Name("double")))
    return value.with_changes(lpar=sync.lpar, rpar=sync.rpar)


def _moved_statement(line: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
    """The statement to insert: its comments go with it, blank lines above it stay behind."""
    comments = [entry for entry in line.leading_lines if entry.comment is not None]
    return line.with_changes(leading_lines=comments)


def _prepend(branch: cst.If, lines: list[cst.SimpleStatementLine]) -> Edit:
    """The edit that puts `lines` (original statements) first in the body of `branch`."""
    statements = tuple(_moved_statement(line) for line in lines)
    body = branch.body
    if isinstance(body, cst.SimpleStatementSuite):
        # `if c: print(v)` becomes a block: the moved statements need lines of their own.
        return Replace(
            body,
            lambda updated: cst.IndentedBlock(
                body=[
                    *statements,
                    cst.SimpleStatementLine(body=updated.body, trailing_whitespace=updated.trailing_whitespace),
                ]
            ),
        )
    return InsertBefore(body.body[0], statements)
