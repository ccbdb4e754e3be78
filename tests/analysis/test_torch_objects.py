"""The tables of torch's objects that are no operation (optimizers, learning-rate
schedulers, legacy tensor types, datasets, torch.utils.data's functions, loaders) checked
against the installed torch: every name is torch's, each optimizer takes the keywords and
keeps the state its entry says, each scheduler writes only the keys of a parameter group
its entry says, and each dataset and data function does what its entry says."""

from __future__ import annotations

import inspect
import warnings

import libcst as cst
import pytest
import torch
from torch.optim import lr_scheduler
from torch.utils import data

from codemod.analysis import torch_facts
from codemod.analysis.loaders import INDEXES
from codemod.analysis.torch_ops import (
    DATA_FUNCTIONS,
    DATASETS,
    DEFAULT_TENSOR_TYPES,
    IMPLEMENTATION_KEYWORDS,
    LOADERS,
    LR_KEYS,
    OPTIMIZERS,
    SCHEDULERS,
    DataFunction,
    data_functions,
    datasets,
)
from codemod.analysis.values import Kind
from codemod.context import FileContext
from tests.torch_support import resolve

TABLES = [OPTIMIZERS, SCHEDULERS, DEFAULT_TENSOR_TYPES, DATASETS, DATA_FUNCTIONS, LOADERS]


@pytest.mark.parametrize("table", TABLES, ids=lambda table: next(iter(table)).rpartition(".")[2])
def test_every_name_is_torchs_and_names_of_one_object_are_one_entry(table):
    by_object: dict[int, set[object]] = {}
    for name, entry in table.items():
        by_object.setdefault(id(resolve(name)), set()).add(entry)
    assert all(len(entries) == 1 for entries in by_object.values())


def _torch_optimizers() -> dict[str, type]:
    return {
        f"torch.optim.{name}": cls
        for name, cls in vars(torch.optim).items()
        if isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer) and cls is not torch.optim.Optimizer
    }


def _parameters() -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(torch.randn(3, 2))]


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_an_optimizer_takes_the_implementation_keywords_it_is_said_to_and_rejects_the_others(name):
    optimizer = OPTIMIZERS[name]
    cls = resolve(name)
    assert set(inspect.signature(cls).parameters) & set(IMPLEMENTATION_KEYWORDS) == set(optimizer.accepts)
    for keyword in set(IMPLEMENTATION_KEYWORDS) - set(optimizer.accepts):
        with pytest.raises(TypeError, match=keyword):
            cls(_parameters(), lr=0.01, **{keyword: False})
    assert ("fused" in optimizer.accepts) == bool(optimizer.fused_devices)


@pytest.mark.parametrize("name", sorted(_torch_optimizers()))
def test_an_optimizer_said_to_be_fused_runs_fused_on_the_cpu_and_every_other_rejects_fused(name):
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    cls = _torch_optimizers()[name]
    devices = OPTIMIZERS[name].fused_devices if name in OPTIMIZERS else frozenset()
    if not devices:
        with pytest.raises(TypeError, match="fused"):
            cls(_parameters(), fused=True)
        return
    assert devices <= set(_get_fused_kernels_supported_devices())
    if "cpu" not in devices:
        return  # the CPU is the one device type this test can run
    params = _parameters()
    optimizer = cls(params, lr=0.01, fused=True)
    params[0].grad = torch.ones_like(params[0])
    optimizer.step()
    assert optimizer.param_groups[0]["fused"] is True


# The value of each state option that switches it on.
STATE_OPTIONS_ON = {"momentum": 0.9, "amsgrad": True, "centered": True}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_an_optimizer_keeps_the_state_tensors_of_a_parameters_shape_its_entry_says(name):
    optimizer = OPTIMIZERS[name]
    options = optimizer.state_options
    for switched_on in ((), *((option,) for option in options), options):
        model = torch.nn.Linear(3, 2)
        flags = {option: STATE_OPTIONS_ON[option] for option in switched_on}
        stepper = resolve(name)(model.parameters(), lr=0.01, **flags)
        model(torch.randn(4, 3)).sum().backward()
        stepper.step()
        state = stepper.state[model.weight].values()
        shaped = [value for value in state if isinstance(value, torch.Tensor) and value.shape == model.weight.shape]
        assert len(shaped) == optimizer.states + len(switched_on), switched_on


