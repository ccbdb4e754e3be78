"""The torch operations perfmod reasons about, as data: one entry per function,
tensor method and `nn` module class, with what it is (its category) and the
facts that cut across categories (it draws from the RNG, it is a loss with
these defaults, CUDA autocast treats it specially, how its result's shape
follows from its arguments, it works on the last dims only, which dim of a
recurrent layer's output runs over time), and where its result is and of
which dtype (by category, `Op.placement` and `Op.result_dtype`, where the
entry does not say). torch's objects that are no operation of their own (module
containers, autocast, grad modes, gradient scalers, a process's device and rank
queries, its settings, torch's types, a checkpoint's load) have entries too, in
categories the views over every category leave out.
Beside it, the tables of a tensor's attributes (`ATTRIBUTES`: views, metadata,
its gradient), of a module's methods (`NN_MODULE_METHODS`: those that return
it, keep it where it is, add hooks, set attributes, set it up, what
DistributedDataParallel answers for it), of torch's dtypes
(`DTYPES`: their names, sizes and the methods that cast to them) and of the
layers whose parameters perfmod counts (`SIZED_LAYERS`: their constructor's
arguments, a recurrent layer's gates).

Analyses and rules ask this table (through `torch_facts`, its view as the name
sets they test membership in) instead of keeping lists of their own, so a fact
is written once and every client reads the same one. tests/analysis/
test_torch_ops.py checks the table against the installed torch: every name
exists, every in-place method is the `_` twin of an entry, each loss's
default reduction and ignore_index are torch's, each shape rule and
last-dims entry gives, on a small tensor, what the table says, each
method's result is where and of the dtype the table says, the module classes
are torch.nn's, each attribute is on a tensor what its entry says, and each
sized layer's arguments and gates are its constructor's and its weights'.

Names are qualified as `names.of` spells them (`torch.nn.functional.cross_entropy`);
methods are keyed `Tensor.<name>`.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import NamedTuple

FUNCTIONAL = "torch.nn.functional"
METHOD = "Tensor."


class Category(enum.Enum):
    UNARY = "elementwise"  # each output element from the same input element, shape kept
    BINARY = "binary elementwise"  # elementwise over broadcast operands
    CAST = "cast"  # the same values in another dtype, device, memory layout or graph
    ALONG_DIM = "along a dim"  # shape kept; an output element reads a slice along one dim
    # Shape and dtype kept, every element moved to another position, in new memory (`roll`, `flip`).
    REARRANGE = "rearrange"
    REDUCTION = "reduction"  # fewer dims: `dim=` (its first argument after the tensor) and `keepdim=` say which
    NORM = "norm"  # a reduction whose first argument after the tensor is the order `p`, then `dim`
    VIEW = "view"  # the same elements in another shape or order
    MATMUL = "matmul"
    FACTORY = "factory"  # a new tensor from sizes or another tensor's shape
    TO_HOST = "to the host"  # a Python number or list of the tensor's values
    LOSS = "loss"
    SAVE = "save"  # writes a checkpoint synchronously
    GRAD_NORM = "gradient norm"  # reads the gradients of the parameters it is given
    RECURRENT = "recurrent module"
    CONVOLUTION = "convolution"  # cuDNN convolutions (TF32 for float32 by default)
    SPARSE = "sparse"  # makes or multiplies sparse tensors
    REPEAT = "repeat"  # copies of its elements repeated into new memory
    JOIN = "join"  # tensors joined along a dim, which it is given after them (`hstack`'s is fixed)
    EMBEDDING = "embedding"  # rows of a weight table picked by integer indices
    METADATA = "metadata"  # what a tensor tells of itself without its values: sizes, rank, kind of dtype
    INDEXING = "indexing"  # elements picked along a dim by a tensor of indices (`gather`, `index_select`)
    EXTREMES = "extremes"  # `max`/`min`: of all elements; (values, indices) along a dim; of two, elementwise
    COMPARISON = "comparison"  # one Python bool of two tensors' values (`equal`, `allclose`)
    MEMORY = "memory"  # what a tensor's storage is, and writes of it whole (`stride`, `copy_`, `set_`)
    AUTOGRAD = "autograd"  # runs the backward pass from a tensor or hooks into it
    # `nn` module classes by what their forward computes (their construction draws nothing):
    ELEMENTWISE_LAYER = "elementwise layer"  # activations and the identity
    NORM_LAYER = "layer along dims"  # norms and softmax: shape kept, an element reads others
    DROPOUT_LAYER = "dropout layer"  # zeroes elements drawn from the RNG, shape kept
    GRAD_CLIP = "gradient clip"  # clips the gradients of the parameters it is given to a value
    POOLING_LAYER = "pooling layer"  # the max or mean of windows of the spatial dims (adaptive: to the size given)
    RESHAPING_LAYER = "reshaping layer"  # its input's values in another shape: flattened, padded, upsampled
    # Distances, covariances and correlations of pairs of rows: matrix products of sizes perfmod does not follow.
    PAIRWISE = "pairwise"
    # torch's objects that are no operation of their own: the views over every category leave them out.
    CONTAINER = "module container"  # an `nn` module that holds others: what it runs is theirs
    WRAPPER = "model wrapper"  # wraps a model: what it runs is the model's forward (`DDP(model)(x)`)
    PROCESS = "process"  # the devices and ranks of the process, and waits for a device's work
    AUTOCAST = "autocast"  # a context manager that runs the ops under it in reduced precision
    GRAD_SCALER = "gradient scaler"  # scales a float16 loss, unscales the gradients before a step
    GRAD_MODE = "grad mode"  # a context manager that turns autograd's recording of a graph on or off
    SETTING = "setting"  # a process-wide setting of torch, or a read of one: seeds, threads, defaults, precision
    TYPES = "types"  # torch's types and its rules over them: a device, a dtype's limits, promotion, broadcasting
    LOAD = "load"  # reads a checkpoint: its tensors are where `map_location` says, else where they were saved
    # `F.batch_norm`: in training mode it writes the running statistics it is given, so it is
    # neither pure nor read-only as the views over every category would take it to be.
    BATCH_NORM = "batch norm"


class Shape(enum.Enum):
    """How the shape of the result follows from the arguments, for the entries whose
    category does not say it (an elementwise op keeps its input's shape)."""

    SIZES = "the sizes it is given"  # `view(B, -1)`, `expand` (-1 keeps a dim), `repeat` (a factor a dim)
    REORDERED = "its dims reordered"  # `transpose(1, 2)`, `permute`, `movedim`
    SQUEEZED = "a dim inserted, removed or merged"  # `unsqueeze`, `squeeze`, `flatten`, `unflatten`
    NEW = "new from sizes"  # its positional arguments, or one tuple of them, are the shape
    FILLED = "new from a size and a value"  # `full((B, T), v)`: the shape first, then the fill value
    LIKE = "its first argument's"  # `zeros_like(x)`
    SPLIT = "pieces along a dim, sized first"  # `split(4, dim=-1)`: a size, count or indices, then the dim
    SLICES = "its slices along a dim"  # `unbind(1)`: a tuple of tensors, one dim fewer each
    JOINED = "joined along a dim"  # `cat([a, b], 1)`: their dims, dim 1 the sum of theirs
    STACKED = "stacked along a new dim"  # `stack([a, b], 1)`: their shape with a new dim 1
    PRODUCT = "a matrix product"  # `matmul(a, b)`: a's leading dims (broadcast), a's rows, b's columns
    BOUNDED = "new from bounds, then sizes"  # `randint(low, high, size)`, `randint(high, size)`
    STEPS = "one dim of its `steps`"  # `linspace(start, end, steps)`
    DATA = "the nesting of the data it is given"  # `tensor([[0.5, 1.0], [2.0, 3.0]])`: (2, 2)


class Placement(enum.Enum):
    """Where the result of an op is (`Op.placement`: by its category, where the entry does not say)."""

    OPERANDS = "where its tensor operands are"  # a method's receiver is one
    TOLD = "the device it is told"  # `device=`, `.to(device)`, `.cuda()`; else the default device
    HOST = "the host's memory"  # `.cpu()`, `torch.from_numpy(a)`
    NO_TENSOR = "no tensor"  # a Python value, an iterator, nothing


_CATEGORY_PLACEMENT = {
    Category.FACTORY: Placement.TOLD,
    Category.TO_HOST: Placement.NO_TENSOR,
    Category.METADATA: Placement.NO_TENSOR,
    Category.COMPARISON: Placement.NO_TENSOR,
    Category.MEMORY: Placement.NO_TENSOR,
    Category.AUTOGRAD: Placement.NO_TENSOR,
    Category.SAVE: Placement.NO_TENSOR,
    Category.PROCESS: Placement.NO_TENSOR,
    Category.AUTOCAST: Placement.NO_TENSOR,
    Category.GRAD_SCALER: Placement.NO_TENSOR,
    Category.GRAD_MODE: Placement.NO_TENSOR,
    Category.SETTING: Placement.NO_TENSOR,
    Category.TYPES: Placement.NO_TENSOR,
    Category.LOAD: Placement.TOLD,
}
_NOT_OPERATIONS = (
    Category.CONTAINER,
    Category.WRAPPER,
    Category.PROCESS,
    Category.AUTOCAST,
    Category.GRAD_SCALER,
    Category.GRAD_MODE,
    Category.SETTING,
    Category.TYPES,
    Category.LOAD,
    Category.BATCH_NORM,
)
_OPERATIONS = tuple(category for category in Category if category not in _NOT_OPERATIONS)
# What an op's result dtype may be, beside the name of one of DTYPES: some floating dtype
# whatever its operands' (`mean` of any tensor), its receiver's, or the one its argument names.
FLOATING = "floating"
KEPT = "kept"
NAMED = "named"
# Categories of ops that change something or run something beside their result: the RNG's
# and in-place writes aside, a checkpoint, the gradients, the backward pass, storage.
_EFFECTS = (Category.SAVE, Category.GRAD_NORM, Category.GRAD_CLIP, Category.AUTOGRAD, Category.MEMORY)
# Module classes of these categories build weights drawn from the RNG (`nn.Linear`, `nn.LSTM`).
_WEIGHTED = (Category.MATMUL, Category.CONVOLUTION, Category.RECURRENT, Category.EMBEDDING)


class Dtype(NamedTuple):
    name: str  # `torch.<name>`
    bytes: int  # of one element
    kind: str  # "float", "complex", "int" or "bool"
    aliases: tuple[str, ...] = ()  # its other names in torch (`torch.half`)
    cast: str | None = None  # the tensor method that casts to it (`x.half()`)

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)


