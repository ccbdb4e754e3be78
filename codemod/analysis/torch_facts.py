"""What perfmod knows about torch, in one place: names of factories, tensor
methods, losses and their reductions, autocast and scaler spellings, savers.

Rules and analyses look facts up here instead of keeping their own copies.
Names are qualified (aliases resolved): `F.cross_entropy` is
`torch.nn.functional.cross_entropy`.
"""

from __future__ import annotations

import libcst as cst

FUNCTIONAL = "torch.nn.functional"

# -- tensors ------------------------------------------------------------------------------

TENSOR_FACTORIES = {
    f"torch.{name}"
    for name in (
        "tensor as_tensor zeros ones empty full rand randn randint randperm arange "
        "linspace logspace eye zeros_like ones_like empty_like full_like rand_like "
        "randn_like randint_like normal bernoulli multinomial"
    ).split()
}
HOST_ONLY_FACTORIES = {"torch.from_numpy", "torch.frombuffer"}
TENSOR_FUNCTIONS = {
    f"torch.{name}"
    for name in (
        "stack cat concat hstack vstack where matmul bmm mm einsum softmax log_softmax "
        "exp log tanh sigmoid relu clamp abs sqrt mean sum max min argmax argmin "
        "flatten reshape transpose permute squeeze unsqueeze cumsum tril triu outer"
    ).split()
}
SAME_PLACE_METHODS = set(
    (
        "float half double bfloat16 long int short bool byte char view view_as reshape "
        "reshape_as unsqueeze squeeze permute transpose contiguous clone detach flatten "
        "t narrow expand expand_as repeat masked_fill type_as index_select gather "
        "softmax log_softmax exp log tanh sigmoid relu clamp abs sqrt mean sum neg "
        "add sub mul div matmul bmm mm pow"
    ).split()
)
TENSOR_ATTRIBUTES = {"data", "T", "mT", "H", "mH", "grad"}
# Tensor methods whose result is not a tensor where the receiver is (every other method of
# a tensor, `argmax`, `chunk`, `new_zeros`, gives tensors on the receiver's device); those
# named `is_*` answer a question.
NOT_SAME_PLACE_METHODS = set(
    (
        "to cuda cpu pin_memory numpy tolist item size dim ndimension numel nelement element_size "
        "data_ptr stride storage untyped_storage storage_offset get_device type equal allclose "
        "backward register_hook retain_grad share_memory_ record_stream __len__ __repr__ __str__ "
        "__format__ __bool__ __int__ __float__ __index__ __array__ __iter__"
    ).split()
)
DTYPE_NAMES = set(
    (
        "float float16 float32 float64 half double bfloat16 long int int8 int16 int32 "
        "int64 uint8 short bool complex64 complex128 cfloat cdouble float8_e4m3fn "
        "float8_e5m2"
    ).split()
)
DATASET_CLASSES = {
    "torch.utils.data.TensorDataset",
    "torch.utils.data.Dataset",
    "torch.utils.data.IterableDataset",
    "torch.utils.data.Subset",
    "torch.utils.data.ConcatDataset",
}
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
# Namespaces whose lowercase functions compute tensors where their tensor arguments are
# (`torch.cos(t)`, `F.relu(x)`, `torch.linalg.norm(x)`), except those listed below.
TENSOR_NAMESPACES = ("torch", "torch.nn.functional", "torch.linalg", "torch.special", "torch.fft", "torch.nn.utils.rnn")
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
NOT_TENSOR_FUNCTIONS = {
    f"torch.{name}"
    for name in (
        "save load device manual_seed seed initial_seed compile no_grad enable_grad set_grad_enabled "
        "inference_mode is_grad_enabled is_tensor is_floating_point is_complex is_nonzero numel typename "
        "get_default_dtype set_default_dtype set_default_device get_default_device autocast "
        "use_deterministic_algorithms set_num_threads get_num_threads set_num_interop_threads "
        "set_float32_matmul_precision get_float32_matmul_precision get_rng_state set_rng_state "
        "set_printoptions result_type promote_types can_cast finfo iinfo broadcast_shapes"
    ).split()
}
# Keyword of Hugging Face tokenizers and processors whose "pt" value returns a BatchEncoding
# of CPU tensors (`tokenizer(texts, return_tensors="pt")`).
RETURN_TENSORS = "return_tensors"

# -- training ----------------------------------------------------------------------------

AUTOCAST_NAMES = {
    "torch.autocast",
    "torch.amp.autocast",
    "torch.cuda.amp.autocast",
    "torch.cuda.amp.autocast_mode.autocast",
    "torch.cpu.amp.autocast",
    "torch.cpu.amp.autocast_mode.autocast",
}
GRAD_SCALER_NAMES = {
    "torch.GradScaler",
    "torch.amp.GradScaler",
    "torch.amp.grad_scaler.GradScaler",
    "torch.cuda.amp.GradScaler",
    "torch.cpu.amp.GradScaler",
}
CLIP_NAMES = {
    "torch.nn.utils.clip_grad_norm_",
    "torch.nn.utils.clip_grad_value_",
    "torch.nn.utils.clip_grad_norm",
    "torch.nn.utils.clip_grad.clip_grad_norm_",
    "torch.nn.utils.clip_grad.clip_grad_value_",
}
FLOAT64_NAMES = {"torch.float64", "torch.double"}
FLOAT64_NAMES = {"torch.float64", "torch.double"}
DOUBLE_TENSOR_TYPES = {"torch.DoubleTensor", "torch.cuda.DoubleTensor"}
CUDA_PROBES = {"torch.cuda.is_available", "torch.cuda.device_count"}
MODULE_METHODS = set(
    (
        "parameters named_parameters buffers named_buffers children named_children modules "
        "named_modules state_dict load_state_dict train eval to cuda cpu half float double "
        "bfloat16 zero_grad requires_grad_ apply register_forward_hook register_full_backward_hook "
        "register_forward_pre_hook register_buffer register_parameter add_module get_submodule "
        "configure_optimizers save_pretrained no_sync"
    ).split()
)
BUILTIN_PREFIXES = ("builtins.",)