# What each scheduler needs beyond the optimizer (ReduceLROnPlateau: lowered at the first
# step without improvement).
SCHEDULER_ARGUMENTS = {
    "LambdaLR": {"lr_lambda": lambda epoch: 0.5**epoch},
    "MultiplicativeLR": {"lr_lambda": lambda epoch: 0.5},
    "StepLR": {"step_size": 1},
    "MultiStepLR": {"milestones": [1, 2]},
    "ExponentialLR": {"gamma": 0.5},
    "CosineAnnealingLR": {"T_max": 4},
    "CosineAnnealingWarmRestarts": {"T_0": 2},
    "ReduceLROnPlateau": {"patience": 0},
    "CyclicLR": {"base_lr": 0.01, "max_lr": 0.1},
    "OneCycleLR": {"max_lr": 0.1, "total_steps": 10},
}


def _scheduler(name: str, optimizer: torch.optim.Optimizer):
    short = name.rpartition(".")[2]
    if short == "SequentialLR":
        parts = [lr_scheduler.ConstantLR(optimizer), lr_scheduler.LinearLR(optimizer)]
        return lr_scheduler.SequentialLR(optimizer, parts, milestones=[2])
    if short == "ChainedScheduler":
        return lr_scheduler.ChainedScheduler([lr_scheduler.ConstantLR(optimizer), lr_scheduler.StepLR(optimizer, 1)])
    return resolve(name)(optimizer, **SCHEDULER_ARGUMENTS.get(short, {}))


def _written_keys(name: str, optimizer: torch.optim.Optimizer) -> set[str]:
    """The keys of the parameter group that building and stepping the scheduler adds or changes."""
    (group,) = optimizer.param_groups
    before = {key: value for key, value in group.items() if key != "params"}
    scheduler = _scheduler(name, optimizer)
    for _ in range(3):
        optimizer.step()
        scheduler.step(*((1.0,) if isinstance(scheduler, lr_scheduler.ReduceLROnPlateau) else ()))
    missing = object()
    return {key for key, value in group.items() if key != "params" and before.get(key, missing) != value}


def _momentum_optimizers() -> list[torch.optim.Optimizer]:
    return [torch.optim.SGD(_parameters(), lr=0.1, momentum=0.9), torch.optim.Adam(_parameters(), lr=0.1)]


def test_the_schedulers_are_torchs():
    expected = {
        f"torch.optim.lr_scheduler.{name}"
        for name, cls in vars(lr_scheduler).items()
        # not the base classes, `LRScheduler` and its old name `_LRScheduler`
        if isinstance(cls, type) and issubclass(cls, lr_scheduler.LRScheduler) and not name.endswith("LRScheduler")
    }
    assert set(SCHEDULERS) == expected


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_a_scheduler_writes_the_learning_rate_and_only_the_keys_its_entry_says(name):
    written = set().union(*(_written_keys(name, optimizer) for optimizer in _momentum_optimizers()))
    writes = set(SCHEDULERS[name].writes)
    assert "lr" in written and written <= writes
    if name not in torch_facts.LR_ONLY_SCHEDULERS:
        assert written == writes  # each key said, SGD's momentum and Adam's betas


def test_the_schedulers_that_cycle_the_momentum_by_default_are_not_learning_rate_only():
    for name in ("CyclicLR", "OneCycleLR"):
        for optimizer in _momentum_optimizers():
            assert _written_keys(f"torch.optim.lr_scheduler.{name}", optimizer) & {"momentum", "betas"}
        assert f"torch.optim.lr_scheduler.{name}" not in torch_facts.LR_ONLY_SCHEDULERS


def test_a_zero_gradient_step_of_plain_sgd_reads_no_learning_rate():
    for lr in (0.1, 10.0):
        params = _parameters()
        start = params[0].detach().clone()
        optimizer = torch.optim.SGD(params, lr=0.01)
        optimizer.param_groups[0]["lr"] = lr
        params[0].grad = torch.zeros_like(params[0])
        optimizer.step()
        assert torch.equal(params[0], start)
    assert torch_facts.LR_GROUP_KEYS >= set(LR_KEYS)


@pytest.mark.parametrize("name", sorted(DEFAULT_TENSOR_TYPES))
def test_a_default_tensor_type_makes_its_dtype_the_default(name):
    dtype = getattr(torch, DEFAULT_TENSOR_TYPES[name])
    tensor_type = resolve(name)
    assert tensor_type.dtype == dtype
    if ".cuda." in name:
        return  # set only where CUDA is
    default = torch.get_default_dtype()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the call is deprecated
            torch.set_default_tensor_type(tensor_type)
        assert torch.get_default_dtype() == dtype and torch.tensor([1.0]).dtype == dtype
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.set_default_tensor_type(torch.FloatTensor)
        torch.set_default_dtype(default)
    assert torch.tensor([1.0]).dtype == default