DTYPES = [
    Dtype("float32", 4, "float", ("float",), "float"),
    Dtype("float64", 8, "float", ("double",), "double"),
    Dtype("float16", 2, "float", ("half",), "half"),
    Dtype("bfloat16", 2, "float", (), "bfloat16"),
    Dtype("float8_e4m3fn", 1, "float"),
    Dtype("float8_e5m2", 1, "float"),
    Dtype("complex32", 4, "complex", ("chalf",)),
    Dtype("complex64", 8, "complex", ("cfloat",)),
    Dtype("complex128", 16, "complex", ("cdouble",)),
    Dtype("int64", 8, "int", ("long",), "long"),
    Dtype("int32", 4, "int", ("int",), "int"),
    Dtype("int16", 2, "int", ("short",), "short"),
    Dtype("int8", 1, "int", (), "char"),
    Dtype("uint8", 1, "int", (), "byte"),
    Dtype("bool", 1, "bool", (), "bool"),
]
DTYPE_OF: dict[str, Dtype] = {name: dtype for dtype in DTYPES for name in dtype.names}  # by each name
_CAST_DTYPES = {dtype.cast: dtype.name for dtype in DTYPES if dtype.cast is not None}


class Loss(NamedTuple):
    functional: str  # the function (last part of its name) that computes it
    reduction: str = "mean"  # torch's default
    ignore_index: int | None = None  # torch's default, for losses over class targets
    counted: bool = False  # its mean divides by the targets that count (ignore_index, class weights)
    # Its mean is the sum of per-element losses over their number (over the counted targets,
    # where `counted`): the rules that batch or split a loss know how to keep such a mean.
    per_element: bool = True
    # Its target holds one class a sample (input `(N, C, ...)`, target `(N, ...)`): the
    # unreduced loss has the target's shape. Otherwise input and target have one shape and
    # the unreduced loss has it too, one loss an element.
    class_targets: bool = False
    # It takes `reduction="batchmean"`: the sum over every element divided by the input's
    # first size, `input.size(0)` (KL divergence; its "mean" divides by every element).
    batchmean: bool = False
    # Keywords that change each element's loss, not how the losses are reduced.
    options: tuple[str, ...] = ()


# The keywords torch's losses took before `reduction=`: torch still honours them, and when
# either is given it overrides `reduction=` (`torch.nn._reduction.legacy_get_string`).
LEGACY_REDUCTION_KEYWORDS = ("size_average", "reduce")


def legacy_reduction(size_average: bool | None, reduce: bool | None) -> str:
    """The reduction a loss runs with when given the legacy keywords (None: not given,
    which torch reads as True): `reduce=False` keeps every element's loss, and
    `size_average=False` sums them."""
    if reduce is False:
        return "none"
    return "sum" if size_average is False else "mean"


class Op(NamedTuple):
    name: str
    category: Category
    random: bool = False  # its values are drawn from the global RNG
    loss: Loss | None = None
    autocast_refused: str | None = None  # CUDA autocast raises for it; the form to use instead
    autocast_float16: bool = False  # CUDA autocast runs it in float16 whatever dtype it was given
    syncs: bool = False  # the host waits for the device (a copy to the host, a value read)
    shares: bool = False  # its result may be its receiver, or a view of the receiver's storage
    # It makes no new memory, ever: its result views its receiver's storage, an array's or a
    # buffer's, made in constant time whatever their size (`view`, `unsqueeze`, `from_numpy`).
    no_copy: bool = False
    uninitialized: bool = False  # a new tensor whose memory is not written: its values are whatever was there
    # Why torch.compile leaves it to eager mode: dynamo (as installed) breaks the graph there.
    compile_breaks: str | None = None
    shape: Shape | None = None  # how its result's shape follows, where the category does not say
    # It works on the last dims whatever its arguments say (`tril`'s diagonal, a matmul's
    # matrices, `layer_norm`'s normalized shape): the leading dims are batch dims it keeps.
    last_dims: bool = False
    # A recurrent layer: the dim of its output (the first item it returns) that runs over
    # the sequence's steps by default, and the constructor keyword that makes it dim 1.
    steps_dim: int | None = None
    batch_first: str | None = None
    place: Placement | None = None  # where its result is, where its category does not say
    # Its result's dtype (a DTYPES name, FLOATING, KEPT, NAMED), where its category does not say.
    dtype: str | None = None
    python: str | None = None  # the Python type of its result where that is no tensor ("int")
    # A mask given to it comes out a mask of the same positions set: a cast, a move, a copy,
    # a view that may only add or broadcast dims (`view(1, T, T)`).
    keeps_mask: bool = False
    tests_finiteness: bool = False  # it tells, element by element, whether a value is NaN or infinite
    # A step of a time loop may pass its state through it and still be an elementwise
    # recurrence (maybe non-linear): elementwise math, reductions, products, moving dims.
    recurrence: bool = False
    # It clips the gradients of the parameters it is given to what it computes from them (a
    # total norm) or is told (a value): the clipping of a step (not `clip_grads_with_norm_`,
    # which is handed a norm computed before it).
    clips: bool = False
    fills: bool = False  # it writes one value to every element, whatever they held (`zero_`, `fill_`)
    # In training mode a sample's output depends on the other samples of its batch (batch statistics).
    mixes_batch: bool = False
    # Its batch statistics are gathered over every process of a data-parallel run (SyncBatchNorm).
    across_ranks: bool = False
    # An `nn` layer whose input may have any leading dims (`(*)` in torch's docs), each row
    # computed alone, where neither its category nor `last_dims` says so (`nn.Embedding`).
    any_leading_dims: bool = False
    stateless: bool = False  # an `nn` layer without parameters or buffers
    # A dropout: where it takes its probability of zeroing an element, (position, keyword) of
    # a module's construction or a function's call.
    drop_probability: tuple[int, str] | None = None
    device_probe: str | None = None  # its value tells whether the process has a device of this type
    compiles: bool = False  # it compiles what it is given with TorchDynamo
    records_graph: bool | None = None  # a grad mode: autograd records a graph under it (None: as its argument says)
    frees_cache: bool = False  # it hands the device memory its caching allocator holds unused back
    float32_precision: bool = False  # it sets whether float32 products run in TF32 or in full
    measures: bool = False  # it answers a size of the tensor: a length, a count of elements or dims
    totals: bool = False  # given the tensor alone, it adds up or averages every element
    permutes: bool = False  # a random permutation of `range(n)`
    accelerator: bool = False  # it moves to an accelerator whatever its argument says (`x.cuda()`)
    # A container built of a "list" of modules (they are the container, by position) or of a
    # "dict" of them (they are its `.values()`, by key).
    holds: str | None = None

    @property
    def placement(self) -> Placement:
        return self.place or _CATEGORY_PLACEMENT.get(self.category, Placement.OPERANDS)

    @property
    def result_dtype(self) -> str | None:
        """The dtype of its result, whatever its operands' are (None: it depends on them):
        a cast's is the one it is named after, a view's is its receiver's."""
        if self.dtype is not None:
            return self.dtype
        short = self.name.rpartition(".")[2]
        if self.category is Category.CAST:
            return _CAST_DTYPES.get(short, KEPT)
        if self.category is Category.VIEW and self.shape not in (Shape.SPLIT, Shape.SLICES):
            return KEPT
        return None

    @property
    def result_kind(self) -> str | None:
        """The kind of its result's dtype whatever its operands' ("float", "complex", "int",
        "bool"), or None."""
        dtype = self.result_dtype
        return "float" if dtype == FLOATING else DTYPE_OF[dtype].kind if dtype in DTYPE_OF else None

    @property
    def pure(self) -> bool:
        """It computes a new value and changes nothing: no draw from the RNG, no write in
        place, no checkpoint written, no gradients read, no backward run, no storage set,
        no module built that draws its weights (a loss module has none)."""
        weighted = self.module and self.category in _WEIGHTED
        return not (self.random or self.in_place or self.category in _EFFECTS or weighted)

    @property
    def in_place(self) -> bool:
        """It writes its result into its receiver or argument: torch spells these with a trailing
        `_` (not the `__` of Python's protocol, `__len__`)."""
        return self.name.endswith("_") and not self.name.endswith("__")

    @property
    def module(self) -> bool:
        """It is an `nn` module class: calling it builds a module, its forward computes."""
        return self.name.startswith("torch.nn.") and self.short[:1].isupper()

    @property
    def short(self) -> str:
        """The last part of its name: what it computes (`softmax` of `torch.softmax` and `F.softmax`)."""
        return self.name.rpartition(".")[2]


