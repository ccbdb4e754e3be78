"""What perfmod knows about torch, in one place: names of factories, tensor
methods, dtypes, losses and their reductions, autocast and scaler spellings,
savers. In four parts:

- torch, as views of the tables in `torch_ops`: its operations, a tensor's
  attributes, a module's methods, dtypes, module containers and wrappers,
  autocast, grad modes, scalers, a process's device and rank queries, its
  settings;
- torch's other objects (datasets, loaders, optimizers, schedulers), as views
  of their tables in `torch_ops`, and what is written here: its namespaces and
  keywords, and the choices of the analyses among its names;
- not torch, plain tables: Python's builtins and standard library, Python's
  random and numpy, tokenizers, torchvision, the training libraries
  (Accelerate, Lightning, Hugging Face), perfmod's runtime;
- torch's and other libraries' names together: lists that mix them, and the
  unions of the tables above.

Rules and analyses look facts up here instead of keeping their own copies.
Names are qualified (aliases resolved): `F.cross_entropy` is
`torch.nn.functional.cross_entropy`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import NamedTuple

import libcst as cst

from codemod.analysis.names import ANY_ATTRIBUTE
from codemod.analysis.torch_ops import (
    DATA,
    DEFAULT_TENSOR_TYPES,
    DTYPES,
    FUNCTIONAL,
    IMPLEMENTATION_KEYWORDS,
    KEPT,
    LAUNCH_FUSED_DEVICES,
    LOADERS,
    LR_KEYS,
    NN_MODULE_METHODS,
    OPS,
    OPTIMIZERS,
    SIZED_LAYERS,
    Category,
    DataFunction,
    Loss,
    Placement,
    Shape,
    attributes,
    data_functions,
    datasets,
    functions,
    methods,
    module_methods,
    schedulers,
    short,
)

# ==========================================================================================
# torch: views of the tables in torch_ops (its operations, attributes, modules' methods, dtypes)
# ==========================================================================================

# -- tensors -------------------------------------------------------------------------------

# Functions that make a tensor where they are told (`device=`, else the default device), and
# those whose tensor is in the host's memory (a numpy array's, a buffer's).
TENSOR_FACTORIES = functions(Category.FACTORY, placement=Placement.TOLD)
HOST_ONLY_FACTORIES = functions(placement=Placement.HOST)
# torch functions that compute a new tensor where their tensor arguments are.
TENSOR_FUNCTIONS = functions(placement=Placement.OPERANDS, module=False, in_place=False)
# Tensor methods whose result is one tensor where the receiver is (`x.float()`, `x.view(...)`).
_PIECES = methods(shape=Shape.SPLIT) | methods(shape=Shape.SLICES)  # a tuple of tensors
SAME_PLACE_METHODS = methods(placement=Placement.OPERANDS, in_place=False) - _PIECES
TENSOR_ATTRIBUTES = attributes(dtype=KEPT)  # tensors of the receiver's dtype, where it is (`x.T`, `x.grad`)
# Tensor methods that move a tensor (`to`, `cuda`, `cpu`, `pin_memory`), and those and the
# ones that write its storage whole (`copy_`, `set_`).
MOVE_METHODS = methods(placement=Placement.TOLD) | methods(placement=Placement.HOST)
MOVING_METHODS = MOVE_METHODS | methods(Category.MEMORY, in_place=True)
# Tensor methods whose result is not a tensor where the receiver is (a move, a Python value, a
# size, storage, the backward pass). Every other method of a tensor, the table's or not
# (`chunk`, `new_zeros`), gives tensors on the receiver's device; those named `is_*` answer a question.
NOT_SAME_PLACE_METHODS = MOVE_METHODS | methods(placement=Placement.NO_TENSOR)
# torch functions that compute no tensor where their arguments are: process settings and
# reads of them, torch's types, checkpoints saved and loaded, grad modes and autocast, a
# tensor's metadata and values read to the host, and the compiler.
NOT_TENSOR_FUNCTIONS = functions(
    Category.SETTING,
    Category.TYPES,
    Category.SAVE,
    Category.LOAD,
    Category.GRAD_MODE,
    Category.AUTOCAST,
    Category.METADATA,
    Category.TO_HOST,
) | functions(Category.WRAPPER, compiles=True)
SIZE_METHODS = methods(measures=True)  # tensor methods that give a size, never negative
# torch's dtypes by their names (`float32`, `float`) and by what they are.
DTYPE_NAMES = frozenset(name for dtype in DTYPES for name in dtype.names)


def _dtype_names(*dtypes) -> frozenset[str]:
    return frozenset(f"torch.{name}" for dtype in dtypes for name in dtype.names)


FLOAT_DTYPES = _dtype_names(*(d for d in DTYPES if d.kind == "float"))
COMPLEX_DTYPES = _dtype_names(*(d for d in DTYPES if d.kind == "complex"))
HALF_NAMES = _dtype_names(*(d for d in DTYPES if d.kind == "float" and d.bytes == 2))  # 16-bit floating point
FLOAT16_NAMES = _dtype_names(*(d for d in DTYPES if d.name == "float16"))  # the dtype a GradScaler is for
FLOAT64_NAMES = _dtype_names(*(d for d in DTYPES if d.name == "float64"))
INT64_DTYPES = _dtype_names(*(d for d in DTYPES if d.name == "int64"))
# Bytes of one element of each dtype; a tensor made without `dtype=` holds float32 (int64 for
# `randint`, `arange` of integers and `LongTensor`).
DTYPE_BYTES = {f"torch.{name}": dtype.bytes for dtype in DTYPES for name in dtype.names}
# The dtype each casting method gives (`x.long()`); the other casts keep the dtype or name it.
CAST_METHOD_DTYPES = {dtype.cast: f"torch.{dtype.name}" for dtype in DTYPES if dtype.cast is not None}

# -- datasets and loaders ------------------------------------------------------------------

# What a `__getitem__` may call and still only index memory it holds: tensor methods that
# read a size or view or convert the indexed rows where they are (no computation over them),
# with the builtins of index arithmetic and the draws of a random index (INDEX_BUILTINS, INDEX_DRAWS).
INDEXING_METHODS = (
    methods(Category.VIEW, Category.CAST, placement=Placement.OPERANDS, in_place=False)
    | methods(Category.METADATA)
    | methods(Category.TO_HOST, syncs=True)
)
# torch's functions that make a new tensor of the data or sizes they are given, drawing
# nothing (`torch.tensor(row)`, `torch.ones(n)`): in a `__getitem__`, making it costs about
# what sending it back from a worker process would.
ITEM_FACTORIES = functions(Category.FACTORY, random=False)

# -- training ------------------------------------------------------------------------------

# torch's autocast context managers and gradient scalers, and the calls that clip the gradients.
AUTOCAST_NAMES = functions(Category.AUTOCAST)
GRAD_SCALER_NAMES = functions(Category.GRAD_SCALER)
CLIP_NAMES = functions(clips=True)
# Module methods that add a hook to every call of the module's forward.
FORWARD_HOOK_REGISTRATIONS = tuple(sorted(module_methods(hook="forward")))
# Every hook registration of a module.
HOOK_REGISTRATIONS = module_methods(hook="forward") | module_methods(hook="backward")
# Calls that wrap a model and run its forward: `DDP(model)(x)` runs `model`'s.
MODEL_WRAPPERS = functions(Category.WRAPPER)
# What compiles a model with TorchDynamo (`torch.compile(m)`; `m.compile()` is a module method).
TORCH_COMPILERS = functions(Category.WRAPPER, compiles=True)
# In-place tensor methods that reset a `.grad` by hand (those that may write zeros, and the
# detach torch's own `zero_grad(set_to_none=False)` does first).
GRAD_ZEROING_METHODS = methods(fills=True)
GRAD_RESET_METHODS = GRAD_ZEROING_METHODS | {"detach_", "requires_grad_"}
# Context managers that turn autograd's recording on or off, and those under which it records no graph.
GRAD_MODES = functions(Category.GRAD_MODE)
GRAD_FREE_CONTEXTS = functions(Category.GRAD_MODE, records_graph=False)
# Module methods that neither move the module nor hand it out, and those that return it.
MODULE_METHODS_IN_PLACE = module_methods(keeps_place=True)
MODULE_METHODS_RETURNING_SELF = module_methods(returns_self=True)
# Module methods that hand out its submodules (`for m in model.modules():`).
SUBMODULE_METHODS = module_methods(submodules=True)
# Module methods that hand out its parameters or buffers (`for p in model.parameters():`).
MODULE_TENSOR_METHODS = module_methods(tensors=True)
# Module methods that set an attribute by name (`register_buffer("mask", mask)` makes
# `self.mask`): method -> the keyword of the value they set.
MODULE_ATTRIBUTE_SETTERS = {m.name: m.sets for m in NN_MODULE_METHODS.values() if m.sets is not None}
# A module's methods by name (`eval`, `parameters`, `to`), with their facts.
MODULE_METHOD_FACTS = {m.name: m for m in NN_MODULE_METHODS.values()}
# What a model is set up with before training (a compile goes after the last of these): the
# moves and casts that return it, and loading its weights; not a mode switch (`.train()`).
MODULE_SET_UP_METHODS = module_methods(sets_up=True)
# What DistributedDataParallel answers like the module it wraps: the module methods it answers
# so, the `training` flag every module has, its own `no_sync`. Any other attribute of the
# wrapped model is read through distributed.unwrap(model).
DDP_ANSWERS = module_methods(wrapper_answers=True) | {"training", "no_sync"}

# -- losses --------------------------------------------------------------------------------

# Losses whose default reduction is a mean over the elements of the batch (or over the
# targets that count), as functions and as module classes; every loss torch has.
_LOSSES = {name: op.loss for name, op in OPS.items() if op.loss is not None}
LOSS_FUNCTIONS = {name for name, loss in _LOSSES.items() if name.startswith(FUNCTIONAL) and loss.per_element}
LOSS_MODULES = {name for name, loss in _LOSSES.items() if not name.startswith(FUNCTIONAL) and loss.per_element}
ALL_LOSS_FUNCTIONS = frozenset(name for name in _LOSSES if name.startswith(FUNCTIONAL))  # every loss torch has
ALL_LOSS_MODULES = frozenset(name for name in _LOSSES if not name.startswith(FUNCTIONAL))  # and as modules
# The loss facts of each loss function and module class (its function's name, torch's defaults).
LOSSES = dict(_LOSSES)


def loss_of(names: Iterable[str]) -> tuple[str, Loss] | None:
    """(qualified name of the function, its facts) for the loss function or module class
    among the qualified `names`, or None."""
    for name in names:
        loss = _LOSSES.get(name)
        if loss is not None:
            return f"{FUNCTIONAL}.{loss.functional}", loss
    return None


# Functions and tensor methods that compute each element of their result from the same
# element of their operands (broadcast): applied to one position of a sequence or to all
# of them, they give the same values. Their random ones draw other numbers, so they are not.
POINTWISE_FUNCTIONS = functions(Category.UNARY, Category.BINARY, random=False, in_place=False)
POINTWISE_METHODS = methods(Category.UNARY, Category.BINARY, Category.CAST, random=False, in_place=False)
# Functions and methods that read a slice along one dim (`dim=`): pointwise over the others.
ALONG_DIM_FUNCTIONS = functions(Category.ALONG_DIM, in_place=False)
ALONG_DIM_METHODS = methods(Category.ALONG_DIM, in_place=False)
# Ops CUDA autocast refuses to run in reduced precision (it raises): use the form given.
AUTOCAST_UNSAFE = {name: op.autocast_refused for name, op in OPS.items() if op.autocast_refused is not None}
# Modules CUDA autocast runs in float16 whatever dtype it was given (cuDNN's RNNs).
AUTOCAST_FLOAT16 = frozenset(name for name, op in OPS.items() if op.autocast_float16)


def module_of_chain(value: cst.BaseExpression) -> cst.BaseExpression:
    """`model` for `model.to(device).to(torch.bfloat16)`, `Net(...)` for
    `Net(...).cuda().train()`: what a chain of module methods that return the module
    itself acts on."""
    return chain_of_module_methods(value)[0]


def chain_of_module_methods(value: cst.BaseExpression) -> tuple[cst.BaseExpression, frozenset[str]]:
    """What the chain acts on (`module_of_chain`), and the names of the methods it calls
    (a class that defines one of them itself may return something else)."""
    called = set()
    while (
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Attribute)
        and value.func.attr.value in MODULE_METHODS_RETURNING_SELF
    ):
        called.add(value.func.attr.value)
        value = value.func.value
    return value, frozenset(called)


def autocast_float16(name: str) -> bool:
    """Is `name` one of AUTOCAST_FLOAT16, or may it be one (`torch.nn.*`, any class of
    `torch.nn`, from `Names.may_name`)?"""
    owner, _, attribute = name.rpartition(".")
    if attribute == ANY_ATTRIBUTE:
        return any(known.rpartition(".")[0] == owner for known in AUTOCAST_FLOAT16)
    return name in AUTOCAST_FLOAT16


CROSS_ENTROPY = f"{FUNCTIONAL}.cross_entropy"
CROSS_ENTROPY_MODULES = functions(Category.LOSS, module=True, short="CrossEntropyLoss")
NLL_LOSS = f"{FUNCTIONAL}.nll_loss"
NLL_LOSS_MODULES = functions(Category.LOSS, module=True, short="NLLLoss")
SOFTMAXES = functions(Category.ALONG_DIM, short="softmax")
DROPOUTS = functions(Category.DROPOUT_LAYER, short="Dropout")
# Module classes whose forward draws from the RNG in training mode (every dropout of torch.nn).
RANDOM_MODULES = functions(Category.DROPOUT_LAYER)
SDPA = f"{FUNCTIONAL}.scaled_dot_product_attention"
# Methods whose result holds, at each position of a mask, whether the mask was set there
# (casts, moves, copies, and views that only add or broadcast dims).
MASK_KEEPING_METHODS = methods(keeps_mask=True)
# Calls whose result is drawn from the RNG: evaluated once instead of once per step, or in
# another order, they give other values.
RANDOM_FUNCTIONS = functions(random=True)
RANDOM_METHODS = methods(random=True)
# Tensor methods whose result is a tensor computed from the receiver and arguments alone.
DETERMINISTIC_TENSOR_METHODS = (SAME_PLACE_METHODS | MOVE_METHODS) - RANDOM_METHODS
# torch functions whose result depends on their arguments alone: no draw from the RNG, no
# uninitialized memory (made once instead of once per step, they give the same tensor).
DETERMINISTIC_FACTORIES = functions(Category.FACTORY, random=False, uninitialized=False)
# ... and every pure torch function of that kind: a computation (`torch.tril(x)`) gives the
# same result wherever its operands are the same.
DETERMINISTIC_FUNCTIONS = functions(pure=True, uninitialized=False)
# Tensor methods whose result may be the receiver or share its storage (a view, a cast
# with nothing to do), and attributes that are such views.
SHARING_METHODS = methods(shares=True)
SHARING_ATTRIBUTES = attributes(shares=True)
# Tensor attributes whose assignment replaces the tensor's contents, dtype included (`p.data = ...`).
REPLACING_ATTRIBUTES = attributes(replaces_tensor=True)
# Tensor methods whose result always shares the receiver's storage (its memory, pinned or not).
VIEW_METHODS = methods(Category.VIEW)
# ... and those whose result is always a view of it, whatever the device and dtype (views
# and `.numpy()`; not a cast or a move, which is the tensor itself only when it has nothing
# to do): a write into the result writes the tensor.
STORAGE_VIEW_METHODS = SHARING_METHODS - methods(Category.CAST)
# Calls that make no new memory, in constant time whatever the size (`torch.from_numpy(a)`,
# `x.unsqueeze(1)`): made once instead of every step, they save nothing worth a line.
NO_COPY_FUNCTIONS = functions(no_copy=True)
NO_COPY_METHODS = methods(no_copy=True)
# Tensor methods that make the host wait for the device.
SYNC_METHODS = methods(syncs=True)
# Random draws a forward makes from the tensors it is given (every dropout, `bernoulli`,
# `randn_like`, `multinomial`): not the factories that draw data from a shape (`torch.randn`),
# the counts a Poisson draw makes of rates (`torch.poisson`), nor the in-place fills that
# initialize weights (`w.normal_()`).
FORWARD_DRAWS = (
    RANDOM_MODULES
    | functions(Category.UNARY, random=True) - {"torch.poisson"}
    | frozenset(n for n in RANDOM_FUNCTIONS if n.endswith("_like") or n.endswith(".multinomial"))
)
FORWARD_DRAW_METHODS = frozenset(m for m in RANDOM_METHODS if not m.endswith("_"))
# What a tensor tells of itself without its values: a test of these reads nothing back from
# the device and does not break a compiled graph (`if x.dim() == 3:`).
METADATA_ATTRIBUTES = attributes(Category.METADATA)
METADATA_METHODS = methods(Category.METADATA)
# torch's functions that draw from its global generator (not the layers that call them).
TORCH_DRAWS = frozenset(name for name in RANDOM_FUNCTIONS if not name.startswith(FUNCTIONAL))
# Calls that read the gradients of the parameters they are given.
GRAD_NORMS = functions(Category.GRAD_NORM)

# -- the dtype of a method's result --------------------------------------------------------

# Tensor methods whose result is floating point, int64 or bool whatever their receiver's
# dtype, and those whose result (called with no argument) keeps their receiver's dtype: what
# tells which Python number `.item()` of their result gives.
FLOAT_RESULT_METHODS = methods(result_kind="float", in_place=False)
INT64_RESULT_METHODS = methods(result_dtype="int64", in_place=False)
BOOL_RESULT_METHODS = methods(result_dtype="bool", in_place=False)
DTYPE_KEEPING_METHODS = methods(result_dtype=KEPT, in_place=False)
# Tensor methods whose result (or receiver, for in-place ones) keeps the device and the
# floating dtype: what `nn.Parameter(...)` or `requires_grad_()` may be applied around. Not
# `max` and `min`, whose result along a dim is a pair of values and indices.
DEVICE_AND_DTYPE_KEEPING_METHODS = (
    methods(placement=Placement.OPERANDS, result_dtype=KEPT, in_place=False)
    | methods(placement=Placement.OPERANDS, result_kind="float", in_place=False)
    | methods(in_place=True)
) - methods(Category.EXTREMES)
# Tensor methods whose result is a tensor (a view, a conversion, a reduction, ...), or an
# array of its memory (`.numpy()`).
TENSOR_RESULT_METHODS = (
    SAME_PLACE_METHODS
    | FLOAT_RESULT_METHODS
    | INT64_RESULT_METHODS
    | BOOL_RESULT_METHODS
    | DTYPE_KEEPING_METHODS
    | methods(Category.TO_HOST, shares=True)
)
# The one notion of a pure tensor method (`Op.pure`: no draw from the RNG, no write in place,
# nothing run beside its result), and the methods above whose result is a tensor but for
# draws. A statement built of them changes nothing (purity) and may move (host reads).
PURE_TENSOR_METHODS = methods(pure=True) | (TENSOR_RESULT_METHODS - methods(random=True))
# torch functions that compute a new value and change nothing (`Op.pure`): no RNG draw, no
# write in place, no checkpoint written, no gradients read, no module built that draws its
# weights (`nn.Linear`, `nn.Conv2d`, `nn.LSTM`: a loss module has none).
PURE_TORCH_FUNCTIONS = functions(pure=True)

# -- matrix products -----------------------------------------------------------------------

# Functions and `nn` module classes that multiply matrices (matmul, linear, attention,
# recurrent and convolution layers): the float32 work that TF32 and reduced precision change.
MATRIX_PRODUCTS = functions(Category.MATMUL, Category.CONVOLUTION, Category.RECURRENT)
MATRIX_PRODUCT_METHODS = methods(Category.MATMUL)
# Those cuBLAS runs, whose float32 precision `torch.backends.cuda.matmul` (TF32) governs (`cdist`
# too: a matmul computes its distances): cuDNN's convolutions and recurrent layers have settings
# of their own, TF32 by default.
FLOAT32_MATMULS = functions(Category.MATMUL, Category.PAIRWISE)
# Functions that multiply matrices of sizes perfmod does not follow (`cdist` computes
# Euclidean distances through a matmul).
UNLISTED_PRODUCTS = functions(Category.PAIRWISE)
# Containers of modules: what they run is what they are given.
MODULE_CONTAINERS = functions(Category.CONTAINER)
# The container that calls its modules one after another on what the one before returns.
SEQUENTIAL_MODULES = frozenset({"torch.nn.Sequential", "torch.nn.modules.container.Sequential"})
# Containers that hold modules by key or by position: their modules are `.values()` or the container.
MODULE_TABLES = {name: op.holds for name, op in OPS.items() if op.holds is not None}
# Functions and tensor methods that reduce a tensor to fewer dims, and every loss: what
# computes a loss value (a function that calls none of them computes none).
REDUCING_FUNCTIONS = functions(Category.REDUCTION, Category.LOSS)
REDUCING_METHODS = methods(Category.REDUCTION)
# Why torch.compile leaves an operation to eager mode (dynamo breaks the graph there), by name.
COMPILE_BREAKS = {name: op.compile_breaks for name, op in OPS.items() if op.compile_breaks is not None}
COMPILE_BREAK_FUNCTIONS = frozenset(name for name in COMPILE_BREAKS if not name.startswith("Tensor."))
COMPILE_BREAK_METHODS = frozenset(name.removeprefix("Tensor.") for name in COMPILE_BREAKS if name.startswith("Tensor."))

# -- devices -------------------------------------------------------------------------------

# Calls that wait until the device has run all the work queued on it.
DEVICE_SYNCHRONIZES = functions(Category.PROCESS, syncs=True)
# Calls whose value tells whether the process has a CUDA device (`if torch.cuda.is_available():`).
CUDA_PROBES = functions(Category.PROCESS, device_probe="cuda")
# Calls that hand the memory CUDA's caching allocator holds unused back to the device.
CACHE_RELEASES = functions(Category.PROCESS, frees_cache=True)
# The names of torch's settings of float32 matrix products (TF32): the backends' flags and the
# function; a program that spells one chooses the precision itself.
MATMUL_PRECISION_SETTINGS = short(functions(Category.SETTING, float32_precision=True))
# torch's functions that return a Python int: device counts and indices, ranks and world sizes.
INT_TORCH_FUNCTIONS = functions(Category.PROCESS, python="int")
# Tensor methods that test a value for NaN or infinity (and the functions: FINITENESS_TESTS).
FINITENESS_METHODS = methods(tests_finiteness=True)

# -- checkpoints ---------------------------------------------------------------------------

# Calls that write a checkpoint synchronously.
SAVE_FUNCTIONS = functions(Category.SAVE)
TORCH_SAVES = frozenset(name for name in SAVE_FUNCTIONS if name.startswith("torch."))  # pickles any object

# -- sizes ---------------------------------------------------------------------------------

# Factories whose positional arguments (or one tuple of them) are the shape, float32 by default.
SHAPED_FACTORIES = functions(shape=Shape.NEW)
# Factories of a float tensor of one dim whose length is their `steps` (`linspace(start, end, steps)`).
STEPS_FACTORIES = functions(shape=Shape.STEPS)
INTEGER_FACTORIES = functions(shape=Shape.BOUNDED)  # `randint(low, high, size)`: int64 by default
# Factories of a tensor holding the (nested) lists of numbers they are given.
DATA_FACTORIES = functions(shape=Shape.DATA)
# Factories of a tensor of another's shape and dtype (`dtype=` may name another).
LIKE_FACTORIES = functions(shape=Shape.LIKE)
# Factories whose first argument is the shape and whose second is the value of every element.
FILLED_FACTORIES = functions(shape=Shape.FILLED)
FILLED_METHODS = methods(shape=Shape.FILLED)  # `x.new_full((B, T), v)`
# Tensor methods that make a tensor on the receiver's device from the sizes they are given.
NEW_FACTORY_METHODS = methods(Category.FACTORY, shape=Shape.NEW) | FILLED_METHODS
# Tensor methods by how their result's shape follows from the receiver's and their arguments.
RESHAPING_METHODS = methods(shape=Shape.SIZES)  # `view(B, -1)`, `expand`, `repeat`
REORDERING_METHODS = methods(shape=Shape.REORDERED)  # `transpose`, `permute`, `movedim`
SQUEEZING_METHODS = methods(shape=Shape.SQUEEZED)  # `unsqueeze`, `squeeze`, `flatten`, `unflatten`
SPLITTING_METHODS = methods(shape=Shape.SPLIT)  # `split(4, dim=-1)`: a size first, then the dim
# Tensor methods whose result is not one tensor of a shape: pieces, a size, a Python value.
NOT_ONE_TENSOR_METHODS = SPLITTING_METHODS | methods(shape=Shape.SLICES) | methods(Category.METADATA, Category.TO_HOST)
# Matrix products of their two operands (`a @ b`'s shape), as functions and tensor methods.
PRODUCT_FUNCTIONS = functions(shape=Shape.PRODUCT)
JOINING_FUNCTIONS = functions(shape=Shape.JOINED)  # `torch.cat`
STACKING_FUNCTIONS = functions(shape=Shape.STACKED)  # `torch.stack`
PRODUCT_METHODS = methods(shape=Shape.PRODUCT)
# `nn` module classes whose output has the shape of their input: activations, norms, dropout.
SAME_SHAPE_MODULES = functions(Category.ELEMENTWISE_LAYER, Category.NORM_LAYER, Category.DROPOUT_LAYER)
ELEMENTWISE_MODULES = functions(Category.ELEMENTWISE_LAYER)  # each output element from its input element
# What works on the last dims whatever its arguments say, and keeps the leading dims as batch
# dims: `tril`, `layer_norm`, `matmul`, `F.linear`, `F.embedding`; `nn.Linear`, `nn.LayerNorm`.
LAST_DIM_FUNCTIONS = functions(last_dims=True, module=False)
LAST_DIM_METHODS = methods(last_dims=True)
LAST_DIM_MODULES = functions(last_dims=True, module=True)
# How the shape of a tensor computed from others follows from theirs, by the table's categories:
# elementwise ops (and those along one dim) keep the broadcast shape of their operands, reductions
# drop (or, with `keepdim`, keep as 1) the dims they are given, casts keep the shape.
SHAPE_KEEPING_FUNCTIONS = functions(Category.UNARY, Category.BINARY, Category.ALONG_DIM, in_place=False)
SHAPE_KEEPING_METHODS = methods(Category.UNARY, Category.BINARY, Category.ALONG_DIM, Category.CAST, in_place=False)
# Elementwise over two or more broadcast operands: `torch.where(condition)` alone is another op.
BINARY_FUNCTIONS = functions(Category.BINARY)
# The shape of their tensor, whatever else they are given (shifts, dims): `roll`, `flip`.
REARRANGING_FUNCTIONS = functions(Category.REARRANGE)
REARRANGING_METHODS = methods(Category.REARRANGE)
REDUCTION_FUNCTIONS = functions(Category.REDUCTION)
REDUCTION_METHODS = methods(Category.REDUCTION)
NORM_METHODS = methods(Category.NORM)  # `x.norm(p, dim)`: reduced as a reduction, its dim second

# -- a per-sample loop run once on the batch (PM502) ---------------------------------------

# Methods whose result holds, element for element, what the receiver held: casts and
# unary math without a draw (`to` and `type` take their arguments into account elsewhere),
# and `pow` of a number.
ONE_OPERAND_METHODS = frozenset(methods(Category.UNARY, Category.CAST, random=False, in_place=False) | {"pow"})
ONE_OPERAND_FUNCTIONS = frozenset(functions(Category.UNARY, random=False) | {"torch.pow"})
TOTALS = functions(totals=True)  # the functions that add up, or average, every element of one tensor

# -- a loop over time read as a recurrence (PM505) -----------------------------------------

# torch functions (by their last name) a loop's state may go through in a loop that is
# still a (maybe non-linear) elementwise recurrence; a state passed to any other call
# (a module, an RNN cell) is not one.
RECURRENCE_FUNCTION_NAMES = short(functions(recurrence=True))
# Tensor methods (and attributes) a state may go through in such a loop.
RECURRENCE_METHODS = methods(recurrence=True) | attributes(recurrence=True)

# -- layers --------------------------------------------------------------------------------

# The layers of torch.nn whose parameters perfmod counts: the names of the constructor's
# arguments in order, with their defaults. `Layer.parameters` and `Layer.matmul` read them.
NN_LAYER_ARGUMENTS = {name: layer.arguments for name, layer in SIZED_LAYERS.items()}
RNN_GATES = {name: layer.gates for name, layer in SIZED_LAYERS.items() if layer.gates}  # per layer and direction
ONE_OPERATOR_LAYERS = frozenset(f"torch.nn.{name}" for name, layer in SIZED_LAYERS.items() if layer.one_operator)
SOFTMAX_MODULES = functions(Category.NORM_LAYER, short="Softmax")  # `nn.Softmax` under both its names
# Layers that act on the last dimensions of their input and take any number of leading ones
# (`(*, H)` in torch's docs), and the containers that only call their children: a sample
# without its batch dimension gives the values its row of a batch gives.
LEADING_DIM_LAYERS = (
    functions(Category.ELEMENTWISE_LAYER) | LAST_DIM_MODULES | functions(any_leading_dims=True) | MODULE_CONTAINERS
)
# Layers whose output for one sample depends on the other samples of the batch (in training mode).
BATCH_MIXING_LAYERS = functions(Category.NORM_LAYER, Category.BATCH_NORM, mixes_batch=True)
# ... the module layers among them that take their statistics from one process's share of the
# batch in a data-parallel run (BatchNorm; SyncBatchNorm gathers them over every process).
PER_RANK_BATCH_NORMS = functions(Category.NORM_LAYER, mixes_batch=True, across_ranks=False)
NN_STATELESS = functions(stateless=True)  # layers of torch.nn without parameters or buffers
# The plain dropout as a function, in torch.nn.functional and torch.
FUNCTIONAL_DROPOUTS = functions(Category.UNARY, random=True, short="dropout")
# Where each dropout of torch takes its probability of zeroing an element, (position,
# keyword): a module's construction, a function's call. With p = 0 it zeroes nothing, and
# draws nothing from the RNG (torch returns the input: `torch.nn.functional.dropout`).
DROP_PROBABILITY = {name: op.drop_probability for name, op in OPS.items() if op.drop_probability is not None}


# ==========================================================================================
# torch's other objects (data loading, optimizers) as views of their tables, and written
# here: its namespaces and keywords, and the choices of the analyses among its names
# ==========================================================================================

# -- datasets and loaders ------------------------------------------------------------------

# torch's dataset classes: a dataset built of tensors is where they are.
DATASET_CLASSES = datasets()
SPLIT_DATASETS = data_functions(DataFunction.SPLIT)  # Subsets of its first argument
ITERABLE_DATASET = f"{DATA}IterableDataset"  # the base of iterable datasets, as torch.utils.data names it
GET_WORKER_INFO = data_functions(DataFunction.WORKER_INFO)
# Keyword arguments of DataLoader that only mean something with worker processes: a loader
# that passes one of them has chosen how it loads.
WORKER_OPTIONS = LOADERS[f"{DATA}DataLoader"].worker_options
# torch's own collate function: it stacks the samples of a batch, nothing more.
DEFAULT_COLLATES = data_functions(DataFunction.COLLATE)
# Datasets of torch whose items are rows of the tensors they are given: an item is an index
# into memory the training process already holds.
TENSOR_ROW_DATASETS = datasets(rows_of_tensors=True)
# Datasets of torch made of other datasets: an item costs what an item of a part costs.
DATASETS_OF_DATASETS = datasets(of_datasets=True)
# Namespaces whose lowercase functions compute tensors where their tensor arguments are
# (`torch.cos(t)`, `F.relu(x)`, `torch.linalg.norm(x)`), except NOT_TENSOR_FUNCTIONS.
TENSOR_NAMESPACES = ("torch", "torch.nn.functional", "torch.linalg", "torch.special", "torch.fft", "torch.nn.utils.rnn")

# -- training ------------------------------------------------------------------------------

# Learning-rate schedulers that write only the groups' learning rates (`lr`, `initial_lr`),
# never momentum or weight decay. CyclicLR and OneCycleLR are not here: with
# `cycle_momentum=True` (their default) they write each group's momentum too.
LR_ONLY_SCHEDULERS = schedulers(writes=LR_KEYS)
# Keys of an optimizer's parameter group that the step of a zero gradient does not read
# (plain SGD steps `p -= lr * 0` whatever the rate is).
LR_GROUP_KEYS = frozenset({*LR_KEYS, "params"})
# The tensor types that make float64 the default dtype (`torch.set_default_tensor_type`).
DOUBLE_TENSOR_TYPES = frozenset(name for name, dtype in DEFAULT_TENSOR_TYPES.items() if dtype == "float64")

# -- models --------------------------------------------------------------------------------

# torch's calls that hand back a model built elsewhere (a file, a hub): what it runs is unknown.
MODEL_LOADERS = ("torch.load", "torch.jit.load", "torch.hub", "torch.export.load", "torch.package")

# -- devices -------------------------------------------------------------------------------

# Where a program may put tensors on an accelerator: calls under these names (CUDA, MPS, XPU,
# the generic accelerator API, a default device, the data-parallel wrappers, process groups).
ACCELERATOR_NAMESPACES = (
    "torch.cuda",
    "torch.mps",
    "torch.xpu",
    "torch.accelerator",
    "torch.backends.mps",
    "torch.backends.cuda",
    "torch.set_default_device",
    "torch.nn.DataParallel",
    "torch.nn.parallel",
    "torch.distributed",
)
# Keywords that name where a call puts what it makes or loads (and Lightning's
# `Trainer(accelerator="gpu", devices=1)`, which chooses an accelerator).
DEVICE_KEYWORDS = frozenset({"device", "device_map", "map_location", "accelerator", "devices", "gpus"})
# Words that show, in a module's text, that it may place tensors on an accelerator.
ACCELERATOR_WORDS = (b"cuda", b"device", b"mps", b"xpu", b"accelerator", b"DataParallel")

# -- checkpoints ---------------------------------------------------------------------------

# Spellings of state sharded across ranks: each rank writes its own part of a checkpoint.
SHARDED_STATE = re.compile(r"FullyShardedDataParallel|\bFSDP\b|fully_shard|torch\.distributed\.checkpoint|DTensor")

# -- parameters of an optimizer (PM402) ----------------------------------------------------

# The optimizers that take a `fused` keyword, and the device types their fused kernels run
# on; every other optimizer of torch.optim rejects the keyword itself, `fused=False` too,
# with a TypeError. FUSED_DEVICE_TYPES: the device types of any fused kernel.
FUSED_OPTIMIZERS = {name: optimizer.fused_devices for name, optimizer in OPTIMIZERS.items() if optimizer.fused_devices}
FUSED_DEVICE_TYPES = frozenset().union(*FUSED_OPTIMIZERS.values())
# Those with fused kernels on every device type of FUSED_DEVICE_TYPES.
FUSED_EVERYWHERE = frozenset(name for name, types in FUSED_OPTIMIZERS.items() if types >= FUSED_DEVICE_TYPES)
# The device types a launch-time guard names: those every supported torch has fused kernels for.
LAUNCH_FUSED_TYPES = LAUNCH_FUSED_DEVICES
# Optimizer arguments that pick the implementation or that fused=True rejects
# (`fused` does not support `differentiable`; `fused` and `foreach` cannot both be True).
FUSED_CONFLICTS = IMPLEMENTATION_KEYWORDS

# -- DistributedDataParallel (PM601) -------------------------------------------------------

# Datasets cheap and pure to build twice (the sampler needs only their length).
REBUILDABLE_DATASETS = datasets(rebuildable=True)

# -- sizes ---------------------------------------------------------------------------------

# The state torch.optim's optimizers keep for each parameter as tensors of its shape: how
# many they always keep, and the keywords that add one each unless left at their default
# (`momentum=0`, `amsgrad=False`, `centered=False`). 0-dim counters (`step`) not counted.
OPTIMIZER_STATES = {name: (optimizer.states, optimizer.state_options) for name, optimizer in OPTIMIZERS.items()}

# -- compiling, gradients, sizes -----------------------------------------------------------

# A namespace of functions that factorize or multiply matrices perfmod does not size
# (UNLISTED_PRODUCTS are such functions elsewhere): every function under it.
UNLISTED_PRODUCT_PREFIXES = ("torch.linalg.",)
# Methods that return a new tensor from the one they are given rather than change it
# (`GradScaler.scale(loss)` returns the scaled loss).
SCALER_METHODS_RETURNING_NEW = frozenset({"scale"})
# Loss keywords whose effect on a per-position or per-sample loss is understood.
LOSS_KEYWORDS = frozenset({"weight", "ignore_index", "reduction", "label_smoothing"})


# ==========================================================================================
# Not torch: plain tables of Python's, numpy's and other libraries' names, and perfmod's runtime
# ==========================================================================================

# -- Python's builtins and standard library ------------------------------------------------

# The calls that end the program: code that ends with one runs once at most.
PROGRAM_EXITS = frozenset({"sys.exit", "os._exit", "exit", "quit", "builtins.exit", "builtins.quit"})

# The decorators that make a generator function a context manager.
CONTEXT_MANAGER_DECORATORS = ("contextlib.contextmanager", "contextlib.asynccontextmanager")

# The builtins of index arithmetic: a `__getitem__` that calls them still only indexes memory.
INDEX_BUILTINS = frozenset(f"builtins.{name}" for name in "len int float min max abs slice divmod round".split()) | {
    "len",
    "int",
    "float",
    "min",
    "max",
    "abs",
    "slice",
    "divmod",
    "round",
}
# Calls that iterate what they are given, item for item (a progress bar, `islice`, `cycle`).
PASS_THROUGH_ITERABLES = {
    "iter",
    "builtins.iter",
    "tqdm.tqdm",
    "tqdm.auto.tqdm",
    "tqdm.notebook.tqdm",
    "tqdm.std.tqdm",
    "itertools.islice",
    "itertools.cycle",
}
# Methods of Python's containers that return (views of) what the container holds.
CONTAINER_READS = frozenset({"get", "values", "items", "__getitem__"})
# Builtins whose result depends on their arguments alone and that change nothing.
PURE_BUILTINS = frozenset(
    f"builtins.{name}"
    for name in (
        "len int float str bool tuple list dict set frozenset min max abs round sum sorted range "
        "isinstance divmod pow ord chr repr hash"
    ).split()
)
# Builtins that read an object's attributes and change nothing.
ATTRIBUTE_READERS = frozenset({"builtins.getattr", "builtins.hasattr"})
# Modules of Python's standard library (and numpy, tqdm's progress bars, wandb's logging) whose
# functions run no torch operation: a call of one multiplies no tensors on the GPU.
NO_TORCH_MODULES = (
    "builtins math cmath random time datetime os sys json logging warnings itertools collections "
    "string re enum pathlib argparse numpy tqdm wandb"
).split()
# Builtins that make a new one-shot iterator: pure to call, but their value is used up once read.
ITERATOR_BUILTINS = frozenset(f"builtins.{name}" for name in "enumerate zip reversed map filter iter".split())
# Calls that build a list holding every element in memory (whatever they read), and those
# that build a tuple.
LIST_BUILDERS = frozenset({"builtins.list", "builtins.sorted", "random.sample", "random.choices"})
TUPLE_BUILDERS = frozenset({"builtins.tuple"})
# String methods that give a list of strings.
STRING_SPLITS = frozenset("split rsplit splitlines".split())
# Methods of Python's strings, lists, dicts and sets that change their receiver.
MUTATING_METHODS = frozenset(
    "append extend insert pop remove clear sort reverse update setdefault popitem add discard "
    "difference_update intersection_update symmetric_difference_update __setitem__ __delitem__".split()
)
# Methods that change only the order of a list's items, not which items it holds.
ORDER_ONLY_METHODS = frozenset({"sort", "reverse"})
# Python's modules whose functions run on the host only: a call of one queues no device work.
HOST_ONLY_MODULES = (
    "builtins",
    "time",
    "math",
    "os",
    "sys",
    "logging",
    "json",
    "datetime",
    "random",
    "io",  # `BytesIO()`: a buffer in host memory
    "gc",  # `gc.collect()` frees host objects (and so cached device blocks); it queues no kernel
    "pickle",
    "contextlib",  # `nullcontext()`, `ExitStack()`: what they enter may queue work, not they
)
# Python's functions of numbers to numbers: on Python numbers they run on the host and queue nothing.
HOST_NUMBER_FUNCTIONS = frozenset(f"builtins.{name}" for name in "min max abs float int round pow".split())
HOST_NUMBER_MODULES = ("math",)
# `math`'s functions whose result is an int (the others give floats), and its constants.
INT_MATH_FUNCTIONS = frozenset(f"math.{name}" for name in "floor ceil trunc isqrt gcd lcm factorial comb perm".split())
MATH_CONSTANTS = frozenset(f"math.{name}" for name in "pi e tau inf nan".split())
# Calls whose only effect outside the calling function is on files (they read, write, make or
# remove files and folders) or on the console: a function that makes no other call may run in
# a background thread (PM405). `os.chdir`, `os.environ`, `sys` and process calls are not here.
FILE_ONLY_FUNCTIONS = (
    frozenset(
        f"builtins.{name}"
        for name in "open print enumerate zip reversed any all bytes bytearray hasattr format type callable".split()
    )
    | frozenset(
        f"os.{name}"
        for name in (
            "makedirs mkdir remove unlink replace rename rmdir removedirs listdir scandir stat lstat close "
            "fsync fdopen walk getpid"
        ).split()
    )
    | frozenset(f"shutil.{name}" for name in "rmtree copy copy2 copyfile copytree move disk_usage".split())
    | frozenset(f"tempfile.{name}" for name in "mkstemp mkdtemp NamedTemporaryFile TemporaryDirectory".split())
    | frozenset({"json.dump", "json.dumps", "yaml.dump", "yaml.safe_dump", "pickle.dump", "pickle.dumps"})
    | frozenset({"pathlib.Path", "pathlib.PurePath", "time.time", "time.strftime", "time.localtime"})
)
# Modules every function of which is such a source (`tempfile.mkdtemp()`, `uuid.uuid4()`).
PER_PROCESS_MODULES = ("tempfile", "uuid", "random", "secrets", "numpy.random")
# Environment variables each process of a torchrun launch has its own value of.
PER_PROCESS_ENVIRONMENT = frozenset({"RANK", "LOCAL_RANK", "GROUP_RANK", "TORCHELASTIC_RUN_ID_LOCAL"})
# Modules all of whose functions only compute (paths, patterns): any of them qualifies too.
FILE_ONLY_MODULES = ("os.path", "re", "fnmatch", "glob")
# Methods of a path that read and change nothing (with READ_ONLY_METHODS above).
PATH_READ_METHODS = frozenset(
    "exists is_file is_dir with_suffix with_name joinpath relative_to resolve absolute".split()
)
# Calls that make an in-memory file: a save into one writes no checkpoint.
BUFFERS = ("io.BytesIO", "io.StringIO")
# Calls and methods whose result is a file path when their argument is one.
PATH_FUNCTIONS = frozenset(
    {
        "os.path.join",
        "os.path.abspath",
        "os.path.expanduser",
        "os.fspath",
        "pathlib.Path",
        "pathlib.PurePath",
        "builtins.str",
    }
)
PATH_METHODS = frozenset({"joinpath", "with_suffix", "with_name", "format", "replace", "resolve", "absolute"})
# Calls that only show a value (a path read by them does not touch its file).
LOGGING_CALLS = frozenset({"builtins.print"})
LOGGING_METHODS = frozenset({"info", "debug", "warning", "log", "write", "set_description", "set_postfix"})
# Calls that give a logger: a module's `logger = logging.getLogger(__name__)` only writes logs.
LOGGER_FACTORIES = frozenset({"logging.getLogger"})
# Python builtins that read a one-element tensor to the host (a sync), by their short name.
HOST_READ_BUILTINS = {"builtins.float": "float", "builtins.int": "int"}
# Reads of an environment variable whose second argument is the value when it is unset.
ENVIRONMENT_READS = frozenset({"os.environ.get", "os.getenv"})

# -- pandas --------------------------------------------------------------------------------

# pandas' readers and constructors of a DataFrame: the whole table is read into memory.
IN_MEMORY_TABLES = frozenset(
    f"pandas.{name}" for name in "DataFrame Series read_csv read_table read_json read_parquet read_pickle".split()
)
# A DataFrame's indexers (`df.iloc[i]`) and its array (`df.values[i]`): they index the table in memory.
TABLE_INDEXERS = frozenset({"iloc", "loc", "iat", "at", "values"})

# -- Python's random and numpy's -----------------------------------------------------------

# The draws of BATCH_DRAWS that pick from a population (a sequence, or `n` for `range(n)`);
# the others draw integers below a bound.
POPULATION_DRAWS = frozenset({"random.sample", "random.choices", "numpy.random.choice"})
# Random generator objects, by family: the calls that build one.
GENERATOR_CONSTRUCTORS = {
    "random": ("random.Random",),
    "numpy": ("numpy.random.default_rng", "numpy.random.RandomState", "numpy.random.Generator"),
}
# Methods of those generator objects that draw a batch: method -> {family: the draw it works as}.
GENERATOR_BATCH_DRAWS = {
    "sample": {"random": "random.sample"},
    "choices": {"random": "random.choices"},
    "choice": {"numpy": "numpy.random.choice"},
    "integers": {"numpy": "numpy.random.randint"},
    "randint": {"numpy": "numpy.random.randint"},
}

# -- tokenizers (Hugging Face, tiktoken) ---------------------------------------------------

# Keyword of Hugging Face tokenizers and processors whose "pt" value returns a BatchEncoding
# of CPU tensors (`tokenizer(texts, return_tensors="pt")`).
RETURN_TENSORS = "return_tensors"
# How a known tokenizer is built: qualified name of the call (with the
# `transformers.<...Tokenizer...>.from_pretrained` family, see TOKENIZER_CLASS_WORD).
TOKENIZER_BUILDERS = frozenset(
    {
        "tiktoken.get_encoding",
        "tiktoken.encoding_for_model",
        "tokenizers.Tokenizer.from_file",
        "tokenizers.Tokenizer.from_pretrained",
        "tokenizers.Tokenizer.from_str",
    }
)
TOKENIZER_CLASS_WORD = "Tokenizer"  # `transformers.AutoTokenizer.from_pretrained`, `GPT2TokenizerFast...`
# Methods of those tokenizers that compute ids from their arguments and change nothing.
TOKENIZER_METHODS = frozenset(
    {
        "encode",
        "encode_plus",
        "batch_encode_plus",
        "apply_chat_template",
        "tokenize",
        "convert_tokens_to_ids",
        "encode_ordinary",
        "encode_batch",
    }
)
# Methods of those tokenizers that give the ids of one text as a flat list of Python ints.
ID_LIST_METHODS = frozenset({"encode", "encode_ordinary"})
# Methods that turn ids (or a model's output) back into text, or generate it.
DETOKENIZER_METHODS = frozenset({"decode", "batch_decode", "generate"})
# Methods of a tokenizer that read it and change nothing: its pure methods and decoding.
TOKENIZER_READERS = TOKENIZER_METHODS | {"decode", "batch_decode"}
# The keyword that makes a Hugging Face tokenizer pad a batch of texts to its longest, and its
# values that leave the ids unpadded.
TOKENIZER_PADDING = "padding"
TOKENIZER_NO_PADDING = frozenset({"False", "'do_not_pad'", '"do_not_pad"'})
# A Hugging Face tokenizer's batched call that pads to the longest text of the batch
# (`padding=True`, "longest") gives the ids `tokenizer.pad({"input_ids": rows}, ...)` gives
# for the rows of each text tokenized alone, unpadded: the keywords that tokenize each text
# as it is tokenized alone (truncation is per text), those `pad` takes to pad the batch, the
# fields of the result `pad` gives from the ids alone, and the libraries whose tokenizers
# have that `pad`.
TOKENIZER_PAD_LONGEST = frozenset({"True", "'longest'", '"longest"'})
TOKENIZER_PER_TEXT_OPTIONS = frozenset({"add_special_tokens", "truncation", "max_length", "verbose"})
TOKENIZER_PAD_OPTIONS = frozenset(
    {"padding", "pad_to_multiple_of", "padding_side", "return_attention_mask", RETURN_TENSORS}
)
TOKENIZER_IDS = "input_ids"
TOKENIZER_PAD_FIELDS = frozenset({TOKENIZER_IDS, "attention_mask"})
TOKENIZER_PAD_LIBRARIES = frozenset({"transformers"})
# The library a known tokenizer's builder comes from (the top of its qualified name), as users name it.
TOKENIZER_LIBRARIES = {"transformers": "Hugging Face", "tokenizers": "Hugging Face", "tiktoken": "tiktoken"}

# -- torchvision's datasets and transforms -------------------------------------------------

MAP_STYLE_PREFIXES = ("torchvision.datasets",)  # all map-style: ImageFolder, MNIST, CIFAR10...
# torchvision's datasets of images of one size, as (channels, height, width) of an image; their
# target is a class index (an int64 in a batch).
IMAGE_DATASETS = {
    **dict.fromkeys(
        (f"torchvision.datasets.{name}" for name in "MNIST FashionMNIST KMNIST EMNIST QMNIST".split()), (1, 28, 28)
    ),
    **dict.fromkeys((f"torchvision.datasets.{name}" for name in "CIFAR10 CIFAR100 SVHN".split()), (3, 32, 32)),
    "torchvision.datasets.STL10": (3, 96, 96),
}
# torchvision transforms that keep an image's shape (and ToTensor's float32).
SHAPE_KEEPING_TRANSFORMS = frozenset(
    f"torchvision.transforms.{name}"
    for name in (
        "Normalize RandomHorizontalFlip RandomVerticalFlip ColorJitter RandomErasing RandomRotation RandomAffine "
        "RandomPerspective GaussianBlur RandomInvert RandomAutocontrast RandomEqualize RandomGrayscale"
    ).split()
)
# torchvision transforms that cut an image to the `size` they are given (a side, or height and width).
CROP_TRANSFORMS = frozenset({"torchvision.transforms.CenterCrop", "torchvision.transforms.RandomCrop"})
# torchvision transforms that add `padding` pixels around an image: one for every side, (left and
# right, top and bottom), or (left, top, right, bottom).
PADDING_TRANSFORMS = frozenset({"torchvision.transforms.Pad"})

# torchvision's model zoo: its models (ResNets, EfficientNets, MobileNets, DenseNets, ...)
# mostly hold BatchNorm layers; these builders' hold none (VGG without `_bn`, AlexNet,
# SqueezeNet; the vision transformers, Swin and ConvNeXt normalise with LayerNorm).
MODEL_ZOOS = ("torchvision.models",)
ZOO_MODELS_WITHOUT_BATCH_NORM = frozenset(
    f"torchvision.models.{name}"
    for name in (
        "alexnet vgg11 vgg13 vgg16 vgg19 squeezenet1_0 squeezenet1_1 vit_b_16 vit_b_32 vit_l_16 vit_l_32 vit_h_14 "
        "swin_t swin_s swin_b swin_v2_t swin_v2_s swin_v2_b convnext_tiny convnext_small convnext_base convnext_large"
    ).split()
)

# -- training libraries (Accelerate, Lightning, Hugging Face) ------------------------------

# Objects whose `.backward(loss)` runs the backward pass and that own the training's mixed
# precision: their constructor's keyword that sets it.
PRECISION_OWNERS = {
    "accelerate.Accelerator": "mixed_precision",
    "accelerate.accelerator.Accelerator": "mixed_precision",
    "lightning.Fabric": "precision",
    "lightning.fabric.Fabric": "precision",
    "lightning_fabric.Fabric": "precision",
}
# Lightning's Trainer (Lightning 2.x; the `pytorch_lightning` package too): it runs every
# training_step under the mixed precision its `precision=` names, on the accelerator its
# `accelerator=` names ("auto" by default: CUDA where a CUDA GPU is present, else MPS, TPU
# or the CPU). "gpu" and "cuda" train on a GPU.
LIGHTNING_TRAINERS = frozenset(
    f"{package}.{path}Trainer"
    for package in ("lightning", "lightning.pytorch", "pytorch_lightning")
    for path in ("", "trainer.", "trainer.trainer.")
    if not (package == "lightning" and path)
)
LIGHTNING_PRECISION_KEYWORD = "precision"
LIGHTNING_GPU_ACCELERATORS = ("gpu", "cuda")
LIGHTNING_DEFAULT_ACCELERATOR = "auto"
# The `precision=` values Lightning 2.x accepts (strings; 16, 32 and 64 as numbers too; "16",
# "bf16" are older aliases of "16-mixed" and "bf16-mixed"), the one an expert writes for a
# GPU (bf16 autocast, no gradient scaler), and the default.
LIGHTNING_PRECISIONS = frozenset(
    {
        "transformer-engine",
        "transformer-engine-float16",
        "16-true",
        "16-mixed",
        "bf16-true",
        "bf16-mixed",
        "32-true",
        "64-true",
        "64",
        "32",
        "16",
        "bf16",
    }
)
LIGHTNING_MIXED_PRECISION = "bf16-mixed"
LIGHTNING_FLOAT16_PRECISION = "16-mixed"  # float16 autocast with a gradient scaler
LIGHTNING_FULL_PRECISION = "32-true"
# Modules that a trainer moves to the device it picks before it calls their
# `configure_optimizers()` (Lightning's strategies: model_to_device, then setup_optimizers).
TRAINER_PLACED_MODULES = frozenset(
    {
        "lightning.LightningModule",
        "lightning.pytorch.LightningModule",
        "lightning.pytorch.core.LightningModule",
        "lightning.pytorch.core.module.LightningModule",
        "pytorch_lightning.LightningModule",
        "pytorch_lightning.core.LightningModule",
        "pytorch_lightning.core.module.LightningModule",
    }
)
SAVE_METHODS = {"save_pretrained", "save_state"}  # Hugging Face models, Accelerate
# Set-up calls of the libraries that run the processes (Accelerate's `accelerator.prepare`,
# Lightning Fabric's `fabric.setup`, DeepSpeed's `deepspeed.initialize`): what they are
# handed, they place on the device they choose.
DEVICE_CHOOSING_SETUP_METHODS = frozenset({"prepare", "setup", "initialize"})
# Of those, the ones that hand back what they are given, wrapped for the processes, in the
# order given: `model, opt, loader = accelerator.prepare(model, opt, loader)` iterates the
# same batches the DataLoader built before it gives (its settings kept).
ARGUMENTS_IN_ORDER_SETUP_METHODS = frozenset({"prepare", "setup_dataloaders"})


class BatchPlacement(NamedTuple):
    """A set-up method whose DataLoader puts each batch on the engine's device inside `next()`."""

    method: str  # `prepare` of `accelerator.prepare(loader)`
    engine_keyword: str | None  # the engine constructor's keyword that may turn it off


