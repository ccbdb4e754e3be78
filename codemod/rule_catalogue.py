"""The rule catalogue's facts, for the command line to use without importing
the rules. Generated from the rule classes by `python -m codemod.catalogue`:
do not edit (tests/test_startup.py fails when it is stale)."""

# The modules of codemod/rules/ it was made from.
MODULES = (
    "async_checkpoint",
    "autocast",
    "compile_model",
    "default_batch_size_of_one",
    "fused_optimizer",
    "gc_in_loop",
    "host_sync",
    "loader_workers",
    "loop_invariant_tokenization",
    "manual_attention",
    "manual_batching",
    "non_blocking_copy",
    "per_call_hooks",
    "per_position_loss",
    "per_sample_forward",
    "pin_memory",
    "prefetch",
    "single_process_training",
    "tf32",
    "time_loop_recurrence",
    "zero_grad",
)

# code, name, level, opt-in, module of codemod.rules, class
RULES = (
    ("PM101", "blocking-host-to-device-copy", "safe", False, "non_blocking_copy", "NonBlockingCopy"),
    ("PM102", "unpinned-loader-batches-to-cuda", "safe", False, "pin_memory", "UnpinnedLoaderToCuda"),
    ("PM103", "batch-copied-in-the-step", "unsafe", False, "prefetch", "BatchCopiedInTheStep"),
    (
        "PM201",
        "single-process-loader-in-training-loop",
        "unsafe",
        False,
        "loader_workers",
        "SingleProcessLoaderInTrainingLoop",
    ),
    ("PM202", "manual-batching-in-step-loop", "unsafe", False, "manual_batching", "ManualBatchingInStepLoop"),
    ("PM203", "loop-invariant-tokenization", "safe", False, "loop_invariant_tokenization", "LoopInvariantTokenization"),
    ("PM204", "default-batch-size-of-one", "unsafe", False, "default_batch_size_of_one", "DefaultBatchSizeOfOne"),
    ("PM301", "forward-without-autocast", "numeric", False, "autocast", "ForwardWithoutAutocast"),
    ("PM302", "float32-matmul-without-tf32", "numeric", False, "tf32", "Float32MatmulWithoutTf32"),
    ("PM401", "zero-filled-gradients", "safe", False, "zero_grad", "ZeroFilledGradients"),
    ("PM402", "unfused-optimizer", "numeric", False, "fused_optimizer", "UnfusedOptimizer"),
    ("PM403", "memory-cleanup-in-step-loop", "safe", False, "gc_in_loop", "MemoryCleanupInStepLoop"),
    ("PM404", "per-step-host-sync", "safe", False, "host_sync", "PerStepHostSync"),
    ("PM405", "synchronous-checkpoint-in-loop", "unsafe", False, "async_checkpoint", "SynchronousCheckpointInLoop"),
    ("PM501", "per-call-hook-registration", "unsafe", False, "per_call_hooks", "PerCallHookRegistration"),
    ("PM502", "per-sample-forward-loop", "unsafe", False, "per_sample_forward", "PerSampleForwardLoop"),
    ("PM503", "per-position-loss-loop", "numeric", False, "per_position_loss", "PerPositionLossLoop"),
    ("PM504", "manual-attention", "numeric", False, "manual_attention", "ManualAttention"),
    ("PM505", "time-loop-recurrence", "numeric", False, "time_loop_recurrence", "TimeLoopRecurrence"),
    ("PM506", "uncompiled-model", "numeric", True, "compile_model", "UncompiledModel"),
    ("PM601", "single-process-training", "unsafe", True, "single_process_training", "SingleProcessTraining"),
)