class Attr(NamedTuple):
    """An attribute of a tensor (`x.T`, `x.shape`), in the terms of an op's facts."""

    name: str
    category: Category  # a view (`T`), a cast (`data`, the tensor detached), metadata, autograd's (`grad`)
    shares: bool = False  # it is a view of the tensor's storage
    dtype: str | None = None  # KEPT: a tensor of the tensor's dtype; None: its dtype depends
    recurrence: bool = False  # as `Op.recurrence`
    # Assigning it replaces the tensor's contents in place, dtype included: `p.data = p.data.half()`
    # makes the parameter `p` itself float16.
    replaces_tensor: bool = False


def _ops(category: Category, names: str, *, prefixes: Iterable[str] = ("torch.",), **facts) -> list[Op]:
    return [Op(prefix + name, category, **facts) for prefix in prefixes for name in names.split()]


# Unary elementwise math, as torch functions and as tensor methods.
_UNARY = (
    "exp log log1p expm1 sigmoid tanh relu sqrt rsqrt sin cos square reciprocal sign "
    "clamp clamp_min clamp_max erf nan_to_num floor ceil round trunc frac log2 log10 exp2 "
    "sinh cosh tan asin acos atan erfc erfinv logit"
)
_ACTIVATIONS = "silu gelu relu elu leaky_relu softplus sigmoid tanh logsigmoid mish hardswish relu6 selu celu"
# Casts return their receiver when there is nothing to do (`x.float()` of a float tensor).
_CASTS = "float double half bfloat16 long int short bool byte char contiguous"
_VIEWS = "view_as t expand_as narrow as_strided select diagonal"
_ELEMENTWISE_LAYERS = (
    "GELU ReLU SiLU Tanh Sigmoid Identity Softplus ELU LeakyReLU Mish Hardswish ReLU6 SELU CELU Hardtanh"
)
_BATCH_NORMS = "BatchNorm1d BatchNorm2d BatchNorm3d LazyBatchNorm1d LazyBatchNorm2d LazyBatchNorm3d"
_POOLING_LAYERS = (
    "MaxPool1d MaxPool2d MaxPool3d AvgPool1d AvgPool2d AvgPool3d AdaptiveAvgPool1d AdaptiveAvgPool2d "
    "AdaptiveAvgPool3d AdaptiveMaxPool1d AdaptiveMaxPool2d"
)
_RESHAPING_LAYERS = "Flatten Unflatten Upsample PixelShuffle ZeroPad2d ReflectionPad2d ReplicationPad2d ConstantPad2d"
# torch's settings of the process, and its reads of them.
_SETTINGS = (
    "manual_seed seed initial_seed set_rng_state set_num_threads get_num_threads "
    "set_num_interop_threads get_default_dtype set_default_dtype get_default_device set_default_device "
    "use_deterministic_algorithms is_grad_enabled get_float32_matmul_precision set_printoptions"
)
_DROPOUT_LAYERS = "Dropout Dropout1d Dropout2d Dropout3d AlphaDropout FeatureAlphaDropout"
_REORDERING = "transpose permute movedim swapaxes swapdims"
# A tensor's Python protocol: numbers, text and arrays of its values.
_PYTHON_CONVERSIONS = "__bool__ __int__ __float__ __index__ __repr__ __str__ __format__"
_RNN = "LSTM GRU RNN"  # cuDNN's RNN path casts to float16 under CUDA autocast (AutocastRNN.cpp)
# Functions, methods and module classes that multiply matrices (cuBLAS on CUDA): the
# float32 work that TF32 speeds up. A module class is here when its forward runs one.
_MATMUL_FUNCTIONS = "baddbmm addmm addbmm addmv mv dot inner tensordot chain_matmul bilinear"
_MATMUL_METHODS = "mv dot baddbmm addmm addbmm addmv inner"
_MATMUL_FUNCTIONALS = "bilinear multi_head_attention_forward"
_MATMUL_MODULES = (
    "LazyLinear Bilinear MultiheadAttention Transformer TransformerEncoder TransformerDecoder "
    "TransformerEncoderLayer TransformerDecoderLayer RNNCell LSTMCell GRUCell AdaptiveLogSoftmaxWithLoss "
    "LinearCrossEntropyLoss"
)
_CONVOLUTIONS = "conv1d conv2d conv3d conv_transpose1d conv_transpose2d conv_transpose3d"
_CONVOLUTION_MODULES = (
    "Conv1d Conv2d Conv3d ConvTranspose1d ConvTranspose2d ConvTranspose3d LazyConv1d LazyConv2d LazyConv3d "
    "LazyConvTranspose1d LazyConvTranspose2d LazyConvTranspose3d"
)
_BCE = "BCEWithLogitsLoss / binary_cross_entropy_with_logits"
# torch 2.13's dynamo (torch/_dynamo/variables/builder.py) refuses to trace these and breaks the graph.
_RNN_BREAK = (
    "dynamo does not trace `nn.LSTM`, `nn.GRU` or `nn.RNN` (`torch._dynamo.config.allow_rnn` is False): "
    "the compiled forward breaks its graph there and runs the recurrence in eager mode"
)
_SPARSE_BREAK = (
    "torch.compile does not support sparse tensors: dynamo breaks the graph at each one and runs "
    "that code in eager mode"
)
_LOSSES = {  # module class: its function and torch's defaults
    "CrossEntropyLoss": Loss(
        "cross_entropy",
        ignore_index=-100,
        counted=True,
        class_targets=True,
        options=("weight", "ignore_index", "label_smoothing"),
    ),
    "NLLLoss": Loss(
        "nll_loss", ignore_index=-100, counted=True, class_targets=True, options=("weight", "ignore_index")
    ),
    "MSELoss": Loss("mse_loss"),
    "L1Loss": Loss("l1_loss"),
    "SmoothL1Loss": Loss("smooth_l1_loss", options=("beta",)),
    "HuberLoss": Loss("huber_loss", options=("delta",)),
    "BCELoss": Loss("binary_cross_entropy"),
    "BCEWithLogitsLoss": Loss("binary_cross_entropy_with_logits"),
    "KLDivLoss": Loss("kl_div", batchmean=True, options=("log_target",)),
    # Means of another kind (per target length, per pair, ...): known as losses, never rewritten.
    "CTCLoss": Loss("ctc_loss", per_element=False),
    "PoissonNLLLoss": Loss("poisson_nll_loss", per_element=False),
    "GaussianNLLLoss": Loss("gaussian_nll_loss", per_element=False),
    "MarginRankingLoss": Loss("margin_ranking_loss", per_element=False),
    "HingeEmbeddingLoss": Loss("hinge_embedding_loss", per_element=False),
    "CosineEmbeddingLoss": Loss("cosine_embedding_loss", per_element=False),
    "SoftMarginLoss": Loss("soft_margin_loss", per_element=False),
    "MultiLabelMarginLoss": Loss("multilabel_margin_loss", per_element=False),
    "MultiLabelSoftMarginLoss": Loss("multilabel_soft_margin_loss", per_element=False),
    "MultiMarginLoss": Loss("multi_margin_loss", per_element=False),
    "TripletMarginLoss": Loss("triplet_margin_loss", per_element=False),
    "TripletMarginWithDistanceLoss": Loss("triplet_margin_with_distance_loss", per_element=False),
}