# -- losses --------------------------------------------------------------------------------

# Loss functions (and their modules) whose default reduction is a mean over the elements
# of the batch.
LOSS_FUNCTIONS = {
    f"{FUNCTIONAL}.{name}"
    for name in (
        "cross_entropy nll_loss mse_loss l1_loss smooth_l1_loss huber_loss "
        "binary_cross_entropy binary_cross_entropy_with_logits kl_div"
    ).split()
}
LOSS_MODULES = {
    f"{prefix}.{name}"
    for prefix in ("torch.nn", "torch.nn.modules.loss")
    for name in "CrossEntropyLoss NLLLoss MSELoss L1Loss SmoothL1Loss HuberLoss BCELoss BCEWithLogitsLoss KLDivLoss".split()
}
# Losses whose mean divides by the targets that count (not ignore_index; weighted by class).
COUNTED_LOSSES = {"cross_entropy", "nll_loss", "CrossEntropyLoss", "NLLLoss"}
# The function a loss module calls.
FUNCTIONAL_OF = {
    "CrossEntropyLoss": "cross_entropy",
    "NLLLoss": "nll_loss",
    "MSELoss": "mse_loss",
    "L1Loss": "l1_loss",
    "SmoothL1Loss": "smooth_l1_loss",
    "HuberLoss": "huber_loss",
    "BCELoss": "binary_cross_entropy",
    "BCEWithLogitsLoss": "binary_cross_entropy_with_logits",
    "KLDivLoss": "kl_div",
}
# Ops CUDA autocast refuses to run in reduced precision (it raises): use the logits form.
AUTOCAST_UNSAFE = {
    f"{FUNCTIONAL}.binary_cross_entropy": "BCEWithLogitsLoss / binary_cross_entropy_with_logits",
    "torch.nn.BCELoss": "BCEWithLogitsLoss / binary_cross_entropy_with_logits",
    "torch.nn.modules.loss.BCELoss": "BCEWithLogitsLoss / binary_cross_entropy_with_logits",
}
CROSS_ENTROPY = f"{FUNCTIONAL}.cross_entropy"
CROSS_ENTROPY_MODULES = {"torch.nn.CrossEntropyLoss", "torch.nn.modules.loss.CrossEntropyLoss"}
NLL_LOSS = f"{FUNCTIONAL}.nll_loss"
NLL_LOSS_MODULES = {"torch.nn.NLLLoss", "torch.nn.modules.loss.NLLLoss"}
SOFTMAXES = {f"{FUNCTIONAL}.softmax", "torch.softmax", "torch.special.softmax"}
# Layers whose output for one sample depends on the other samples of the batch (in training mode).
BATCH_MIXING_LAYERS = {
    f"torch.nn.{name}"
    for name in (
        "BatchNorm1d BatchNorm2d BatchNorm3d LazyBatchNorm1d LazyBatchNorm2d LazyBatchNorm3d SyncBatchNorm"
    ).split()
} | {f"{FUNCTIONAL}.batch_norm"}
# Libraries that run a model with parameters passed per call (MAML-style inner loops).
FUNCTIONAL_PARAMETERS = ("torch.func", "torch.nn.utils.stateless", "functorch", "higher")
DROPOUTS = {"torch.nn.Dropout", "torch.nn.modules.dropout.Dropout"}
SDPA = f"{FUNCTIONAL}.scaled_dot_product_attention"

# Calls whose result is drawn from the RNG: evaluated once instead of once per step, or in
# another order, they give other values.
RANDOM_FUNCTIONS = {
    *(
        f"torch.{name}"
        for name in "rand randn randint rand_like randn_like randint_like randperm bernoulli "
        "multinomial normal poisson".split()
    ),
    f"{FUNCTIONAL}.dropout",
    f"{FUNCTIONAL}.dropout1d",
    f"{FUNCTIONAL}.dropout2d",
    f"{FUNCTIONAL}.alpha_dropout",
    f"{FUNCTIONAL}.gumbel_softmax",
}
RANDOM_METHODS = {"bernoulli", "bernoulli_", "normal_", "uniform_", "random_", "exponential_", "multinomial"}

# -- checkpoints ------------------------------------------------------------------------------

# Calls that write a checkpoint synchronously: (qualified name or method, what it saves).
SAVE_FUNCTIONS = {
    "torch.save",
    "torch.serialization.save",
    "safetensors.torch.save_file",
    "safetensors.torch.save_model",
}
SAVE_METHODS = {"save_pretrained", "save_state"}  # Hugging Face models, Accelerate


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