# Engines (by their constructor) whose set-up call hands back a DataLoader that places each
# batch on the engine's device itself: Accelerate's `prepare` (`device_placement`, on by
# default, on the Accelerator and per call), Fabric's `setup_dataloaders` (`move_to_device`,
# on by default, per call). A `.to(device)` of such a batch in the step copies nothing.
BATCH_PLACING_ENGINES = {
    **dict.fromkeys(
        ("accelerate.Accelerator", "accelerate.accelerator.Accelerator"), BatchPlacement("prepare", "device_placement")
    ),
    **dict.fromkeys(
        ("lightning.Fabric", "lightning.fabric.Fabric", "lightning_fabric.Fabric"),
        BatchPlacement("setup_dataloaders", None),
    ),
}

# -- perfmod's runtime ---------------------------------------------------------------------

# perfmod's runtime, as rewritten code calls it: the precision policy, data loading,
# checkpoints, hooks, process setup and the elementwise linear recurrence multiply no
# matrices (`runtime.kernels.linear_attention` does).
RUNTIME_WITHOUT_PRODUCTS = (
    "runtime.amp runtime.data runtime.checkpoint runtime.hooks runtime.distributed runtime.trace "
    "runtime.kernels.linear_recurrence runtime.kernels.scan"
).split()
# perfmod's background checkpointer: `.save(obj, path)` writes what torch.save would, on rank 0.
CHECKPOINTERS = frozenset({"runtime.checkpoint.AsyncCheckpointer", "runtime.AsyncCheckpointer"})