ENTRIES: list[Op] = [
    *_ops(Category.UNARY, _UNARY, prefixes=("torch.", METHOD)),
    *_ops(Category.UNARY, _ACTIVATIONS, prefixes=(f"{FUNCTIONAL}.",)),
    *_ops(Category.UNARY, "expit", prefixes=("torch.special.",)),
    *_ops(Category.UNARY, "abs neg", prefixes=("torch.", METHOD), dtype=KEPT),
    *_ops(Category.UNARY, "isnan isinf isfinite", prefixes=("torch.", METHOD), dtype="bool", tests_finiteness=True),
    *_ops(Category.UNARY, "logical_not", prefixes=("torch.", METHOD), dtype="bool"),
    *_ops(Category.UNARY, "exp_ sigmoid_ tanh_ relu_ clamp_", prefixes=(METHOD,)),
    *_ops(Category.UNARY, "zero_ fill_", prefixes=(METHOD,), fills=True),
    *_ops(Category.BINARY, "pow mul add sub div float_power lerp masked_fill", prefixes=(METHOD,)),
    *_ops(Category.BINARY, "pow where add sub mul div"),
    *_ops(Category.BINARY, "maximum minimum fmod remainder atan2", prefixes=("torch.", METHOD)),
    *_ops(Category.BINARY, "eq ne lt le gt ge", prefixes=("torch.", METHOD), dtype="bool"),
    *_ops(Category.BINARY, "mul_ add_ div_ sub_ masked_fill_", prefixes=(METHOD,)),
    *_ops(Category.CAST, _CASTS, prefixes=(METHOD,), shares=True),
    *_ops(Category.CAST, "to type", prefixes=(METHOD,), shares=True, place=Placement.TOLD, dtype=NAMED),
    *_ops(Category.CAST, "type_as", prefixes=(METHOD,), shares=True, dtype=NAMED),
    *_ops(Category.CAST, "cuda", prefixes=(METHOD,), shares=True, place=Placement.TOLD),
    *_ops(Category.CAST, "pin_memory", prefixes=(METHOD,), shares=True, place=Placement.HOST),
    *_ops(Category.CAST, "clone", prefixes=(METHOD,)),
    *_ops(Category.CAST, "detach", prefixes=(METHOD,), shares=True, no_copy=True),
    *_ops(Category.CAST, "detach_ requires_grad_", prefixes=(METHOD,), shares=True),
    # `reshape`, `reshape_as` and `flatten` copy a tensor whose strides no view can follow.
    *_ops(Category.VIEW, _VIEWS, prefixes=(METHOD,), shares=True, no_copy=True),
    *_ops(Category.VIEW, "reshape_as", prefixes=(METHOD,), shares=True),
    *_ops(Category.VIEW, "view expand", prefixes=(METHOD,), shares=True, no_copy=True, shape=Shape.SIZES),
    *_ops(Category.VIEW, "reshape", prefixes=("torch.", METHOD), shares=True, shape=Shape.SIZES),
    *_ops(
        Category.VIEW,
        "transpose permute",
        prefixes=("torch.", METHOD),
        shares=True,
        no_copy=True,
        shape=Shape.REORDERED,
    ),
    *_ops(
        Category.VIEW, "movedim swapaxes swapdims", prefixes=(METHOD,), shares=True, no_copy=True, shape=Shape.REORDERED
    ),
    *_ops(
        Category.VIEW, "squeeze unsqueeze", prefixes=("torch.", METHOD), shares=True, no_copy=True, shape=Shape.SQUEEZED
    ),
    *_ops(Category.VIEW, "flatten", prefixes=("torch.", METHOD), shares=True, shape=Shape.SQUEEZED),
    *_ops(Category.VIEW, "unflatten", prefixes=(METHOD,), shares=True, no_copy=True, shape=Shape.SQUEEZED),
    *_ops(Category.VIEW, "split chunk tensor_split", prefixes=(METHOD,), shares=True, no_copy=True, shape=Shape.SPLIT),
    *_ops(Category.VIEW, "unbind", prefixes=(METHOD,), shares=True, no_copy=True, shape=Shape.SLICES),
    *_ops(Category.VIEW, "__iter__", prefixes=(METHOD,), shares=True, shape=Shape.SLICES, place=Placement.NO_TENSOR),
    *_ops(Category.REPEAT, "repeat", prefixes=(METHOD,), shape=Shape.SIZES),
    *_ops(Category.JOIN, "cat concat concatenate", shape=Shape.JOINED),
    *_ops(Category.JOIN, "stack", shape=Shape.STACKED),
    *_ops(Category.JOIN, "hstack vstack"),
    *_ops(Category.INDEXING, "gather index_select", prefixes=("torch.", METHOD)),
    *_ops(Category.EXTREMES, "max min", prefixes=("torch.", METHOD), dtype=KEPT),
    *_ops(
        Category.METADATA,
        "size dim numel ndimension nelement element_size get_device is_floating_point is_complex __len__",
        prefixes=(METHOD,),
    ),
    *_ops(Category.MEMORY, "stride storage untyped_storage storage_offset data_ptr record_stream", prefixes=(METHOD,)),
    # ... and those that write it whole: they return their receiver.
    *_ops(Category.MEMORY, "copy_ set_ share_memory_", prefixes=(METHOD,), place=Placement.OPERANDS),
    *_ops(Category.AUTOGRAD, "backward register_hook retain_grad", prefixes=(METHOD,)),
    *_ops(Category.COMPARISON, "equal allclose", prefixes=("torch.", METHOD), syncs=True),
    *_ops(Category.ALONG_DIM, "softmax log_softmax cumsum cumprod", prefixes=("torch.", METHOD)),
    *_ops(Category.ALONG_DIM, "tril triu", prefixes=("torch.", METHOD), last_dims=True),
    *_ops(Category.ALONG_DIM, "argsort", prefixes=("torch.", METHOD), dtype="int64"),
    *_ops(Category.REARRANGE, "roll flip fliplr flipud", prefixes=("torch.", METHOD), dtype=KEPT),
    *_ops(Category.ALONG_DIM, "softmax log_softmax normalize", prefixes=(f"{FUNCTIONAL}.",)),
    *_ops(Category.ALONG_DIM, "layer_norm", prefixes=(f"{FUNCTIONAL}.",), last_dims=True),
    *_ops(Category.ALONG_DIM, "softmax", prefixes=("torch.special.",)),
    *_ops(Category.REDUCTION, "sum prod logsumexp", prefixes=("torch.", METHOD)),
    *_ops(Category.REDUCTION, "mean std var", prefixes=("torch.", METHOD), dtype=FLOATING),
    *_ops(Category.REDUCTION, "amax amin", prefixes=("torch.", METHOD), dtype=KEPT),
    *_ops(Category.REDUCTION, "argmax argmin count_nonzero", prefixes=("torch.", METHOD), dtype="int64"),
    *_ops(Category.NORM, "norm", prefixes=("torch.", METHOD), dtype=FLOATING),
    *_ops(Category.MATMUL, "einsum outer"),
    *_ops(Category.MATMUL, "bmm mm", prefixes=("torch.", METHOD), shape=Shape.PRODUCT),
    *_ops(Category.MATMUL, "matmul", prefixes=("torch.", METHOD), last_dims=True, shape=Shape.PRODUCT),
    *_ops(Category.MATMUL, _MATMUL_FUNCTIONS),
    *_ops(Category.MATMUL, "matmul multi_dot", prefixes=("torch.linalg.",)),
    *_ops(Category.MATMUL, _MATMUL_METHODS, prefixes=(METHOD,)),
    *_ops(Category.MATMUL, _MATMUL_FUNCTIONALS, prefixes=(f"{FUNCTIONAL}.",)),
    *_ops(Category.MATMUL, "linear scaled_dot_product_attention", prefixes=(f"{FUNCTIONAL}.",), last_dims=True),
    *_ops(Category.MATMUL, _MATMUL_MODULES, prefixes=("torch.nn.",)),
    *_ops(Category.MATMUL, "Linear", prefixes=("torch.nn.", "torch.nn.modules.linear."), last_dims=True),
    *_ops(Category.EMBEDDING, "embedding", prefixes=(f"{FUNCTIONAL}.",), last_dims=True),
    *_ops(Category.ELEMENTWISE_LAYER, _ELEMENTWISE_LAYERS, prefixes=("torch.nn.",)),
    *_ops(Category.NORM_LAYER, "LayerNorm RMSNorm", prefixes=("torch.nn.",), last_dims=True),
    *_ops(Category.NORM_LAYER, "GroupNorm", prefixes=("torch.nn.",)),
    *_ops(Category.NORM_LAYER, "Softmax", prefixes=("torch.nn.", "torch.nn.modules.activation.")),
    *_ops(Category.NORM_LAYER, "LogSoftmax", prefixes=("torch.nn.",)),
    *_ops(Category.NORM_LAYER, _BATCH_NORMS, prefixes=("torch.nn.", "torch.nn.modules.batchnorm."), mixes_batch=True),
    *_ops(
        Category.NORM_LAYER,
        "SyncBatchNorm",
        prefixes=("torch.nn.", "torch.nn.modules.batchnorm."),
        mixes_batch=True,
        across_ranks=True,
    ),
    *_ops(Category.BATCH_NORM, "batch_norm", prefixes=(f"{FUNCTIONAL}.",), mixes_batch=True),
    *_ops(Category.POOLING_LAYER, _POOLING_LAYERS, prefixes=("torch.nn.",)),
    *_ops(Category.RESHAPING_LAYER, _RESHAPING_LAYERS, prefixes=("torch.nn.",)),
    *_ops(
        Category.DROPOUT_LAYER,
        _DROPOUT_LAYERS,
        prefixes=("torch.nn.", "torch.nn.modules.dropout."),
        drop_probability=(0, "p"),
    ),
    *_ops(Category.EMBEDDING, "Embedding", prefixes=("torch.nn.",)),
    *_ops(Category.PAIRWISE, "cdist cov corrcoef"),  # not `F.pdist`: its own kernel, no product
    *_ops(Category.CONVOLUTION, _CONVOLUTIONS, prefixes=("torch.", f"{FUNCTIONAL}.")),
    *_ops(Category.CONVOLUTION, _CONVOLUTION_MODULES, prefixes=("torch.nn.",)),
    *_ops(Category.CAST, "cpu", prefixes=(METHOD,), syncs=True, shares=True, place=Placement.HOST),
    *_ops(Category.TO_HOST, "item tolist", prefixes=(METHOD,), syncs=True),
    *_ops(Category.TO_HOST, "is_nonzero", syncs=True),
    *_ops(Category.TO_HOST, _PYTHON_CONVERSIONS, prefixes=(METHOD,), syncs=True),
    *_ops(
        Category.TO_HOST, "numpy __array__", prefixes=(METHOD,), shares=True, no_copy=True
    ),  # the same memory; host tensors only
    *_ops(
        Category.UNARY,
        "dropout dropout1d dropout2d dropout3d alpha_dropout feature_alpha_dropout",
        prefixes=(f"{FUNCTIONAL}.",),
        random=True,
        drop_probability=(1, "p"),
    ),
    *_ops(Category.UNARY, "dropout", random=True, drop_probability=(1, "p")),  # `torch.dropout(x, p, train)`
    *_ops(Category.UNARY, "gumbel_softmax", prefixes=(f"{FUNCTIONAL}.",), random=True),
    *_ops(Category.FACTORY, "tensor as_tensor", shape=Shape.DATA),
    *_ops(
        Category.FACTORY,
        "arange eye hann_window hamming_window blackman_window bartlett_window kaiser_window",
    ),
    *_ops(Category.FACTORY, "tril_indices triu_indices", dtype="int64"),
    *_ops(Category.FACTORY, "linspace logspace", shape=Shape.STEPS),
    *_ops(
        Category.FACTORY, "from_numpy frombuffer", place=Placement.HOST, no_copy=True
    ),  # the memory of an array, a buffer
    *_ops(Category.FACTORY, "zeros ones", shape=Shape.NEW),
    *_ops(Category.FACTORY, "full", shape=Shape.FILLED),
    *_ops(Category.FACTORY, "zeros_like ones_like full_like", shape=Shape.LIKE),
    *_ops(Category.FACTORY, "empty", uninitialized=True, shape=Shape.NEW),
    *_ops(Category.FACTORY, "empty_like", uninitialized=True, shape=Shape.LIKE),
    # A tensor's factories make theirs where it is (unless told otherwise).
    *_ops(Category.FACTORY, "new_zeros new_ones", prefixes=(METHOD,), shape=Shape.NEW, place=Placement.OPERANDS),
    *_ops(Category.FACTORY, "new_full", prefixes=(METHOD,), shape=Shape.FILLED, place=Placement.OPERANDS),
    *_ops(
        Category.FACTORY,
        "new_empty",
        prefixes=(METHOD,),
        uninitialized=True,
        shape=Shape.NEW,
        place=Placement.OPERANDS,
    ),
    *_ops(
        Category.FACTORY,
        "generate_square_subsequent_mask",
        prefixes=("torch.nn.Transformer.", "torch.nn.modules.transformer.Transformer."),
    ),
    *_ops(Category.FACTORY, "normal", random=True),  # new tensors drawn from the RNG
    *_ops(Category.FACTORY, "randint", random=True, dtype="int64", shape=Shape.BOUNDED),
    *_ops(Category.FACTORY, "randperm", random=True, dtype="int64", permutes=True),
    # indices drawn by the weights it is given, where they are
    *_ops(
        Category.FACTORY,
        "multinomial",
        prefixes=("torch.", METHOD),
        random=True,
        dtype="int64",
        place=Placement.OPERANDS,
    ),
    *_ops(Category.FACTORY, "rand randn", random=True, shape=Shape.NEW),
    *_ops(Category.FACTORY, "rand_like randn_like randint_like", random=True, shape=Shape.LIKE),
    *_ops(Category.UNARY, "bernoulli poisson", random=True),  # a draw per element of the argument
    *_ops(Category.UNARY, "bernoulli", prefixes=(METHOD,), random=True),
    *_ops(
        Category.UNARY,
        "bernoulli_ normal_ uniform_ random_ exponential_ geometric_ cauchy_ log_normal_",
        prefixes=(METHOD,),
        random=True,
    ),
    *_ops(Category.SAVE, "save", prefixes=("torch.", "torch.serialization.")),
    *_ops(Category.SAVE, "save_file save_model", prefixes=("safetensors.torch.",)),
    *_ops(Category.GRAD_NORM, "clip_grad_norm_ clip_grad_norm", prefixes=("torch.nn.utils.",), clips=True),
    *_ops(Category.GRAD_NORM, "get_total_norm clip_grads_with_norm_", prefixes=("torch.nn.utils.",)),
    *_ops(Category.GRAD_NORM, "clip_grad_norm_", prefixes=("torch.nn.utils.clip_grad.",), clips=True),
    *_ops(
        Category.RECURRENT,
        _RNN,
        prefixes=("torch.nn.", "torch.nn.modules.rnn."),
        autocast_float16=True,
        compile_breaks=_RNN_BREAK,
        steps_dim=0,  # (T, B, H) unless batch_first=True
        batch_first="batch_first",
    ),
    *_ops(Category.SPARSE, "spmm hspmm smm sspaddmm sparse_coo_tensor sparse_csr_tensor", compile_breaks=_SPARSE_BREAK),
    *_ops(Category.SPARSE, "mm addmm", prefixes=("torch.sparse.",), compile_breaks=_SPARSE_BREAK),
    *_ops(Category.SPARSE, "to_sparse to_sparse_coo to_sparse_csr", prefixes=(METHOD,), compile_breaks=_SPARSE_BREAK),
    *_ops(
        Category.GRAD_CLIP,
        "clip_grad_value_",
        prefixes=("torch.nn.utils.", "torch.nn.utils.clip_grad."),
        clips=True,
    ),
    *_ops(Category.CONTAINER, "Sequential", prefixes=("torch.nn.",)),
    *_ops(Category.CONTAINER, "ModuleList", prefixes=("torch.nn.", "torch.nn.modules.container."), holds="list"),
    *_ops(Category.CONTAINER, "ModuleDict", prefixes=("torch.nn.", "torch.nn.modules.container."), holds="dict"),
    *_ops(
        Category.WRAPPER,
        "DistributedDataParallel",
        prefixes=("torch.nn.parallel.", "torch.nn.parallel.distributed."),
    ),
    *_ops(
        Category.WRAPPER,
        "DataParallel",
        prefixes=("torch.nn.", "torch.nn.parallel.", "torch.nn.parallel.data_parallel."),
    ),
    *_ops(Category.WRAPPER, "compile", compiles=True),
    *_ops(Category.PROCESS, "device_count", prefixes=("torch.cuda.",), python="int", device_probe="cuda"),
    *_ops(Category.PROCESS, "current_device", prefixes=("torch.cuda.",), python="int"),
    *_ops(Category.PROCESS, "is_available", prefixes=("torch.cuda.",), python="bool", device_probe="cuda"),
    # The CUDA caching allocator's hand-back of the memory it holds unused.
    *_ops(Category.PROCESS, "empty_cache", prefixes=("torch.cuda.", "torch.cuda.memory."), frees_cache=True),
    *_ops(Category.PROCESS, "device_count current_device_index", prefixes=("torch.accelerator.",), python="int"),
    *_ops(
        Category.PROCESS, "get_rank get_world_size get_node_local_rank", prefixes=("torch.distributed.",), python="int"
    ),
    # The wait for a device's work, of torch's devices and of out-of-tree ones (torch_npu, Intel Gaudi's).
    *_ops(
        Category.PROCESS,
        "synchronize",
        prefixes=tuple(f"torch.{device}." for device in ("cuda", "mps", "xpu", "accelerator", "npu", "hpu")),
        syncs=True,
    ),
    *_ops(
        Category.AUTOCAST,
        "autocast",
        prefixes=(
            "torch.",
            "torch.amp.",
            "torch.cuda.amp.",
            "torch.cuda.amp.autocast_mode.",
            "torch.cpu.amp.",
            "torch.cpu.amp.autocast_mode.",
        ),
    ),
    *_ops(
        Category.GRAD_SCALER,
        "GradScaler",
        prefixes=("torch.", "torch.amp.", "torch.amp.grad_scaler.", "torch.cuda.amp.", "torch.cpu.amp."),
    ),
    *_ops(Category.GRAD_MODE, "no_grad inference_mode", records_graph=False),
    *_ops(Category.GRAD_MODE, "enable_grad", records_graph=True),
    *_ops(Category.GRAD_MODE, "set_grad_enabled"),  # as its argument says
    *_ops(Category.SETTING, _SETTINGS),
    *_ops(Category.SETTING, "get_rng_state", place=Placement.HOST),  # the CPU generator's state, a tensor
    # How float32 matrix products (and cuDNN's convolutions) run: in TF32 or in full.
    *_ops(Category.SETTING, "set_float32_matmul_precision", float32_precision=True),
    *_ops(
        Category.SETTING,
        "allow_tf32 fp32_precision",
        prefixes=("torch.backends.cuda.matmul.", "torch.backends.cudnn."),
        float32_precision=True,
    ),
    *_ops(Category.TYPES, "device finfo iinfo result_type promote_types can_cast broadcast_shapes is_tensor typename"),
    *_ops(Category.METADATA, "numel is_floating_point is_complex"),
    *_ops(Category.LOAD, "load"),
    *[
        Op(name, Category.LOSS, loss=loss, autocast_refused=_BCE if module == "BCELoss" else None)
        for module, loss in _LOSSES.items()
        for name in (f"torch.nn.{module}", f"torch.nn.modules.loss.{module}", f"{FUNCTIONAL}.{loss.functional}")
    ],
]
# Facts that cut across the groups above, by entry: a mask kept, a step of a recurrence.
_MASK_KEEPING = (
    "bool to type_as float half bfloat16 double int long byte cuda cpu contiguous detach clone "
    "view reshape unsqueeze expand"
)
_MEASURES = "size dim numel ndimension nelement element_size __len__"
_RECURRENCE_METHODS = (
    "unsqueeze squeeze transpose sum mean exp sigmoid tanh relu float to type_as softmax clamp abs neg sqrt "
    "matmul mul add sub div"
)
# Layers without parameters or buffers: those of these categories, and softmax.
_STATELESS = (Category.ELEMENTWISE_LAYER, Category.DROPOUT_LAYER, Category.POOLING_LAYER, Category.RESHAPING_LAYER)
_CROSSING: list[tuple[Iterable[str], dict[str, object]]] = [
    ([METHOD + name for name in _MASK_KEEPING.split()], {"keeps_mask": True}),
    ([METHOD + name for name in _MEASURES.split()], {"measures": True}),
    ([f"{prefix}{name}" for prefix in ("torch.", METHOD) for name in ("sum", "mean")], {"totals": True}),
    ([METHOD + "cuda"], {"accelerator": True}),
    (
        [op.name for op in ENTRIES if op.module and op.category in _STATELESS]
        + ["torch.nn.Softmax", "torch.nn.modules.activation.Softmax", "torch.nn.LogSoftmax"],
        {"stateless": True},
    ),
    # The layers of any input shape that compute each element alone: a row is computed as in its batch.
    (["torch.nn.Dropout", "torch.nn.modules.dropout.Dropout", "torch.nn.Embedding"], {"any_leading_dims": True}),
    ([METHOD + name for name in _RECURRENCE_METHODS.split()], {"recurrence": True}),
    # The functions a recurrence may be made of: elementwise math, math along a dim, products, `where`.
    (
        [
            op.name
            for op in ENTRIES
            if op.category in (Category.UNARY, Category.ALONG_DIM) and not op.name.startswith(METHOD)
        ]
        + ["torch.einsum", "torch.matmul", "torch.outer", "torch.where"],
        {"recurrence": True},
    ),
]
_FACTS_BY_NAME: dict[str, dict[str, object]] = {}
for _names, _facts in _CROSSING:
    for _name in _names:
        _FACTS_BY_NAME.setdefault(_name, {}).update(_facts)
