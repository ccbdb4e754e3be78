"""The rule catalogue: one module per rule (or small family), each carrying its
docs and its valid/invalid examples. Add a rule: import it here, one line, and
list it in RULES."""

from __future__ import annotations

from codemod.rule import Rule
from codemod.rules.async_checkpoint import SynchronousCheckpointInLoop
from codemod.rules.autocast import ForwardWithoutAutocast
from codemod.rules.compile_model import UncompiledModel
from codemod.rules.fused_optimizer import UnfusedOptimizerOnCuda
from codemod.rules.gc_in_loop import MemoryCleanupInStepLoop
from codemod.rules.manual_attention import ManualAttention
from codemod.rules.host_sync import PerStepHostSync
from codemod.rules.loader_workers import SingleProcessLoaderInTrainingLoop
from codemod.rules.loop_invariant_tokenization import LoopInvariantTokenization
from codemod.rules.manual_batching import ManualBatchingInStepLoop
from codemod.rules.non_blocking_copy import NonBlockingCopy
from codemod.rules.per_call_hooks import PerCallHookRegistration
from codemod.rules.per_position_loss import PerPositionLossLoop
from codemod.rules.per_sample_forward import PerSampleForwardLoop
from codemod.rules.pin_memory import UnpinnedLoaderToCuda
from codemod.rules.prefetch import BatchCopiedInTheStep
from codemod.rules.tf32 import Float32MatmulWithoutTf32
from codemod.rules.time_loop_recurrence import TimeLoopRecurrence
from codemod.rules.zero_grad import ZeroFilledGradients

RULES: list[type[Rule]] = [
    NonBlockingCopy,
    UnpinnedLoaderToCuda,
    ManualBatchingInStepLoop,
    LoopInvariantTokenization,
    MemoryCleanupInStepLoop,
    ZeroFilledGradients,
    Float32MatmulWithoutTf32,
    UnfusedOptimizerOnCuda,
    ForwardWithoutAutocast,
    PerStepHostSync,
    SynchronousCheckpointInLoop,
    PerCallHookRegistration,
    UncompiledModel,
    SingleProcessLoaderInTrainingLoop,
    BatchCopiedInTheStep,
    ManualAttention,
    TimeLoopRecurrence,
    PerPositionLossLoop,
    PerSampleForwardLoop,
]

ALL_RULES: list[type[Rule]] = sorted(RULES, key=lambda rule: rule.CODE)
RULES_BY_CODE: dict[str, type[Rule]] = {rule.CODE: rule for rule in ALL_RULES}
