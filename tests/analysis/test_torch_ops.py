"""The table of torch operations checked against the installed torch: every name
exists, each category's shape rule holds for its entries, in-place methods
return their receiver, each loss's defaults are torch's, every module class is
one of torch.nn, and each tensor attribute is what its entry says."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
import subprocess
import sys

import pytest
import torch

from codemod.analysis.torch_facts import (
    BATCH_MIXING_LAYERS,
    DDP_ANSWERS,
    DEVICE_AND_DTYPE_KEEPING_METHODS,
    PER_RANK_BATCH_NORMS,
)
from codemod.analysis.torch_ops import (
    ATTRIBUTES,
    DTYPE_OF,
    DTYPES,
    ENTRIES,
    FLOATING,
    FUNCTIONAL,
    KEPT,
    METHOD,
    MODULE,
    NAMED,
    NN_MODULE_METHODS,
    OPS,
    SIZED_LAYERS,
    Category,
    Placement,
    Shape,
    functions,
    methods,
    module_methods,
)
from tests.torch_support import resolve

# Arguments beyond the tensor for entries that need them.
EXTRA = {
    "clamp": {"min": 0.0},
    "clamp_": {"min": 0.0},
    "fill_": (0.5,),
    "clamp_min": (0.0,),
    "clamp_max": (0.0,),
    "softmax": {"dim": -1},
    "log_softmax": {"dim": -1},
    "cumsum": {"dim": -1},
    "cumprod": {"dim": -1},
    "logsumexp": {"dim": -1},
    "layer_norm": ((3,),),
    "pow": (2,),
    "mul": (2,),
    "add": (1,),
    "sub": (1,),
    "div": (2,),
    "float_power": (2,),
    "lerp": (torch.zeros(2, 3), 0.5),
    "masked_fill": (torch.zeros(2, 3, dtype=torch.bool), 0.0),
    "geometric_": (0.5,),
    "to": (torch.float64,),
    "type": (torch.float64,),
    "type_as": (torch.zeros(1, dtype=torch.float64),),
    "gumbel_softmax": {"tau": 1.0},
    # views of a (2, 3) tensor
    "view": (6,),
    "view_as": (torch.zeros(3, 2),),
    "reshape": (6,),
    "reshape_as": (torch.zeros(3, 2),),
    "unsqueeze": (0,),
    "squeeze": (0,),
    "transpose": (0, 1),
    "swapaxes": (0, 1),
    "swapdims": (0, 1),
    "movedim": (0, 1),
    "permute": (1, 0),
    "unflatten": (1, (3, 1)),
    "expand": (2, 3),
    "expand_as": (torch.zeros(2, 3),),
    "narrow": (1, 0, 2),
    "as_strided": ((3,), (1,)),
    "split": (1,),
    "chunk": (2,),
    "tensor_split": (2,),
    "select": (0, 1),
    "char": (),
    **dict.fromkeys(("eq", "ne", "lt", "le", "gt", "ge"), (0.5,)),
    "where": (torch.zeros(2, 3), torch.ones(2, 3)),  # `where(condition, x, y)`
    "gather": (1, torch.zeros(2, 3, dtype=torch.long)),
    "index_select": (1, torch.tensor([0, 2])),
    "copy": (torch.zeros(2, 3),),
    "dropout": (0.5, True),  # p, training mode
    "roll": (1, 0),  # shifts, dims
    "flip": ((0,),),
    **dict.fromkeys(("maximum", "minimum", "atan2"), (torch.ones(2, 3),)),
    **dict.fromkeys(("fmod", "remainder"), (2,)),
}


def _call(name: str, tensor: torch.Tensor):
    short = name.rsplit(".", 1)[1]
    extra = EXTRA.get(short.rstrip("_"), EXTRA.get(short, ()))
    args, kwargs = (extra, {}) if isinstance(extra, tuple) else ((), extra)
    if name.startswith(METHOD):
        return getattr(tensor, short)(*args, **kwargs)
    return resolve(name)(tensor, *args, **kwargs)


def test_one_entry_a_name():
    assert len(OPS) == len(ENTRIES)


# Devices whose torch modules come with out-of-tree packages (torch_npu, Intel Gaudi's).
OUT_OF_TREE = ("torch.npu.", "torch.hpu.")


@pytest.mark.parametrize("name", sorted(OPS))
def test_every_name_exists_in_torch(name):
    if name.startswith("safetensors.") and importlib.util.find_spec("safetensors") is None:
        pytest.skip("safetensors is not installed")
    if name.startswith(OUT_OF_TREE):
        pytest.skip("a device of an out-of-tree package")
    target = resolve(name)
    # A setting is a function or a flag of torch.backends (`allow_tf32`: a bool; `fp32_precision`: a str).
    assert callable(target) or (OPS[name].category is Category.SETTING and isinstance(target, (bool, str)))


@pytest.mark.parametrize("name", sorted(OPS))
def test_the_module_classes_are_torch_nn_modules(name):
    target = resolve(name) if not name.startswith(OUT_OF_TREE) and not name.startswith("safetensors.") else None
    is_module = inspect.isclass(target) and issubclass(target, torch.nn.Module)
    assert OPS[name].module == is_module, name


def test_the_entries_of_torchs_other_objects_are_what_their_category_says():
    """Containers hold modules, wrappers run their model's forward, autocasts are autocast
    context managers, scalers are GradScalers, and a process's queries answer Python ints."""
    for name in functions(Category.CONTAINER):
        assert issubclass(resolve(name), torch.nn.Module) and hasattr(resolve(name)(), "__len__"), name
    model = torch.nn.Linear(2, 2)
    for name in functions(Category.WRAPPER):  # without a process group, DDP is only checked to wrap
        wrapper = resolve(name)
        if name.endswith("DistributedDataParallel"):
            assert "module" in inspect.signature(wrapper).parameters
            continue
        x = torch.rand(3, 2)
        torch.testing.assert_close(wrapper(model)(x), model(x))
    for name in functions(Category.AUTOCAST):
        assert issubclass(resolve(name), torch.amp.autocast), name
    for name in functions(Category.GRAD_SCALER):
        assert issubclass(resolve(name), torch.amp.GradScaler), name
    for name in functions(Category.PROCESS):
        if OPS[name].python is not None:
            assert inspect.signature(resolve(name)).return_annotation.__name__ == OPS[name].python, name
    assert isinstance(torch.cuda.device_count(), int) and isinstance(torch.accelerator.device_count(), int)
    # None of them is an operation: the views over every category leave them out.
    others = functions(
        Category.CONTAINER,
        Category.WRAPPER,
        Category.AUTOCAST,
        Category.GRAD_SCALER,
        Category.PROCESS,
        Category.GRAD_MODE,
        Category.SETTING,
        Category.TYPES,
        Category.LOAD,
        Category.BATCH_NORM,
    )
    assert others and not others & functions()


@pytest.mark.parametrize("name", sorted(functions(clips=True)))
def test_clipping_functions_clip_the_gradients_they_are_given(name):
    parameter = torch.nn.Parameter(torch.zeros(4))
    parameter.grad = torch.full((4,), 10.0)
    resolve(name)([parameter], 1.0)
    assert parameter.grad.abs().max() <= 1.0 + 1e-6


@pytest.mark.parametrize(
    "name", sorted(functions(tests_finiteness=True) | {METHOD + n for n in methods(tests_finiteness=True)})
)
def test_finiteness_tests_tell_nan_and_infinities_from_numbers(name):
    answers = _call(name, torch.tensor([1.0, float("nan"), float("inf"), -float("inf")]))
    number, nan, infinity, negative_infinity = answers.tolist()
    assert answers.dtype == torch.bool and infinity == negative_infinity
    assert nan != number or infinity != number


# Arguments that keep a (4, 4) mask a mask of the same positions (views that add a dim).
MASK_ARGUMENTS = {
    "to": (torch.float32,),
    "type_as": (torch.zeros(1),),
    "view": (1, 4, 4),
    "reshape": (1, 4, 4),
    "expand": (2, 4, 4),
    "unsqueeze": (0,),
}