ROWS = data.TensorDataset(torch.arange(12.0).view(6, 2), torch.arange(6))
# Each dataset made of others, built of ROWS, and the item of ROWS its item 1 is.
OF_DATASETS = {
    "Subset": (lambda cls: cls(ROWS, [4, 1]), ROWS[1]),
    "ConcatDataset": (lambda cls: cls([ROWS, ROWS]), ROWS[1]),
    "StackDataset": (lambda cls: cls(ROWS), (ROWS[1],)),
}


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))


def test_the_dataset_classes_are_torchs_and_iterable_as_said():
    for name, dataset in DATASETS.items():
        cls = resolve(name)
        assert issubclass(cls, data.Dataset)
        assert issubclass(cls, data.IterableDataset) == dataset.iterable, name
    assert torch_facts.ITERABLE_DATASET in datasets(iterable=True)


def test_the_items_of_a_dataset_of_rows_are_rows_of_its_tensors():
    for name in datasets(rows_of_tensors=True):
        tensors = (torch.randn(5, 3), torch.arange(5))
        dataset = resolve(name)(*tensors)
        assert all(_same(dataset[i], tuple(t[i] for t in tensors)) for i in range(5))


def test_a_dataset_of_datasets_gives_its_parts_items():
    for name in datasets(of_datasets=True):
        build, item = OF_DATASETS[name.rpartition(".")[2]]
        assert _same(build(resolve(name))[1], item), name


def test_a_rebuildable_dataset_built_twice_is_the_same_and_draws_nothing():
    for name in datasets(rebuildable=True):
        short = name.rpartition(".")[2]
        build = OF_DATASETS[short][0] if short in OF_DATASETS else lambda cls: cls(*ROWS.tensors)
        state = torch.get_rng_state()
        first, second = build(resolve(name)), build(resolve(name))
        assert torch.equal(torch.get_rng_state(), state)
        assert len(first) == len(second) and all(_same(first[i], second[i]) for i in range(len(first)))


def test_a_split_gives_subsets_of_its_first_argument():
    for name in data_functions(DataFunction.SPLIT):
        parts = resolve(name)(ROWS, [4, 2])
        assert all(isinstance(part, data.Subset) and part.dataset is ROWS for part in parts)


def test_each_kind_of_data_function_is_one_function_under_each_name():
    for kind in DataFunction:
        assert len({id(resolve(name)) for name in data_functions(kind)}) == 1, kind
    (get_worker_info,) = {resolve(name) for name in data_functions(DataFunction.WORKER_INFO)}
    assert get_worker_info() is None  # not in a loader's worker
    (collate,) = {resolve(name) for name in data_functions(DataFunction.COLLATE)}
    assert _same(collate([ROWS[0], ROWS[1]]), [torch.stack([ROWS[0][0], ROWS[1][0]]), torch.tensor([0, 1])])


def test_the_worker_options_are_a_loaders_and_raise_without_workers():
    values = {"persistent_workers": True, "prefetch_factor": 2, "multiprocessing_context": "spawn"}
    for name, loader in LOADERS.items():
        cls = resolve(name)
        assert set(loader.worker_options) <= set(inspect.signature(cls).parameters)
        assert set(loader.worker_options) - {"num_workers"} == set(values)
        for option, value in values.items():
            with pytest.raises(ValueError, match=option):
                cls(ROWS, num_workers=0, **{option: value})


HEAD = "import torch\nfrom torch.utils.data import DataLoader\n"


def test_a_dataset_imported_from_the_module_that_defines_it_is_known():
    context = FileContext.of_source(
        HEAD + "from torch.utils.data.dataset import TensorDataset, random_split\n"
        "train, val = random_split(TensorDataset(torch.randn(8, 2)), [6, 2])\nloader = DataLoader(train)\n"
    )
    (loader,) = context.loaders.constructions
    assert context.loaders.batch_cost(loader) == INDEXES


def test_a_stack_of_datasets_is_a_dataset():
    context = FileContext.of_source(
        HEAD + "from torch.utils.data import StackDataset, TensorDataset\n"
        "rows = TensorDataset(torch.randn(8, 2))\nstack = StackDataset(rows, rows)\n"
    )
    (stack,) = [call for call in context.index.find(cst.Call) if context.source(call.func) == "StackDataset"]
    assert context.kinds.fact(stack).kind is Kind.DATASET