_UNKNOWN = sorted(_FACTS_BY_NAME.keys() - {op.name for op in ENTRIES})
if _UNKNOWN:  # a misspelt name would lose its facts silently
    raise KeyError(f"facts of names not in the table: {_UNKNOWN}")
# Only the entries with such facts are rebuilt: a rebuild of all of them (each of some
# forty fields) was a third of this module's import.
ENTRIES = [op._replace(**_FACTS_BY_NAME[op.name]) if op.name in _FACTS_BY_NAME else op for op in ENTRIES]
OPS: dict[str, Op] = {op.name: op for op in ENTRIES}  # one entry a name (tested)

# A tensor's attributes, keyed `Tensor.<name>` as its methods are.
ATTRIBUTES: dict[str, Attr] = {
    METHOD + attr.name: attr
    for attr in (
        Attr("data", Category.CAST, shares=True, dtype=KEPT, replaces_tensor=True),
        *(Attr(name, Category.VIEW, shares=True, dtype=KEPT) for name in ("T", "H", "mH")),
        Attr("mT", Category.VIEW, shares=True, dtype=KEPT, recurrence=True),
        *(Attr(name, Category.VIEW, shares=True) for name in ("real", "imag")),  # a complex tensor's: real
        Attr("grad", Category.AUTOGRAD, dtype=KEPT),
        *(Attr(name, Category.METADATA) for name in ("shape", "ndim", "dtype", "device", "is_cuda", "requires_grad")),
    )
}

