"""How big the things a training program moves are, where the code shows it: the bytes of
a step's batch, a model's parameters and the widths of its matrix products, the bytes of
a checkpoint, and whether the step loop makes the host wait for the device every step.

A rule asks here before it rewrites for speed that grows with size (a copy overlapped, a
save in the background, TF32): where the size is KNOWN to be too small for the change to
buy anything, it reports instead of fixing. Unknown stays unknown (None): a rule may only
hold a fix back on a known size.

Sizes come from what the script runs with as written: literal shapes, argparse defaults,
module constants, config dicts, torchvision's datasets and transforms, `TensorDataset`s of
tensors made with literal shapes or of data written out (`torch.tensor([[...]])`), the items
a map-style Dataset class returns from its `__getitem__` (windows of a tokenizer's ids among
them), and the `torch.nn` layers a model's class builds (through `nn.Sequential` and the
classes of this file and of the project's modules, each construction with what it passes the
class's `__init__`: a construction in another module hands its arguments over as literals).
Where a value may be one of several, the largest counts: a size here is an upper bound.

Frequency: `rarely_waited(node)` tells a node that runs only every few steps (behind a
periodic test, `Periodic.sometimes`) or only outside the step loops (an accuracy pass after
each epoch, `TrainingLoops.outside_steps`), after which the host waits for the device at
once (an evaluation loop reading `loss.item()` every batch): an overlap there buys nothing
whatever the size; `overlap_buys_nothing(loader, copies)` says why pinning a loader's
batches buys nothing.

Launches: `step_rows(loop)` estimates the rows a step's matrix products run over from the
batch its models are called on (a DataLoader's batch where the loop's target binds it, a
tensor made in the step), and `launch_bound(products, rows)` says why a step whose every
product takes less device time than the host needs to launch it gains nothing from faster
arithmetic (TF32, autocast): the device waits for the host.

The thresholds are derived from the hardware facts in `HARDWARE`, in one place, with their
arithmetic beside them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import libcst as cst

from codemod.analysis.bindings import argument_for, passed_by, returned_values
from codemod.analysis.loaders import COLLATE_FN_POSITION
from codemod.analysis.names import dict_entry, integer_value, is_self, kwarg, method_name, number_value, positional
from codemod.analysis.periodic import periodic
from codemod.analysis.project import project_of
from codemod.analysis.tokenizers import tokenizers as tokenizers_of
from codemod.analysis.torch_facts import (
    BINARY_FUNCTIONS,
    CAST_METHOD_DTYPES,
    CROP_TRANSFORMS,
    DATA_FACTORIES,
    DTYPE_BYTES,
    FILLED_FACTORIES,
    HOST_NUMBER_MODULES,
    HOST_ONLY_MODULES,
    HOST_READ_BUILTINS,
    ID_LIST_METHODS,
    IMAGE_DATASETS,
    INTEGER_FACTORIES,
    JOINING_FUNCTIONS,
    LIKE_FACTORIES,
    LOGGING_CALLS,
    MATH_CONSTANTS,
    MATRIX_PRODUCT_METHODS,
    MATRIX_PRODUCTS,
    MODEL_WRAPPERS,
    MODULE_CONTAINERS,
    MODULE_METHODS,
    MODULE_METHODS_RETURNING_SELF,
    MUTATING_METHODS,
    NN_LAYER_ARGUMENTS,
    NN_STATELESS,
    OPTIMIZER_STATES,
    PADDING_TRANSFORMS,
    REARRANGING_FUNCTIONS,
    REARRANGING_METHODS,
    REDUCTION_FUNCTIONS,
    REDUCTION_METHODS,
    RNN_GATES,
    RUNTIME_WITHOUT_PRODUCTS,
    SAME_SHAPE_MODULES,
    SEQUENTIAL_MODULES,
    SHAPE_KEEPING_FUNCTIONS,
    SHAPE_KEEPING_METHODS,
    SHAPE_KEEPING_TRANSFORMS,
    SHAPED_FACTORIES,
    STACKING_FUNCTIONS,
    STEPS_FACTORIES,
    SYNC_METHODS,
    TENSOR_ROW_DATASETS,
    UNLISTED_PRODUCT_PREFIXES,
    UNLISTED_PRODUCTS,
)
from codemod.analysis.torch_ops import DTYPE_OF, METHOD, OPS
from codemod.analysis.values import FLOAT, Kind, Place
from codemod.analysis.values import values as values_of

if TYPE_CHECKING:
    from codemod.context import FileContext

# -- the hardware facts every threshold is derived from -----------------------------------------

HARDWARE = {
    # Host-to-device copies from pinned memory over PCIe 4.0 x16 (nominal 32 GB/s).
    "h2d_bytes_per_s": 25e9,
    # Queuing one CUDA kernel from Python: the host time a launch takes.
    "kernel_launch_s": 5e-6,
    # torch.save of a checkpoint to local disk, fsync'd: N MB take about N/1000 s.
    "save_bytes_per_s": 1e9,
    # An A100's float32 arithmetic without tensor cores and its memory bandwidth: a matrix
    # product that does fewer flops per byte than their ratio waits for memory, not arithmetic.
    "fp32_flops_per_s": 19.5e12,
    "memory_bytes_per_s": 1.555e12,
    # Its bf16 tensor cores (dense): the fastest any matrix product of a step may run.
    "bf16_flops_per_s": 312e12,
}
# A copy that overlaps nothing longer than ten kernel launches saves at most the launches it
# overlapped: 10 x 5 us = 50 us, which at 25 GB/s is a copy of 1.25 MB.
MIN_COPY_S = 10 * HARDWARE["kernel_launch_s"]
MIN_COPY_BYTES = int(MIN_COPY_S * HARDWARE["h2d_bytes_per_s"])
# A step whose device work takes more than 100 times what a blocking copy of its batch costs
# (`blocking_copy_seconds`) loses under 1% to that copy: overlapping it buys nothing measurable.
DWARFING_FACTOR = 100
# A save that blocks training for less than 20 ms, made at most once every few steps (or per
# epoch), costs less than a single slow step: 20 ms at 1 GB/s is a checkpoint of 20 MB.
MIN_SAVE_S = 0.02
MIN_SAVE_BYTES = int(MIN_SAVE_S * HARDWARE["save_bytes_per_s"])
# A product (m x k) @ (k x n) over many rows m moves 4(mk + kn + mn) bytes for 2mkn flops:
# k*n / (2(k + n)) flops per byte. Below 19.5e12 / 1.555e12 = 12.5 flops per byte it is
# bound by memory even in plain float32, and TF32's faster arithmetic cannot speed it up.
MEMORY_BOUND_FLOPS_PER_BYTE = HARDWARE["fp32_flops_per_s"] / HARDWARE["memory_bytes_per_s"]
MAX_DEPTH = 24  # how many names, calls and attributes a look-up follows
TORCH_NN = "torch.nn."
FLOAT32_BYTES = 4
INDEX_BYTES = 8  # a class index in a batch: int64
# The element widths of a batch taken to hold features, not indices, where its dtype is not
# known otherwise: float32 and the 16-bit floats (int32 indices are rare in batches).
FLOAT_ELEMENT_BYTES = frozenset({2, 4})
# What perfmod's own fixes write (PM601): the module under a wrapper, and a process's share
# of the global batch (the global batch over the number of processes, at most the whole).
RUNTIME_UNWRAP = "runtime.distributed.unwrap"
RUNTIME_LOCAL_BATCH = "runtime.distributed.local_batch_size"
# perfmod's runtime, as its fixes call it, but for `linear_attention`: no matrix product.
RUNTIME_WITHOUT_PRODUCT_PREFIXES = tuple(f"{name}." for name in RUNTIME_WITHOUT_PRODUCTS)
LIST_RESIZERS = frozenset({"append", "extend", "insert", "pop", "remove", "clear"})
LIST_GROWERS = frozenset({"extend", "insert", "__setitem__", "__iadd__"})  # add elements `append` does not
HOST_NUMBER_PREFIXES = tuple(module + "." for module in HOST_NUMBER_MODULES)
COPIES = ("copy.deepcopy", "copy.copy")  # `ema = copy.deepcopy(model)`
PRODUCTS_OF_ELEMENTS = ("math.prod", "numpy.prod", "numpy.product")  # of a shape: its elements
BATCH_SAMPLER_POSITION = 4  # `DataLoader(dataset, batch_size, shuffle, sampler, batch_sampler, ...)`


Tensor = tuple[tuple[int, ...], int]  # a tensor's shape and the bytes of one element
# The tensors an item (or a batch) of a dataset holds, in order, each with where it sits: () for
# an item that is one tensor, (1,) for the second of a tuple, None for one in a dict.
Item = tuple[tuple[tuple[int, ...] | None, Tensor], ...]


class ModuleSize(NamedTuple):
    parameters: int  # elements of its parameters
    state: int  # elements of its state_dict: parameters and buffers (running statistics)
    # (k, n) of each float32 matrix product its sized layers make: all it makes unless `unknown`,
    # and a lower bound of its arithmetic either way
    known: tuple[tuple[int, int], ...]
    convolves: bool = False  # it holds convolution layers (whose products `products` leaves out)
    # those of `known` that cuDNN's recurrent layers make (`nn.LSTM`, `nn.GRU`, `nn.RNN`):
    # cuDNN runs them in TF32 by default (`torch.backends.cudnn.rnn.fp32_precision`), whatever
    # the float32 matmul precision says
    recurrent: tuple[tuple[int, int], ...] = ()
    unknown: bool = False  # it also makes products of unknown width (a `@`, `torch.matmul`)

    @property
    def products(self) -> tuple[tuple[int, int], ...] | None:
        """(k, n) of every float32 matrix product it makes; None when some are of unknown width."""
        return None if self.unknown else self.known

    @property
    def state_bytes(self) -> int:
        return self.state * FLOAT32_BYTES

    @property
    def matmul_products(self) -> tuple[tuple[int, int], ...] | None:
        """The products the float32 matmul precision governs: `products` but the recurrent
        layers' (each taken out once, as many times as they are listed)."""
        if self.products is None:
            return None
        left = list(self.products)
        for product in self.recurrent:
            left.remove(product)
        return tuple(left)

    def plus(self, other: ModuleSize, times: int = 1) -> ModuleSize:
        return ModuleSize(
            self.parameters + times * other.parameters,
            self.state + times * other.state,
            self.known + other.known * times,
            self.convolves or other.convolves,
            self.recurrent + other.recurrent * times,
            self.unknown or other.unknown,
        )


EMPTY = ModuleSize(0, 0, ())


def copy_seconds(size: int) -> float:
    return size / HARDWARE["h2d_bytes_per_s"]


def save_seconds(size: int) -> float:
    return size / HARDWARE["save_bytes_per_s"]


def memory_bound(product: tuple[int, int]) -> bool:
    k, n = product
    return k * n / (2 * (k + n)) < MEMORY_BOUND_FLOPS_PER_BYTE


def widest_memory_bound(products: tuple[tuple[int, int], ...]) -> str | None:
    """Why every one of `products` waits for memory, not arithmetic: the widest, its flops per
    byte and the threshold; None when one of them may be bound by arithmetic (or none is given)."""
    if not products or not all(memory_bound(product) for product in products):
        return None
    k, n = max(products, key=lambda product: product[0] * product[1])
    return (
        f"the widest, {k} by {n}, does {k * n / (2 * (k + n)):.1f} flops per byte it moves, under the "
        f"{MEMORY_BOUND_FLOPS_PER_BYTE:.1f} below which even plain float32 waits for memory (an A100: "
        f"{HARDWARE['fp32_flops_per_s'] / 1e12:.1f} TFLOPS over {HARDWARE['memory_bytes_per_s'] / 1e12:.2f} TB/s)"
    )


def product_seconds(rows: int, product: tuple[int, int]) -> float:
    """The device time of a float32 product (rows x k) @ (k x n): its 2 * rows * k * n flops at
    the arithmetic rate, or the 4(rows*k + k*n + rows*n) bytes it moves at the memory's,
    whichever takes longer."""
    k, n = product
    flops = 2 * rows * k * n
    moved = FLOAT32_BYTES * (rows * k + k * n + rows * n)
    return max(flops / HARDWARE["fp32_flops_per_s"], moved / HARDWARE["memory_bytes_per_s"])


def launch_bound(products: tuple[tuple[int, int], ...], rows: int | None) -> str | None:
    """Why none of `products`, each run over `rows` rows, keeps the device busy: the longest
    takes less device time than the host needs to launch it (the backward's two products of
    each are as long), so the device waits for the host whatever precision they run in; None
    when one may take longer, or the rows or products are not known."""
    if not products or not rows:
        return None
    k, n = max(products, key=lambda product: product_seconds(rows, product))
    took = product_seconds(rows, (k, n))
    if took >= HARDWARE["kernel_launch_s"]:
        return None
    return (
        f"each runs over the {rows} row{'s' if rows > 1 else ''} of the step's batch, and the longest, "
        f"{rows} x {k} by {k} x {n}, "
        f"takes about {took * 1e6:.2f} us on the device in float32 (an A100: "
        f"{HARDWARE['fp32_flops_per_s'] / 1e12:.1f} TFLOPS, {HARDWARE['memory_bytes_per_s'] / 1e12:.2f} TB/s), less "
        f"than the {HARDWARE['kernel_launch_s'] * 1e6:.0f} us the host takes to launch a kernel: the device waits "
        "for the host, not for arithmetic"
    )


def blocking_copy_seconds(size: int) -> float:
    """The most a blocking copy of `size` bytes costs a step over one that overlaps: the
    copy itself from pageable memory (staged, at about half the pinned rate), and the device
    idle while the host, which waited for it, launches the kernels that follow (ten launches)."""
    return 2 * copy_seconds(size) + MIN_COPY_S


def shown(size: int) -> str:
    """`200 KB`, `3.1 MB`: a size as a reason states it."""
    if size < 10_000:
        return f"{size} bytes"
    if size < 1_000_000:
        return f"{size / 1000:.0f} KB"
    return f"{size / 1e6:.1f} MB"


def small_copy(size: int) -> str:
    """Why a copy of `size` bytes (under MIN_COPY_BYTES) is not worth overlapping."""
    micros = copy_seconds(size) * 1e6
    took = f"about {micros:.0f} us" if micros >= 1 else "under 1 us"
    return (
        f"a batch holds about {shown(size)}, which copies to the device in {took} "
        f"(at {HARDWARE['h2d_bytes_per_s'] / 1e9:.0f} GB/s from pinned memory): "
        f"less than the {MIN_COPY_S * 1e6:.0f} us of ten kernel launches"
    )


def sizes_of(context: FileContext) -> Sizes:
    return context.shared("sizes", Sizes)