# ==========================================================================================
# torch's and other libraries' names together
# ==========================================================================================

# -- lists of torch's names and others' together -------------------------------------------

# Datasets of torch that are map-style (indexed by the sampler): each index is loaded once,
# by whichever worker the index is sent to. A list or tuple of samples is one too.
MAP_STYLE_DATASETS = frozenset(
    {
        "torch.utils.data.TensorDataset",
        "torch.utils.data.Subset",
        "torch.utils.data.ConcatDataset",
        "torch.utils.data.StackDataset",
        "list",
        "builtins.list",
        "tuple",
        "builtins.tuple",
    }
)
# Draws of a random index, of torch, Python's random and numpy.
INDEX_DRAWS = frozenset(
    {
        "torch.randint",
        "random.randint",
        "random.randrange",
        "random.random",
        "numpy.random.randint",
        "numpy.random.choice",
    }
)
# collate functions whose batches hold only tensors, mappings and sequences of them (and
# Hugging Face's collators, `transformers.DataCollator*`, whose batches are dicts of tensors).
TENSOR_COLLATES = {
    "torch.utils.data.default_collate",
    "torch.utils.data.dataloader.default_collate",
    "torch.utils.data._utils.collate.default_collate",
    "runtime.data.PadCollate",
    "runtime.PadCollate",
    "transformers.default_data_collator",
    "transformers.data.data_collator.default_data_collator",
}


