"""One follower from a read to the values it may hold (`Kinds.sources`), asked by the
kinds of values and the sources of a read (`Kinds.value_sources`), and by the loaders
(`Loaders.bound_values`): tuple unpacking, an attribute set in `__init__`, a local
function's return, `x += y` in a loop (it updates the value it reads), a comprehension."""

from __future__ import annotations

import textwrap

import libcst as cst

from codemod.analysis.host_reads import host_reads
from codemod.analysis.values import BOOL, COMPLEX, FLOAT, INT64, Kind, Memory, Place, values
from codemod.config import Settings
from codemod.context import FileContext
from codemod.engine import process_source
from codemod.result import Level


def context(code: str) -> FileContext:
    return FileContext.of_source(textwrap.dedent(code))


def last_read(ctx: FileContext, name: str) -> cst.Name:
    """The last read of `name` in the file (a name in a `print(...)` call)."""
    reads = [
        n
        for call in ctx.index.find(cst.Call)
        if ctx.source(call.func) == "print"
        for n in ctx.index.find(cst.Name, within=call)
        if n.value == name
    ]
    return reads[-1]


def lines_of(ctx: FileContext, bindings) -> list[int]:
    return [ctx.line(b.node) for b in bindings]


UPDATED_IN_A_LOOP = """\
import torch

x = torch.zeros(4, device="cuda")
n = 0
for step in range(3):
    x += torch.ones(4, device="cuda")
    n += 1
print(x, n)
"""


def test_an_augmented_assignment_in_a_loop_stands_for_the_value_it_updates():
    ctx = context(UPDATED_IN_A_LOOP)
    kinds = ctx.kinds
    x, n = last_read(ctx, "x"), last_read(ctx, "n")
    assert lines_of(ctx, kinds.reaching(x)) == [3, 6]  # the bindings: the first, and the update
    assert lines_of(ctx, kinds.sources(x)) == [3, 6]
    assert (kinds.fact(x).kind, kinds.fact(x).place) == (Kind.TENSOR, Place.CUDA)  # updated in place: still on CUDA
    assert [ctx.source(v) for v in ctx.kinds.value_sources(n)] == ["0", "1"]
    assert ctx.training.is_int(n)


def test_an_update_read_after_a_rebinding_reaches_back_only_to_that_rebinding():
    ctx = context(
        """\
        import torch

        x = torch.zeros(4, device="cuda")
        x = torch.zeros(4).pin_memory()
        x += 1
        print(x)
        """
    )
    x = last_read(ctx, "x")
    assert lines_of(ctx, ctx.kinds.sources(x)) == [4, 5]  # not the first binding, which line 4 hides
    fact = ctx.kinds.fact(x)
    assert (fact.kind, fact.place, fact.memory) == (Kind.TENSOR, Place.HOST, Memory.PINNED)


def test_a_float_added_to_a_counter_makes_it_no_int():
    ctx = context(UPDATED_IN_A_LOOP.replace("n += 1", "n += 0.5"))
    n = last_read(ctx, "n")
    assert [ctx.source(v) for v in ctx.kinds.value_sources(n)] == ["0", "0.5"]
    assert not ctx.training.is_int(n)


def test_a_string_updated_keeps_both_parts_among_its_values():
    ctx = context(
        """\
        device = "cuda"
        device += ":1"
        print(device)
        """
    )
    assert ctx.training.strings(last_read(ctx, "device")) == frozenset({"cuda", ":1"})


def test_a_value_read_after_the_last_binding_does_not_see_an_earlier_one():
    ctx = context(
        """\
        device = "cpu"
        print(device)
        device = "cuda"
        print(device)
        """
    )
    assert [ctx.source(v) for v in ctx.kinds.value_sources(last_read(ctx, "device"))] == ['"cuda"']


def test_a_tensor_updated_before_its_loader_is_built_is_what_the_loader_holds():
    ctx = context(
        """\
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        x = torch.randn(64, 3)
        x += 0.1 * torch.randn(64, 3)
        loader = DataLoader(TensorDataset(x), batch_size=8)
        """
    )
    read = next(n for n in ctx.index.find(cst.Name) if n.value == "x" and ctx.line(n) == 6)
    assert [(ctx.source(v), path) for v, path in ctx.loaders.bound_values(read)] == [("torch.randn(64, 3)", ())]


def test_tuple_unpacking_gives_each_name_its_element():
    ctx = context(
        """\
        import torch

        a, b = torch.zeros(2).cuda(), torch.zeros(2).pin_memory()
        print(a, b)
        """
    )
    a, b = last_read(ctx, "a"), last_read(ctx, "b")
    assert (ctx.kinds.fact(a).kind, ctx.kinds.fact(a).place) == (Kind.TENSOR, Place.CUDA)
    assert ctx.kinds.fact(b).memory is Memory.PINNED
    assert [(ctx.source(v), path) for v, path in ctx.loaders.bound_values(b)] == [
        ("torch.zeros(2).cuda(), torch.zeros(2).pin_memory()", (1,))
    ]