# A module's methods (`nn.Module`'s), by what they do to the module.
MODULE = "Module."


class ModuleMethod(NamedTuple):
    name: str
    returns_self: bool = False  # it returns the module itself: `Net().to(device).train()` is the `Net`
    # It neither moves the module nor hands it out: a model's place is the same after
    # `model.compile()` (which compiles its forward in place) as before.
    keeps_place: bool = False
    hook: str | None = None  # it adds a hook to each pass of this kind: "forward", "backward"
    sets: str | None = None  # it sets an attribute by name (`register_buffer("mask", m)`): the value's keyword
    # DistributedDataParallel, whose one child is the module it wraps, answers it as that module
    # would: it acts on the module's parameters, buffers, mode or forward, or hands them out
    # (its `modules()` and `apply` take in the wrapper too; its `children()` is the module).
    wrapper_answers: bool = False
    sets_up: bool = False  # it sets the module up in place for training: a move, a cast, weights loaded
    compiles: bool = False  # it compiles the module's forward with TorchDynamo, in place
    accelerator: bool = False  # it moves the module to an accelerator whatever its argument says
    runs_forward: bool = False  # it runs the module's forward pass
    # It hands out the module's submodules (the module too, for `modules()`), named or not:
    # an attribute set on one of them is set on the module's tree.
    submodules: bool = False
    # It hands out the module's own tensors, its parameters or buffers (named or not): one
    # replaced in place (`p.data = ...`) is replaced in the module.
    tensors: bool = False
    # The mode it leaves the module in: "eval" (`eval()`), "train" (`train()`, or `train(False)`,
    # which this table does not tell apart).
    mode: str | None = None