class ProcessStart(NamedTuple):
    """A call that runs a function in new processes: where it takes the function (position,
    keyword), and whether each process calls it with its process index first (`mp.spawn(fn,
    args=(a,))` runs `fn(i, a)` for i in range(nprocs))."""

    position: int
    keyword: str
    index_first: bool


# A process started with `spawn` or `forkserver` (CUDA needs one of them; `forkserver` is
# Python 3.14's default on Linux) inherits no process-wide setting made before the call.
PROCESS_STARTS = {
    "torch.multiprocessing.spawn": ProcessStart(0, "fn", index_first=True),
    "torch.multiprocessing.spawn.spawn": ProcessStart(0, "fn", index_first=True),
    "torch.multiprocessing.start_processes": ProcessStart(0, "fn", index_first=True),
    "torch.multiprocessing.spawn.start_processes": ProcessStart(0, "fn", index_first=True),
    "torch.multiprocessing.Process": ProcessStart(1, "target", index_first=False),
    "multiprocessing.Process": ProcessStart(1, "target", index_first=False),
    "multiprocessing.context.Process": ProcessStart(1, "target", index_first=False),
}
# Methods of a model that do not run its forward: nn.Module's, DDP's `no_sync`, Lightning's
# `configure_optimizers` and Hugging Face's `save_pretrained`.
MODULE_METHODS = module_methods(runs_forward=False) | {"no_sync", "configure_optimizers", "save_pretrained"}
# Methods that run outside the model's forward pass (nn.Module's, `forward` itself through DDP,
# Hugging Face's `save_pretrained`); a training forward through any other method skips DDP's
# gradient synchronisation.
NOT_FORWARD = DDP_ANSWERS | module_methods() | {"save_pretrained"}
# Methods that set a model up in place (torch's moves, casts, loads and compile; the
# initializations models define by these names): the DDP wrap goes after the last of them.
CONFIGURES = MODULE_SET_UP_METHODS | module_methods(compiles=True) | {"init_weights", "reset_parameters", "tie_weights"}
# Methods that move a tensor or module to an accelerator whatever their argument: torch's, and
# those of out-of-tree devices (torch_npu's, Intel Gaudi's) and `mps` as programs spell them.
ACCELERATOR_METHODS = methods(accelerator=True) | module_methods(accelerator=True) | {"mps", "npu", "hpu"}
# Calls that hand memory back (Python's collector, the CUDA caching allocator), with how a
# message spells each.
MEMORY_CLEANUPS = {"gc.collect": "gc.collect()"} | dict.fromkeys(sorted(CACHE_RELEASES), "torch.cuda.empty_cache()")
# Methods of Python's strings and containers (and nn.Module's get_submodule) that read and change nothing.
READ_ONLY_METHODS = frozenset(
    (
        "get keys values items copy count index split rsplit splitlines join strip lstrip rstrip lower "
        "upper title capitalize casefold startswith endswith replace format find rfind partition rpartition "
        "isdigit isalpha isalnum isspace isupper islower zfill ljust rjust center encode decode "
        "union intersection difference issubset issuperset"
        # nn.Module's look-up of a submodule by its dotted name: what an attribute access reads
        " get_submodule"
    ).split()
)
# Libraries that run a model with parameters passed per call (MAML-style inner loops).
FUNCTIONAL_PARAMETERS = ("torch.func", "torch.nn.utils.stateless", "functorch", "higher")
INFINITIES = ("math.inf", "torch.inf", "numpy.inf")
# Calls that draw a random permutation of `range(n)`: a shuffled order of the samples.
PERMUTATIONS = functions(permutes=True) | {"numpy.random.permutation"}
# Calls that draw a batch of samples (or of their indices) at random, with replacement
# across calls: qualified name -> how a message spells it.
BATCH_DRAWS = {
    "torch.randint": "torch.randint",
    "random.sample": "random.sample",
    "random.choices": "random.choices",
    "numpy.random.randint": "np.random.randint",
    "numpy.random.choice": "np.random.choice",
}
# Context managers that change how ops are computed (precision, gradients), not what a
# factory or a tokenizer gives.
TRANSPARENT_BLOCKS = GRAD_MODES | AUTOCAST_NAMES | {"contextlib.nullcontext"}
# Functions that take a tensor, read it and change nothing in it (they return something new).
NON_MUTATING_CALLS = frozenset(
    {f"builtins.{name}" for name in "print float int len str repr isinstance".split()}
    | {f"{module}.{name}" for module in ("math", "torch") for name in ("isnan", "isfinite", "isinf")}
)
# Calls whose value differs from one process to the next, even with the same arguments
# (a temporary folder or name, a clock, a random draw, a process id, a rank): a file rank 0
# writes under such a path is not where the other ranks look for it.
PER_PROCESS_SOURCES = frozenset(
    {
        "os.getpid",
        "os.getppid",
        "os.urandom",
        "socket.gethostname",
        "platform.node",
        "torch.distributed.get_rank",
        "torch.distributed.get_node_local_rank",
    }
    | {
        f"time.{name}"
        for name in "time time_ns monotonic monotonic_ns perf_counter perf_counter_ns strftime localtime gmtime ctime".split()
    }
    | {f"datetime.datetime.{name}" for name in "now utcnow today".split()}
    | {"datetime.date.today"}
)
# What returns a model whose parameters are the given model's, or copies of them, on its device.
SAME_DEVICE_MODEL_WRAPPERS = frozenset(MODEL_WRAPPERS | {"copy.deepcopy"})
# Libraries whose calls in a model's class build torch layers or plain values.
LAYER_LIBRARIES = ("torch.", "builtins.", "math.")