def test_an_attribute_set_in_init_holds_what_init_assigns():
    ctx = context(
        """\
        import torch

        class Buffers:
            def __init__(self):
                self.staging = torch.empty(8, pin_memory=True)

            def send(self):
                print(self.staging)
        """
    )
    read = next(a for a in ctx.index.find(cst.Attribute) if ctx.source(a) == "self.staging" and ctx.line(a) == 8)
    fact = ctx.kinds.fact(read)
    assert (fact.kind, fact.place, fact.memory) == (Kind.TENSOR, Place.HOST, Memory.PINNED)
    assert [ctx.source(v) for v in ctx.kinds.attribute_values(read)] == ["torch.empty(8, pin_memory=True)"]


def test_a_local_function_holds_what_it_returns_and_its_parameter_what_calls_pass():
    ctx = context(
        """\
        import torch

        def make(device):
            buf = torch.zeros(8, device=device)
            return buf

        x = make("cuda")
        print(x)
        """
    )
    x = last_read(ctx, "x")
    assert (ctx.kinds.fact(x).kind, ctx.kinds.fact(x).place) == (Kind.TENSOR, Place.CUDA)
    [device] = [a.value for a in ctx.index.find(cst.Arg) if ctx.source(a) == "device=device"]
    assert [ctx.source(v) for v in ctx.kinds.value_sources(device)] == ['"cuda"']


def test_a_comprehension_reads_names_bound_around_it_and_binds_its_own():
    ctx = context(
        """\
        import torch

        host = [torch.zeros(4) for _ in range(3)]
        pinned = [t.pin_memory() for t in host]
        print(pinned)
        for p in pinned:
            print(p)
        """
    )
    t = next(n for n in ctx.index.find(cst.Name) if n.value == "t" and ctx.line(n) == 4)
    assert lines_of(ctx, ctx.kinds.sources(t)) == [4]  # the comprehension's own target
    host = next(n for n in ctx.index.find(cst.Name) if n.value == "host" and ctx.line(n) == 4)
    assert lines_of(ctx, ctx.kinds.sources(host)) == [3]
    p = last_read(ctx, "p")
    fact = ctx.kinds.fact(p)
    assert (fact.kind, fact.place, fact.memory) == (Kind.TENSOR, Place.HOST, Memory.PINNED)


DTYPES = """\
import torch
import torch.nn.functional as F


def scores(x):
    return x.mean(-1)


class Counter:
    def __init__(self):
        self.seen = torch.zeros((), dtype=torch.long)


model = torch.nn.Linear(4, 3)
counter = Counter()
hits = torch.zeros(()).long()
for step in range(3):
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    out = model(x)
    loss = F.cross_entropy(out, y)
    loss.backward()
    right, total = (out.argmax(-1) == y).sum(), y.numel()
    probs = scores(out)
    kept = [p.detach() for p in probs]
    hits += right
    print(loss, right, probs, kept, hits, out > 0, right / total)
"""


def test_dtypes_follow_names_unpacking_local_functions_updates_and_comprehensions():
    ctx = context(DTYPES)
    answers = values(ctx)
    call = next(c for c in ctx.index.find(cst.Call) if ctx.source(c.func) == "print")
    printed = {ctx.source(a.value): a.value for a in call.args}
    assert answers.dtype(printed["loss"]) == FLOAT  # a torch loss, and differentiated
    assert answers.dtype(printed["right"]) == INT64  # `right, total = (...).sum(), ...`: a sum of bools
    assert answers.dtype(printed["probs"]) == FLOAT  # what a local function returns
    assert answers.dtype(printed["hits"]) == INT64  # `hits += right` updates an int64 tensor in place
    assert answers.dtype(printed["out > 0"]) == BOOL
    assert answers.dtype(printed["right / total"]) == FLOAT
    [comprehension] = ctx.index.find(cst.ListComp)
    assert answers.dtype(comprehension.elt) is None  # a row of a tensor iterated over: not followed
    assert answers.is_tensor(printed["probs"]) and not answers.is_tensor(printed["kept"])


def test_a_value_whose_backward_runs_is_floating_point_whatever_built_it():
    ctx = context(
        """\
        import torch

        def step(model, x):
            loss = model(x).loss
            loss.backward()
            print(loss)

        def other(loss):
            print(loss)
        """
    )
    printed = [c.args[0].value for c in ctx.index.find(cst.Call) if ctx.source(c.func) == "print"]
    loss, elsewhere = printed
    assert values(ctx).dtype(loss) == FLOAT
    assert values(ctx).dtype(elsewhere) is None  # another function's `loss`: a name, not the value


def test_a_name_rebound_to_a_wrap_of_itself_reads_the_binding_before_it():
    code = textwrap.dedent(
        """\
        import torch

        net = torch.nn.Linear(4, 1)
        net = torch.compile(net)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        """
    )
    ctx = context(code)
    wrapped, built = [n for n in ctx.index.find(cst.Name) if n.value == "net" and ctx.line(n) in (4, 5)][1:]
    assert [ctx.source(v) for v in ctx.kinds.value_sources(built)] == ["torch.compile(net)"]
    assert [ctx.source(v) for v in ctx.kinds.value_sources(wrapped)] == ["torch.nn.Linear(4, 1)"]
    # so the optimizer's parameters are known to stay on the CPU (PM402 fuses its steps there)
    result = process_source(code.encode(), "<test>", Settings(select=("PM402",), level=Level.NUMERIC))
    assert ["stay on the CPU" in f.message for f in result.findings] == [True]