@pytest.mark.parametrize("name", sorted(methods(keeps_mask=True)))
def test_mask_keeping_methods_keep_the_positions_set(name):
    if name == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    mask = torch.rand(4, 4) > 0.5
    kept = getattr(mask, name)(*MASK_ARGUMENTS.get(name, ()))
    assert torch.equal(kept.bool().expand(*kept.shape[:-2], 4, 4), mask.expand(*kept.shape[:-2], 4, 4))


@pytest.mark.parametrize("name", sorted(ATTRIBUTES))
def test_each_attribute_of_a_tensor_is_what_its_entry_says(name):
    """A view shares its tensor's storage, KEPT is a tensor of its tensor's dtype where it
    is, metadata is no tensor."""
    attr = ATTRIBUTES[name]
    tensor = torch.rand(2, 3, dtype=torch.complex64 if attr.name == "imag" else torch.float32, requires_grad=True)
    tensor.grad = torch.rand(2, 3, dtype=tensor.dtype)
    value = getattr(tensor, attr.name)
    if attr.category is Category.METADATA:
        assert not isinstance(value, torch.Tensor)
        return
    assert isinstance(value, torch.Tensor) and value.device == tensor.device
    if attr.shares:
        assert value.untyped_storage().data_ptr() == tensor.untyped_storage().data_ptr()
    if attr.dtype == KEPT:
        assert value.dtype == tensor.dtype


SHAPE_KEPT = sorted(
    functions(Category.UNARY, Category.ALONG_DIM)
    | {METHOD + n for n in methods(Category.UNARY, Category.ALONG_DIM)}
    | {METHOD + n for n in methods(Category.BINARY, Category.CAST)}
)


@pytest.mark.parametrize("name", SHAPE_KEPT)
def test_same_shape_categories_keep_the_shape(name):
    if name in ("Tensor.cuda", "Tensor.pin_memory") and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    assert _call(name, torch.rand(2, 3)).shape == (2, 3)


@pytest.mark.parametrize(
    "name", sorted(functions(Category.REARRANGE) | {METHOD + n for n in methods(Category.REARRANGE)})
)
def test_rearrangements_move_every_element_into_new_memory_of_the_same_shape_and_dtype(name):
    tensor = torch.arange(6.0).view(2, 3)
    result = _call(name, tensor)
    assert result.shape == tensor.shape and result.dtype == tensor.dtype and OPS[name].result_dtype == KEPT
    assert torch.equal(result.flatten().sort().values, tensor.flatten()) and not torch.equal(result, tensor)
    assert result.untyped_storage().data_ptr() != tensor.untyped_storage().data_ptr()


@pytest.mark.parametrize("name", sorted(METHOD + n for n in methods(shares=True)))
def test_sharing_methods_return_the_receiver_or_a_view_of_its_storage(name):
    if name in ("Tensor.cuda", "Tensor.pin_memory") and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    tensor = torch.rand(2, 3)  # float32 on the CPU: a cast to what it is has nothing to do
    if name.rsplit(".", 1)[1] in ("long", "int", "short", "bool", "byte", "char", "half", "double", "bfloat16"):
        tensor = getattr(tensor, name.rsplit(".", 1)[1])()
    short = name.rsplit(".", 1)[1]
    if short in ("to", "type", "type_as"):  # to what it is
        results = getattr(tensor, short)(tensor if short == "type_as" else tensor.dtype)
    else:
        results = _call(name, tensor)
    if short == "__iter__":
        results = tuple(results)
    for result in results if isinstance(results, tuple) else (results,):
        result = result if isinstance(result, torch.Tensor) else torch.from_numpy(result)
        assert result is tensor or result.untyped_storage().data_ptr() == tensor.untyped_storage().data_ptr()


def _no_copy_operand(name: str):
    """What a `no_copy` entry is called on: a tensor whose strides no contiguous layout
    has (a transposed one), so that an op that may copy would; an array or a buffer for
    the factories that view them."""
    short = name.rsplit(".", 1)[1]
    if short == "from_numpy":
        return torch.rand(3, 2).numpy().T
    if short == "frombuffer":
        return bytearray(24)
    return torch.rand(3, 2).t()