def _module_methods(names: str, **facts) -> list[ModuleMethod]:
    return [ModuleMethod(name, **facts) for name in names.split()]


# Facts that cut across the groups below, by method.
_MODULE_CROSSING: list[tuple[str, dict[str, object]]] = [
    (
        "parameters buffers modules train eval zero_grad to cuda cpu half float double bfloat16 type "
        "requires_grad_ apply forward",
        {"wrapper_answers": True},
    ),
    (
        "to cuda cpu xpu ipu mtia float half double bfloat16 type apply share_memory to_empty requires_grad_ "
        "load_state_dict",
        {"sets_up": True},
    ),
    ("cuda xpu ipu mtia", {"accelerator": True}),
    ("compile", {"compiles": True}),
    ("eval", {"mode": "eval"}),
    ("train", {"mode": "train"}),
    ("forward", {"runs_forward": True}),
    ("modules named_modules children named_children get_submodule", {"submodules": True}),
    ("parameters named_parameters buffers named_buffers get_parameter get_buffer", {"tensors": True}),
]

_MODULE_METHODS = [
    *_module_methods(
        "to cuda cpu xpu ipu mtia float half double bfloat16 type apply share_memory to_empty", returns_self=True
    ),
    *_module_methods("train eval requires_grad_", returns_self=True, keeps_place=True),
    *_module_methods(
        "compile parameters named_parameters buffers named_buffers state_dict zero_grad forward extra_repr",
        keeps_place=True,
    ),
    *_module_methods("register_forward_hook register_forward_pre_hook", hook="forward"),
    *_module_methods(
        "register_full_backward_hook register_full_backward_pre_hook register_backward_hook", hook="backward"
    ),
    ModuleMethod("register_buffer", sets="tensor"),
    ModuleMethod("register_parameter", sets="param"),
    *_module_methods("add_module register_module", sets="module"),
    # Reads of its submodules, parameters and buffers, and the load of its weights.
    *_module_methods(
        "modules named_modules children named_children get_submodule get_parameter get_buffer load_state_dict"
    ),
]
_MODULE_FACTS: dict[str, dict[str, object]] = {}
for _names, _facts in _MODULE_CROSSING:
    for _name in _names.split():
        _MODULE_FACTS.setdefault(_name, {}).update(_facts)
_UNKNOWN_METHODS = sorted(_MODULE_FACTS.keys() - {method.name for method in _MODULE_METHODS})
if _UNKNOWN_METHODS:  # a misspelt name would lose its facts silently
    raise KeyError(f"facts of module methods not in the table: {_UNKNOWN_METHODS}")
NN_MODULE_METHODS: dict[str, ModuleMethod] = {
    MODULE + method.name: method._replace(**_MODULE_FACTS.get(method.name, {})) for method in _MODULE_METHODS
}


# The `nn` layers whose parameters perfmod counts, by their class name in torch.nn.
class SizedLayer(NamedTuple):
    # The constructor's first arguments in torch's order, with their defaults (None: required):
    # the sizes its parameters follow from, and those before them.
    arguments: tuple[tuple[str, object], ...]
    gates: int | None = None  # a recurrent layer's weight matrices per layer and direction
    # its forward is one operator of torch (`F.linear`, `F.conv2d`, `F.layer_norm`): compiled
    # alone, there is nothing for the compiler to fuse
    one_operator: bool = False


_CONVOLUTION_ARGUMENTS = (
    ("in_channels", None), ("out_channels", None), ("kernel_size", None), ("stride", 1), ("padding", 0),
)  # fmt: skip
_CONVOLUTION = SizedLayer((*_CONVOLUTION_ARGUMENTS, ("dilation", 1), ("groups", 1), ("bias", True)), one_operator=True)
_TRANSPOSED_CONVOLUTION = SizedLayer(
    (*_CONVOLUTION_ARGUMENTS, ("output_padding", 0), ("groups", 1), ("bias", True), ("dilation", 1))
)
_BATCH_NORM = SizedLayer(
    (("num_features", None), ("eps", 1e-5), ("momentum", 0.1), ("affine", True), ("track_running_stats", True))
)
_INSTANCE_NORM = SizedLayer(
    (("num_features", None), ("eps", 1e-5), ("momentum", 0.1), ("affine", False), ("track_running_stats", False))
)
_RECURRENT_ARGUMENTS = (
    ("input_size", None), ("hidden_size", None), ("num_layers", 1), ("bias", True), ("batch_first", False),
    ("dropout", 0.0), ("bidirectional", False),
)  # fmt: skip
SIZED_LAYERS: dict[str, SizedLayer] = {
    "Linear": SizedLayer((("in_features", None), ("out_features", None), ("bias", True)), one_operator=True),
    **dict.fromkeys(("Conv1d", "Conv2d", "Conv3d"), _CONVOLUTION),
    **dict.fromkeys(("ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d"), _TRANSPOSED_CONVOLUTION),
    **dict.fromkeys(
        ("Embedding", "EmbeddingBag"),
        SizedLayer((("num_embeddings", None), ("embedding_dim", None)), one_operator=True),
    ),
    "LayerNorm": SizedLayer(
        (("normalized_shape", None), ("eps", 1e-5), ("elementwise_affine", True), ("bias", True)), one_operator=True
    ),
    **dict.fromkeys(("BatchNorm1d", "BatchNorm2d", "BatchNorm3d"), _BATCH_NORM),
    "GroupNorm": SizedLayer(
        (("num_groups", None), ("num_channels", None), ("eps", 1e-5), ("affine", True)), one_operator=True
    ),
    **dict.fromkeys(("InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d"), _INSTANCE_NORM),
    "LSTM": SizedLayer(_RECURRENT_ARGUMENTS, gates=4),
    "GRU": SizedLayer(_RECURRENT_ARGUMENTS, gates=3),
    "RNN": SizedLayer(_RECURRENT_ARGUMENTS, gates=1),
}


def functions(*categories: Category, **facts: object) -> frozenset[str]:
    """Qualified names of the torch functions and classes in `categories` (every
    category of operations when none is given) whose facts have the values given
    (`random=True`, `in_place=False`, `shape=Shape.NEW`, `module=True`)."""
    return frozenset(op.name for op in _select(False, categories, facts))


def methods(*categories: Category, **facts: object) -> frozenset[str]:
    """Names of the tensor methods in `categories` (as `functions`), without `Tensor.`."""
    return frozenset(op.name.removeprefix(METHOD) for op in _select(True, categories, facts))


def attributes(*categories: Category, **facts: object) -> frozenset[str]:
    """Names of the tensor attributes in `categories` (all when none is given) whose facts
    have the values given (`shares=True`), without `Tensor.`."""
    found = [attr for attr in ATTRIBUTES.values() if not categories or attr.category in categories]
    return frozenset(attr.name for attr in found if all(getattr(attr, f) == v for f, v in facts.items()))