class Sizes:
    """The sizes of one file's program; each look-up computed once."""

    def __init__(self, context: FileContext) -> None:
        self.context = context
        self.names = context.names
        self.index = context.index
        self.kinds = context.kinds
        self.loaders = context.loaders
        self._modules: dict[tuple[int, ...], ModuleSize | None] = {}
        # The constructions of the file's own classes being sized, innermost last: in a class's
        # `__init__`, a parameter holds what this construction passes it (`SensorNet(d=32)`).
        # None: the module's own constructions; `Told`: what a construction in another module passes.
        self._frames: list[tuple[cst.FunctionDef, cst.Call | Told | None]] = []
        self._told: list[Told] = []  # the constructions of other modules sized here, kept for the ids `_built` keys on
        self._indices: list[cst.Param] = []  # the index parameter of a `__getitem__` being sized
        self._syncs: dict[int, cst.Call | None] = {}
        self._steps: dict[int, ModuleSize | None] = {}
        # the calls of sized models each step loop makes, each with its model's size
        self._model_calls: dict[int, list[tuple[cst.Call, ModuleSize]]] = {}
        self._visiting: set[tuple[int, tuple[int, ...]]] = set()
        self._optimizer_counted = False  # `saved`: an optimizer's state was counted

    # -- values ----------------------------------------------------------------------------

    def values(self, expr: cst.BaseExpression, depth: int = 0) -> list[cst.BaseExpression] | None:
        """What `expr` may evaluate to, followed through names, `self.` attributes, the
        functions of this file that return it, tuple unpacking, a module's `.to(device)`, and
        DDP/DataParallel wrappers (and their `.module`); None when some of it cannot be seen."""
        return self._values(expr, (), depth)

    def _values(self, expr, path: tuple[int, ...], depth: int) -> list[cst.BaseExpression] | None:
        if depth > MAX_DEPTH:
            return None
        key = (id(expr), path)
        if key in self._visiting:
            return []  # `self.model = DDP(self.model)`: what it held before is followed already
        self._visiting.add(key)
        try:
            return self._followed(expr, path, depth)
        finally:
            self._visiting.discard(key)

    def _followed(self, expr, path: tuple[int, ...], depth: int) -> list[cst.BaseExpression] | None:
        if path:
            if isinstance(expr, (cst.Tuple, cst.List)):
                if path[0] >= len(expr.elements) or any(isinstance(e, cst.StarredElement) for e in expr.elements):
                    return None
                return self._values(expr.elements[path[0]].value, path[1:], depth + 1)
            if not isinstance(expr, (cst.Name, cst.Attribute, cst.Call)):
                return None
        if isinstance(expr, cst.Name):
            if expr.value in ("True", "False", "None"):
                return [expr]
            if self.kinds.parameter_read(expr) is not None:
                passed = self._passed_values(expr)
                found = [(value, ()) for value in passed] if passed else []
            else:
                found = self.loaders.bound_values(expr)
            return self._joined(found, path, depth)
        if isinstance(expr, cst.Attribute):
            if expr.attr.value == "module" and not path:
                # `ddp_model.module`: the wrapped model, which is what the wrapper's values are
                # followed to (of a model that is no wrapper, a part: no larger than the whole)
                inner = self._values(expr.value, (), depth + 1)
                if inner and all(isinstance(v, cst.Call) and self._is_module_build(v) for v in inner):
                    return inner
            if (
                isinstance(expr.value, cst.Name)
                and expr.value.value in ("self",)
                or self.kinds.instance_class(expr.value)
            ):
                found = self.loaders.attribute_values(expr)
                return self._joined(found, path, depth) if found else None
            return [expr] if not path else None
        if isinstance(expr, cst.Call):
            wrapped = self._wrapped(expr, depth)
            if wrapped is not None:
                return self._values(wrapped, path, depth + 1)
            function = self.kinds.local_callee(expr)  # a function of this file, or a method of its classes
            if function is not None:
                returned = self.kinds.returned(function)
                return self._all(returned, path, depth) if returned else None
            return [expr] if not path else None
        return [expr] if not path else None

    def _wrapped(self, expr: cst.BaseExpression, depth: int = 0) -> cst.BaseExpression | None:
        """The module `model.to(device)`, `DDP(model, ...)` hold: `model` (a module by its
        kind, or a name every value of which builds one: a parameter given a model)."""
        if not isinstance(expr, cst.Call):
            return None
        if method_name(expr) in MODULE_METHODS_RETURNING_SELF and (
            self._is_module_value(expr.func.value) or self._builds_modules(expr.func.value, depth)
        ):
            return expr.func.value
        if self.names.of(expr.func) & (MODEL_WRAPPERS | {RUNTIME_UNWRAP, *COPIES}):  # (a copy is as large)
            first = kwarg(expr, "module") or kwarg(expr, "model") or positional(expr, 0)
            return first.value if first is not None else None
        return None

    def _builds_modules(self, expr: cst.BaseExpression, depth: int) -> bool:
        found = self._values(expr, (), depth + 1)
        return bool(found) and all(isinstance(v, cst.Call) and self._is_module_build(v) for v in found)

    def _is_module_build(self, call: cst.Call) -> bool:
        return self._might_be_module(call)

    def _is_module_value(self, expr: cst.BaseExpression) -> bool:
        return self.kinds.fact(expr).kind is Kind.MODULE or self.context.training.is_model(expr)

    def _joined(self, found, path, depth) -> list[cst.BaseExpression] | None:
        if not found:
            return None
        values: list[cst.BaseExpression] = []
        for value, inner in found:
            part = self._values(value, inner + path, depth + 1)
            if part is None:
                return None
            values.extend(part)
        return values

    def _all(self, exprs, path, depth) -> list[cst.BaseExpression] | None:
        return self._joined([(e, ()) for e in exprs], path, depth)

    def integer(self, expr: cst.BaseExpression | None, depth: int = 0) -> int | None:
        """The largest integer `expr` may be as the script runs as written: literals, names and
        attributes bound to them, argparse defaults, `int(...)`, `+ - * //` and `**`."""
        if expr is None or depth > MAX_DEPTH:
            return None
        value = integer_value(expr)
        if value is not None:
            return value
        if isinstance(expr, cst.BinaryOperation):
            return self._integer_operation(expr, depth)
        if isinstance(expr, cst.Call):
            return self._integer_call(expr, depth)
        if isinstance(expr, cst.Subscript):
            keyed = self._keyed_integer(expr, depth)  # `cfg["emb_dim"]`
            return keyed if keyed is not None else self._indexed_size(expr, depth)
        if isinstance(expr, (cst.Name, cst.Attribute)):
            setting = None if self._framed(expr) else self.loaders.setting(expr, 0)
            if setting is not None:
                return integer_value(setting)
            values = self.values(expr, depth + 1)
            if not values or any(v is expr for v in values):
                return None
            found = [self.integer(v, depth + 1) for v in values]
            return None if any(f is None for f in found) else max(found)
        return None

    def _integer_operation(self, expr: cst.BinaryOperation, depth: int) -> int | None:
        """`integer` of `a + b`, `a * b`, `a // b` or `a ** b`, and of `a - b` where `b` has one
        value (a difference of upper bounds bounds nothing)."""
        left, right = self.integer(expr.left, depth + 1), self.integer(expr.right, depth + 1)
        if left is None or right is None:
            return None
        operator = expr.operator
        if isinstance(operator, cst.Subtract):
            return left - right if self._one_value(expr.right, depth + 1) else None
        if isinstance(operator, cst.Add):
            return left + right
        if isinstance(operator, cst.Multiply):
            return left * right
        if isinstance(operator, cst.FloorDivide) and right > 0:
            return left // right
        if isinstance(operator, cst.Power) and 0 <= right < 64:
            return left**right
        return None

    def _one_value(self, expr: cst.BaseExpression, depth: int) -> bool:
        """Can `expr` hold one integer only as the script runs as written (so that its upper
        bound, `integer`, is its value): a literal, a name or attribute with one value that
        does, `+ - * //` of such, `int()` of one?"""
        if depth > MAX_DEPTH:
            return False
        if integer_value(expr) is not None:
            return True
        if isinstance(expr, cst.BinaryOperation) and isinstance(
            expr.operator, (cst.Add, cst.Subtract, cst.Multiply, cst.FloorDivide)
        ):
            return self._one_value(expr.left, depth + 1) and self._one_value(expr.right, depth + 1)
        if isinstance(expr, cst.Call) and len(expr.args) == 1 and self.names.is_(expr.func, "int", "builtins.int"):
            return self._one_value(expr.args[0].value, depth + 1)
        if isinstance(expr, (cst.Name, cst.Attribute)):
            if not self._framed(expr) and self.loaders.setting(expr, 0) is not None:
                return True  # an argparse default (or the loader setting it names)
            values = self.values(expr, depth + 1)
            return bool(values) and len(values) == 1 and values[0] is not expr and self._one_value(values[0], depth + 1)
        return False

    def _integer_call(self, expr: cst.Call, depth: int) -> int | None:
        """`integer` of `int(n)` (and a process's share of a batch: at most the whole),
        `len(x)` and `x.size(0)`."""
        if len(expr.args) != 1:
            return None
        if self.names.is_(expr.func, "int", "builtins.int", RUNTIME_LOCAL_BATCH):
            return self.integer(expr.args[0].value, depth + 1)
        if self.names.is_(expr.func, *PRODUCTS_OF_ELEMENTS):
            return self._product_of_elements(expr.args[0].value, depth)
        if self.names.is_(expr.func, "len", "builtins.len"):
            length = self._literal_length(expr.args[0].value, depth + 1)
            return length if length is not None else self._dim_size(expr.args[0].value, 0, depth)
        if method_name(expr) == "size" and expr.args[0].keyword is None:
            return self._dim_size(expr.func.value, expr.args[0].value, depth)  # `x.size(0)`
        return None

    def _product_of_elements(self, expr: cst.BaseExpression, depth: int) -> int | None:
        """`np.prod(img_shape)`: the product of the integers of every tuple or list literal
        `expr` may hold (the largest)."""
        values = self.values(expr, depth + 1) if isinstance(expr, (cst.Name, cst.Attribute)) else [expr]
        if not values or not all(isinstance(v, (cst.Tuple, cst.List)) for v in values):
            return None
        found = []
        for literal in values:
            if any(isinstance(e, cst.StarredElement) for e in literal.elements):
                return None
            factors = [self.integer(e.value, depth + 1) for e in literal.elements]
            if None in factors or any(f < 0 for f in factors):
                return None
            found.append(math.prod(factors))
        return max(found)

    def _framed(self, expr: cst.BaseExpression) -> bool:
        """Is `expr` a parameter of a construction being sized, whose value is what that
        construction passes, not what the file's own calls do?"""
        bound = self.context.bindings.param_of(expr) if isinstance(expr, cst.Name) else None
        return bound is not None and any(function is bound[0] for function, _ in self._frames)

    def _keyed_integer(self, expr: cst.Subscript, depth: int) -> int | None:
        """`cfg["emb_dim"]` where every dict `cfg` may hold is a literal with that key (the
        largest of its entries), and nothing changes the dict in place."""
        key = _string_key(expr)
        owners = self._dicts(expr.value, depth + 1) if key is not None else None
        if not owners:
            return None
        found = [self.integer(dict_entry(owner, key), depth + 1) for owner in owners]
        return None if None in found else max(found)

    def _dicts(self, expr: cst.BaseExpression, depth: int) -> list[cst.Dict] | None:
        """The dict literals `expr` may hold, followed through names (parameters: what this
        construction or every call passes) and entries of dicts (`cfg["model"]`); None where
        one is no literal, or a name on the way is changed in place (`cfg.update(...)`,
        `cfg["dim"] = 64`)."""
        if depth > MAX_DEPTH:
            return None
        if isinstance(expr, cst.Dict):
            return [expr]
        if isinstance(expr, cst.Subscript):
            key = _string_key(expr)
            owners = self._dicts(expr.value, depth + 1) if key is not None else None
            entries = [dict_entry(owner, key) for owner in owners or ()]
            if not entries or None in entries:
                return None
            return self._all_dicts(entries, depth)
        if not isinstance(expr, cst.Name) or self._changed_in_place(expr):
            return None
        if self.context.bindings.param_of(expr) is not None:
            held = self._passed_values(expr)
        else:
            held = [value for value, path in self.loaders.bound_values(expr) if not path]
        return self._all_dicts(held, depth) if held else None

    def _all_dicts(self, exprs: list[cst.BaseExpression], depth: int) -> list[cst.Dict] | None:
        found = [self._dicts(e, depth + 1) for e in exprs]
        return None if None in found else [d for f in found for d in f]

    def _changed_in_place(self, expr: cst.BaseExpression) -> bool:
        """May the dict or list a name holds be changed in place (`cfg.update(...)`, `cfg[k] = v`)?"""
        return (
            not isinstance(expr, cst.Name)
            or self.kinds.is_mutated_in_place(expr)
            or self._grown(expr, MUTATING_METHODS)
        )

    def told(self, value: cst.BaseExpression, depth: int = 0) -> cst.BaseExpression | None:
        """What `value`, an argument of a construction, holds, written as a literal that reads
        the same in any module: an integer it is at most, a float, string, `True`/`False`/`None`
        literal, or a dict of string keys whose entries are such (the entries that are not are
        left out, so reading them stays unknown); None for anything else."""
        if depth > MAX_DEPTH:
            return None
        literal = self.loaders.setting(value, 0)  # `p=dropout` with `dropout = 0.1`
        if isinstance(literal, (cst.Float, cst.SimpleString)) or (
            isinstance(literal, cst.Name) and literal.value in ("True", "False", "None")
        ):
            return literal.deep_clone()
        number = self.integer(value, depth + 1)
        if number is not None:
            return cst.Integer(str(number)) if number >= 0 else None
        held = self._dicts(value, depth + 1)
        if not held or len(held) != 1:
            return None
        entries = []
        for element in held[0].elements:
            if not isinstance(element, cst.DictElement) or not isinstance(element.key, cst.SimpleString):
                return None  # `**other` may hold any key
            entry = self.told(element.value, depth + 1)
            if entry is not None:
                entries.append(cst.DictElement(element.key.deep_clone(), entry))
        return cst.Dict(entries)

    def _dim_size(self, tensor: cst.BaseExpression, dim: cst.BaseExpression | int, depth: int) -> int | None:
        """The size of a dim of a tensor of known shape: `x.size(0)`, `x.shape[-1]`, `len(x)`."""
        at = dim if isinstance(dim, int) else integer_value(dim)
        found = self.tensor(tensor, depth + 1)
        if at is None or found is None or not -len(found[0]) <= at < len(found[0]):
            return None
        return found[0][at]

    def _indexed_size(self, expr: cst.Subscript, depth: int) -> int | None:
        """`x.shape[1]`, `x.size()[1]`: a dim of a tensor of known shape."""
        if len(expr.slice) != 1 or not isinstance(expr.slice[0].slice, cst.Index):
            return None
        sizes = expr.value
        if isinstance(sizes, cst.Attribute) and sizes.attr.value == "shape":
            return self._dim_size(sizes.value, expr.slice[0].slice.value, depth)
        if isinstance(sizes, cst.Call) and method_name(sizes) == "size" and not sizes.args:
            return self._dim_size(sizes.func.value, expr.slice[0].slice.value, depth)
        return None

    def _literal_length(self, expr: cst.BaseExpression, depth: int) -> int | None:
        """The length of the list or tuple a name holds where every binding is a display
        without `*` (`VOCAB = ["good", ...]`) and nothing grows or changes it in place: the
        largest of them."""
        if not isinstance(expr, cst.Name) or self.kinds.is_mutated_in_place(expr) or self._grown(expr):
            return None
        values = self.values(expr, depth + 1)
        if not values or any(
            not isinstance(v, (cst.List, cst.Tuple)) or any(isinstance(e, cst.StarredElement) for e in v.elements)
            for v in values
        ):
            return None
        return max(len(v.elements) for v in values)

    def _grown(self, name: cst.Name, methods: frozenset[str] = LIST_RESIZERS) -> bool:
        """Is a method that changes a list's length (or one of `methods`) called on the
        variable behind `name`, or on an item of it (`cfg["model"].update(...)`)?"""
        scope = self.context.scopes.get(name)
        if scope is None:
            return True
        for access in scope.accesses[name.value]:
            node, parent = access.node, self.context.parents.get(access.node)
            while isinstance(parent, cst.Subscript) and parent.value is node:
                node, parent = parent, self.context.parents.get(parent)
            if isinstance(parent, cst.Attribute) and parent.attr.value in methods:
                return True
        return False

    def _shape(self, args: list[cst.BaseExpression], depth: int) -> tuple[int, ...] | None:
        """A shape given as integers or as one tuple or list of them."""
        if len(args) == 1 and isinstance(args[0], (cst.Tuple, cst.List)):
            args = [e.value for e in args[0].elements]
        dims = [self.integer(a, depth + 1) for a in args]
        return None if any(d is None for d in dims) else tuple(dims)

    # -- tensors ---------------------------------------------------------------------------

    def tensor(self, expr: cst.BaseExpression, depth: int = 0) -> tuple[tuple[int, ...], int] | None:
        """(shape, bytes of an element) of a tensor whose shape the code shows: made by a factory
        of known shape (`torch.randn(64, 8)`, `torch.zeros((n, d), dtype=torch.long)`,
        `torch.randint(0, 9, (n,))`, `torch.zeros_like(x)`), or computed from such tensors by
        slicing and indexing (`x[:, :3]`, `x[0]`), elementwise ops and arithmetic (broadcast),
        reductions over the dims given (`x.sum(1, keepdim=True)`), casts (`x.long()`), reshapes
        (`view`, `reshape`, `unsqueeze`, `flatten`, `t`, `permute`), rearrangements (`torch.roll`,
        `flip`) and `torch.cat`/`torch.stack`; any other call is unknown;
        a name where every binding that reaches it gives the same (`if cuda: X = X.pin_memory()`).
        Every dim is an upper bound (a slice of unknown bounds keeps its dim)."""
        found = self._tensor(expr, depth)
        return found if found is not None and found[1] else None

    def _tensor(self, expr: cst.BaseExpression, depth: int) -> tuple[tuple[int, ...], int] | None:
        """`tensor`, where a Python number is `((), 0)`: no dims, and no dtype of its own."""
        if depth > MAX_DEPTH:
            return None
        if isinstance(expr, cst.Attribute) and self.names.of(expr) & MATH_CONSTANTS:
            return (), 0  # `math.pi`: a Python float
        if isinstance(expr, (cst.Name, cst.Attribute)):
            return self._tensor_held(expr, depth)
        if isinstance(expr, (cst.Integer, cst.Float)):
            return (), 0
        if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus):
            return self._tensor(expr.expression, depth + 1)
        if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.MatrixMultiply):
            return self._tensor_product(expr.left, expr.right, depth)
        if isinstance(expr, cst.BinaryOperation):
            return self._tensor_broadcast([expr.left, expr.right], depth)
        if isinstance(expr, cst.Comparison) and len(expr.comparisons) == 1:
            compared = self._tensor_broadcast([expr.left, expr.comparisons[0].comparator], depth)
            return (compared[0], 1 if compared[1] else 0) if compared is not None else None  # bool
        if isinstance(expr, cst.Subscript):
            return self._tensor_indexed(expr, depth)
        if isinstance(expr, cst.Call) and any(n.startswith(HOST_NUMBER_PREFIXES) for n in self.names.of(expr.func)):
            return (), 0  # `math.cos(i)`: a Python float
        if isinstance(expr, cst.Call) and not any(a.star for a in expr.args):
            made = self._tensor_made(expr, depth)
            if made is None:
                made = self._tensor_computed(expr, depth)
            if made is None:
                made = self._tensor_returned(expr, depth)
            return made if made is not None else self._sequential_output(expr, depth)
        return None

    def _tensor_returned(self, call: cst.Call, depth: int) -> Tensor | None:
        """What a function of this file returns (`two_moons(768)`), its parameters holding what
        `call` passes them: known where every `return` agrees."""
        function = self.kinds.local_callee(call)
        returned = self.kinds.returned(function) if function is not None else []
        if not returned:
            return None
        self._frames.append((function, call))
        try:
            found = {self._tensor(value, depth + 1) for value in returned}
        finally:
            self._frames.pop()
        return found.pop() if len(found) == 1 else None

    def _tensor_held(self, expr: cst.Name | cst.Attribute, depth: int) -> Tensor | None:
        """`_tensor` of a name or attribute: a transpose (`x.T`), a batch a loader feeds, what
        the bindings that reach it hold, or for a parameter, what every call passes it."""
        if isinstance(expr, cst.Attribute) and expr.attr.value in ("T", "mT"):
            inner = self._tensor(expr.value, depth + 1)
            return _transposed(inner, -2, -1) if inner is not None and len(inner[0]) >= 2 else None
        fed = self._fed(expr, (), depth) if isinstance(expr, cst.Name) else None
        if fed is not None:
            return fed
        if isinstance(expr, cst.Name) and self.kinds.parameter_read(expr) is not None:
            values = self._passed_values(expr)  # each call's argument: a batch its loop feeds
        else:
            values = self.values(expr, depth + 1)
        if not values or any(value is expr for value in values):
            return None
        # Several bindings reach it (`if cuda: X = X.pin_memory()`): known where all agree.
        found = {self._tensor(value, depth + 1) for value in values}
        return found.pop() if len(found) == 1 else None

    def _sequential_output(self, call: cst.Call, depth: int) -> Tensor | None:
        """What an `nn.Sequential` of `nn.Linear` layers and layers that keep their input's shape
        (activations, norms, dropout) returns for the one tensor of known shape it is called on:
        that shape with the last Linear's width last, in float32 once a Linear ran."""
        if (
            len(call.args) != 1
            or call.args[0].keyword is not None
            or not isinstance(call.func, (cst.Name, cst.Attribute, cst.Call))
        ):
            return None
        built = self.values(call.func, depth + 1)
        if not built or len(built) != 1 or not isinstance(built[0], cst.Call):
            return None
        if not self.names.of(built[0].func) & SEQUENTIAL_MODULES or any(a.keyword or a.star for a in built[0].args):
            return None
        found = self._tensor(call.args[0].value, depth + 1)
        if found is None or not found[0] or not found[1]:
            return None
        shape, element = found
        for layer in (arg.value for arg in built[0].args):
            values = self.values(layer, depth + 1)
            if not values or len(values) != 1 or not isinstance(values[0], cst.Call):
                return None
            names = self.names.of(values[0].func)
            if names & SAME_SHAPE_MODULES:
                continue
            given = _layer_arguments(values[0], NN_LAYER_ARGUMENTS["Linear"]) if f"{TORCH_NN}Linear" in names else None
            if given is None:
                return None
            widths = _LayerArguments(self, "Linear", given, depth + 1)
            k, n = widths.number("in_features"), widths.number("out_features")
            if k is None or n is None or k != shape[-1]:
                return None  # not the width it is given: not what the code shows
            shape, element = (*shape[:-1], n), FLOAT32_BYTES
        return shape, element

    def _fed(self, name: cst.Name, where: tuple[int, ...], depth: int) -> Tensor | None:
        """The tensor at `where` in what `name` holds, where every binding that reaches it is
        (part of) the target of a loop over a DataLoader or of `next(it)` over one, or unpacks
        a name that holds such a batch (`x, y = batch`): the batch's tensor there."""
        if depth > MAX_DEPTH:
            return None
        found: list[Tensor] = []
        for assignment in self.kinds.sources(name) or ():
            unpacked = self.context.bindings.unpacked(assignment)
            if unpacked is not None and isinstance(unpacked[0], cst.Name):
                part = self._fed(unpacked[0], (unpacked[1], *where), depth + 1)
            else:
                part = self._batch_part(assignment.node, where)
            if part is None:
                return None
            found.append(part)
        return _widest(found)

    def _batch_part(self, target: cst.CSTNode, where: tuple[int, ...]) -> Tensor | None:
        """The tensor at `where` in the part of a loader's batch that `target` (a name in the
        target of a loop over loaders) binds, the widest of the loaders' batches."""
        for feed in self.loaders.feeds:
            inside = _path_to(feed.target, target)
            if inside is None:
                continue
            loaders = self.loaders.sources(feed.loader, (), 0)
            batches = [self.loader_batch(loader) for loader in loaders]
            if not batches or any(batch is None for batch in batches):
                return None
            parts = [next((tensor for at, tensor in batch if at == (*inside, *where)), None) for batch in batches]
            return None if any(part is None for part in parts) else _widest(parts)
        return None

    def _tensor_product(self, left, right, depth: int) -> tuple[tuple[int, ...], int] | None:
        """`a @ b` of matrices or batches of them, (..., m, k) @ (..., k, n): (..., m, n), the
        batch dims broadcast; of vectors, the dim they share goes."""
        found = [self._tensor(operand, depth + 1) for operand in (left, right)]
        if any(f is None or not f[0] or not f[1] for f in found):
            return None
        (a, a_element), (b, b_element) = found
        element = max(a_element, b_element)
        if a[-1] != (b[0] if len(b) == 1 else b[-2]):
            return None  # the dims multiplied do not match (or one is an upper bound): not shown
        if len(b) == 1:
            return a[:-1], element
        if len(a) == 1:
            return (*b[:-2], b[-1]), element
        rank = max(len(a), len(b)) - 2
        batch = [(1,) * (rank - len(s) + 2) + s[:-2] for s in (a, b)]
        return (*(max(dims) for dims in zip(*batch)), a[-2], b[-1]), element

    def _tensor_made(self, call: cst.Call, depth: int) -> tuple[tuple[int, ...], int] | None:
        """A factory's tensor: its shape and its dtype (float32, int64 for `randint`)."""
        names = self.names.of(call.func)
        plain = [a.value for a in call.args if a.keyword is None]
        if names & SHAPED_FACTORIES:
            size = kwarg(call, "size")
            shape = self._shape([size.value] if size is not None else plain, depth)
            default = FLOAT32_BYTES
        elif names & INTEGER_FACTORIES:
            size = kwarg(call, "size") or (positional(call, 2) if len(plain) >= 3 else positional(call, 1))
            shape = self._shape([size.value], depth) if size is not None else None
            default = INDEX_BYTES
        elif names & STEPS_FACTORIES:
            steps = kwarg(call, "steps") or positional(call, 2)
            length = self.integer(steps.value, depth + 1) if steps is not None else None
            shape = (length,) if length is not None else None
            default = FLOAT32_BYTES
        elif names & FILLED_FACTORIES and plain:  # `torch.full((channels,), 1.5)`: its fill value's dtype
            fill = positional(call, 1) or kwarg(call, "fill_value")
            shape = self._shape([plain[0]], depth)
            default = INDEX_BYTES if fill is not None and isinstance(fill.value, cst.Integer) else FLOAT32_BYTES
        elif names & LIKE_FACTORIES and plain:
            like = self._tensor(plain[0], depth + 1)
            shape, default = like if like is not None else (None, 0)
        elif names & DATA_FACTORIES and plain:
            data = self._literal_data(plain[0], depth + 1)
            ids = self._id_list(plain[0], depth + 1) if data is None else None
            if ids is not None and ids[0] is not None:
                data = (ids[0],), INDEX_BYTES  # `torch.tensor(token_ids[i:i + n])`: int64
            shape, default = data if data is not None else (None, 0)
        else:
            return None
        if shape is None:
            return None
        return self._tensor_dtype(call, shape, default)

    def _literal_data(self, data: cst.BaseExpression, depth: int) -> Tensor | None:
        """(shape, bytes of an element) of the tensor `torch.tensor(data)` makes of numbers
        written out, nested in lists or tuples of one length per level (`[[-1.2, 3.1], [0.5,
        2.0]]`), or of a name every binding of which is such a literal that nothing grows or
        changes: float32 where one is a float, else int64, bool for `True`/`False` only."""
        if isinstance(data, cst.Name) and data.value not in ("True", "False"):
            if self.kinds.is_mutated_in_place(data) or self._grown(data):
                return None
            values = self.values(data, depth + 1)
            found = {self._literal_data(value, depth + 1) for value in values or ()}
            return found.pop() if values and len(found) == 1 and None not in found else None
        kinds: set[type] = set()
        shape = _nesting(data, kinds)
        if shape is None or not kinds:
            return None
        return shape, FLOAT32_BYTES if float in kinds else INDEX_BYTES if int in kinds else 1

    def _id_list(self, expr: cst.BaseExpression, depth: int) -> tuple[int | None] | None:
        """(the most elements it holds, None where unknown) of a flat list of Python ints: the
        ids a tokenizer's `encode` gives one text, a slice of such a list (`ids[i:i + n]`
        holds at most n), or a name every binding of which is one; None for anything else."""
        if depth > MAX_DEPTH:
            return None
        if isinstance(expr, cst.Name):
            values = self.values(expr, depth + 1)
            if not values or any(value is expr for value in values):
                return None
            found = [self._id_list(value, depth + 1) for value in values]
            if None in found:
                return None
            lengths = [length for (length,) in found]
            return (None,) if None in lengths else (max(lengths),)
        if isinstance(expr, cst.Call):
            tokenized = method_name(expr) in ID_LIST_METHODS and tokenizers_of(self.context).tokenizes(expr)
            return (None,) if tokenized else None
        if isinstance(expr, cst.Subscript) and len(expr.slice) == 1 and isinstance(expr.slice[0].slice, cst.Slice):
            part = expr.slice[0].slice
            whole = self._id_list(expr.value, depth + 1)
            if whole is None or part.step is not None:
                return whole  # a stepped slice holds at most what the whole does
            width = self._slice_width(part.lower, part.upper, depth)
            known = [n for n in (whole[0], width) if n is not None]
            return (min(known) if known else None,)
        return None

    def _slice_width(self, lower: cst.BaseExpression | None, upper: cst.BaseExpression | None, depth: int):
        """At most how many elements `x[lower:upper]` holds, both sums of terms where those
        that are not numbers are the same on either side (`i + 1`, `i + max_length + 1`): the
        upper's numbers (at most their largest value) less the lower's (literals only, so that
        the difference stays an upper bound); None where it cannot be told."""
        if upper is None:
            return None
        unmatched = _terms(lower) if lower is not None else []
        low = 0
        for term in list(unmatched):
            literal = integer_value(term)
            if literal is not None:
                low += literal
                unmatched.remove(term)
        high = 0
        for term in _terms(upper):
            same = next((other for other in unmatched if other.deep_equals(term)), None)
            if same is not None:
                unmatched.remove(same)
                continue
            number = self.integer(term, depth + 1)
            if number is None:
                return None
            high += number
        return high - low if not unmatched and high >= low else None

    def _tensor_dtype(self, call: cst.Call, shape: tuple[int, ...], default: int):
        dtype = kwarg(call, "dtype")
        if dtype is None:
            return (shape, default) if default else None
        element = self._dtype_bytes(dtype.value)
        return (shape, element) if element is not None else None

    def _dtype_bytes(self, expr: cst.BaseExpression) -> int | None:
        return next((DTYPE_BYTES[n] for n in self.names.of(expr) if n in DTYPE_BYTES), None)

    def _tensor_broadcast(self, operands, depth: int) -> tuple[tuple[int, ...], int] | None:
        """The shape of operands broadcast together (each dim the largest: an upper bound of
        every valid broadcast), in the widest of their dtypes."""
        found = [self._tensor(operand, depth + 1) for operand in operands]
        if any(f is None for f in found):
            return None
        rank = max(len(shape) for shape, _ in found)
        padded = [(1,) * (rank - len(shape)) + shape for shape, _ in found]
        shape = tuple(max(dims) for dims in zip(*padded)) if rank else ()
        return shape, max(element for _, element in found)

    def _tensor_indexed(self, expr: cst.Subscript, depth: int) -> tuple[tuple[int, ...], int] | None:
        """`x[:, :3]`, `x[0]`, `x[..., None]`: basic indexing by slices, Python integers, None
        and `...`; and one index by an int64 tensor of known shape (`centers[labels]`: that dim
        becomes the index's dims). Other gathers (by a list, by several tensors) are not followed."""
        base = self._tensor(expr.value, depth + 1)
        if base is None or not base[0]:
            return None
        shape, element = base
        parts = [e.slice for e in expr.slice]
        counted = [p for p in parts if not (isinstance(p, cst.Index) and _is_none_or_ellipsis(p.value))]
        if len(counted) > len(shape) or sum(isinstance(p, cst.Index) and _is_ellipsis(p.value) for p in parts) > 1:
            return None
        out: list[int] = []
        dim = 0
        gathered = False  # an index by a tensor of indices was met
        for part in parts:
            if isinstance(part, cst.Slice):
                out.append(self._slice_length(shape[dim], part, depth))
                dim += 1
            elif _is_ellipsis(part.value):
                skipped = len(shape) - len(counted)
                out.extend(shape[dim : dim + skipped])
                dim += skipped
            elif isinstance(part.value, cst.Name) and part.value.value == "None":
                out.append(1)
            elif (
                self._is_item_index(part.value)
                or self.integer(part.value, depth + 1) is not None
                or self._scalar(part.value, depth + 1)
                or self._tensor(part.value, depth + 1) == ((), INDEX_BYTES)
            ):
                dim += 1  # a Python integer (or a 0-d int64 tensor: `labels[i]`) picks one entry: the dim goes
            elif not gathered and (index := self._tensor(part.value, depth + 1)) and index[1] == INDEX_BYTES:
                out.extend(index[0])  # a gather: one entry per index
                dim += 1
                gathered = True
            else:
                return None
        return (*out, *shape[dim:]), element

    def _slice_length(self, size: int, part: cst.Slice, depth: int) -> int:
        """The length of a dim of `size` after the slice `part` (at most `size`)."""
        bounds = [part.lower, part.upper, part.step]
        literal = [integer_value(b) if b is not None else None for b in bounds]
        if all(b is None or v is not None for b, v in zip(bounds, literal)) and literal[2] != 0:
            return len(range(size)[slice(*literal)])
        if part.lower is None and part.step is None:
            upper = self.integer(part.upper, depth + 1)
            if upper is not None and upper >= 0:
                return min(size, upper)
        if part.lower is not None and part.upper is not None and part.step is None:
            width = _window(part.lower, part.upper)  # `x[i:i + 48]`, `x[i + 48:i + 60]`
            if width is not None and width >= 0:
                return min(size, width)
        return size

    def _tensor_computed(self, call: cst.Call, depth: int) -> tuple[tuple[int, ...], int] | None:
        """A tensor computed by a torch function or a tensor method from tensors of known
        shape; its elements of the dtype the op gives whatever its operands' (`argmax`: int64,
        `eq`: bool), else of theirs."""
        found = self._tensor_from_operands(call, depth)
        names = self.names.of(call.func)
        method = method_name(call)
        op = next((OPS[n] for n in names if n in OPS), None) or OPS.get(f"{METHOD}{method}")
        dtype = op.result_dtype if op is not None else None
        if found is None or dtype not in DTYPE_OF:
            return found
        return found[0], DTYPE_OF[dtype].bytes

    def _tensor_from_operands(self, call: cst.Call, depth: int) -> tuple[tuple[int, ...], int] | None:
        names = self.names.of(call.func)
        plain = [a.value for a in call.args if a.keyword is None]
        if names & (JOINING_FUNCTIONS | STACKING_FUNCTIONS):
            return self._tensor_joined(call, bool(names & STACKING_FUNCTIONS), depth)
        if names & REDUCTION_FUNCTIONS and plain:
            receiver = self._tensor(plain[0], depth + 1)
            return self._tensor_reduced(receiver, call, 1, depth) if receiver is not None else None
        if names & REARRANGING_FUNCTIONS:
            return self._tensor(plain[0], depth + 1) if plain else None
        if names & SHAPE_KEEPING_FUNCTIONS:
            enough = len(plain) >= (2 if names & BINARY_FUNCTIONS else 1)
            return self._tensor_broadcast(plain, depth) if enough else None
        method = method_name(call)
        if method is None:
            return None
        # (a method of what a call returns, `torch.randint(...).cuda()`, is named after that call)
        if not isinstance(call.func.value, cst.Call) and any(not n.startswith("builtins.") for n in names):
            return None  # a function of another library, or one torch's table does not shape
        receiver = self._tensor(call.func.value, depth + 1)
        if receiver is None or not receiver[1]:
            return None
        if method in REDUCTION_METHODS:
            return self._tensor_reduced(receiver, call, 0, depth)
        if method in CAST_METHOD_DTYPES:
            return receiver[0], DTYPE_BYTES[CAST_METHOD_DTYPES[method]]
        if method == "to":
            return self._tensor_moved(receiver, call)
        if method in SHAPE_KEEPING_METHODS:
            return self._tensor_broadcast([call.func.value, *plain], depth) if plain else receiver
        if method in REARRANGING_METHODS:
            return receiver
        return self._tensor_reshaped(receiver, method, call, depth)

    def _tensor_moved(self, receiver, call: cst.Call):
        """`x.to(device)` keeps the dtype, `x.to(torch.long)` / `x.to(device, dtype=...)` names it."""
        dtypes = [
            self._dtype_bytes(arg.value) for arg in call.args if arg.keyword is None or arg.keyword.value == "dtype"
        ]
        named = [d for d in dtypes if d is not None]
        if named:
            return receiver[0], named[0]
        others = [
            arg.value
            for arg in call.args
            if arg.keyword is None
            and self.kinds.fact(arg.value).kind is not Kind.DEVICE
            and not isinstance(arg.value, cst.SimpleString)
        ]
        return receiver if not others else None

    def _tensor_reduced(self, receiver, call: cst.Call, first: int, depth: int):
        """`x.sum()`, `x.sum(1)`, `torch.mean(x, dim=(0, 1), keepdim=True)`: the dims given go
        (or stay as 1 with `keepdim`); with none, all of them."""
        shape, element = receiver
        given = kwarg(call, "dim") or kwarg(call, "axis") or positional(call, first)
        keep = kwarg(call, "keepdim") or positional(call, first + 1)
        if given is None:
            return ((), element) if keep is None else None
        dims = (
            [e.value for e in given.value.elements] if isinstance(given.value, (cst.Tuple, cst.List)) else [given.value]
        )
        picked = {integer_value(d) for d in dims}
        if None in picked or not all(-len(shape) <= d < len(shape) for d in picked):
            return None
        picked = {d % len(shape) for d in picked}
        keeps = False if keep is None else _literal_bool(keep.value)
        if keeps is None:
            return None
        if keeps:
            return tuple(1 if i in picked else n for i, n in enumerate(shape)), element
        return tuple(n for i, n in enumerate(shape) if i not in picked), element

    def _tensor_reshaped(self, receiver, method: str, call: cst.Call, depth: int):
        """`view`/`reshape` to sizes (one of them -1), `unsqueeze`, `flatten()`, `t()`,
        `transpose`, `permute`; None for the others."""
        reshape = _RESHAPES.get(method)
        if reshape is None:
            return None
        return reshape(self, receiver, [a.value for a in call.args if a.keyword is None], call, depth)

    def _viewed(self, receiver, plain: list[cst.BaseExpression], call: cst.Call, depth: int):
        """`x.view(B, -1)`, `x.reshape((B, T, C))`: the sizes given, the -1 the rest of them."""
        shape, element = receiver
        if not plain:
            return None
        dims = [integer_value(s) if integer_value(s) == -1 else self.integer(s, depth + 1) for s in _listed(plain)]
        if None in dims or dims.count(-1) > 1:
            return None
        if -1 in dims:
            known = math.prod(d for d in dims if d != -1)
            dims = [math.prod(shape) // known if d == -1 and known else d for d in dims]
        return tuple(dims), element

    def _unsqueezed(self, receiver, plain: list[cst.BaseExpression], call: cst.Call, depth: int):
        shape, element = receiver
        at = integer_value(plain[0]) if len(plain) == 1 else None
        if at is None or not -len(shape) - 1 <= at <= len(shape):
            return None
        at %= len(shape) + 1
        return (*shape[:at], 1, *shape[at:]), element

    def _flattened(self, receiver, plain: list[cst.BaseExpression], call: cst.Call, depth: int):
        shape, element = receiver
        return ((math.prod(shape),), element) if not call.args else None

    def _matrix_transposed(self, receiver, plain: list[cst.BaseExpression], call: cst.Call, depth: int):
        """`m.t()`: a matrix's two dims swapped."""
        return _transposed(receiver, 0, 1) if not call.args and len(receiver[0]) == 2 else None

    def _dims_swapped(self, receiver, plain: list[cst.BaseExpression], call: cst.Call, depth: int):
        """`x.transpose(1, 2)`, `swapaxes`, `swapdims`."""
        if len(plain) != 2:
            return None
        first, second = integer_value(plain[0]), integer_value(plain[1])
        if first is None or second is None or not receiver[0]:
            return None
        return _transposed(receiver, first, second)

    def _permuted(self, receiver, plain: list[cst.BaseExpression], call: cst.Call, depth: int):
        shape, element = receiver
        if not plain:
            return None
        picked = [integer_value(o) for o in _listed(plain)]
        if None in picked or sorted(p % len(shape) for p in picked) != list(range(len(shape))):
            return None
        return tuple(shape[p] for p in picked), element

    def _tensor_stacked(self, call: cst.Call, comprehension, depth: int):
        """`torch.stack([x[i:i + 48] for i in range(n)])`: n of the element's shape, along dim 0."""
        loop = comprehension.for_in
        if loop.inner_for_in is not None or loop.ifs or kwarg(call, "dim") or positional(call, 1):
            return None
        if not isinstance(loop.iter, cst.Call) or not self.names.is_(loop.iter.func, "range", "builtins.range"):
            return None
        if len(loop.iter.args) != 1:
            return None
        count = self.integer(loop.iter.args[0].value, depth + 1)
        element = self._tensor(comprehension.elt, depth + 1)
        if count is None or element is None or not element[1]:
            return None
        return (count, *element[0]), element[1]

    def _tensor_joined(self, call: cst.Call, stacked: bool, depth: int):
        """`torch.cat([a, b], dim)` sums the dim, `torch.stack` adds one of their number."""
        parts = positional(call, 0) or kwarg(call, "tensors")
        if parts is not None and stacked and isinstance(parts.value, (cst.ListComp, cst.GeneratorExp)):
            return self._tensor_stacked(call, parts.value, depth)
        if parts is None or not isinstance(parts.value, (cst.List, cst.Tuple)) or not parts.value.elements:
            return None
        if any(isinstance(e, cst.StarredElement) for e in parts.value.elements):
            return None
        found = [self._tensor(e.value, depth + 1) for e in parts.value.elements]
        if any(f is None or not f[1] for f in found) or len({len(shape) for shape, _ in found}) != 1:
            return None
        dim_arg = kwarg(call, "dim") or positional(call, 1)
        at = 0 if dim_arg is None else integer_value(dim_arg.value)
        rank = len(found[0][0]) + (1 if stacked else 0)
        if at is None or not -rank <= at < rank:
            return None
        at %= rank
        element = max(e for _, e in found)
        widest = tuple(max(dims) for dims in zip(*(shape for shape, _ in found)))
        if stacked:
            return (*widest[:at], len(found), *widest[at:]), element
        if at >= len(widest):
            return None
        return (*widest[:at], sum(shape[at] for shape, _ in found), *widest[at + 1 :]), element

    # -- batches ---------------------------------------------------------------------------

    def row_bytes(self, tensor: cst.BaseExpression, depth: int = 0) -> int | None:
        """The bytes of one row (one index along the first dim) of `tensor`."""
        shape = self.tensor(tensor, depth)
        return math.prod(shape[0][1:]) * shape[1] if shape is not None and shape[0] else None

    def rows_batch_bytes(self, tensors: list[cst.BaseExpression], batch_size: cst.BaseExpression) -> int | None:
        """The bytes of a batch of `batch_size` rows of each of `tensors` (what a TensorDataset
        of them batches); None when any of it cannot be sized."""
        count = self.integer(batch_size)
        rows = [self.row_bytes(tensor) for tensor in tensors]
        return None if count is None or any(r is None for r in rows) else count * sum(rows)

    def loader_batch_bytes(self, loader: cst.Call) -> int | None:
        """The bytes of one batch of the DataLoader `loader` builds: its `batch_size` (1 when
        not given) times the bytes of one item of its dataset."""
        batch = self.loader_batch_size(loader)
        item = self.item_bytes(self.loaders.dataset(loader)) if batch is not None else None
        return batch * item if item is not None else None

    def loader_batch(self, loader: cst.Call) -> Item | None:
        """The tensors of one batch of the DataLoader `loader` builds, each where it sits in
        the batch: its items' tensors stacked `batch_size` high."""
        batch = self.loader_batch_size(loader)
        item = self.item_tensors(self.loaders.dataset(loader)) if batch is not None else None
        if item is None:
            return None
        return tuple((where, ((batch, *shape), element)) for where, (shape, element) in item)

    def loader_batch_size(self, loader: cst.Call) -> int | None:
        """The number of items the DataLoader `loader` stacks in a batch (1 when not given);
        None where a sampler, a collate function or a subclass may batch otherwise."""
        loaders = self.loaders
        if any(kwarg(loader, key) is not None for key in ("batch_sampler", "collate_fn")):
            return None
        if positional(loader, BATCH_SAMPLER_POSITION) or positional(loader, COLLATE_FN_POSITION):
            return None
        if loaders.overridden_subclass(loader):
            return None  # a loader class that may batch otherwise
        starred = any(arg.star for arg in loader.args)
        if starred and any(self._star_setting(loader, key) is not None for key in ("batch_sampler", "collate_fn")):
            return None
        size = kwarg(loader, "batch_size") or positional(loader, 1)
        value = size.value if size is not None else self._star_setting(loader, "batch_size") if starred else None
        if value is _MISSING:
            return None
        return 1 if value is None else self.integer(value)

    def _star_setting(self, loader: cst.Call, key: str):
        """The value the `**settings` dict of `loader` gives `key`: None when it gives none,
        _MISSING when that cannot be told (no literal, or an `update` may set it)."""
        keys = self.loaders.star_kwargs_keys(loader, either=True)
        if keys is None:
            return _MISSING
        if key not in keys:
            return None
        name = next(arg.value for arg in loader.args if arg.star)
        literal = self._dict_literal(name)
        value = dict_entry(literal, key) if literal is not None else None
        if value is None:
            return _MISSING
        for call in self.index.find(cst.Call):
            if not (method_name(call) == "update" and _same_name(call.func.value, name)):
                continue
            for arg in call.args:
                added = self._dict_literal(arg.value)
                if arg.keyword is not None and arg.keyword.value == key:
                    return _MISSING
                if arg.keyword is None and (added is None or dict_entry(added, key) is not None):
                    return _MISSING
        return value

    def _dict_literal(self, expr: cst.BaseExpression) -> cst.Dict | None:
        if isinstance(expr, cst.Dict):
            return expr
        values = self.values(expr) if isinstance(expr, cst.Name) else None
        return values[0] if values and len(values) == 1 and isinstance(values[0], cst.Dict) else None

    def item_bytes(self, dataset: cst.BaseExpression | None, depth: int = 0) -> int | None:
        """The bytes of one item of `dataset` as the default collation stacks it: a
        TensorDataset's row, an image and class index of a torchvision dataset of one image
        size (after its transform), the largest of the datasets a name may hold."""
        items = self._items(dataset, depth)
        if items is None:
            return None
        return max(sum(math.prod(shape) * element for _, (shape, element) in item) for item in items)

    def item_tensors(self, dataset: cst.BaseExpression | None, depth: int = 0) -> Item | None:
        """The tensors of one item of `dataset`, each where it sits in the item: every dim the
        largest any item of the datasets a name may hold has there. None when the items differ
        in how they are laid out, or cannot be told."""
        items = self._items(dataset, depth)
        if not items or any([where for where, _ in item] != [where for where, _ in items[0]] for item in items):
            return None
        merged = []
        for index, (where, _) in enumerate(items[0]):
            widest = _widest([item[index][1] for item in items])
            if widest is None:
                return None
            merged.append((where, widest))
        return tuple(merged)

    def _items(self, dataset: cst.BaseExpression | None, depth: int) -> list[Item] | None:
        """Each way an item of `dataset` may be laid out (one per dataset a name may hold, per
        value its `__getitem__` returns)."""
        if dataset is None or depth > MAX_DEPTH:
            return None
        values = self.values(dataset, depth + 1)
        if not values:
            return None
        found: list[Item] = []
        for value in values:
            items = self._dataset_items(value, depth) if isinstance(value, cst.Call) else None
            if items is None:
                return None
            found.extend(items)
        return found

    def _dataset_items(self, call: cst.Call, depth: int) -> list[Item] | None:
        classdef = self.kinds.local_class(call.func) if isinstance(call.func, cst.Name) else None
        if classdef is not None:
            return self._class_items(classdef, call, depth)
        found = project_of(self.context).class_of(call.func)
        if found is not None:
            # Read in its own module, its `__init__`'s parameters holding what `call` passes.
            context, classdef = found
            elsewhere = sizes_of(context)
            return elsewhere._class_items(classdef, elsewhere.told_by(classdef, call, self, depth), depth)
        names = self.names.of(call.func)
        if names & TENSOR_ROW_DATASETS:
            tensors = self._row_tensors(call, depth)
            if not tensors:
                return None
            rows = [self.tensor(tensor, depth + 1) for tensor in tensors]
            if any(r is None or not r[0] for r in rows):
                return None
            return [tuple(((index,), (shape[1:], element)) for index, (shape, element) in enumerate(rows))]
        image = next((IMAGE_DATASETS[n] for n in names if n in IMAGE_DATASETS), None)
        if image is None:
            return None
        if kwarg(call, "target_transform") is not None:
            return None
        transform = kwarg(call, "transform")
        if transform is None:
            return None  # PIL images: the default collation cannot stack them
        shape = self._transformed(transform.value, image, False, depth + 1)
        if shape is None or shape[1] is False:
            return None
        return [(((0,), (shape[0], FLOAT32_BYTES)), ((1,), ((), INDEX_BYTES)))]

    def _row_tensors(self, call: cst.Call, depth: int) -> list[cst.BaseExpression] | None:
        """The tensors `TensorDataset(...)` is given: its arguments, or the items of the one
        tuple its one starred argument holds (`TensorDataset(*make_data(n))`, a function of the
        file that returns `x, y`); None when they cannot be told."""
        if any(a.keyword is not None for a in call.args) or not call.args:
            return None
        if not any(a.star for a in call.args):
            return [a.value for a in call.args]
        if len(call.args) != 1 or call.args[0].star != "*":
            return None
        held = self.values(call.args[0].value, depth + 1)
        if not held or len(held) != 1 or not isinstance(held[0], (cst.Tuple, cst.List)):
            return None
        if any(isinstance(element, cst.StarredElement) for element in held[0].elements):
            return None
        return [element.value for element in held[0].elements]

    def told_by(self, classdef: cst.ClassDef, call: cst.Call, caller: Sizes, depth: int) -> Told | None:
        """What `call`, a construction in the module `caller` reads, passes the parameters of
        `classdef`'s `__init__` (a class of this module), each told as a literal; None where
        its arguments cannot be matched to them (`*args`, `**kwargs`)."""
        init = _method(classdef, "__init__")
        if init is None or any(arg.star for arg in call.args):
            return None
        told = Told({})
        for param in init.params.params[1:]:
            argument = argument_for(call, init, param, 1)
            if argument is not None:
                told.values[param.name.value] = caller.told(argument, depth + 1)
        self._told.append(told)
        return told

    def _class_items(self, classdef: cst.ClassDef, call: cst.Call | Told | None, depth: int) -> list[Item] | None:
        """A map-style Dataset class of this file built by `call`: the items its
        `__getitem__(self, i)` returns (a tensor, or a tuple, list or dict of them as the
        default collation stacks them), its `__init__`'s parameters holding what `call`
        passes (what the module's own constructions pass, where `call` is in another module
        and given as None) and `i` a Python integer."""
        if not classdef.bases or not all(
            self.names.is_(base.value, "torch.utils.data.Dataset", "torch.utils.data.dataset.Dataset")
            for base in classdef.bases
        ):
            return None
        getitem = _method(classdef, "__getitem__")
        if (
            getitem is None
            or len(getitem.params.params) != 2
            or getitem.params.star_arg is not cst.MaybeSentinel.DEFAULT
        ):
            return None
        returned = returned_values(getitem)
        init = _method(classdef, "__init__")
        if not returned or init is None:
            return None
        self._frames.append((init, call))
        self._indices.append(getitem.params.params[1])
        try:
            found = [self._collated(value, (), depth + 1) for value in returned]
        finally:
            self._frames.pop()
            self._indices.pop()
        return None if any(f is None for f in found) else found

    def _collated(self, value: cst.BaseExpression, where: tuple[int, ...] | None, depth: int) -> Item | None:
        """The tensors `value` holds, in order, each with where it sits (None inside a dict)."""
        if isinstance(value, (cst.Tuple, cst.List, cst.Dict)):
            parts = [e.value for e in value.elements if isinstance(e, (cst.Element, cst.DictElement))]
            if len(parts) != len(value.elements) or any(isinstance(e, cst.StarredElement) for e in value.elements):
                return None
            inner = [
                None if where is None or isinstance(value, cst.Dict) else (*where, index) for index in range(len(parts))
            ]
            found = [self._collated(part, at, depth + 1) for part, at in zip(parts, inner)]
            return None if any(f is None for f in found) else tuple(t for f in found for t in f)
        elements = self._list_elements(value, depth)
        if elements is not None:
            return _widest_item([self._collated(element, where, depth + 1) for element in elements])
        shape = self.tensor(value, depth + 1)
        return ((where, shape),) if shape is not None else None

    def _list_elements(self, value: cst.BaseExpression, depth: int) -> list[cst.BaseExpression] | None:
        """For `items[i]`, the expressions every element of the list may be made by: the
        element of a comprehension that builds it (`self.data = [(x, y) for ...]`), or what
        `append` adds to a list made empty (`self.input_ids = []`, then
        `self.input_ids.append(torch.tensor(chunk))`); None for anything else, or a list another
        method may grow or an item assignment may change."""
        if not (isinstance(value, cst.Subscript) and len(value.slice) == 1):
            return None
        if not isinstance(value.slice[0].slice, cst.Index):
            return None
        held = value.value
        made = self.values(held, depth + 1)
        if not made or len(made) != 1 or not isinstance(held, (cst.Name, cst.Attribute)):
            return None
        appended = self._appended(held)
        if appended is None:
            return None
        if isinstance(made[0], cst.ListComp) and not appended:
            return [made[0].elt]
        if isinstance(made[0], cst.List) and not made[0].elements and appended:
            return appended
        return None

    def _appended(self, held: cst.Name | cst.Attribute) -> list[cst.BaseExpression] | None:
        """What `held.append(x)` calls add to the list a variable (or an attribute of this
        name, of any object, anywhere in the file) holds; None where another method that adds
        to it is called on it (`extend`, `insert`) or an item of it is assigned."""
        if isinstance(held, cst.Name):
            scope = self.context.scopes.get(held)
            if scope is None:
                return None
            uses = [access.node for access in scope.accesses[held.value]]
        else:
            uses = [a for a in self.index.find(cst.Attribute) if a.attr.value == held.attr.value]
        appended: list[cst.BaseExpression] = []
        for use in uses:
            parent = self.context.parents.get(use)
            if isinstance(parent, cst.Subscript) and parent.value is use and self._assigned(parent):
                return None  # `held[i] = x`
            if not isinstance(parent, cst.Attribute) or parent.value is not use:
                continue
            call = self.context.parents.get(parent)
            if parent.attr.value == "append" and isinstance(call, cst.Call) and len(call.args) == 1:
                appended.append(call.args[0].value)
            elif parent.attr.value in LIST_GROWERS:
                return None
        return appended

    def _assigned(self, target: cst.BaseExpression) -> bool:
        parent = self.context.parents.get(target)
        return isinstance(parent, cst.AssignTarget) or isinstance(parent, cst.AugAssign) and parent.target is target

    def _is_item_index(self, expr: cst.BaseExpression) -> bool:
        if not self._indices or not isinstance(expr, cst.Name):
            return False
        bound = self.context.bindings.param_of(expr)
        return bound is not None and bound[1] is self._indices[-1]

    def _transformed(self, transform, image: tuple[int, ...], tensor: bool, depth: int):
        """(shape, is a float32 tensor) of an image of `image` shape after `transform`."""
        if depth > MAX_DEPTH:
            return None
        values = self.values(transform, depth + 1)
        if not values or len(values) != 1 or not isinstance(values[0], cst.Call):
            return None
        call = values[0]
        names = {n.replace(".transforms.transforms.", ".transforms.") for n in self.names.of(call.func)}
        if "torchvision.transforms.Compose" in names:
            steps = positional(call, 0) or kwarg(call, "transforms")
            if steps is None or not isinstance(steps.value, (cst.List, cst.Tuple)):
                return None
            state = (image, tensor)
            for element in steps.value.elements:
                if isinstance(element, cst.StarredElement):
                    return None
                state = self._transformed(element.value, state[0], state[1], depth + 1)
                if state is None:
                    return None
            return state
        if "torchvision.transforms.ToTensor" in names:
            return image, True
        if names & SHAPE_KEEPING_TRANSFORMS:
            return image, tensor
        if names & CROP_TRANSFORMS:
            size = positional(call, 0) or kwarg(call, "size")
            side = self.integer(size.value, depth + 1) if size is not None else None
            return ((image[0], side, side), tensor) if side is not None else None
        if names & PADDING_TRANSFORMS:
            padding = positional(call, 0) or kwarg(call, "padding")
            sides = self._padding(padding.value, depth) if padding is not None else None
            if sides is None:
                return None
            left, top, right, bottom = sides
            return (image[0], image[1] + top + bottom, image[2] + left + right), tensor
        return None

    def _padding(self, padding: cst.BaseExpression, depth: int) -> tuple[int, int, int, int] | None:
        """(left, top, right, bottom) of a `Pad` transform's `padding`: one for every side,
        (left and right, top and bottom), or the four."""
        given = [padding] if not isinstance(padding, (cst.Tuple, cst.List)) else [e.value for e in padding.elements]
        sides = [self.integer(side, depth + 1) for side in given]
        if None in sides or len(sides) not in (1, 2, 4):
            return None
        if len(sides) == 1:
            return sides[0], sides[0], sides[0], sides[0]
        if len(sides) == 2:
            return sides[0], sides[1], sides[0], sides[1]
        return tuple(sides)

    # -- the step loop ---------------------------------------------------------------------

    def feeding_batch_bytes(self, node: cst.CSTNode) -> tuple[int, tuple[cst.CSTNode, ...]] | None:
        """(bytes of the largest batch, the loops) for the innermost loops around `node` that
        DataLoaders of known batch size feed: in its own function, or, in a function of this
        file, around each call of it (a helper given the batch to copy, `calc_loss_batch(x, y,
        model, device)`, called from a training loop and an evaluation loop); None when a way
        to `node` passes no such loop, or one fed by a loader whose batches are not known."""
        found = self._feeding(node, 0, ())
        if not found:
            return None
        return max(size for size, _ in found), tuple(loop for _, loop in found)

    def _feeding(
        self, node: cst.CSTNode, depth: int, callers: tuple[cst.FunctionDef, ...]
    ) -> list[tuple[int, cst.CSTNode]] | None:
        """`feeding_batch_bytes`' (bytes, loop) pairs; `callers`: the functions whose call sites
        are being followed, whose recursive calls run inside the loops of the outer calls."""
        if depth > MAX_DEPTH:
            return None
        feeds = self.loaders.feeds
        loops = {id(feed.loop) for feed in feeds}
        for ancestor in self.index.ancestors(node):
            if isinstance(ancestor, (cst.Lambda, cst.ClassDef)):
                return None
            if isinstance(ancestor, cst.FunctionDef):
                if any(ancestor is caller for caller in callers):
                    return []  # a recursive call: the loops around the outer call are counted there
                calls = self.context.loops.call_sites(ancestor)
                found = [self._feeding(call, depth + 1, (*callers, ancestor)) for call in calls]
                return None if not found or None in found else [fed for each in found for fed in each]
            if id(ancestor) not in loops:
                continue
            sizes = [self.largest_batch_bytes(feed.loader) for feed in feeds if feed.loop is ancestor]
            if not sizes or None in sizes:
                return None
            return [(max(sizes), ancestor)]
        return None

    def largest_batch_bytes(self, loader: cst.BaseExpression) -> int | None:
        """The bytes of the largest batch of any DataLoader the expression `loader` may be
        (`loaders.sources`); None when one of them, or which they are, is not known."""
        batches = [self.loader_batch_bytes(source) for source in self.loaders.sources(loader, (), 0)]
        return max(batches) if batches and None not in batches else None

    def sync_every_step(self, loop: cst.CSTNode) -> cst.CSTNode | None:
        """A read of a device value to the host (`loss.item()`, `.tolist()`, `.cpu()`,
        `float(loss)`, a tensor formatted or printed: `f"{loss:.2f}"`, `print(loss)`) that
        `loop` makes on every pass, in its own body (under no `if`, nested loop or `try`) or,
        for the calls, in a function of the file it runs every step: the host waits there for
        all the step queued. None when there is none."""
        key = id(loop)
        if key not in self._syncs:
            self._syncs[key] = self._find_sync(loop)
        return self._syncs[key]

    def _find_sync(self, loop: cst.CSTNode) -> cst.CSTNode | None:
        if not isinstance(loop, (cst.For, cst.While)):
            return None  # a comprehension over batches
        for call in self.context.loops.reached_calls(loop.body):
            if not self._reads_to_host(call):
                continue
            inside = self.index.inside(call, loop)
            if (inside and self._every_pass(call, loop)) or (not inside and self.every_step(call, loop)):
                return call
        for part in self.index.find(cst.FormattedStringExpression, within=loop.body):
            if self._device_tensor(part.expression) and self._every_pass(part, loop):
                return part  # formatting a tensor reads it (`Tensor.__format__`)
        return None

    def _reads_to_host(self, call: cst.Call) -> bool:
        """Does `call` read a device value to the host: a sync method of a tensor (or of what
        may be one), `float`/`int` of a tensor, or `print` given a tensor?"""
        if method_name(call) in SYNC_METHODS:
            return self.kinds.fact(call.func.value).kind in (Kind.TENSOR, Kind.UNKNOWN)
        if self.names.of(call.func) & {*HOST_READ_BUILTINS, *LOGGING_CALLS}:
            return any(self._device_tensor(arg.value) for arg in call.args if not arg.keyword)
        return False

    def _device_tensor(self, expr: cst.BaseExpression) -> bool:
        """Is `expr` a tensor not known to be on the host (reading it waits for the device)?"""
        fact = self.kinds.fact(expr)
        return fact.kind is Kind.TENSOR and fact.place is not Place.HOST

    def overlap_buys_nothing(self, loader: cst.Call, copies) -> str | None:
        """Why letting the `copies` of `loader`'s batches overlap (pinned memory) buys nothing,
        as a reason states it: its batches are known and every loop that copies them waits for
        the device anyway or computes far longer than a copy takes (`copy_costs_nothing`); or,
        whatever their size, every copy runs only every few steps with the host waiting right
        after it (`rarely_waited`). None otherwise."""
        if not copies:
            return None
        size = self.loader_batch_bytes(loader)
        fed = [self.feeding_batch_bytes(copy) for copy in copies] if size is not None else []
        if fed and None not in fed:
            why = self.copy_costs_nothing(size, tuple(loop for each in fed for loop in each[1]))
            if why is not None:
                return why
        found = [self.rarely_waited(copy) for copy in copies]
        if not all(found):
            # a helper that copies the batches of several loaders (`calc_loss_batch`): the
            # loops over this loader's batches tell how often its copies run
            found = [self.rare_pass(loop) for loop in self._copying_loops(loader)]
            if not found or not all(found):
                return None
        syncs = dict.fromkeys(sync for _, sync in found)
        reads = " and ".join(f"`{self.context.source(sync)}` (line {self.context.line(sync)})" for sync in syncs)
        waits = (
            f"and the host then waits for the device at {reads} after each copy: pinned memory would let the copy "
            "overlap at most the launches of one batch"
        )
        guards = list(dict.fromkeys(where for where, _ in found if isinstance(where, cst.If)))
        passes = list(dict.fromkeys(where for where, _ in found if not isinstance(where, cst.If)))
        when = [f"when `{self.context.source(guard.test)}` holds (line {self.context.line(guard)})" for guard in guards]
        if passes:
            lines = ", ".join(str(self.context.line(loop)) for loop in passes)
            when.append(
                f"outside the step loops, in a loop that trains nothing (line{'s' if len(passes) > 1 else ''} {lines})"
            )
        often = (
            "every few steps"
            if not passes
            else "in a pass run once an epoch or after training"
            if not guards
            else "in passes that run now and then"
        )
        return f"its batches are copied only {' and '.join(when)}, {waits}, {often}"

    def _copying_loops(self, loader: cst.Call) -> list[cst.CSTNode]:
        """The loops `loader` feeds whose batches they (or the helpers they call) copy to a device."""
        loaders = self.loaders
        return [
            feed.loop
            for feed in loaders.feeds
            if feed.loader is loader and loaders.copies_to_device(feed.loop, feed.target)
        ]

    def copy_costs_nothing(self, size: int, loops: tuple[cst.CSTNode, ...]) -> str | None:
        """Why a blocking copy of a `size`-byte batch costs each of `loops` nothing measurable,
        as a reason states it: the batch is small and every loop reads a value to the host
        every step (`sync_every_step`), so it waits for the device there whatever the copy
        does; or every loop's known matrix products over its batch take more than
        `DWARFING_FACTOR` times what the copy can cost it (`copy_dwarfed`). None otherwise."""
        if size < MIN_COPY_BYTES:
            syncs = [self.sync_every_step(loop) for loop in loops]
            if all(syncs):
                return (
                    f"{small_copy(size)}, and the loop reads `{self.context.source(syncs[0])}` every step (line "
                    f"{self.context.line(syncs[0])}), so it waits for the device there whatever the copy does"
                )
        dwarfed = [self.copy_dwarfed(size, loop) for loop in loops]
        return dwarfed[0] if dwarfed and all(dwarfed) else None

    def copy_dwarfed(self, size: int, loop: cst.CSTNode) -> str | None:
        """Why a pass of `loop` is too long for a blocking copy of its `size`-byte batch to
        matter: the matrix products of the sized models it calls, over the rows each call is
        given (`_call_rows`; the products of unknown width, an attention's, left out), take
        more device time, even at the fastest rate a product runs, than `DWARFING_FACTOR`
        times the most a blocking copy costs the step (`blocking_copy_seconds`). None when
        they may not, when the step convolves (its products run over positions the batch
        does not show), or when `loop` is a comprehension."""
        if not isinstance(loop, (cst.For, cst.While)):
            return None  # a comprehension over batches: no step
        work = self.least_step_work(loop)
        if work is None or work.convolves:
            return None
        flops = 0
        for call, model in self._model_calls.get(id(loop), ()):
            rows = self._call_rows(call, model)
            flops += sum(2 * rows * k * n for k, n in model.known) if rows else 0
        took, cost = flops / HARDWARE["bf16_flops_per_s"], blocking_copy_seconds(size)
        if took < DWARFING_FACTOR * cost:
            return None
        return (
            f"the forward's matrix products alone take at least {took * 1e3:.1f} ms a step on the device (an A100's "
            f"bf16 tensor cores: {HARDWARE['bf16_flops_per_s'] / 1e12:.0f} TFLOPS), over {DWARFING_FACTOR} times the "
            f"{cost * 1e6:.0f} us a blocking copy of its {shown(size)} batch can cost it (the copy from pageable "
            "memory and the device idle while the host launches the first kernels after it)"
        )

    def rarely_waited(self, node: cst.CSTNode) -> tuple[cst.If | cst.For | cst.While, cst.CSTNode] | None:
        """(the periodic `if` or the evaluation loop, the read) when `node` runs only every few
        steps (behind a periodic test, `Periodic.sometimes`: an evaluation every N steps) or
        only outside the step loops (`TrainingLoops.outside_steps`: an accuracy pass after each
        epoch), and the host waits for the device every time right after it: the loop around
        `node` in its function (one that trains nothing: an evaluation loop) reads a device
        value on every pass, or, with no such loop, the body of that periodic `if` does
        whenever it runs. An overlap there would save at most the launches of one pass, in a
        pass that runs now and then. None otherwise."""
        guard = periodic(self.context).sometimes(node)
        if guard is None:  # then none guards its innermost loop either: an evaluation after each epoch?
            loops = self.index.enclosing_loops(node)
            return self.rare_pass(loops[0]) if loops else None
        loops = [loop for loop in self.index.enclosing_loops(node) if self.index.inside(loop, guard)]
        if loops or not self.index.inside(node, guard):
            loop = loops[0] if loops else next(iter(self.index.enclosing_loops(node)), None)
            if loop is None or self.context.loops.is_training_loop(loop):
                return None
            sync = self.sync_every_step(loop)
            return (guard, sync) if sync is not None else None
        for call in self.context.loops.reached_calls(guard.body):
            if (
                self._reads_to_host(call)
                and self.index.inside(call, guard)
                and self.index.before(node, call)
                and self._every_pass(call, guard)
            ):
                return guard, call
        return None

    def rare_pass(self, loop: cst.CSTNode) -> tuple[cst.If | cst.For | cst.While, cst.CSTNode] | None:
        """(the periodic `if`, or `loop` itself where it runs outside the step loops; the read)
        when `loop` is an evaluation's: it trains nothing, reads a device value on every pass
        (`sync_every_step`), and runs only every few steps (`Periodic.sometimes`) or only
        outside the step loops (`TrainingLoops.outside_steps`: after each epoch, after
        training). None otherwise."""
        if not isinstance(loop, (cst.For, cst.While)) or self.context.loops.is_training_loop(loop):
            return None
        sync = self.sync_every_step(loop)
        if sync is None:
            return None
        guard = periodic(self.context).sometimes(loop)
        if guard is not None:
            return guard, sync
        return (loop, sync) if self.context.loops.outside_steps(loop) else None

    def _every_pass(self, node: cst.CSTNode, owner: cst.CSTNode) -> bool:
        """Does `node` run whenever `owner` (a loop's pass, a function) runs on: under no `if`
        (but one whose other branch leaves `owner`: `if i < n: ... else: break`), nested loop,
        `try`, conditional expression or comprehension on the way?"""
        for ancestor in self.index.ancestors(node):
            if ancestor is owner:
                return True
            if isinstance(ancestor, cst.If) and self._other_branch_leaves(ancestor, node):
                continue
            if isinstance(
                ancestor,
                (cst.If, cst.For, cst.While, cst.Try, cst.IfExp, cst.BooleanOperation, cst.Lambda, cst.FunctionDef),
            ):
                return False
            if isinstance(ancestor, (cst.ListComp, cst.GeneratorExp, cst.SetComp, cst.DictComp)):
                return False
        return False

    def _other_branch_leaves(self, branch: cst.If, node: cst.CSTNode) -> bool:
        """Does the branch of `branch` that does not hold `node` end the pass's run for good:
        its last statement a `break` (of the loop right around the `if`, none between), a
        `return` or a `raise`? Then every pass that goes on runs the branch that holds it."""
        if branch.orelse is None or isinstance(branch.orelse, cst.If):
            return False  # no other branch, or an `elif` chain
        other = branch.orelse.body if self.index.inside(node, branch.body) else branch.body
        last = other.body[-1] if other.body else None
        if not isinstance(last, cst.SimpleStatementLine):
            return False
        return isinstance(last.body[-1], (cst.Break, cst.Return, cst.Raise))

    def every_step(self, node: cst.CSTNode, loop: cst.CSTNode | None = None) -> bool:
        """Does `node` run on every pass of a step loop (of `loop`, when given), in its body or
        in a function of this file the body calls, unconditionally all the way?"""
        for site in self.context.loops.runs_in(node):
            if loop is not None and site.loop is not loop:
                continue
            chain = [*site.calls, node]
            owners = [site.loop, *(self.index.first_enclosing(later, cst.FunctionDef) for later in chain[1:])]
            if all(owner is not None and self._every_pass(step, owner) for step, owner in zip(chain, owners)):
                return True
        return False

    # -- models ----------------------------------------------------------------------------

    def module(self, expr: cst.BaseExpression, depth: int = 0) -> ModuleSize | None:
        """The size of the module `expr` holds (the largest it may hold); None when any part
        of it cannot be sized."""
        if depth > MAX_DEPTH:
            return None
        values = self.values(expr, depth + 1)
        if not values:
            return None
        found = [self._built(v, depth + 1) for v in values]
        if any(f is None for f in found):
            return None
        return max(found, key=lambda size: size.state)

    def _built(self, value: cst.BaseExpression, depth: int) -> ModuleSize | None:
        if not isinstance(value, cst.Call):
            return None
        key = (id(value), *(id(call) for _, call in self._frames))
        if key not in self._modules:
            self._modules[key] = None  # a cycle while this runs: unknown
            self._modules[key] = self._construct(value, depth)
        return self._modules[key]

    def _construct(self, call: cst.Call, depth: int) -> ModuleSize | None:
        names = self.names.of(call.func)
        if names & NN_STATELESS:
            return EMPTY
        if names & MODULE_CONTAINERS:
            return self._container(call, depth)
        layer = next((n[len(TORCH_NN) :] for n in names if n.startswith(TORCH_NN)), None)
        if layer in NN_LAYER_ARGUMENTS:
            return self._layer(layer, call, depth)
        classdef = self.kinds.local_class(call.func) if isinstance(call.func, cst.Name) else None
        if classdef is not None:
            return self._constructed(classdef, call, depth)
        found = project_of(self.context).class_of(call.func)
        if found is None:
            return None
        module, classdef = found  # a class of the project's own modules, sized where it is defined
        elsewhere = sizes_of(module)
        told = elsewhere.told_by(classdef, call, self, depth)
        return elsewhere._class(classdef, depth) if told is None else elsewhere._constructed(classdef, told, depth)

    def _container(self, call: cst.Call, depth: int) -> ModuleSize | None:
        total = EMPTY
        for arg in call.args:
            if arg.keyword is not None:
                return None
            parts = [arg.value]
            if arg.star and isinstance(arg.value, cst.Call):
                part = self._returned_layers(arg.value, depth)
                if part is None:
                    return None
                total = total.plus(part)
                continue
            if arg.star or isinstance(arg.value, (cst.List, cst.Tuple)):
                inner = arg.value
                if isinstance(inner, (cst.ListComp, cst.GeneratorExp)):
                    part = self._repeated(inner, depth)
                    if part is None:
                        return None
                    total = total.plus(part)
                    continue
                if not isinstance(inner, (cst.List, cst.Tuple)):
                    return None
                if any(isinstance(e, cst.StarredElement) for e in inner.elements):
                    return None
                parts = [e.value for e in inner.elements]
            elif isinstance(arg.value, (cst.ListComp, cst.GeneratorExp)):
                part = self._repeated(arg.value, depth)
                if part is None:
                    return None
                total = total.plus(part)
                continue
            for part in parts:
                size = self.module(part, depth + 1)
                if size is None:
                    return None
                total = total.plus(size)
        return total

    def _returned_layers(self, call: cst.Call, depth: int) -> ModuleSize | None:
        """`*block(128, 256)`: the layers a function of this file returns in a list, the list
        it builds (`layers = [nn.Linear(i, o)]`) and everything `append` may add to it, sized
        with the function's parameters holding what `call` passes."""
        function = self.kinds.local_callee(call)
        returned = self.kinds.returned(function) if function is not None else []
        if len(returned) != 1 or not isinstance(returned[0], (cst.Name, cst.List)):
            return None
        held = returned[0]
        made = self.values(held, depth + 1) if isinstance(held, cst.Name) else [held]
        if not made or len(made) != 1 or not isinstance(made[0], cst.List):
            return None
        appended = self._appended(held) if isinstance(held, cst.Name) else []
        if appended is None or any(isinstance(e, cst.StarredElement) for e in made[0].elements):
            return None
        self._frames.append((function, call))
        try:
            total = EMPTY
            for layer in [*(e.value for e in made[0].elements), *appended]:
                size = self.module(layer, depth + 1)
                if size is None:
                    return None
                total = total.plus(size)
            return total
        finally:
            self._frames.pop()

    def _repeated(self, comprehension, depth: int) -> ModuleSize | None:
        """`[Block(d) for _ in range(n)]`: n blocks."""
        loop = comprehension.for_in
        if loop.inner_for_in is not None or loop.ifs or not isinstance(loop.iter, cst.Call):
            return None
        if not self.names.is_(loop.iter.func, "range", "builtins.range") or len(loop.iter.args) != 1:
            return None
        count = self.integer(loop.iter.args[0].value, depth + 1)
        size = self.module(comprehension.elt, depth + 1)
        if count is None or size is None:
            return None
        return EMPTY.plus(size, count)

    def _layer(self, layer: str, call: cst.Call, depth: int) -> ModuleSize | None:
        sized = _LAYER_SIZES.get(layer)
        given = _layer_arguments(call, NN_LAYER_ARGUMENTS[layer])
        if sized is None or given is None:
            return None
        return sized(_LayerArguments(self, layer, given, depth))

    def _constructed(self, classdef: cst.ClassDef, call: cst.Call | Told, depth: int) -> ModuleSize | None:
        """A class of this file built by `call`: its `__init__`'s parameters hold what `call`
        passes them (or their defaults) while its attributes are sized."""
        init = _method(classdef, "__init__")
        if init is None:
            return self._class(classdef, depth)
        self._frames.append((init, call))
        try:
            return self._class(classdef, depth)
        finally:
            self._frames.pop()

    def _dims(self, expr: cst.BaseExpression | None, depth: int, product: int = 0) -> int | None:
        """An integer argument; with `product` (the number of dimensions), a size given as an
        integer or a tuple of them (`kernel_size=3`, `(3, 3)`) as the elements it spans."""
        if expr is None:
            return None
        if product and isinstance(expr, (cst.Tuple, cst.List)):
            dims = [self.integer(e.value, depth + 1) for e in expr.elements]
            return None if any(d is None for d in dims) else math.prod(dims)
        value = self.integer(expr, depth + 1)
        if value is None or not product:
            return value
        return value**product

    def _class(self, classdef: cst.ClassDef, depth: int) -> ModuleSize | None:
        """A module class of this file: what its methods assign to `self.` attributes (layers,
        containers, modules of its other classes, `nn.Parameter`s, registered buffers)."""
        if depth > MAX_DEPTH:
            return None
        for base in classdef.bases:
            if not self.names.is_(base.value, "torch.nn.Module"):
                return None
        total = EMPTY
        for assign in self.index.find(cst.Assign, within=classdef):
            method = self.index.first_enclosing(assign, cst.FunctionDef)
            if method is None or not method.params.params:
                continue
            me = method.params.params[0].name.value
            for target in assign.targets:
                if not (
                    isinstance(target.target, cst.Attribute)
                    and isinstance(target.target.value, cst.Name)
                    and target.target.value.value == me
                ):
                    continue
                size = self._attribute(assign.value, depth)
                if size is None and isinstance(assign.value, cst.Name):
                    size = self._passed(classdef, method, assign.value, depth)
                if size is None:
                    return None
                total = total.plus(size)
        for call in self.index.find(cst.Call, within=classdef):
            if method_name(call) == "register_buffer":
                tensor = positional(call, 1) or kwarg(call, "tensor")
                shape = self.tensor(tensor.value, depth + 1) if tensor is not None else None
                if shape is None:
                    return None
                total = total._replace(state=total.state + math.prod(shape[0]))
            elif self.names.of(call.func) & (MATRIX_PRODUCTS - _SIZED_LAYERS) or (
                isinstance(call.func, cst.Attribute) and call.func.attr.value in MATRIX_PRODUCT_METHODS
            ):
                total = total._replace(unknown=True)
        if any(
            isinstance(b.operator, cst.MatrixMultiply) for b in self.index.find(cst.BinaryOperation, within=classdef)
        ):
            total = total._replace(unknown=True)
        return total

    def _passed_values(self, name: cst.Name) -> list[cst.BaseExpression] | None:
        """For a parameter of a function of this file: what every call of the function passes
        it (its default where a call passes nothing), as the training analysis follows them;
        None when one of them cannot be told (a call from elsewhere, `*args`, a class handed
        on to a factory or subclassed)."""
        bound = self.kinds.parameter_read(name)
        frame = next((call for function, call in reversed(self._frames) if bound and function is bound[0]), None)
        if isinstance(frame, Told):
            value = frame.values.get(bound[1].name.value, bound[1].default)  # not passed: its default
            return [value] if value is not None else None
        if frame is not None:  # a construction or a method's call (its `self` not passed), a function's
            value = passed_by(frame, bound[0], bound[1], 1 if self.kinds.class_of(bound[0]) is not None else 0)
            if value is not None:
                return [value]
        sources = self.context.kinds.value_sources(name)
        if not sources or any(source is None for source in sources):
            return None
        return sources

    def _passed(self, classdef: cst.ClassDef, method: cst.FunctionDef, name: cst.Name, depth: int):
        """`self.x = x` for a parameter `x` of `__init__`: the largest of what the constructions
        of the class in this file pass it (a number adds nothing, a module its size)."""
        passed = self._passed_values(name)
        if not passed:
            return None
        total = EMPTY
        for value in passed:
            size = EMPTY if self._scalar(value, depth + 1) else self._attribute(value, depth + 1)
            if size is None:
                return None
            total = max(total, size, key=lambda s: s.state)
        return total

    def _attribute(self, value: cst.BaseExpression, depth: int) -> ModuleSize | None:
        """What one `self.x = value` adds to its module: a module's size, a parameter's
        elements, nothing for a plain value (a number, a string, a tensor that is no parameter)."""
        if isinstance(value, (cst.Integer, cst.Float, cst.SimpleString, cst.FormattedString, cst.Tuple, cst.Dict)):
            return EMPTY
        if isinstance(value, cst.Name) and value.value in ("True", "False", "None"):
            return EMPTY
        if isinstance(value, cst.Call) and self.names.is_(
            value.func, "torch.nn.Parameter", "torch.nn.parameter.Parameter"
        ):
            data = positional(value, 0) or kwarg(value, "data")
            shape = self.tensor(data.value, depth + 1) if data is not None else None
            if shape is None:
                return None
            count = math.prod(shape[0])
            return ModuleSize(count, count, ())
        fact = self.kinds.fact(value)
        if fact.kind is Kind.MODULE or isinstance(value, cst.Call) and self._might_be_module(value):
            return self.module(value, depth + 1)
        if fact.kind in (Kind.TENSOR, Kind.DEVICE):
            return EMPTY  # a tensor attribute that is no parameter or buffer is not saved
        if isinstance(value, (cst.Name, cst.Attribute, cst.BinaryOperation)) and self.integer(value) is not None:
            return EMPTY
        return None

    def _might_be_module(self, call: cst.Call) -> bool:
        names = self.names.of(call.func)
        return any(n.startswith(TORCH_NN) for n in names) or (
            isinstance(call.func, cst.Name) and self.kinds.local_class(call.func) is not None
        )

    # -- checkpoints -----------------------------------------------------------------------

    def saved(self, obj: cst.BaseExpression) -> tuple[int, bool] | None:
        """(`saved_bytes`, whether an optimizer's state is among what it counts)."""
        self._optimizer_counted = False
        size = self.saved_bytes(obj)
        return (size, self._optimizer_counted) if size is not None else None

    def saved_bytes(self, obj: cst.BaseExpression, depth: int = 0) -> int | None:
        """The bytes `torch.save(obj, ...)` writes, where `obj` is a module's `state_dict()`, a
        module, an optimizer's `state_dict()` (one of `OPTIMIZER_STATES` over modules of known size), or
        a dict literal of those and of plain numbers and strings."""
        if depth > MAX_DEPTH:
            return None
        if isinstance(obj, (cst.Integer, cst.Float, cst.SimpleString, cst.FormattedString)):
            return 0
        if isinstance(obj, cst.Dict):
            total = 0
            for element in obj.elements:
                if not isinstance(element, cst.DictElement):
                    return None
                part = self.saved_bytes(element.value, depth + 1)
                if part is None:
                    return None
                total += part
            return total
        if isinstance(obj, cst.Call) and method_name(obj) == "state_dict" and not obj.args:
            owner = obj.func.value
            built = self.values(owner, depth + 1)
            if built and all(
                isinstance(b, cst.Call) and self.names.startswith(b.func, ("torch.optim",)) for b in built
            ):
                self._optimizer_counted = True
                return self._optimizer_bytes(owner, depth)
            size = self.module(owner, depth + 1)
            return size.state_bytes if size is not None else None
        if isinstance(obj, (cst.Name, cst.Attribute)):
            if self._scalar(obj, depth + 1):
                return 0
            if self._is_module_value(obj):
                size = self.module(obj, depth + 1)
                return size.state_bytes if size is not None else None
            values = self.values(obj, depth + 1)
            if not values or any(v is obj for v in values):
                return None
            found = [self.saved_bytes(v, depth + 1) for v in values]
            return None if any(f is None for f in found) else max(found)
        return None

    def _scalar(self, expr: cst.BaseExpression, depth: int = 0) -> bool:
        """A number or a string (a loop counter, a literal, a parameter every call passes one
        to): nothing a checkpoint's size is made of."""
        if depth > MAX_DEPTH:
            return False
        if isinstance(expr, (cst.Integer, cst.Float, cst.SimpleString, cst.FormattedString)):
            return True
        if isinstance(expr, cst.BinaryOperation):
            return self._scalar(expr.left, depth + 1) and self._scalar(expr.right, depth + 1)
        if isinstance(expr, cst.Attribute) and self.kinds.instance_class(expr.value) is not None:
            return self._scalar_field(expr, depth) or self.integer(expr) is not None
        if isinstance(expr, cst.Subscript) and _string_key(expr) is not None:
            # `cfg["drop_rate"]`: the entry of every dict literal `cfg` may hold
            owners = self._dicts(expr.value, depth + 1)
            entries = [dict_entry(owner, _string_key(expr)) for owner in owners or ()]
            return bool(entries) and all(e is not None and self._scalar(e, depth + 1) for e in entries)
        if not isinstance(expr, cst.Name):
            return self.integer(expr) is not None
        bindings = self.context.bindings
        if self.kinds.parameter_read(expr) is not None:
            passed = self._passed_values(expr)
            return bool(passed) and all(self._scalar(v, depth + 1) for v in passed)
        assignments = bindings.assignments(expr)
        if not assignments:
            return False
        for assignment in assignments:
            statement = bindings.statement(assignment.node)
            if (
                isinstance(statement, cst.For)
                and statement.target is assignment.node
                and isinstance(statement.iter, cst.Call)
                and self.names.is_(statement.iter.func, "range", "builtins.range")
            ):
                continue  # a counter
            value = bindings.assigned_value(assignment)
            if value is None or not self._scalar(value, depth + 1):
                return False
        return True

    def _scalar_field(self, field: cst.Attribute, depth: int) -> bool:
        """`self.global_step` of a class of this file: every assignment of the attribute in
        its methods (`= 0`, `+= 1`) gives a number or a string, and there is one."""
        classdef = self.kinds.instance_class(field.value)
        values = []
        for statement in self.index.find((cst.Assign, cst.AugAssign, cst.AnnAssign), within=classdef):
            targets = [t.target for t in statement.targets] if isinstance(statement, cst.Assign) else [statement.target]
            for target in targets:
                if isinstance(target, (cst.Tuple, cst.List)) and any(
                    isinstance(e.value, cst.Attribute) and e.value.attr.value == field.attr.value
                    for e in target.elements
                ):
                    return False  # unpacked from something
                if (
                    isinstance(target, cst.Attribute)
                    and target.attr.value == field.attr.value
                    and is_self(target.value)
                ):
                    values.append(statement.value)
        return bool(values) and all(v is not None and self._scalar(v, depth + 1) for v in values)

    def _optimizer_bytes(self, optimizer: cst.BaseExpression, depth: int) -> int | None:
        """The bytes of an optimizer's `state_dict()`: the tensors of each parameter's shape it
        keeps (`OPTIMIZER_STATES`: Adam's two moments, SGD's momentum buffer when it has momentum)
        over the parameters of the modules it trains."""
        values = self.values(optimizer, depth + 1)
        if not values or len(values) != 1 or not isinstance(values[0], cst.Call):
            return None
        build = values[0]
        spec = next((OPTIMIZER_STATES[n] for n in self.names.of(build.func) if n in OPTIMIZER_STATES), None)
        if spec is None:
            return None
        always, optional = spec
        states = always + sum(self._optimizer_option_on(build, option) for option in optional)
        params = kwarg(build, "params") or positional(build, 0)
        models = self.context.training.parameter_models(params.value) if params is not None else None
        if not models:
            return None
        sizes = [self.module(model, depth + 1) for model in models]
        if any(s is None for s in sizes):
            return None
        return states * sum(s.parameters for s in sizes) * FLOAT32_BYTES

    def _optimizer_option_on(self, build: cst.Call, option: str) -> bool:
        """Whether an optimizer's keyword that adds a state (`momentum`, `amsgrad`) may be on:
        off only where it is not given or is given as a literal 0 or False (an upper bound)."""
        given = kwarg(build, option)
        if given is None:
            return False
        value = given.value
        return not (number_value(value) == 0 or isinstance(value, cst.Name) and value.value == "False")

    def step_products(self, loop: cst.CSTNode) -> tuple[tuple[int, int], ...] | None:
        """(k, n) of every float32 matrix product a pass of `loop` makes through the models it
        calls (and the functions of this file it calls); None when it may make one of unknown
        width: a `@`, `torch.matmul`, a model perfmod cannot size, a model handed to code
        perfmod does not see."""
        work = self.step_work(loop)
        return work.products if work is not None else None

    def step_matmul_products(self, loop: cst.CSTNode) -> tuple[tuple[int, int], ...] | None:
        """`step_products` but those of cuDNN's recurrent layers, which run in TF32 already:
        the products the float32 matmul precision (TF32) governs."""
        work = self.step_work(loop)
        return work.matmul_products if work is not None else None

    def step_work(self, loop: cst.CSTNode) -> ModuleSize | None:
        """What the models a pass of `loop` runs hold, summed: their parameters, the (k, n) of
        every float32 matrix product they make and whether they convolve; None where
        `step_products` is."""
        work = self.least_step_work(loop)
        return None if work is None or work.unknown else work

    def least_step_work(self, loop: cst.CSTNode) -> ModuleSize | None:
        """`step_work` where the step may also multiply matrices of unknown width (an attention's
        `q @ k.transpose(-2, -1)`): then `unknown`, its `known` products a lower bound of the
        step's arithmetic. None when the step calls no model of known size."""
        key = id(loop)
        if key not in self._steps:
            self._steps[key] = self._step_work(loop)
        return self._steps[key]

    def step_rows(self, loop: cst.CSTNode) -> int | None:
        """The most rows a matrix product of a pass of `loop` runs over, from the largest batch
        its models are called on (`step_work`): every id of a batch of indices, which
        embeddings turn into rows; for a float batch, its leading dims, or, where a dim of the
        batch is the input width of one of the called model's products, its elements over that
        width when that is more (the model moves those features last: spectrogram frames
        transposed to rows). An estimate, not a bound: a model that repeats its input runs
        more. None when the step convolves (its products run over positions the batch does not
        show), or its models or a tensor they are given cannot be sized."""
        work = self.step_work(loop)
        if work is None or work.convolves or not work.products:
            return None
        found = [self._call_rows(call, size) for call, size in self._model_calls.get(id(loop), ())]
        return max(found) if found and None not in found and any(found) else None

    def _call_rows(self, call: cst.Call, model: ModuleSize) -> int | None:
        """The rows of the largest tensor a model call is given, 0 for a method of the model
        given none (`model.no_sync()`); None when one of its arguments may be a tensor of
        unknown shape (numbers, strings, None and booleans are no tensors), or the model is
        called on no tensor (what it runs over is made inside)."""
        widths = {k for k, _ in model.known}
        found = []
        for arg in call.args:
            if isinstance(arg.value, (cst.SimpleString, cst.FormattedString, cst.ConcatenatedString)):
                continue
            if isinstance(arg.value, cst.Name) and arg.value.value in ("None", "True", "False"):
                continue
            tensor = None if arg.star else self._tensor(arg.value, 0)
            if tensor is None:
                return None
            shape, element = tensor
            if not element:
                continue  # a Python number
            if values_of(self.context).dtype(arg.value) == FLOAT or element in FLOAT_ELEMENT_BYTES:
                moved_last = [math.prod(shape) // dim for dim in shape[:-1] if dim in widths]
                found.append(max([math.prod(shape[:-1]), *moved_last]))
            else:
                found.append(math.prod(shape))
        if found:
            return max(found)
        method = method_name(call)
        return 0 if method is not None and method != "forward" else None

    def _step_work(self, loop: cst.CSTNode) -> ModuleSize | None:
        """The matrix products of one step of `loop`: those of the models of known size it
        calls, `unknown` where it may multiply matrices otherwise; None when it calls none."""
        steps, training = self.context.loops, self.context.training
        total = EMPTY._replace(unknown=self._multiplies_by_operator(loop.body))
        ran = False  # a model of known size is called
        for call in steps.reached_calls(loop.body):
            if self._calls_matrix_product(call):
                total = total._replace(unknown=True)
                continue
            if steps.callee(call) is not None:
                continue  # a function of this file: its calls are among those reached
            if isinstance(call.func, cst.Attribute) and call.func.attr.value in MODULE_METHODS:
                continue
            if self._may_multiply_unseen(call):
                total = total._replace(unknown=True)
                continue
            if self._multiplies_no_matrices(call):
                continue
            func = call.func
            model = func
            if isinstance(func, cst.Attribute) and training.is_model(func.value) and self.module(func) is None:
                model = func.value  # a method of the model (`model.no_sync()`), not a submodule (`self.net(x)`)
            if self._loss_module(model):
                continue  # `criterion(output, target)`: torch's losses multiply no matrices
            size = self.module(model) if isinstance(model, (cst.Name, cst.Attribute)) else None
            if size is not None:
                total = total.plus(size)
                ran = True
                self._model_calls.setdefault(id(loop), []).append((call, size))
            elif self._runs_unsized_model(call, model):
                total = total._replace(unknown=True)
        return total if ran else None

    def _multiplies_by_operator(self, body: cst.CSTNode) -> bool:
        """Does `body`, or a function of this file it reaches, multiply with `@`?"""
        regions = [body, *(function.body for function in self.context.loops.functions_reached(body))]
        return any(
            isinstance(b.operator, cst.MatrixMultiply)
            for region in regions
            for b in self.index.find(cst.BinaryOperation, within=region)
        )

    def _calls_matrix_product(self, call: cst.Call) -> bool:
        func = call.func
        return bool(self.names.of(func) & MATRIX_PRODUCTS) or (
            isinstance(func, cst.Attribute) and func.attr.value in MATRIX_PRODUCT_METHODS
        )

    def _may_multiply_unseen(self, call: cst.Call) -> bool:
        """Is `call` a function that may multiply matrices perfmod does not size: one listed so,
        or a function of another library?"""
        qualified = self.names.of(call.func)
        if qualified & UNLISTED_PRODUCTS or any(n.startswith(UNLISTED_PRODUCT_PREFIXES) for n in qualified):
            return True
        return bool(qualified) and not _torch_or_host(qualified) and self.kinds.local_class(call.func) is None

    def _multiplies_no_matrices(self, call: cst.Call) -> bool:
        """Is `call` one of torch's functions (its products returned before) or Python's own,
        rather than a `torch.nn` module class?"""
        qualified = self.names.of(call.func)
        return _torch_or_host(qualified) and not any(
            n.startswith("torch.nn.") and not n.startswith("torch.nn.functional.") for n in qualified
        )

    def _runs_unsized_model(self, call: cst.Call, model: cst.BaseExpression) -> bool:
        """Is `model`, called by `call`, or a model `call` is given, one perfmod cannot size?"""
        training = self.context.training
        if training.is_model(model) or self.kinds.fact(model).kind is Kind.MODULE:
            return True
        return any(training.is_model(arg.value) for arg in call.args)  # run by code perfmod does not read

    def _loss_module(self, expr: cst.BaseExpression) -> bool:
        if not isinstance(expr, (cst.Name, cst.Attribute)):
            return False
        values = self.values(expr)
        return bool(values) and all(
            isinstance(v, cst.Call) and any(_is_loss(n) for n in self.names.of(v.func)) for v in values
        )

    def trained_modules(self, optimizers) -> list[ModuleSize] | None:
        """The sizes of the modules the optimizers (`OptimizerBuild`s of a training loop) train;
        None when one cannot be sized or an optimizer's parameters cannot be followed."""
        found: list[ModuleSize] = []
        for optimizer in optimizers:
            params = optimizer.params
            models = self.context.training.parameter_models(params) if params is not None else None
            if not models:
                return None
            for model in models:
                size = self.module(model)
                if size is None:
                    return None
                found.append(size)
        return found or None


class _Missing:
    pass


@dataclass
class Told:
    """What a construction in another module passes the parameters of a class's `__init__`,
    by name, each as a literal (`Sizes.told`) or None where it cannot be told; a parameter
    it does not pass holds its default."""

    values: dict[str, cst.BaseExpression | None]


def _string_key(expr: cst.Subscript) -> str | None:
    """The key of `cfg["key"]`."""
    if len(expr.slice) != 1 or not isinstance(expr.slice[0].slice, cst.Index):
        return None
    key = expr.slice[0].slice.value
    return key.evaluated_value if isinstance(key, cst.SimpleString) else None


def _terms(expr: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The terms a sum adds: `i + n + 1` is [i, n, 1]."""
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Add):
        return [*_terms(expr.left), *_terms(expr.right)]
    return [expr]


def _window(lower: cst.BaseExpression, upper: cst.BaseExpression) -> int | None:
    """`upper - lower` where both are one expression plus literal integers (`i`, `i + 48`)."""
    (base, low), (top, high) = _offset(lower), _offset(upper)
    return high - low if base is not None and top is not None and base.deep_equals(top) else None


def _offset(expr: cst.BaseExpression) -> tuple[cst.BaseExpression | None, int]:
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Add):
        right = integer_value(expr.right)
        if right is not None:
            return expr.left, right
    return (expr, 0) if integer_value(expr) is None else (None, 0)


def _nesting(data: cst.BaseExpression, kinds: set[type]) -> tuple[int, ...] | None:
    """The shape of numbers written out in nested lists or tuples, one length per level,
    adding the kind of each number (int, float, bool) to `kinds`; None for anything else."""
    if isinstance(data, cst.UnaryOperation) and isinstance(data.operator, (cst.Minus, cst.Plus)):
        data = data.expression
    if isinstance(data, cst.Name) and data.value in ("True", "False"):
        kinds.add(bool)
        return ()
    number = number_value(data) if isinstance(data, (cst.Integer, cst.Float)) else None
    if number is not None:
        kinds.add(type(number))
        return ()
    if not isinstance(data, (cst.List, cst.Tuple)) or any(isinstance(e, cst.StarredElement) for e in data.elements):
        return None
    inner = {_nesting(element.value, kinds) for element in data.elements}
    if len(inner) > 1 or None in inner:
        return None
    return (len(data.elements), *(inner.pop() if inner else ()))


def _widest_item(items: list[Item | None]) -> Item | None:
    """One item no smaller where each of `items` holds a tensor, all laid out alike; None otherwise."""
    if not items or None in items or len({tuple(where for where, _ in item) for item in items}) != 1:
        return None
    merged = [_widest([item[index][1] for item in items]) for index in range(len(items[0]))]
    return None if None in merged else tuple((where, tensor) for (where, _), tensor in zip(items[0], merged))


def _widest(tensors: list[Tensor]) -> Tensor | None:
    """One tensor no smaller in any dim than each of `tensors` (of one rank); None otherwise."""
    if not tensors or len({len(shape) for shape, _ in tensors}) != 1:
        return None
    return tuple(max(dims) for dims in zip(*(shape for shape, _ in tensors))), max(e for _, e in tensors)


def _path_to(target: cst.CSTNode, node: cst.CSTNode) -> tuple[int, ...] | None:
    """Where `node` sits in the (nested) tuple or list `target` binds: () for `target` itself."""
    if target is node:
        return ()
    if isinstance(target, (cst.Tuple, cst.List)) and not any(
        isinstance(e, cst.StarredElement) for e in target.elements
    ):
        for index, element in enumerate(target.elements):
            inner = _path_to(element.value, node)
            if inner is not None:
                return (index, *inner)
    return None


def _method(classdef: cst.ClassDef, name: str) -> cst.FunctionDef | None:
    return next(
        (s for s in classdef.body.body if isinstance(s, cst.FunctionDef) and s.name.value == name),
        None,
    )


def _is_loss(name: str) -> bool:
    return name.startswith("torch.nn.") and name.endswith("Loss")


def _same_name(expr: cst.BaseExpression, name: cst.BaseExpression) -> bool:
    return isinstance(expr, cst.Name) and isinstance(name, cst.Name) and expr.value == name.value


def _is_ellipsis(expr: cst.BaseExpression) -> bool:
    return isinstance(expr, cst.Ellipsis)


def _is_none_or_ellipsis(expr: cst.BaseExpression) -> bool:
    return _is_ellipsis(expr) or isinstance(expr, cst.Name) and expr.value == "None"


def _literal_bool(expr: cst.BaseExpression) -> bool | None:
    if isinstance(expr, cst.Name) and expr.value in ("True", "False"):
        return expr.value == "True"
    return None


def _torch_or_host(qualified: set[str]) -> bool:
    """Does a call of these names run torch, perfmod's runtime without products, Python's
    host-only modules or a loss?"""
    prefixes = ("torch.", *RUNTIME_WITHOUT_PRODUCT_PREFIXES, *(m + "." for m in HOST_ONLY_MODULES))
    return any(n.startswith(prefixes) or n in RUNTIME_WITHOUT_PRODUCTS or _is_loss(n) for n in qualified)


def _listed(plain: list[cst.BaseExpression]) -> list[cst.BaseExpression]:
    """The sizes or dims of a call given them one by one (`view(B, T)`) or as one tuple or list."""
    if len(plain) == 1 and isinstance(plain[0], (cst.Tuple, cst.List)):
        return [e.value for e in plain[0].elements]
    return plain


def _transposed(tensor: tuple[tuple[int, ...], int], first: int, second: int):
    shape, element = tensor
    if not (-len(shape) <= first < len(shape) and -len(shape) <= second < len(shape)):
        return None
    dims = list(shape)
    dims[first], dims[second] = dims[second], dims[first]
    return tuple(dims), element


@dataclass
class _LayerArguments:
    """The arguments a `torch.nn` layer is built with, read by name over the layer's defaults."""

    sizes: Sizes
    layer: str
    given: dict[str, cst.BaseExpression]
    depth: int

    def number(self, name: str) -> int | None:
        if name not in self.given:
            default = dict(NN_LAYER_ARGUMENTS[self.layer])[name]
            return default if isinstance(default, int) and not isinstance(default, bool) else None
        return self.sizes._dims(self.given[name], self.depth)

    def flag(self, name: str) -> bool | None:
        value = self.given.get(name)
        if value is None:
            return dict(NN_LAYER_ARGUMENTS[self.layer])[name]
        literal = _literal_bool(value)
        return literal if literal is not None else _literal_bool(self.sizes.loaders.setting(value, 0))

    def elements(self, name: str, product: int) -> int | None:
        """A size given as an integer or one per dim (`kernel_size=3`, `(3, 3)`): the elements it spans."""
        return self.sizes._dims(self.given.get(name), self.depth, product=product)


def _layer_arguments(call: cst.Call, spec) -> dict[str, cst.BaseExpression] | None:
    """The arguments of a layer's construction by parameter name; None for `*args`, `**kwargs`
    or more positional arguments than the layer takes."""
    if any(a.star for a in call.args):
        return None
    given: dict[str, cst.BaseExpression] = {}
    for position, arg in enumerate(call.args):
        if arg.keyword is not None:
            given[arg.keyword.value] = arg.value
        elif position < len(spec):
            given[spec[position][0]] = arg.value
        else:
            return None
    return given


def _linear_size(args: _LayerArguments) -> ModuleSize | None:
    k, n, bias = args.number("in_features"), args.number("out_features"), args.flag("bias")
    if k is None or n is None or bias is None:
        return None
    count = k * n + (n if bias else 0)
    return ModuleSize(count, count, ((k, n),))


def _convolution_size(args: _LayerArguments) -> ModuleSize | None:
    c_in, c_out, groups = args.number("in_channels"), args.number("out_channels"), args.number("groups")
    bias = args.flag("bias")
    kernel = args.elements("kernel_size", product=int(args.layer[-2]))
    if None in (c_in, c_out, groups, bias, kernel) or groups == 0:
        return None
    count = c_in // groups * c_out * kernel + (c_out if bias else 0)
    return ModuleSize(count, count, (), True)  # convolutions: cuDNN uses TF32 for them already


def _embedding_size(args: _LayerArguments) -> ModuleSize | None:
    rows, dim = args.number("num_embeddings"), args.number("embedding_dim")
    return None if rows is None or dim is None else ModuleSize(rows * dim, rows * dim, ())


def _layer_norm_size(args: _LayerArguments) -> ModuleSize | None:
    shape = args.elements("normalized_shape", product=1)
    affine, bias = args.flag("elementwise_affine"), args.flag("bias")
    if shape is None or affine is None or bias is None:
        return None
    count = shape * (int(affine) + int(affine and bias))
    return ModuleSize(count, count, ())


def _group_norm_size(args: _LayerArguments) -> ModuleSize | None:
    channels, affine = args.number("num_channels"), args.flag("affine")
    if channels is None or affine is None:
        return None
    return ModuleSize(2 * channels * affine, 2 * channels * affine, ())


def _batch_norm_size(args: _LayerArguments) -> ModuleSize | None:
    """BatchNorm and InstanceNorm: a weight and a bias when affine, running statistics when tracked."""
    features, affine, tracked = args.number("num_features"), args.flag("affine"), args.flag("track_running_stats")
    if features is None or affine is None or tracked is None:
        return None
    count = 2 * features * affine
    return ModuleSize(count, count + (2 * features + 1) * tracked, ())


def _recurrent_size(args: _LayerArguments) -> ModuleSize | None:
    size, hidden, layers = args.number("input_size"), args.number("hidden_size"), args.number("num_layers")
    bias, both = args.flag("bias"), args.flag("bidirectional")
    if None in (size, hidden, layers, bias, both):
        return None
    gates, directions = RNN_GATES[args.layer] * hidden, 2 if both else 1
    count, products = 0, []
    for index in range(layers):
        width = size if index == 0 else hidden * directions
        count += directions * (gates * width + gates * hidden + 2 * gates * bias)
        products += [(width, gates), (hidden, gates)]
    return ModuleSize(count, count, tuple(products), recurrent=tuple(products))


_MISSING = _Missing()
# What each reshaping tensor method makes of its receiver's (shape, element bytes).
_RESHAPES = {
    "view": Sizes._viewed,
    "reshape": Sizes._viewed,
    "unsqueeze": Sizes._unsqueezed,
    "flatten": Sizes._flattened,
    "t": Sizes._matrix_transposed,
    "transpose": Sizes._dims_swapped,
    "swapaxes": Sizes._dims_swapped,
    "swapdims": Sizes._dims_swapped,
    "permute": Sizes._permuted,
}
# How many parameters and buffers each sized `torch.nn` layer holds, from its arguments.
_LAYER_SIZES = {
    "Linear": _linear_size,
    "Embedding": _embedding_size,
    "EmbeddingBag": _embedding_size,
    "LayerNorm": _layer_norm_size,
    "GroupNorm": _group_norm_size,
    **{name: _convolution_size for name in NN_LAYER_ARGUMENTS if name.startswith("Conv")},
    **{name: _batch_norm_size for name in NN_LAYER_ARGUMENTS if name.startswith(("BatchNorm", "InstanceNorm"))},
    **dict.fromkeys(RNN_GATES, _recurrent_size),
}
_SIZED_LAYERS = frozenset(f"torch.nn.{name}" for name in NN_LAYER_ARGUMENTS)
