from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import libcst as cst
import libcst.matchers as m

from codemod.analysis.kinds import Place
from codemod.analysis.training import TrainingLoop
from codemod.rule import Invalid, Level, Rule, Valid

POLICY_NAMES = ("precision", "amp_precision")
SCALER_NAMES = ("scaler", "grad_scaler")
POLICY_IMPORT = ("runtime.amp", "Precision")
FP16 = {"amp": "fp16"}

HEAD = """\
import torch
import torch.nn as nn
import torch.nn.functional as F
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = nn.Linear(8, 2).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = [(torch.randn(4, 8), torch.randint(0, 2, (4,))) for _ in range(3)]
"""
POLICY_HEAD = HEAD.replace("\ndevice =", "\nfrom runtime.amp import Precision\n\ndevice =")
LOOP = """\
for x, y in data:
    x, y = x.to(device), y.to(device)
    # forward
    logits = model(x)
    loss = F.cross_entropy(logits, y)  # mean over the batch
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
"""
LOOP_BF16 = """\
precision = Precision.for_device(device)
for x, y in data:
    x, y = x.to(device), y.to(device)
    # forward
    with precision.autocast():
        logits = model(x)
        loss = F.cross_entropy(logits, y)  # mean over the batch
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
"""
ACCUMULATION = """\
accum = 4
for epoch in range(2):
    for i, (x, y) in enumerate(data):
        loss = F.cross_entropy(model(x.to(device)), y.to(device))
        loss = loss / accum
        loss.backward()
        if (i + 1) % accum == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
"""
ACCUMULATION_FP16 = """\
accum = 4
precision = Precision.for_device(device, prefer="fp16")
scaler = precision.grad_scaler()
for epoch in range(2):
    for i, (x, y) in enumerate(data):
        with precision.autocast():
            loss = F.cross_entropy(model(x.to(device)), y.to(device))
            loss = loss / accum
        scaler.scale(loss).backward()
        if (i + 1) % accum == 0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
"""


@dataclass
class _Fix:
    """The edits of one loop, keyed by the identity of the nodes they replace."""

    region: list[int]  # ids of the forward statements, in order
    autocast: cst.BaseExpression  # `precision.autocast()`
    calls: dict[int, Callable[[cst.Call], cst.Call]]  # id(call) -> how to rewrite its updated version
    after: dict[int, cst.BaseStatement]  # id(statement) -> statement to put after it
    before: dict[int, cst.BaseStatement]  # id(statement) -> statement to put before it