def test_a_set_up_call_hands_each_name_of_its_tuple_target_what_it_was_given():
    ctx = context(
        """\
        import torch
        from accelerate import Accelerator

        accelerator = Accelerator()
        model = torch.nn.Linear(8, 1)
        optimizer = torch.optim.AdamW(model.parameters())
        model, optimizer = accelerator.prepare(model, optimizer)
        print(model)
        """
    )
    model = last_read(ctx, "model")
    [given] = ctx.kinds.value_sources(model)
    assert (ctx.source(given), ctx.line(given)) == ("model", 7)
    assert [ctx.source(v) for v in ctx.kinds.value_sources(given)] == ["torch.nn.Linear(8, 1)"]


def test_the_dtype_an_expression_names_is_read_through_the_names_bound_to_it():
    ctx = context(
        """\
        import torch

        half, wide = torch.bfloat16, torch.complex64
        dtype = half if torch.cuda.is_available() else torch.float32
        print(dtype, wide, torch.int64)
        """
    )
    call = next(c for c in ctx.index.find(cst.Call) if ctx.source(c.func) == "print")
    dtype, wide, integer = (a.value for a in call.args)
    assert values(ctx).named_dtype(dtype) is None  # an `if` expression: not followed
    assert values(ctx).named_dtype(wide) == COMPLEX
    assert values(ctx).named_dtype(integer) is None
    [first] = [n for n in ctx.index.find(cst.Name) if n.value == "half" and ctx.line(n) == 4]
    assert values(ctx).named_dtype(first) == FLOAT


def test_a_counter_is_a_number_where_only_numbers_reach_it():
    ctx = context(
        """\
        import torch

        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        seen = "none yet"
        print(seen)
        seen, scale = 0, 4
        for step in range(3):
            loss = model(torch.randn(2, 4)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            seen += 1
        print(seen, scale)
        """
    )
    scan = host_reads(ctx).loop(ctx.loops.step_loops[0])
    seen, scale = last_read(ctx, "seen"), last_read(ctx, "scale")
    first = next(n for n in ctx.index.find(cst.Name) if n.value == "seen" and ctx.line(n) == 6)
    assert scan.is_number(seen) and not scan.is_number(first)  # the string does not reach the last read
    assert scan.is_nonzero_number(scale) and not scan.is_nonzero_number(seen)


def test_a_pair_kept_in_an_attribute_unpacks_to_what_another_method_put_in_it():
    """modded-nanogpt's shape: counts made on the host, kept as a tuple in `self.state`
    (reset to None after use), unpacked in another method: still host tensors, so reading
    them is no wait for the device."""
    ctx = context(
        """
        import numpy as np
        import torch

        class Manager:
            def __init__(self):
                self.state = None

            def begin(self, idx):
                counts = torch.from_numpy(np.bincount(idx, minlength=8))
                self.state = (counts, torch.empty_like(counts))

            def finish(self):
                counts, recv = self.state
                self.state = None
                print(counts, recv)
        """
    )
    kinds = ctx.kinds
    for name in ("counts", "recv"):
        fact = kinds.fact(last_read(ctx, name))
        assert (fact.kind, fact.place) == (Kind.TENSOR, Place.HOST), name


RETRIED_IN_A_LOOP = """\
import torch

x = None
it = iter([])
for step in range(3):
    try:
        x = next(it)
    except StopIteration:
        {handler}
    print(x)
    x = x.cuda()
"""


def test_a_try_binding_a_name_in_its_body_and_each_handler_hides_the_bindings_before_it():
    """Both ways out of the `try` bind `x`, so neither the binding before the loop nor the
    previous step's `x = x.cuda()` reaches the read after it."""
    for handler in ("it = iter([1])\n        x = next(it)", "raise", "break", "continue"):
        ctx = context(RETRIED_IN_A_LOOP.format(handler=handler))
        read = last_read(ctx, "x")
        bound = [7, 10] if "x = next" in handler else [7]
        assert lines_of(ctx, ctx.kinds.reaching(read)) == bound, handler


def test_a_try_that_may_leave_the_name_unbound_keeps_the_earlier_bindings():
    """A handler that goes on without binding `x` (or binds it only in a branch, or as a
    loop's target) lets the earlier values through."""
    for handler in ("pass", "if step:\n            x = next(it)", "for x in []:\n            pass"):
        ctx = context(RETRIED_IN_A_LOOP.format(handler=handler))
        read = last_read(ctx, "x")
        lines = lines_of(ctx, ctx.kinds.reaching(read))
        assert 3 in lines and max(lines) == ctx.line(read) + 1, (handler, lines)  # `x = x.cuda()` too