# -- unions of the tables above ------------------------------------------------------------

# What only reads a batch or a tensor: a dict's reads, sizes, and the tensor methods above.
READING_METHODS = frozenset({"keys", "values", "items", "get"}) | methods(Category.METADATA) | SAME_PLACE_METHODS
# Methods whose result may be (part of) what their receiver holds: tensor views and
# casts with nothing to do, and containers' reads.
SHARING_CALLS = methods(shares=True) | CONTAINER_READS
# Calls known to change none of their arguments: builtins that read, torch's functions and
# factories but the in-place ones (`torch.nn.init.normal_`), and numpy's and math's that
# compute a new value. An argument handed to any other library call may be changed in place
# (`random.shuffle(order)`, `heapq.heappush(queue, item)`, `np.copyto(dst, src)`).
READ_ONLY_FUNCTIONS = (
    PURE_BUILTINS
    | ATTRIBUTE_READERS
    | ITERATOR_BUILTINS
    | LIST_BUILDERS
    | TUPLE_BUILDERS
    | frozenset(f"builtins.{name}" for name in "print id type callable format vars".split())
    | functions(in_place=False)
    | frozenset(
        {
            "torch.autograd.Variable",
            "torch.autograd.grad",
            "torch.utils.data.TensorDataset",
            "torch.utils.data.DataLoader",
            "torch.utils.data.Subset",
        }
    )
    | frozenset(
        f"numpy.{name}"
        for name in (
            "array asarray stack concatenate mean sum std var min max argmin argmax abs sqrt exp log "
            "clip where zeros_like ones_like full_like copy"
        ).split()
    )
    | frozenset(
        f"math.{name}" for name in "sqrt exp log log2 log10 cos sin tan floor ceil isnan isinf isfinite prod".split()
    )
)
# Tests of a value for NaN or infinity: a guard against a broken step (skip it, stop), not a
# choice between computations.
FINITENESS_TESTS = functions(tests_finiteness=True) | {
    f"{module}.{name}"
    for module in ("math", "numpy")
    for name in ("isfinite", "isnan", "isinf")  # not torch's
}