def _memory(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.untyped_storage().data_ptr()
    if isinstance(value, bytearray):
        return torch.frombuffer(value, dtype=torch.uint8).data_ptr()
    return _memory(torch.from_numpy(value))


def _no_copy_results(name: str, operand) -> tuple:
    short = name.rsplit(".", 1)[1]
    if short == "frombuffer":
        return (resolve(name)(operand, dtype=torch.float32),)
    if name == "torch.permute":  # the dims as one tuple
        return (torch.permute(operand, (1, 0)),)
    results = _call(name, operand)
    if short in ("numpy", "__array__"):
        results = torch.from_numpy(results)
    return results if isinstance(results, tuple) else (results,)


@pytest.mark.parametrize("name", sorted(functions(no_copy=True) | {METHOD + n for n in methods(no_copy=True)}))
def test_no_copy_entries_view_their_operands_memory_and_never_copy(name):
    operand = _no_copy_operand(name)
    try:
        results = _no_copy_results(name, operand)
    except RuntimeError:  # `view` refuses strides it cannot follow rather than copy
        operand = operand.contiguous()
        results = _no_copy_results(name, operand)
    assert all(result.untyped_storage().data_ptr() == _memory(operand) for result in results)


@pytest.mark.parametrize(
    "name",
    sorted(
        n for n, op in OPS.items() if op.category is Category.VIEW and not op.no_copy and op.shape is not Shape.SLICES
    ),
)
def test_views_left_out_of_no_copy_copy_a_tensor_whose_strides_they_cannot_follow(name):
    operand = torch.rand(3, 2).t()
    arguments = {"reshape": ((6,),), "reshape_as": (torch.empty(6),), "flatten": ()}[name.rsplit(".", 1)[1]]
    result = resolve(name)(operand, *arguments)
    assert result.untyped_storage().data_ptr() != operand.untyped_storage().data_ptr()


@pytest.mark.parametrize("name", sorted(METHOD + n for n in methods(in_place=True)))
def test_in_place_methods_return_their_receiver(name):
    tensor = torch.rand(2, 3)
    assert _call(name, tensor) is tensor


def test_in_place_twins_have_the_category_of_their_method():
    for op in ENTRIES:
        twin = OPS.get(op.name.removesuffix("_"))
        if op.in_place and twin is not None:
            assert twin.category == op.category and twin.random == op.random, op.name


@pytest.mark.parametrize("name", sorted(n for n, op in OPS.items() if op.random and not n.startswith(METHOD)))
def test_random_functions_draw_from_the_global_generator(name):
    args = {
        "torch.randint": (10, (4,)),
        "torch.randint_like": (torch.zeros(4), 10),
        "torch.randperm": (8,),
        "torch.normal": (torch.zeros(4), torch.ones(4)),
        "torch.multinomial": (torch.ones(4, 8), 4),
        "torch.poisson": (torch.full((4,), 3.0),),
        "torch.bernoulli": (torch.full((8,), 0.5),),
        "torch.dropout": (torch.rand(4, 8), 0.5, True),  # (input, p, train)
    }.get(name, (torch.rand(4, 8) if "like" in name or name.startswith(FUNCTIONAL) else (4, 8),))
    args = args if isinstance(args, tuple) else (args,)
    kwargs = {"training": True} if "dropout" in name and name.startswith(FUNCTIONAL) else {}
    function = resolve(name)
    torch.manual_seed(0)
    first = function(*args, **kwargs)
    torch.manual_seed(0)
    assert torch.equal(function(*args, **kwargs), first)
    assert any(not torch.equal(function(*args, **kwargs), first) for _ in range(5))


def test_every_loss_torch_has_is_in_the_table():
    names = {
        f"{FUNCTIONAL}.{n}"
        for n in dir(torch.nn.functional)
        if n.endswith("_loss") or n in ("cross_entropy", "binary_cross_entropy", "binary_cross_entropy_with_logits")
    }
    assert names <= {n for n, op in OPS.items() if op.category is Category.LOSS} | {f"{FUNCTIONAL}.kl_div"}


@pytest.mark.parametrize("name", sorted(n for n, op in OPS.items() if op.loss is not None))
def test_each_loss_has_torchs_defaults(name):
    loss = OPS[name].loss
    target = resolve(name)
    parameters = inspect.signature(target.__init__ if inspect.isclass(target) else target).parameters
    assert parameters["reduction"].default == loss.reduction
    if loss.ignore_index is not None:
        assert parameters["ignore_index"].default == loss.ignore_index
    if inspect.isclass(target):
        assert resolve(f"{FUNCTIONAL}.{loss.functional}") is not None


FUNCTIONAL_LOSSES = sorted(n for n, op in OPS.items() if op.loss is not None and n.startswith(FUNCTIONAL))
# Inputs torch accepts for each loss that reduces one value an element (probabilities for BCE).
LOSS_INPUTS = {"binary_cross_entropy": lambda x, y: (x.sigmoid(), y.sigmoid())}


@pytest.mark.parametrize("name", [n for n in FUNCTIONAL_LOSSES if OPS[n].loss.per_element])
def test_each_loss_unreduced_shape_options_and_batchmean_are_torchs(name):
    """What PM503 relies on to batch a loss computed one position at a time: the unreduced
    loss's shape (the target's for class targets, else the input's), the keywords that
    change each element's loss, and `batchmean` as the sum over the input's first size."""
    loss = OPS[name].loss
    function = resolve(name)
    torch.manual_seed(0)
    x = torch.randn(4, 5, dtype=torch.float64)
    if loss.class_targets:
        y = torch.randint(5, (4,))
        x = x.log_softmax(-1)
        assert function(x, y, reduction="none").shape == y.shape
    else:
        x, y = LOSS_INPUTS.get(loss.functional, lambda a, b: (a, b))(x, torch.randn(4, 5, dtype=torch.float64))
        if loss.functional == "kl_div":
            x, y = x.log_softmax(-1), y.softmax(-1)
        none = function(x, y, reduction="none")
        assert none.shape == x.shape
        torch.testing.assert_close(function(x, y), none.mean())
    parameters = inspect.signature(function).parameters
    assert set(loss.options) <= set(parameters)
    if loss.batchmean:
        torch.testing.assert_close(function(x, y, reduction="batchmean"), function(x, y, reduction="sum") / x.size(0))
    else:
        with pytest.raises((ValueError, RuntimeError, KeyError)):
            function(x, y, reduction="batchmean")


# What a module's forward shows when it multiplies matrices: a matmul or convolution call,
# the `@` operator, cuDNN's RNN kernels, or the submodules (attention, feed-forward blocks,
# encoder, decoder) that torch's own composite layers call.
MATRIX_PRODUCT_SOURCE = re.compile(
    r"\bF\.(linear|bilinear|conv\w*|scaled_dot_product_attention|multi_head_attention_forward)\("
    r"|_conv_forward\(|torch\.(matmul|bmm|mm|addmm|baddbmm|bilinear)\(|\.(matmul|bmm|mm|addmm)\("
    r"|_VF\.(lstm|gru|rnn_\w+|\w+_cell)\(|self\.(self_attn|linear\d?|encoder|decoder|layers|head|tail|_ff_block|_sa_block)\b"
    r"|torch\._transformer_encoder_layer_fwd|\s@\s"
)
MATRIX_PRODUCTS = functions(Category.MATMUL, Category.CONVOLUTION, Category.RECURRENT)


@pytest.mark.parametrize(
    "name", sorted(n for n in dir(torch.nn) if inspect.isclass(getattr(torch.nn, n)) and n[0].isupper())
)
def test_a_module_class_is_in_the_matrix_products_exactly_when_its_forward_multiplies_matrices(name):
    cls = getattr(torch.nn, name)
    if not issubclass(cls, torch.nn.Module):
        pytest.skip("not a module")
    multiplies = MATRIX_PRODUCT_SOURCE.search(inspect.getsource(cls.forward)) is not None
    assert (f"torch.nn.{name}" in MATRIX_PRODUCTS) == multiplies


@pytest.mark.parametrize("name", sorted(NN_MODULE_METHODS))
def test_every_module_method_is_nn_modules(name):
    assert callable(getattr(torch.nn.Module, NN_MODULE_METHODS[name].name, None))


@pytest.mark.parametrize("name", sorted(module_methods(keeps_place=True)))
def test_module_methods_keeping_the_place_leave_the_parameters_where_they_are(name):
    module = torch.nn.Linear(2, 2)
    before = [p.data_ptr() for p in module.parameters()]
    result = getattr(module, name)(*((torch.rand(1, 2),) if name == "forward" else ()))
    if inspect.isgenerator(result):  # `parameters()`, `buffers()`: run through them
        result = list(result)
    assert [p.data_ptr() for p in module.parameters()] == before
    assert not isinstance(result, torch.nn.Module) or result is module


@pytest.mark.parametrize("name", sorted(module_methods(hook="forward") | module_methods(hook="backward")))
def test_hook_registrations_hook_the_pass_they_say(name):
    module, passes, running = torch.nn.Linear(2, 2), [], []
    getattr(module, name)(lambda *arguments: passes.append(running[-1]))
    running.append("forward")
    loss = module(torch.rand(1, 2, requires_grad=True)).sum()
    running.append("backward")
    loss.backward()
    assert passes == [NN_MODULE_METHODS[MODULE + name].hook]


@pytest.mark.parametrize("name", sorted(n for n, m in NN_MODULE_METHODS.items() if m.sets is not None))
def test_attribute_setters_set_the_value_of_their_keyword(name):
    method = NN_MODULE_METHODS[name]
    value = {"tensor": torch.zeros(2), "param": torch.nn.Parameter(torch.zeros(2)), "module": torch.nn.ReLU()}
    module = torch.nn.Linear(2, 2)
    getattr(module, method.name)("added", **{method.sets: value[method.sets]})
    assert module.added is value[method.sets]


@pytest.mark.parametrize("name", sorted(module_methods(returns_self=True)))
def test_module_methods_returning_self_do(name):
    module = torch.nn.Linear(2, 2)
    arguments = {"to": ("cpu",), "type": (torch.float32,), "apply": (lambda m: None,), "to_empty": ()}
    if name in ("cuda", "xpu", "ipu", "mtia"):  # need their device; torch's own source says what they return
        assert str(inspect.signature(getattr(torch.nn.Module, name)).return_annotation) in ("T", "Self", "typing.Self")
        return
    kwargs = {"device": "cpu"} if name == "to_empty" else {}
    assert getattr(module, name)(*arguments.get(name, ()), **kwargs) is module


def test_compile_breaks_are_where_the_installed_dynamo_breaks_the_graph():
    """The table's `compile_breaks`: a recurrent layer and a sparse tensor each break the
    graph of a compiled function (dynamo only; the eager backend compiles nothing)."""
    from torch._dynamo.utils import counters

    assert torch._dynamo.config.allow_rnn is False
    breaking = {n for n, op in OPS.items() if op.compile_breaks is not None}
    assert {f"torch.nn.{n}" for n in ("GRU", "LSTM", "RNN")} <= breaking and "torch.spmm" in breaking
    gru, linear = torch.nn.GRU(4, 8, batch_first=True), torch.nn.Linear(8, 2)
    adjacency = torch.eye(5).to_sparse()
    cases = [
        (lambda x: linear(gru(x)[0]).sum(), (torch.randn(2, 3, 4),)),
        (lambda a, x: torch.spmm(a, x * 2).sum(), (adjacency, torch.randn(5, 3))),
    ]
    for function, args in cases:
        torch._dynamo.reset()
        counters.clear()
        torch.compile(function, backend="eager")(*args)
        assert sum(counters["graph_break"].values()) >= 1, function
    torch._dynamo.reset()


def test_the_device_types_with_fused_optimizer_kernels_are_torchs():
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    from codemod.analysis.torch_facts import FUSED_DEVICE_TYPES, LAUNCH_FUSED_TYPES

    assert FUSED_DEVICE_TYPES <= set(_get_fused_kernels_supported_devices())
    assert set(LAUNCH_FUSED_TYPES) <= FUSED_DEVICE_TYPES


def test_random_modules_are_torchs_dropouts():
    """torch_facts.RANDOM_MODULES names every dropout module of the installed torch, and
    each one draws: two calls in training mode give different outputs."""
    import torch.nn.modules.dropout as dropout

    from codemod.analysis.torch_facts import RANDOM_MODULES

    classes = {
        name
        for name, value in vars(dropout).items()
        if isinstance(value, type) and issubclass(value, dropout._DropoutNd) and value is not dropout._DropoutNd
    }
    assert {name.rsplit(".", 1)[1] for name in RANDOM_MODULES} == classes
    for name in classes:
        module = getattr(torch.nn, name)(0.5).train()
        spatial = int(name[-2]) if name.endswith("d") else 3  # Dropout2d: (N, C, H, W)
        x = torch.ones(8, 16, *[4] * spatial)
        assert not torch.equal(module(x), module(x)), name


def test_fused_conflicts_are_optimizer_keywords_and_fused_rejects_some():
    """torch_facts.FUSED_CONFLICTS: keywords of Adam and AdamW that choose the
    implementation (`capturable` is one `fused=True` accepts); `fused=True` with `foreach`
    or `differentiable` raises."""
    from codemod.analysis.torch_facts import FUSED_CONFLICTS

    for optimizer in (torch.optim.Adam, torch.optim.AdamW):
        assert set(FUSED_CONFLICTS) <= set(inspect.signature(optimizer).parameters), optimizer
    params = [torch.nn.Parameter(torch.zeros(2))]
    for name in ("foreach", "differentiable"):
        with pytest.raises(RuntimeError):
            torch.optim.AdamW(params, fused=True, **{name: True})


def test_the_analyses_tables_of_torch_names_are_torchs():
    from codemod.analysis.torch_facts import (
        GRAD_FREE_CONTEXTS,
        GRAD_RESET_METHODS,
        GRAD_ZEROING_METHODS,
        LOSS_KEYWORDS,
        SCALER_METHODS_RETURNING_NEW,
        SIZE_METHODS,
        TORCH_COMPILERS,
    )

    assert all(callable(resolve(name)) for name in (*TORCH_COMPILERS, *GRAD_FREE_CONTEXTS))
    for method in GRAD_RESET_METHODS:
        grad = torch.ones(3)
        args = (0.0,) if method == "fill_" else ()
        assert getattr(grad, method)(*args) is grad  # in place, on the gradient itself
    assert GRAD_ZEROING_METHODS <= GRAD_RESET_METHODS
    assert all(isinstance(getattr(torch.ones(2, 3), name)(), int) for name in SIZE_METHODS if name != "size")
    assert all(k in inspect.signature(torch.nn.functional.cross_entropy).parameters for k in LOSS_KEYWORDS)
    scaler = torch.amp.GradScaler("cpu")
    loss = torch.ones(())
    assert all(getattr(scaler, name)(loss) is not loss for name in SCALER_METHODS_RETURNING_NEW)


NOT_IN_PLACE = methods(
    Category.UNARY,
    Category.BINARY,
    Category.CAST,
    Category.VIEW,
    Category.ALONG_DIM,
    Category.REDUCTION,
    in_place=False,
) - {"cuda", "pin_memory"}


@pytest.mark.parametrize("name", sorted(NOT_IN_PLACE))
def test_methods_without_a_trailing_underscore_leave_their_receiver_as_it_was(name):
    """The table says a method writes in place by its trailing `_` (`Op.in_place`): those
    without one return their result and leave the receiver's values alone."""
    tensor = torch.rand(2, 3)
    before = tensor.clone()
    _call(METHOD + name, tensor)
    assert torch.equal(tensor, before)


# One call a shape rule, on a (2, 1, 3) tensor `x`, and the shape the rule says it gives.
SHAPE_CALLS = {
    "Tensor.view": (lambda x: x.view(3, 2), (3, 2)),
    "Tensor.reshape": (lambda x: x.reshape(3, 2), (3, 2)),
    "Tensor.expand": (lambda x: x.expand(4, 2, 1, 3), (4, 2, 1, 3)),
    "Tensor.repeat": (lambda x: x.repeat(1, 2, 1), (2, 2, 3)),  # a factor a dim
    "Tensor.transpose": (lambda x: x.transpose(0, 2), (3, 1, 2)),
    "Tensor.swapaxes": (lambda x: x.swapaxes(0, 2), (3, 1, 2)),
    "Tensor.swapdims": (lambda x: x.swapdims(0, 2), (3, 1, 2)),
    "Tensor.permute": (lambda x: x.permute(2, 0, 1), (3, 2, 1)),
    "Tensor.movedim": (lambda x: x.movedim(2, 0), (3, 2, 1)),
    "Tensor.unsqueeze": (lambda x: x.unsqueeze(0), (1, 2, 1, 3)),
    "Tensor.squeeze": (lambda x: x.squeeze(1), (2, 3)),
    "Tensor.flatten": (lambda x: x.flatten(1), (2, 3)),
    "Tensor.unflatten": (lambda x: x.unflatten(2, (3, 1)), (2, 1, 3, 1)),
    "Tensor.split": (lambda x: x.split(2, dim=-1)[0], (2, 1, 2)),  # a size first, then the dim
    "Tensor.chunk": (lambda x: x.chunk(3, dim=-1)[0], (2, 1, 1)),  # a count first
    "Tensor.tensor_split": (lambda x: x.tensor_split(3, dim=-1)[0], (2, 1, 1)),
    "Tensor.unbind": (lambda x: x.unbind(2)[0], (2, 1)),
    "Tensor.__iter__": (lambda x: next(iter(x)), (1, 3)),  # its slices along dim 0
    "torch.reshape": (lambda x: torch.reshape(x, (3, 2)), (3, 2)),
    "torch.transpose": (lambda x: torch.transpose(x, 0, 2), (3, 1, 2)),
    "torch.permute": (lambda x: torch.permute(x, (2, 0, 1)), (3, 2, 1)),
    "torch.unsqueeze": (lambda x: torch.unsqueeze(x, 0), (1, 2, 1, 3)),
    "torch.squeeze": (lambda x: torch.squeeze(x, 1), (2, 3)),
    "torch.flatten": (lambda x: torch.flatten(x, 1), (2, 3)),
    "torch.matmul": (lambda x: torch.matmul(x, torch.rand(3, 4)), (2, 1, 4)),
    "Tensor.matmul": (lambda x: x.matmul(torch.rand(2, 3, 4)), (2, 1, 4)),
    "torch.bmm": (lambda x: torch.bmm(x, torch.rand(2, 3, 4)), (2, 1, 4)),
    "Tensor.bmm": (lambda x: x.bmm(torch.rand(2, 3, 4)), (2, 1, 4)),
    "torch.mm": (lambda x: torch.mm(x[0], torch.rand(3, 4)), (1, 4)),
    "Tensor.mm": (lambda x: x[0].mm(torch.rand(3, 4)), (1, 4)),
    "torch.cat": (lambda x: torch.cat([x, x], 2), (2, 1, 6)),
    "torch.concat": (lambda x: torch.concat([x, x], -1), (2, 1, 6)),
    "torch.concatenate": (lambda x: torch.concatenate([x, x], 0), (4, 1, 3)),
    "torch.stack": (lambda x: torch.stack([x, x], 1), (2, 2, 1, 3)),
    "torch.zeros": (lambda x: torch.zeros(4, 5), (4, 5)),
    "torch.ones": (lambda x: torch.ones((4, 5)), (4, 5)),
    "torch.empty": (lambda x: torch.empty(4, 5), (4, 5)),
    "torch.rand": (lambda x: torch.rand(4, 5), (4, 5)),
    "torch.randn": (lambda x: torch.randn((4, 5)), (4, 5)),
    "Tensor.new_zeros": (lambda x: x.new_zeros(4, 5), (4, 5)),
    "Tensor.new_ones": (lambda x: x.new_ones((4, 5)), (4, 5)),
    "Tensor.new_empty": (lambda x: x.new_empty(4, 5), (4, 5)),
    "torch.full": (lambda x: torch.full((4, 5), 7.0), (4, 5)),  # the shape, then the value
    "Tensor.new_full": (lambda x: x.new_full((4, 5), 7.0), (4, 5)),
    "torch.zeros_like": (lambda x: torch.zeros_like(x), (2, 1, 3)),
    "torch.ones_like": (lambda x: torch.ones_like(x), (2, 1, 3)),
    "torch.empty_like": (lambda x: torch.empty_like(x), (2, 1, 3)),
    "torch.full_like": (lambda x: torch.full_like(x, 7.0), (2, 1, 3)),
    "torch.rand_like": (lambda x: torch.rand_like(x), (2, 1, 3)),
    "torch.randn_like": (lambda x: torch.randn_like(x), (2, 1, 3)),
    "torch.randint_like": (lambda x: torch.randint_like(x, 10), (2, 1, 3)),
    "torch.randint": (lambda x: torch.randint(0, 10, (4, 5)), (4, 5)),  # the bounds, then the sizes
    "torch.linspace": (lambda x: torch.linspace(0, 1, 5), (5,)),
    "torch.logspace": (lambda x: torch.logspace(0, 1, 5), (5,)),
    "torch.tensor": (lambda x: torch.tensor([[-1.2, 3.1], [0.5, 2.0], [1, 2]]), (3, 2)),
    "torch.as_tensor": (lambda x: torch.as_tensor(((True,), (False,))), (2, 1)),
}


def test_every_entry_with_a_shape_rule_is_sampled():
    assert {name for name, op in OPS.items() if op.shape is not None} == set(SHAPE_CALLS)


@pytest.mark.parametrize("name", sorted(SHAPE_CALLS))
def test_shape_rules_give_the_shapes_they_say(name):
    call, expected = SHAPE_CALLS[name]
    x = torch.rand(2, 1, 3)
    result = call(x)
    assert tuple(result.shape) == expected
    rule = OPS[name].shape
    if rule is Shape.REORDERED:
        assert sorted(result.shape) == sorted(x.shape)
    if rule is Shape.SQUEEZED:
        assert result.numel() == x.numel() and result.dim() != x.dim()
    if rule is Shape.LIKE:
        assert result.shape == x.shape
    if rule is Shape.FILLED:
        assert bool((result == 7.0).all())


RECURRENT_LAYERS = sorted(name for name, op in OPS.items() if op.steps_dim is not None)


def test_the_recurrent_layers_say_where_their_steps_are():
    assert RECURRENT_LAYERS and {OPS[n].category for n in RECURRENT_LAYERS} == {Category.RECURRENT}
    assert all(OPS[n].steps_dim is not None for n in OPS if OPS[n].category is Category.RECURRENT)


@pytest.mark.parametrize("name", RECURRENT_LAYERS)
def test_a_recurrent_layers_steps_are_at_its_steps_dim_unless_batch_first(name):
    """A step's output depends on the steps before it and not on those after: changing the
    input at the last step along the dim the table names changes only that step's output."""
    op = OPS[name]
    layer_class = eval(name, {"torch": torch})
    for batch_first, dim in ((False, op.steps_dim), (True, 1)):
        torch.manual_seed(0)
        layer = layer_class(3, 4, **{op.batch_first: batch_first})
        x = torch.rand(5, 2, 3) if dim == 0 else torch.rand(2, 5, 3)
        changed = x.clone()
        changed.select(dim, 4).add_(1.0)
        with torch.no_grad():
            moved = (layer(changed)[0] - layer(x)[0]).abs().sum(-1)
        assert moved.select(dim, 4).min() > 0 and moved.narrow(dim, 0, 4).max() == 0


# The calls that work on the last dims, each on a batch of rows: a function of one row,
# given a (4, 3) row, and torch's result for a batch (2, 4, 3) of them.
_WEIGHT, _INDICES = torch.rand(5, 3), torch.tensor([[0, 2], [1, 4]])
LAST_DIM_CALLS = {
    "torch.tril": lambda x: torch.tril(x, 1),
    "torch.triu": lambda x: torch.triu(x, -1),
    "Tensor.tril": lambda x: x.tril(1),
    "Tensor.triu": lambda x: x.triu(),
    "torch.matmul": lambda x: torch.matmul(x, _WEIGHT.T),
    "Tensor.matmul": lambda x: x.matmul(_WEIGHT.T),
    f"{FUNCTIONAL}.linear": lambda x: torch.nn.functional.linear(x, _WEIGHT),
    f"{FUNCTIONAL}.layer_norm": lambda x: torch.nn.functional.layer_norm(x, (3,)),
    f"{FUNCTIONAL}.scaled_dot_product_attention": lambda x: torch.nn.functional.scaled_dot_product_attention(x, x, x),
    f"{FUNCTIONAL}.embedding": lambda x: torch.nn.functional.embedding((x * 4).long(), _WEIGHT),
    "torch.nn.Linear": torch.nn.Linear(3, 5),
    "torch.nn.modules.linear.Linear": torch.nn.modules.linear.Linear(3, 5),
    "torch.nn.LayerNorm": torch.nn.LayerNorm(3),
    "torch.nn.RMSNorm": torch.nn.RMSNorm(3),
}


def test_every_last_dims_entry_is_sampled():
    assert {name for name, op in OPS.items() if op.last_dims} == set(LAST_DIM_CALLS)


@pytest.mark.parametrize("name", sorted(LAST_DIM_CALLS))
def test_last_dims_entries_keep_the_leading_dims_as_a_batch(name):
    """Whatever the arguments say, one more leading dim gives each row what it gave alone."""
    call = LAST_DIM_CALLS[name]
    batch = torch.rand(2, 4, 3)
    with torch.no_grad():
        torch.testing.assert_close(call(batch), torch.stack([call(row) for row in batch]))


@pytest.mark.parametrize(
    "name",
    sorted(functions(Category.ELEMENTWISE_LAYER, Category.NORM_LAYER, Category.DROPOUT_LAYER)),
)
def test_layers_keep_the_shape_and_elementwise_ones_each_element(name):
    module = _layer(name)
    assert OPS[name].module
    x = _input_for(name, 2)
    with torch.no_grad():
        assert module(x).shape == x.shape
        if OPS[name].category is Category.ELEMENTWISE_LAYER:
            torch.testing.assert_close(module(x).flatten(), module(x.flatten()))


def test_metadata_methods_answer_with_python_values():
    x = torch.rand(2, 3)
    for name in methods(Category.METADATA):
        assert isinstance(getattr(x, name)(*((1,) if name == "size" else ())), (int, bool)), name


@pytest.mark.parametrize("name", sorted(functions(Category.REDUCTION, Category.NORM)))
def test_reductions_take_the_dim_first_and_norms_after_the_order(name):
    x = torch.rand(2, 3, 4)
    before_dim = (2,) if OPS[name].category is Category.NORM else ()
    function = resolve(name)
    assert function(x, *before_dim, 1).shape == (2, 4)
    if name != "torch.count_nonzero":  # the one without `keepdim`
        assert function(x, *before_dim, 1, keepdim=True).shape == (2, 1, 4)
    short = name.rsplit(".", 1)[1]
    method = getattr(x, short)
    assert method(*before_dim, -1).shape == (2, 3)
    if short != "logsumexp":  # the one that needs its dim
        assert method().shape == ()


@pytest.mark.parametrize("name", sorted(n for n, op in OPS.items() if op.shape is Shape.PRODUCT and not op.last_dims))
def test_products_not_on_the_last_dims_refuse_one_more_leading_dim(name):
    """`mm` takes matrices and `bmm` batches of them, nothing with a dim more (`matmul`
    broadcasts it): a rewrite that adds a dim to their operands would break them."""
    call, _ = SHAPE_CALLS[name]
    with pytest.raises(RuntimeError):
        call(torch.rand(2, 2, 1, 3))


# -- where a result is, and its dtype ------------------------------------------------------

# Arguments, given the receiver, for the methods whose placement and dtype are sampled
# beyond EXTRA's.
CALL_ARGUMENTS = {
    "to": lambda t: (torch.float64,),
    "type": lambda t: (torch.float64,),
    "new_zeros": lambda t: (2,),
    "new_ones": lambda t: (2,),
    "new_empty": lambda t: (2,),
    "new_full": lambda t: ((2,), 1),
    "repeat": lambda t: (1, 2),
    "lerp": lambda t: (torch.zeros_like(t), 0.5),
    "copy_": lambda t: (torch.zeros_like(t),),
    "equal": lambda t: (t.clone(),),
    "allclose": lambda t: (t.clone(),),
    "__format__": lambda t: ("",),
}
# Methods that need a device, a stream or a graph to call: their entries are checked by name.
NOT_CALLED = {"cuda", "pin_memory", "record_stream", "backward", "register_hook", "retain_grad", "set_", "__iter__"}


def _method_result(name: str, tensor: torch.Tensor):
    short = name.removeprefix(METHOD)
    arguments = CALL_ARGUMENTS.get(short)
    if arguments is None:
        return _call(name, tensor)
    return getattr(tensor, short)(*arguments(tensor))


@pytest.mark.parametrize(
    "name", sorted(n for n, op in OPS.items() if n.startswith(METHOD) and n.removeprefix(METHOD) not in NOT_CALLED)
)
def test_each_methods_result_is_where_and_of_the_dtype_the_table_says(name):
    """`Op.placement`: a tensor where the receiver is, on the host, where it is told, or no
    tensor; `Op.result_dtype`: the dtype whatever the receiver's (a double receiver and an
    int one tell a kept dtype from a named one)."""
    op = OPS[name]
    if op.category in (Category.MATMUL, Category.SPARSE) or op.random:
        pytest.skip("a product's operands, a draw: their placement is their operands'")
    receivers = (torch.rand(2, 3, dtype=torch.float64), torch.arange(6).view(2, 3))
    if op.category is Category.TO_HOST:  # a Python number of one element
        receivers = tuple(r[:1, :1] for r in receivers)
    answered = 0
    for receiver in receivers:
        receiver = receiver.clone()
        try:
            result = _method_result(name, receiver)
        except (RuntimeError, TypeError):
            continue  # not for this dtype: float math of integers, `__index__` of floats
        answered += 1
        results = result if isinstance(result, tuple) and op.placement is not Placement.NO_TENSOR else (result,)
        for piece in results:
            if op.placement is Placement.NO_TENSOR:
                assert not isinstance(piece, torch.Tensor), name
                continue
            assert isinstance(piece, torch.Tensor) and piece.device == receiver.device, name
            dtype = op.result_dtype
            if dtype == KEPT:
                assert piece.dtype == receiver.dtype, name
            elif dtype == FLOATING:
                assert piece.is_floating_point(), name
            elif dtype in DTYPE_OF:
                assert piece.dtype == getattr(torch, dtype), name
            if op.placement is Placement.HOST:
                assert piece.device.type == "cpu"
    assert answered, name


def test_the_moves_are_told_or_go_to_the_host_and_factories_are_told():
    """The placements the table gives by category or entry: factories take `device=`, the
    host-only ones do not, and a tensor's own factories make theirs where it is."""
    for name in functions(Category.FACTORY, placement=Placement.TOLD):
        if name.startswith("torch."):
            assert "device" in str(resolve(name).__doc__) or name.endswith("_mask"), name
    host = functions(placement=Placement.HOST)
    assert host == {"torch.from_numpy", "torch.frombuffer"}
    import numpy as np

    assert torch.from_numpy(np.zeros(3)).device.type == "cpu"
    assert {"to", "type", "cuda"} == methods(placement=Placement.TOLD)
    assert {"cpu", "pin_memory"} == methods(placement=Placement.HOST)
    assert all(OPS[METHOD + n].result_dtype == NAMED for n in ("to", "type", "type_as"))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_the_dtypes_are_torchs(dtype):
    """Each dtype, its aliases, its size, its kind and the method that casts to it."""
    found = getattr(torch, dtype.name)
    assert isinstance(found, torch.dtype)
    assert all(getattr(torch, alias) is found for alias in dtype.aliases)
    assert found.itemsize == dtype.bytes
    assert found.is_floating_point == (dtype.kind == "float") and found.is_complex == (dtype.kind == "complex")
    assert (found == torch.bool) == (dtype.kind == "bool")
    if dtype.cast is not None:
        assert OPS[METHOD + dtype.cast].category is Category.CAST
        assert getattr(torch.zeros(2), dtype.cast)().dtype is found


def test_every_method_named_after_a_dtype_casts_to_it():
    for name in methods(Category.CAST):
        if name in DTYPE_OF and not name.endswith("_"):
            assert OPS[METHOD + name].result_dtype == DTYPE_OF[name].name, name


def test_pure_entries_change_nothing_and_draw_nothing():
    """`Op.pure`: no draw, no write in place, no effect beside its result (a checkpoint, the
    gradients, the backward pass, storage), no module built with weights."""
    for name, op in OPS.items():
        if op.pure:
            assert not (op.random or op.in_place), name
            assert op.category not in (Category.SAVE, Category.GRAD_NORM, Category.AUTOGRAD, Category.MEMORY), name
    assert not OPS["torch.nn.Linear"].pure and OPS["torch.nn.CrossEntropyLoss"].pure


def _constructor_arguments(layer: type[torch.nn.Module]) -> list[tuple[str, object]]:
    """The arguments of a layer's constructor in order, with their defaults (None: required);
    the recurrent layers take `*args` and hand them to RNNBase after their `mode`."""
    init = torch.nn.RNNBase.__init__ if issubclass(layer, torch.nn.RNNBase) else layer.__init__
    parameters = list(inspect.signature(init).parameters.values())[1:]
    if issubclass(layer, torch.nn.RNNBase):
        parameters = parameters[1:]
    return [(p.name, None if p.default is inspect.Parameter.empty else p.default) for p in parameters]


@pytest.mark.parametrize("name", sorted(SIZED_LAYERS))
def test_each_sized_layers_arguments_are_its_constructors_first(name):
    arguments = SIZED_LAYERS[name].arguments
    assert _constructor_arguments(getattr(torch.nn, name))[: len(arguments)] == list(arguments)


@pytest.mark.parametrize("name", sorted(name for name, layer in SIZED_LAYERS.items() if layer.gates))
def test_each_recurrent_layers_gates_are_its_weight_matrices(name):
    layer = getattr(torch.nn, name)(input_size=3, hidden_size=5)
    assert layer.weight_ih_l0.shape == (SIZED_LAYERS[name].gates * 5, 3)
    assert layer.weight_hh_l0.shape == (SIZED_LAYERS[name].gates * 5, 5)


_SMALL = {"kernel_size": 3, "num_groups": 2, "num_embeddings": 10}


@pytest.mark.parametrize("name", sorted(SIZED_LAYERS))
def test_a_layer_is_one_operator_exactly_when_its_traced_forward_calls_one(name):
    """torch.fx traces the layer's forward: one call of a torch function or method, and
    nothing else, is what PM506 takes as nothing to fuse (a BatchNorm also counts its
    batches in training; a recurrent layer's forward cannot be traced)."""
    layer = SIZED_LAYERS[name]
    required = {arg: _SMALL.get(arg, 4) for arg, default in layer.arguments if default is None}
    module = getattr(torch.nn, name)(**required)
    try:
        graph = torch.fx.symbolic_trace(module).graph
    except Exception:  # control flow on the input: more than one operator in any case
        assert not layer.one_operator
        return
    calls = [node for node in graph.nodes if node.op in ("call_function", "call_method", "call_module")]
    assert (len(calls) == 1) == layer.one_operator, [node.target for node in calls]


def test_only_the_recurrent_layers_have_gates():
    assert {name for name, layer in SIZED_LAYERS.items() if layer.gates} == {
        name for name in SIZED_LAYERS if issubclass(getattr(torch.nn, name), torch.nn.RNNBase)
    }


@pytest.mark.parametrize("name", sorted(methods(fills=True)))
def test_filling_methods_write_one_value_to_every_element(name):
    tensor = torch.randn(2, 3)
    arguments = EXTRA.get(name, ())
    getattr(tensor, name)(*arguments)
    assert torch.equal(tensor, torch.full((2, 3), float(arguments[0]) if arguments else 0.0))


# Small constructor arguments of the `nn` layers that need some, by class name.
LAYER_ARGUMENTS = {
    **dict.fromkeys(("GroupNorm",), (1, 4)),
    **dict.fromkeys(("LayerNorm", "RMSNorm"), (5,)),
    **dict.fromkeys(("Softmax", "LogSoftmax"), (-1,)),
    **dict.fromkeys(("BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm"), (4,)),
    **{f"{kind}Pool{n}d": (2,) for kind in ("Max", "Avg") for n in (1, 2, 3)},
    **{f"Adaptive{kind}Pool{n}d": (1,) for kind in ("Max", "Avg") for n in (1, 2, 3)},
    "Unflatten": (1, (2, 2)),
    "PixelShuffle": (2,),
    **dict.fromkeys(("ZeroPad2d", "ReflectionPad2d", "ReplicationPad2d"), (1,)),
    "ConstantPad2d": (1, 0.0),
}
LAYERS = sorted(
    name
    for name in functions(
        Category.ELEMENTWISE_LAYER,
        Category.NORM_LAYER,
        Category.DROPOUT_LAYER,
        Category.POOLING_LAYER,
        Category.RESHAPING_LAYER,
        module=True,
    )
)


def _input_for(name: str, batch: int) -> torch.Tensor:
    """(batch, 4, ..., 5): the spatial dims a `...1d`, `2d` or `3d` layer or function takes (2 otherwise)."""
    short = name.rsplit(".", 1)[1]
    spatial = int(short[-2]) if short.endswith("d") and short[-2].isdigit() else 2
    return torch.rand(batch, 4, *(3,) * (spatial - 1), 5)


def _layer(name: str) -> torch.nn.Module:
    short = name.rsplit(".", 1)[1]
    return resolve(name)(*LAYER_ARGUMENTS.get(short, ()), **({"scale_factor": 2} if short == "Upsample" else {}))


@pytest.mark.parametrize("name", LAYERS)
def test_a_layer_is_stateless_exactly_when_it_has_no_parameters_or_buffers(name):
    layer = _layer(name)
    assert OPS[name].stateless == (not list(layer.parameters()) and not list(layer.buffers()))


@pytest.mark.parametrize("name", sorted(functions(Category.NORM_LAYER) | functions(Category.BATCH_NORM)))
def test_a_layer_mixes_the_batch_exactly_when_a_samples_row_depends_on_the_others(name):
    """In training mode, a sample's output in a batch of 2 and in a batch of 8 is the same
    unless the layer mixes the samples (batch norm's statistics)."""
    torch.manual_seed(0)
    x = _input_for(name, 8)
    if OPS[name].module:
        layer = _layer(name).train()
    else:  # `F.batch_norm` with no running statistics: the batch's
        layer = lambda batch: resolve(name)(batch, None, None, training=True)  # noqa: E731
    with torch.no_grad():
        alike = torch.allclose(layer(x)[0], layer(x[:2])[0])
    assert OPS[name].mixes_batch == (not alike)


def _parameter_names(name: str) -> list[str]:
    target = resolve(name)
    try:
        return list(inspect.signature(target).parameters)
    except ValueError:  # a builtin of torch (`torch.dropout`): its ATen schema names its arguments
        return [argument.name for argument in getattr(torch.ops.aten, OPS[name].short).default._schema.arguments]


@pytest.mark.parametrize("name", sorted(n for n, op in OPS.items() if op.drop_probability is not None))
def test_each_dropout_takes_its_probability_where_the_table_says(name):
    """The keyword is the argument at the position; given there, p=1 changes every element
    and p=0 none (in training mode: a function's argument after `p`, a module's `.train()`)."""
    position, keyword = OPS[name].drop_probability
    assert _parameter_names(name)[position] == keyword
    x = _input_for(name, 4)
    if OPS[name].module:
        build = resolve(name)
        run = lambda p: build(*[0.5] * position, p).train()(x)  # noqa: E731
    else:
        run = lambda p: resolve(name)(*[x, 0.5][:position], p, True)  # noqa: E731
    assert torch.equal(run(0.0), x)
    assert not torch.isclose(run(1.0), x).any()


@pytest.mark.parametrize("name", sorted(functions(Category.GRAD_MODE)))
def test_grad_modes_record_a_graph_as_the_table_says(name):
    records = OPS[name].records_graph
    for outside in (torch.no_grad, torch.enable_grad):
        for told in (True, False) if records is None else (None,):
            with outside(), resolve(name)(*(() if told is None else (told,))):
                assert torch.is_grad_enabled() == (told if records is None else records)


def test_cuda_probes_tell_whether_the_process_has_a_cuda_device():
    probes = functions(Category.PROCESS, device_probe="cuda")
    assert probes
    for name in probes:
        assert bool(resolve(name)()) == (torch.cuda.device_count() > 0), name


def test_cache_releases_are_the_cuda_allocators_and_free_what_it_holds_unused():
    releases = functions(Category.PROCESS, frees_cache=True)
    assert {resolve(name) for name in releases} == {torch.cuda.memory.empty_cache}
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    block = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    del block
    assert torch.cuda.memory_reserved() > 0
    for name in releases:
        resolve(name)()
        assert torch.cuda.memory_reserved() == 0


# How float32 products run: cuBLAS's matmuls, cuDNN's convolutions and RNNs (torch's own readings).
_FLOAT32_PRECISION = "(b.cuda.matmul.fp32_precision, b.cudnn.conv.fp32_precision, b.cudnn.rnn.fp32_precision)"


@pytest.mark.parametrize("name", sorted(functions(Category.SETTING, float32_precision=True)))
def test_float32_precision_settings_change_how_float32_products_run(name):
    """Each, set to another value, changes what torch says float32 products run in (in a
    process of its own: torch refuses to read a mix of its two ways of setting it)."""
    value = resolve(name)
    if callable(value):  # `set_float32_matmul_precision`, "highest" by default
        statement = f"{name}('high')"
    elif isinstance(value, bool):
        statement = f"{name} = not {name}"
    else:
        statement = f"{name} = 'ieee' if {name} != 'ieee' else 'tf32'"
    script = f"import torch; b = torch.backends; before = {_FLOAT32_PRECISION}; {statement}; print(before != {_FLOAT32_PRECISION})"
    changed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert changed.strip() == "True"


def test_measures_are_sizes_never_negative():
    measures = methods(measures=True)
    assert measures
    for tensor in (torch.rand(2, 3), torch.zeros(0, dtype=torch.int8)):
        for name in measures:
            value = getattr(tensor, name)(*((0,) if name == "size" and tensor.dim() else ()))
            assert isinstance(value, int) and value >= 0, name
    # A metadata method may be a negative int: the device index of a host tensor.
    assert torch.rand(2).get_device() == -1 and "get_device" not in measures


@pytest.mark.parametrize("name", sorted(functions(totals=True)))
def test_totals_add_up_or_average_every_element(name):
    x = torch.rand(3, 4, dtype=torch.float64)
    total = resolve(name)(x)
    assert total.shape == ()
    assert total.item() in (pytest.approx(sum(x.flatten().tolist())), pytest.approx(sum(x.flatten().tolist()) / 12))


@pytest.mark.parametrize("name", sorted(functions(permutes=True)))
def test_permutations_are_orders_of_range_n(name):
    assert torch.equal(resolve(name)(7).sort().values, torch.arange(7))


def test_the_compilers_compile_with_dynamo():
    from torch._dynamo.eval_frame import OptimizedModule

    assert functions(Category.WRAPPER, compiles=True) and module_methods(compiles=True)
    for name in functions(Category.WRAPPER, compiles=True):
        assert isinstance(resolve(name)(torch.nn.Linear(2, 2)), OptimizedModule), name
    for name in module_methods(compiles=True):
        module = torch.nn.Linear(2, 2)
        getattr(module, name)()
        assert module._compiled_call_impl is not None, name


@pytest.mark.parametrize("name", sorted(module_methods(sets_up=True)))
def test_set_up_methods_change_the_module_in_place(name):
    """The module keeps its parameter objects (moved, cast or loaded in place)."""
    if name in ("cuda", "xpu", "ipu", "mtia"):
        pytest.skip("needs its device")
    module = torch.nn.Linear(2, 2)
    before = list(module.parameters())
    arguments = {
        "to": (torch.float64,),
        "type": (torch.float64,),
        "apply": (lambda m: None,),
        "load_state_dict": (torch.nn.Linear(2, 2).state_dict(),),
    }
    getattr(module, name)(*arguments.get(name, ()), **({"device": "cpu"} if name == "to_empty" else {}))
    assert all(p is q for p, q in zip(module.parameters(), before, strict=True))


def test_accelerator_moves_go_to_an_accelerator_without_an_argument():
    assert all(callable(getattr(torch.Tensor, name)) for name in methods(accelerator=True))
    assert all(callable(getattr(torch.nn.Module, name)) for name in module_methods(accelerator=True))
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    assert torch.zeros(2).cuda().device.type == "cuda"
    assert next(torch.nn.Linear(2, 2).cuda().parameters()).device.type == "cuda"


# nn.Module's reads of its parts without arguments, and the arguments of its other methods.
MODULE_READS = (
    "parameters buffers modules children named_parameters named_buffers named_modules named_children state_dict"
).split()
MODULE_METHOD_ARGUMENTS = {
    "to": (torch.float64,),
    "type": (torch.float64,),
    "apply": (lambda m: torch.nn.init.zeros_(m.weight) if isinstance(m, torch.nn.Linear) else None,),
    "requires_grad_": (False,),
    "forward": (torch.rand(3, 2),),
}


def _same(part, other) -> bool:
    """The same object, the same name (a state_dict's key), or the same name and object."""
    if isinstance(part, tuple):
        return part[0] == other[0] and part[1] is other[1]
    return part is other or (isinstance(part, str) and part == other)


def _model_state(model: torch.nn.Module) -> list:
    parameters = [(p.dtype, p.requires_grad, p.grad is None, p.detach().double().tolist()) for p in model.parameters()]
    return [model.training, *parameters]


def test_distributed_data_parallel_answers_like_the_module_it_wraps(tmp_path):
    """On a real DDP (one process, gloo): a read of the module's parts answers the module's
    parts exactly when the table says DDP answers it (`named_parameters` are prefixed with
    `module.`, `children()` is the module), and every other method it answers does to the
    module what it does called on the module."""
    import copy

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/group", rank=0, world_size=1)
    try:
        answered = module_methods(wrapper_answers=True)
        assert answered - {"cuda"}
        for name in sorted(answered | set(MODULE_READS)):
            if name == "cuda" and not torch.cuda.is_available():
                continue
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
            alone = copy.deepcopy(model)
            for p in (*model.parameters(), *alone.parameters()):
                p.grad = torch.ones_like(p)
            wrapper = torch.nn.parallel.DistributedDataParallel(model)
            arguments = MODULE_METHOD_ARGUMENTS.get(name, ())
            through, direct = getattr(wrapper, name)(*arguments), getattr(alone, name)(*arguments)
            if name in MODULE_READS:
                through, direct = list(through), list(getattr(model, name)())
                assert all(any(_same(t, d) for t in through) for d in direct) == (name in answered), name
                continue
            if name == "forward":
                torch.testing.assert_close(through, direct)
            assert _model_state(model) == _model_state(alone), name
        # The analyses' DDP_ANSWERS add the mode every module has and DDP's own `no_sync`.
        assert all(hasattr(wrapper, name) for name in DDP_ANSWERS)
        assert wrapper.eval().training is model.training is False
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("name", sorted(DEVICE_AND_DTYPE_KEEPING_METHODS))
def test_device_and_dtype_keeping_methods_give_a_floating_tensor_where_their_receiver_is(name):
    """Their result, or their receiver for an in-place one, a tensor of a floating dtype where
    the receiver is (on the GPU where there is one)."""
    tensor = torch.rand(2, 3, device="cuda" if torch.cuda.is_available() else "cpu")
    result = _call(METHOD + name, tensor)
    assert isinstance(result, torch.Tensor) and result.device == tensor.device and result.dtype.is_floating_point


@pytest.mark.parametrize("name", sorted(n for n, op in OPS.items() if op.holds is not None))
def test_module_tables_hold_their_modules_as_a_list_or_a_dict(name):
    linear = torch.nn.Linear(2, 2)
    holds = OPS[name].holds
    table = resolve(name)([linear] if holds == "list" else {"linear": linear})
    assert list(table.values() if holds == "dict" else table) == [linear]


# Arguments of torch's functions that answer no tensor, or a host tensor: settings set to
# what they are, types and a tensor's metadata and values.
_X = torch.tensor([1.0])
NOT_TENSOR_ARGUMENTS = {
    "manual_seed": (0,),
    "set_rng_state": (torch.get_rng_state(),),
    "set_num_threads": (torch.get_num_threads(),),
    "set_default_dtype": (torch.get_default_dtype(),),
    "set_default_device": (None,),
    "use_deterministic_algorithms": (torch.are_deterministic_algorithms_enabled(),),
    "set_float32_matmul_precision": (torch.get_float32_matmul_precision(),),
    "device": ("cpu",),
    "finfo": (torch.float32,),
    "iinfo": (torch.int64,),
    "result_type": (_X, 1),
    "promote_types": (torch.float32, torch.float64),
    "can_cast": (torch.float32, torch.int64),
    "broadcast_shapes": ((2, 1), (1, 3)),
    **dict.fromkeys(("is_tensor", "typename", "numel", "is_floating_point", "is_complex", "is_nonzero"), (_X,)),
}


@pytest.mark.parametrize(
    "name",
    sorted(
        name
        for name in functions(Category.SETTING, Category.TYPES) | functions(Category.METADATA, Category.TO_HOST)
        if callable(resolve(name)) and name != "torch.set_num_interop_threads"  # once a process, before any work
    ),
)
def test_settings_types_and_reads_answer_no_tensor_or_a_host_tensor(name):
    state = torch.get_rng_state()
    try:
        result = resolve(name)(*NOT_TENSOR_ARGUMENTS.get(OPS[name].short, ()))
    finally:
        torch.set_rng_state(state)  # `torch.seed()` reseeds the generator
    if OPS[name].placement is Placement.HOST:
        assert isinstance(result, torch.Tensor) and result.device.type == "cpu"
    else:
        assert OPS[name].placement is Placement.NO_TENSOR and not isinstance(result, torch.Tensor), name


# The pairwise functions, and one that computes its distances without a matrix product.
PAIRWISE = sorted(functions(Category.PAIRWISE) | {f"{FUNCTIONAL}.pdist"})


@pytest.mark.parametrize("name", PAIRWISE)
def test_pairwise_functions_multiply_matrices(name):
    """What torch's profiler sees them run (40 rows: `cdist` multiplies past 25)."""
    from torch.profiler import profile

    x = torch.rand(40, 8)
    with profile() as run:
        resolve(name)(*((x, x) if OPS.get(name, None) and OPS[name].short == "cdist" else (x,)))
    products = {"aten::mm", "aten::bmm", "aten::addmm", "aten::matmul"}
    assert bool(products & {event.name for event in run.events()}) == (name in functions(Category.PAIRWISE))


def test_batch_norms_that_normalise_over_one_process_share_are_told_from_sync_batch_norm():
    """PM601's BatchNorm obstacle comes from the table: SyncBatchNorm gathers its statistics
    over every process of a data-parallel run, the other BatchNorm layers do not."""
    assert "torch.nn.BatchNorm2d" in PER_RANK_BATCH_NORMS and "torch.nn.SyncBatchNorm" not in PER_RANK_BATCH_NORMS
    assert {"torch.nn.SyncBatchNorm", "torch.nn.BatchNorm2d"} <= BATCH_MIXING_LAYERS
    for name in PER_RANK_BATCH_NORMS:
        module, _, short = name.rpartition(".")
        layer = getattr(importlib.import_module(module), short)
        assert issubclass(layer, torch.nn.modules.batchnorm._BatchNorm) or "Lazy" in short