class ForwardWithoutAutocast(Rule):
    """
    ## What it does
    Finds training loops whose forward pass and loss run in float32 and wraps
    them in autocast: one `with precision.autocast():` block around the
    statements from the first model call to the loss, with the precision
    policy of `runtime.amp` built once before the loop from the script's own
    device expression:

    ```python
    precision = Precision.for_device(device)
    ```

    The default (`amp = "bf16"` in `[tool.perfmod]`) needs nothing else:
    bfloat16 has float32's exponent range, so gradients do not underflow. With
    `amp = "fp16"` the fix also adds a gradient scaler:
    `scaler.scale(loss).backward()`, `scaler.unscale_(optimizer)` before
    gradient clipping, `scaler.step(optimizer)` and `scaler.update()` right
    after it, inside the same `if (i + 1) % accum == 0:` as the step when
    gradients are accumulated, so the scale is updated only on step
    iterations.

    ## Why is this bad?
    On GPUs with tensor cores, matmuls and convolutions in bfloat16 or float16
    run several times faster than in float32 and move half the bytes;
    autocast runs those ops in the low precision and keeps reductions,
    softmax and losses in float32. Typical gain: 1.5-3x step time on
    Ampere or newer GPUs for matmul-heavy models, and less activation memory.

    The policy (`runtime.amp.Precision`) picks what the device supports:
    bf16 on CUDA GPUs that run it natively (Ampere, sm_80, or newer), nothing
    on older ones (fp16 would need the GradScaler that only `amp = "fp16"`
    writes), nothing on the CPU unless asked (CPU autocast pays off only
    with bf16 units): so the rewritten script still runs, unchanged, where it
    ran before. The `PERFMOD_AMP` environment variable (`bf16`, `fp16`,
    `off`) overrides it without editing code. Seeds of this rule used
    `torch.cuda.amp.autocast` and `torch.cuda.amp.GradScaler`; torch 2.13
    deprecates both (FutureWarning) for `torch.amp.autocast(device_type)` and
    `torch.amp.GradScaler(device_type)`, which the policy uses.

    ## Example
    ```python
    for x, y in loader:
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    ```
    Use instead:
    ```python
    precision = Precision.for_device(device)
    for x, y in loader:
        with precision.autocast():
            logits = model(x)
            loss = F.cross_entropy(logits, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    ```

    ## Fix safety
    Numeric: the forward pass computes in bf16 (8 significant bits) or fp16
    (11), so losses move away from float32's in the third or fourth digit and
    drift slowly; `perfmod verify` compares them. On the CPU, with autocast
    forced (`PERFMOD_AMP=bf16` or `fp16`), the fixtures' losses stayed within
    1.1e-3 relative of float32 over 20 steps; the tests allow 5e-3
    (`tests/rules/test_pm301_execution.py`). With fp16 the scaler skips a
    step whose scaled gradients overflow, by design, and the run then follows
    its own path. With the default `amp = "bf16"`, a GPU older than Ampere
    trains in float32 as before: set `amp = "fp16"` to get fp16 with a
    GradScaler there.

    Not reported where autocast is already on in any form (`torch.autocast`,
    `torch.amp.autocast`, `torch.cuda.amp.autocast`, `torch.cpu.amp.autocast`,
    a `ctx = nullcontext() if ... else autocast(...)` variable, a helper that
    returns one, a policy's `.autocast()`), nor for a model that stays on the
    CPU. Reported without a fix: a float64 model (`.double()`,
    `.to(torch.float64)`, `torch.set_default_dtype(torch.float64)`), whose
    author asked for more precision, not less; autocast used elsewhere in the
    file; a GradScaler without autocast; a forward pass that cannot be
    delimited (the loss computed in a nested block or in the backward call
    itself, the forward split across blocks); a device that cannot be told or
    is defined only inside the loop; and, for fp16, several optimizers or
    clipping placed where `unscale_` could not go once per step.
    """

    CODE = "PM301"
    NAME = "forward-without-autocast"
    LEVEL = Level.NUMERIC
    REQUIRES = ("backward",)
    MESSAGE = "the forward pass and loss run in float32; run them under autocast"
    GAIN = "1.5-3x step time on Ampere or newer GPUs for matmul-heavy models, and less activation memory"

    VALID = [
        Valid(HEAD + LOOP.replace("    logits = model(x)\n    loss = F.cross_entropy(logits, y)  # mean over the batch\n",
                                  "    with torch.autocast(device_type='cuda', dtype=torch.bfloat16):\n"
                                  "        logits = model(x)\n        loss = F.cross_entropy(logits, y)\n"),
              "autocast already there"),
        Valid(POLICY_HEAD + LOOP_BF16, "the fix itself: nothing left to do"),
        Valid("from contextlib import nullcontext\n" + HEAD + "ctx = nullcontext() if device.type == 'cpu' else "
              "torch.amp.autocast(device_type='cuda', dtype=torch.bfloat16)\n"
              + LOOP.replace("    logits = model(x)\n", "    with ctx:\n        logits = model(x)\n"),
              "nanoGPT's context variable"),
        Valid(HEAD.replace('torch.device("cuda" if torch.cuda.is_available() else "cpu")', '"cpu"') + LOOP,
              "a CPU model: autocast rarely pays off there"),
        Valid(HEAD + "for x, y in data:\n    with torch.no_grad():\n        print(model(x.to(device)))\n",
              "no training loop"),
    ]
    INVALID = [
        Invalid(HEAD + LOOP, POLICY_HEAD + LOOP_BF16, "bf16: one with-block, comments kept, policy before the loop"),
        Invalid(HEAD + ACCUMULATION, POLICY_HEAD + ACCUMULATION_FP16,
                "fp16: scaler, unscale_ before clipping, update only on step iterations", config=FP16),
        Invalid(
            HEAD + "model.double()\n" + LOOP, None, "float64 model: more precision was asked for, not less",
        ),
        Invalid(
            HEAD + LOOP.replace("    loss = F.cross_entropy(logits, y)  # mean over the batch\n",
                                "    if y.numel() > 2:\n        loss = F.cross_entropy(logits, y)\n"
                                "    else:\n        loss = logits.sum()\n"),
            None,
            "the loss is computed in branches",
        ),
        Invalid(
            HEAD + "scaler = torch.amp.GradScaler('cuda')\n"
            + LOOP.replace("loss.backward()", "scaler.scale(loss).backward()")
            .replace("optimizer.step()", "scaler.step(optimizer)\n    scaler.update()"),
            None,
            "a GradScaler without autocast",
        ),
        Invalid(
            HEAD.replace("nn.Linear(8, 2).to(device)", "nn.Linear(8, 2).to(args.device)") + LOOP + "x = torch.zeros(1).cuda()\n",
            POLICY_HEAD.replace("nn.Linear(8, 2).to(device)", "nn.Linear(8, 2).to(args.device)")
            + LOOP_BF16.replace("for_device(device)", "for_device(args.device)") + "x = torch.zeros(1).cuda()\n",
            "the device expression the script uses, whatever it is",
        ),
        Invalid(
            HEAD + LOOP.replace("    optimizer.step()\n", "    for group in optimizer.param_groups:\n"
                                "        torch.nn.utils.clip_grad_norm_(group['params'], 1.0)\n    optimizer.step()\n"),
            None,
            "fp16 with clipping in a loop: unscale_ must run once per step",
            config=FP16,
        ),
        Invalid(
            HEAD + "head = nn.Linear(2, 2).to(device)\nopt2 = torch.optim.SGD(head.parameters(), lr=0.1)\n"
            + LOOP.replace("    optimizer.step()\n", "    optimizer.step()\n    opt2.step()\n"),
            None,
            "fp16 with two optimizers: left to a human",
            config=FP16,
        ),
    ]

    def visit_Module(self, node: cst.Module) -> None:
        training = self.context.training
        inside_loops = [loop.autocast.node for loop in training.loops if loop.autocast is not None]
        elsewhere = [use for use in training.autocast_uses if not any(self.context.inside(use, n) for n in inside_loops)]
        for loop in training.loops:
            if loop.autocast is None:
                self._check(loop, elsewhere)

    def _check(self, loop: TrainingLoop, elsewhere: list[cst.CSTNode]) -> None:
        training = self.context.training
        outer = self._outermost_loop(loop.loop)
        if loop.float64 is not None:
            return self._decline(loop, outer, f"the model is float64 (line {self.context.line(loop.float64)}): "
                                        "autocast would lower the precision its author chose")
        if elsewhere:
            return self._decline(loop, outer, f"autocast is already used at line {self.context.line(elsewhere[0])}; "
                                        "check whether it covers this loop's forward pass")
        if loop.scaler is not None:
            return self._decline(loop, outer, f"`{loop.scaler.expression}` scales the loss but no autocast is on; "
                                        "add autocast around the forward pass by hand")
        if loop.forward is None:
            return self._decline(loop, outer, loop.forward_problem)
        model = next((model for model in loop.models if model.move is not None), None)
        if model is None:
            if training.cuda_use is not None:
                self._decline(loop, outer, "cannot tell which device the model runs on")
            return
        if model.places == {Place.HOST}:
            return  # CPU autocast pays off only on CPUs with bf16 units; the policy leaves it off there
        device = training.code(model.device) if model.device is not None else '"cuda"'
        if model.device is not None and not (self._is_plain(model.device) and training.defined_before(model.device, outer)):
            return self._decline(loop, outer, f"the device `{device}` is not a plain expression defined before the loop")
        fp16 = self.context.settings.amp == "fp16"
        problem = self._fp16_problem(loop) if fp16 else None
        if problem is not None:
            return self._decline(loop, outer, problem)
        taken = {name.value for name in m.findall(self.context.module, m.Name())}
        policy = next((n for n in POLICY_NAMES if n not in taken), None)
        scaler = next((n for n in SCALER_NAMES if n not in taken), None)
        if policy is None or (fp16 and scaler is None):
            return self._decline(loop, outer, "the names the fix would use are all taken")
        prefer = ', prefer="fp16"' if fp16 else ""
        setup = [cst.parse_statement(f"{policy} = Precision.for_device({device}{prefer})\n")]
        if fp16:
            setup.append(cst.parse_statement(f"{scaler} = {policy}.grad_scaler()\n"))
        fix = _Fix(
            region=[id(s) for s in loop.forward.statements],
            autocast=cst.parse_expression(f"{policy}.autocast()"),
            calls={}, after={}, before={},
        )
        if fp16:
            self._scale(loop, fix, scaler)
        new_outer = outer.visit(_Rewrite(fix))
        setup[0] = setup[0].with_changes(leading_lines=outer.leading_lines)
        replacement = cst.FlattenSentinel([*setup, new_outer.with_changes(leading_lines=[])])
        self.report(outer, replacement=replacement, imports=[POLICY_IMPORT], at=self._forward_start(loop))

    # -- fp16 ----------------------------------------------------------------------

    def _fp16_problem(self, loop: TrainingLoop) -> str | None:
        """Why the GradScaler calls cannot be placed, or None."""
        if len(loop.optimizers) != 1:
            return f"fp16 needs one GradScaler step per optimizer; this loop steps {len(loop.optimizers)}"
        for step in loop.steps:
            if not self._own_line(step.call):
                return "the optimizer step shares a one-line block; `scaler.update()` cannot follow it"
        if loop.clips:
            clip = min(loop.clips, key=self._position)
            if not self._own_line(clip) or not all(self._clips_before_step(c, s) for c in loop.clips for s in loop.steps):
                return ("gradient clipping is not in the optimizer step's block before the step; "
                        "`scaler.unscale_` could not run exactly once per step")
        return None

    def _scale(self, loop: TrainingLoop, fix: _Fix, scaler: str) -> None:
        training = self.context.training
        backward = loop.backwards[0].call
        fix.calls[id(backward)] = lambda call: call.with_changes(
            func=call.func.with_changes(value=_method(scaler, "scale", call.func.value.with_changes(lpar=[], rpar=[])))
        )
        for step in loop.steps:
            fix.calls[id(step.call)] = lambda call: _method(scaler, "step", call.func.value)
            fix.after[id(training.statement_of(step.call))] = cst.parse_statement(f"{scaler}.update()\n")
        if loop.clips:
            clip = min(loop.clips, key=self._position)
            optimizer = training.code(loop.steps[0].optimizer)
            fix.before[id(training.statement_of(clip))] = cst.parse_statement(f"{scaler}.unscale_({optimizer})\n")

    def _clips_before_step(self, clip: cst.Call, step) -> bool:
        """Is `clip` in the step's block, before it, and not inside a nested loop there?"""
        training = self.context.training
        step_statement = training.statement_of(step.call)
        block = self.context.parents.get(step_statement)
        current = training.statement_of(clip)
        while not isinstance(current, (cst.For, cst.While)):
            parent = self.context.parents.get(current)
            if parent is block:
                body = list(block.body)
                return _index(body, current) < _index(body, step_statement)
            if parent is None:
                return False
            current = parent
        return False  # a loop between the clip and the step's block would unscale_ more than once

    def _own_line(self, call: cst.Call) -> bool:
        statement = self.context.training.statement_of(call)
        return isinstance(statement, cst.SimpleStatementLine) and isinstance(
            self.context.parents.get(statement), cst.IndentedBlock
        )

    # -- helpers -------------------------------------------------------------------

    def _decline(self, loop: TrainingLoop, outer: cst.CSTNode, why: str) -> None:
        self.report(outer, f"{self.MESSAGE} (not fixed: {why})", at=self._forward_start(loop))

    @staticmethod
    def _forward_start(loop: TrainingLoop) -> cst.CSTNode:
        """Where to point the user: the forward pass's first statement, else the loop."""
        return loop.forward.statements[0] if loop.forward is not None and loop.forward.statements else loop.loop

    def _outermost_loop(self, loop: cst.CSTNode) -> cst.CSTNode:
        """The loop to put the policy before: the outermost loop around `loop` in its function."""
        outer = loop
        current = self.context.parents.get(loop)
        while current is not None and not isinstance(current, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            if isinstance(current, (cst.For, cst.While)):
                outer = current
            current = self.context.parents.get(current)
        return outer

    def _is_plain(self, expr: cst.BaseExpression) -> bool:
        """A device expression that is safe to evaluate once more, before the loop:
        names, attributes, strings, and `torch.device(...)` of those."""
        if isinstance(expr, (cst.Name, cst.SimpleString, cst.Integer)):
            return True
        if isinstance(expr, cst.Attribute):
            return self._is_plain(expr.value)
        if isinstance(expr, cst.Call) and self.context.names.is_(expr.func, "torch.device"):
            return all(self._is_plain(arg.value) for arg in expr.args)
        return False

    def _position(self, node: cst.CSTNode) -> tuple[int, int]:
        start = self.context.positions[node].start
        return (start.line, start.column)


class _Rewrite(cst.CSTTransformer):
    """Applies a `_Fix` to the outermost loop: the forward statements become one
    `with` block (the last of them is replaced by it, the others removed)."""

    def __init__(self, fix: _Fix) -> None:
        super().__init__()
        self.fix = fix
        self.wrapped: list[cst.BaseStatement] = []

    def on_leave(self, original_node, updated_node):
        key = id(original_node)
        if key in self.fix.calls:
            updated_node = self.fix.calls[key](updated_node)
        if key in self.fix.region:
            self.wrapped.append(updated_node)
            if key != self.fix.region[-1]:
                return cst.RemovalSentinel.REMOVE
            first, rest = self.wrapped[0], self.wrapped[1:]
            return cst.With(
                items=[cst.WithItem(item=self.fix.autocast)],
                body=cst.IndentedBlock(body=[first.with_changes(leading_lines=[]), *rest]),
                leading_lines=first.leading_lines,
            )
        if key in self.fix.after:
            return cst.FlattenSentinel([updated_node, self.fix.after[key]])
        if key in self.fix.before:
            return cst.FlattenSentinel([self.fix.before[key], updated_node])
        return updated_node


def _method(receiver: str, name: str, argument: cst.BaseExpression) -> cst.Call:
    return cst.Call(func=cst.Attribute(value=cst.Name(receiver), attr=cst.Name(name)), args=[cst.Arg(argument)])


def _index(body: list, statement: cst.CSTNode) -> int:
    return next(i for i, s in enumerate(body) if s is statement)