def module_methods(**facts: object) -> frozenset[str]:
    """Names of the module methods whose facts have the values given (`returns_self=True`),
    without `Module.`."""
    return frozenset(m.name for m in NN_MODULE_METHODS.values() if all(getattr(m, f) == v for f, v in facts.items()))


def _select(method: bool, categories: tuple[Category, ...], facts: dict[str, object]) -> list[Op]:
    found = [op for category in categories or _OPERATIONS for op in _BY_KIND.get((method, category), ())]
    for fact, value in facts.items():
        found = [op for op in found if getattr(op, fact) == value]
    return found


# The entries by (is a method, category): the views in torch_facts, read at import, look
# up their categories instead of scanning the whole table each.
_BY_KIND: dict[tuple[bool, Category], list[Op]] = {}
for _op in ENTRIES:
    _BY_KIND.setdefault((_op.name.startswith(METHOD), _op.category), []).append(_op)


def short(names: Iterable[str]) -> frozenset[str]:
    """The last part of each qualified name (`torch.exp` -> `exp`)."""
    return frozenset(name.rsplit(".", 1)[1] for name in names)


# ==========================================================================================
# torch's objects that are no operation: optimizers, learning-rate schedulers, datasets and loaders
# ==========================================================================================
# What perfmod knows of each, keyed by the qualified names torch exposes it under;
# tests/analysis/test_torch_objects.py checks every fact against the installed torch.

OPTIM = "torch.optim."
SCHEDULERS_MODULE = "torch.optim.lr_scheduler."
DATA = "torch.utils.data."
# The keywords of an optimizer that pick its implementation; `fused=True` rejects some of the
# others (`foreach=True`, `differentiable=True`).
IMPLEMENTATION_KEYWORDS = ("fused", "foreach", "capturable", "differentiable")
# The device types of fused Adam, AdamW and SGD kernels
# (torch.utils._foreach_utils._get_fused_kernels_supported_devices), and those every torch
# perfmod supports has them for: the ones a guard written into a script may name.
_FUSED_DEVICES = frozenset({"cuda", "cpu", "mps", "xpu", "hpu"})
LAUNCH_FUSED_DEVICES = ("cuda", "cpu")


class Optimizer(NamedTuple):
    # The state it keeps for each parameter as tensors of the parameter's shape (0-dim
    # counters, `step`, not counted), and the keywords that add one each unless left at their
    # default (`momentum=0`, `amsgrad=False`, `centered=False`).
    states: int
    state_options: tuple[str, ...] = ()
    accepts: tuple[str, ...] = ()  # its IMPLEMENTATION_KEYWORDS; it rejects the others with a TypeError
    fused_devices: frozenset[str] = frozenset()  # the device types of its fused kernels (it `accepts` "fused")


_ADAM = Optimizer(2, ("amsgrad",), IMPLEMENTATION_KEYWORDS, _FUSED_DEVICES)
_NOT_FUSED = ("foreach", "capturable", "differentiable")
OPTIMIZERS: dict[str, Optimizer] = {
    OPTIM + name: optimizer
    for name, optimizer in (
        ("SGD", Optimizer(0, ("momentum",), ("fused", "foreach", "differentiable"), _FUSED_DEVICES)),
        ("Adam", _ADAM),
        ("AdamW", _ADAM),
        ("Adagrad", Optimizer(1, (), ("fused", "foreach", "differentiable"), frozenset({"cuda", "cpu"}))),
        ("Adadelta", Optimizer(2, (), _NOT_FUSED)),
        ("Adamax", Optimizer(2, (), _NOT_FUSED)),
        ("NAdam", Optimizer(2, (), _NOT_FUSED)),
        ("RAdam", Optimizer(2, (), _NOT_FUSED)),
        ("RMSprop", Optimizer(1, ("momentum", "centered"), _NOT_FUSED)),
        ("Rprop", Optimizer(2, (), _NOT_FUSED)),
        ("ASGD", Optimizer(1, (), _NOT_FUSED)),
    )
}

# The keys of an optimizer's parameter group that hold its learning rate (`initial_lr`: the
# one a scheduler started from).
LR_KEYS = ("lr", "initial_lr")


class Scheduler(NamedTuple):
    writes: tuple[str, ...]  # the keys of each parameter group it writes, built and stepped with its defaults


# Cycling the momentum (`cycle_momentum=True`, their default): SGD's `momentum`, Adam's `betas`.
_MOMENTUM_CYCLE = (*LR_KEYS, "momentum", "betas", "base_momentum", "max_momentum")
SCHEDULERS: dict[str, Scheduler] = {
    SCHEDULERS_MODULE + name: scheduler
    for names, scheduler in (
        (
            "LambdaLR MultiplicativeLR StepLR MultiStepLR ConstantLR LinearLR ExponentialLR SequentialLR "
            "CosineAnnealingLR ChainedScheduler ReduceLROnPlateau CosineAnnealingWarmRestarts PolynomialLR",
            Scheduler(LR_KEYS),
        ),
        ("CyclicLR", Scheduler(_MOMENTUM_CYCLE)),
        ("OneCycleLR", Scheduler((*_MOMENTUM_CYCLE, "max_lr", "min_lr"))),
    )
    for name in names.split()
}

# The legacy tensor types `torch.set_default_tensor_type` takes, with the dtype each makes
# the default.
DEFAULT_TENSOR_TYPES: dict[str, str] = {
    f"torch.{device}{name}Tensor": dtype
    for name, dtype in (("Float", "float32"), ("Double", "float64"))
    for device in ("", "cuda.")
}


class DatasetClass(NamedTuple):
    iterable: bool = False  # its items are iterated, not indexed: the base of iterable datasets
    rows_of_tensors: bool = False  # its items are rows of the tensors it is given, memory already held
    of_datasets: bool = False  # made of other datasets: an item costs what an item of a part costs
    rebuildable: bool = False  # cheap and pure to build twice (a sampler needs only its length)


# Under `torch.utils.data` and the module that defines them.
DATASETS: dict[str, DatasetClass] = {
    f"{DATA}{module}{name}": dataset
    for name, dataset in (
        ("Dataset", DatasetClass()),
        ("IterableDataset", DatasetClass(iterable=True)),
        ("TensorDataset", DatasetClass(rows_of_tensors=True, rebuildable=True)),
        ("Subset", DatasetClass(of_datasets=True, rebuildable=True)),
        ("ConcatDataset", DatasetClass(of_datasets=True)),
        ("StackDataset", DatasetClass(of_datasets=True)),
    )
    for module in ("", "dataset.")
}


class DataFunction(enum.Enum):
    SPLIT = "splits a dataset"  # into Subsets of it (`random_split`)
    WORKER_INFO = "tells a loader's worker who it is"  # None in the training process
    COLLATE = "stacks the samples of a batch"  # torch's own collate function, nothing more


DATA_FUNCTIONS: dict[str, DataFunction] = {
    f"{DATA}random_split": DataFunction.SPLIT,
    f"{DATA}dataset.random_split": DataFunction.SPLIT,
    f"{DATA}get_worker_info": DataFunction.WORKER_INFO,
    f"{DATA}_utils.worker.get_worker_info": DataFunction.WORKER_INFO,
    **dict.fromkeys(
        (f"{DATA}{module}default_collate" for module in ("", "dataloader.", "_utils.collate.")), DataFunction.COLLATE
    ),
}


class Loader(NamedTuple):
    # Its keywords that raise or mean nothing without worker processes: a loader that passes
    # one of them has chosen how it loads.
    worker_options: tuple[str, ...]


LOADERS: dict[str, Loader] = {
    f"{DATA}{module}DataLoader": Loader(
        ("num_workers", "persistent_workers", "prefetch_factor", "multiprocessing_context")
    )
    for module in ("", "dataloader.")
}


def schedulers(**facts: object) -> frozenset[str]:
    """Qualified names of the learning-rate schedulers whose facts have the values given."""
    return _matching(SCHEDULERS, facts)


def datasets(**facts: object) -> frozenset[str]:
    """Qualified names of the dataset classes whose facts have the values given (`of_datasets=True`)."""
    return _matching(DATASETS, facts)


def data_functions(kind: DataFunction) -> frozenset[str]:
    """Qualified names of torch.utils.data's functions of this kind."""
    return frozenset(name for name, function in DATA_FUNCTIONS.items() if function is kind)


def _matching(table: dict[str, object], facts: dict[str, object]) -> frozenset[str]:
    return frozenset(name for name, entry in table.items() if all(getattr(entry, f) == v for f, v in facts.items()))