# ==========================================================================================
# Helpers
# ==========================================================================================

# -- source helpers ------------------------------------------------------------------------


def functional_alias(module: cst.Module) -> str | None:
    """How this file's top-level imports spell torch.nn.functional (`F`,
    `nn.functional`, `torch.nn.functional`), if they do."""
    code = module.code_for_node
    fallback = None
    for line in module.body:
        if not isinstance(line, cst.SimpleStatementLine):
            continue
        for statement in line.body:
            if isinstance(statement, cst.Import):
                for alias in statement.names:
                    bound = alias.asname.name.value if alias.asname is not None else None
                    if code(alias.name) == FUNCTIONAL:
                        return bound or FUNCTIONAL
                    if code(alias.name) == "torch.nn" and bound is not None:
                        fallback = f"{bound}.functional"  # `import torch.nn as nn`; `F` may follow
                    elif code(alias.name) in ("torch", "torch.nn") and bound is None and fallback is None:
                        fallback = FUNCTIONAL  # a shorter alias may follow
            elif (
                isinstance(statement, cst.ImportFrom)
                and statement.module is not None
                and not isinstance(statement.names, cst.ImportStar)
                and not statement.relative
            ):
                source = code(statement.module)
                for alias in statement.names:
                    bound = alias.asname.name.value if alias.asname is not None else alias.name.value
                    if source == "torch.nn" and alias.name.value == "functional":
                        return bound
                    if source == "torch" and alias.name.value == "nn":
                        return f"{bound}.functional"
    return fallback


def is_literal(expr: cst.BaseExpression) -> bool:
    """A number or string written in the code (`-100` too)."""
    if isinstance(expr, (cst.Integer, cst.Float, cst.SimpleString)):
        return True
    return isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus) and is_literal(expr.expression)
