"""Mixed precision policy per device, so that rewritten training loops read the same everywhere.

    precision = Precision.for_device(device)
    scaler = precision.grad_scaler()
    with precision.autocast():
        loss = model(x, y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()

The policy picks the autocast dtype; the scaler is enabled only for fp16. A disabled
`torch.amp.GradScaler` is torch's own pass-through (scale returns the loss, step calls
optimizer.step(), update does nothing), so the loop above is the same code when off.
"""

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
ENV_VAR = "PERFMOD_AMP"  # "bf16", "fp16" or "off": overrides the arguments of for_device


def cuda_has_native_bf16(device: torch.device) -> bool:
    """Whether bf16 runs natively (Ampere, sm_80, or newer; any ROCm GPU).

    Not torch.cuda.is_bf16_supported(): by default it also counts older GPUs that only
    emulate bf16, where autocast to bf16 works but is slower than fp32. False without
    CUDA (a CPU build, or no GPU): a script whose `.cuda()` is skipped there trains in fp32.
    """
    if not torch.cuda.is_available():
        return False
    return bool(torch.version.hip) or torch.cuda.get_device_capability(device)[0] >= 8


@dataclass(frozen=True)
class Precision:
    """Which dtype autocast computes in on one device type; torch.float32 means off."""

    device_type: str
    dtype: torch.dtype = torch.float32

    @classmethod
    def for_device(
        cls,
        device: torch.device | str | None = None,
        prefer: str = "bf16",
        enabled: bool | None = None,
        native_bf16: Callable[[torch.device], bool] = cuda_has_native_bf16,
    ) -> "Precision":
        """The policy for `device` (None: torch's default device, usually the CPU).

        - CUDA: bf16 where native, as it has fp32's exponent range, so gradients cannot
          underflow and need no scaler; fp16 (with a GradScaler) when prefer="fp16".
        - MPS: fp16 (with a scaler) when prefer="fp16" and the installed torch autocasts
          on MPS: fp16 is the dtype MPS autocast has supported longest.
        - prefer="bf16" where bf16 is not native (pre-Ampere CUDA, MPS): off, not fp16.
          Code written for bf16 has no GradScaler (perfmod's PM301 writes none by
          default), and fp16 without one lets small gradients underflow to zero.
        - CPU and other devices: off unless enabled=True, then the preferred dtype: CPU
          autocast pays off only on CPUs with bf16 units (AMX, AVX512-BF16). Tests force it
          to run the autocast path.

        enabled=False turns it off everywhere. The PERFMOD_AMP environment variable wins
        over both arguments: "bf16" or "fp16" is prefer=that with enabled=True, "off" is
        enabled=False; so `perfmod verify` and tests switch precision without editing code.
        """
        device = torch.device(device) if device is not None else torch.get_default_device()
        if env := os.environ.get(ENV_VAR):
            if env not in (*DTYPES, "off"):
                raise ValueError(f"{ENV_VAR}={env!r}: expected bf16, fp16 or off")
            prefer, enabled = (prefer, False) if env == "off" else (env, True)
        if prefer not in DTYPES:
            raise ValueError(f"prefer={prefer!r}: expected bf16 or fp16")
        if enabled is False or not torch.amp.is_autocast_available(device.type):
            return cls(device.type)
        if device.type in ("cuda", "mps"):
            if prefer == "fp16":
                return cls(device.type, torch.float16)
            native = device.type == "cuda" and native_bf16(device)
            return cls(device.type, torch.bfloat16) if native else cls(device.type)
        return cls(device.type, DTYPES[prefer]) if enabled else cls(device.type)

    @property
    def enabled(self) -> bool:
        return self.dtype != torch.float32

    def autocast(self) -> contextlib.AbstractContextManager:
        """torch.autocast in this dtype, or a no-op context when off."""
        if not self.enabled:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def grad_scaler(self, **kwargs) -> torch.amp.GradScaler:
        """A new torch.amp.GradScaler, enabled only for fp16: its 5 exponent bits flush small
        gradients to zero unless the loss is scaled up first. Disabled, it passes through.
        kwargs (init_scale, growth_interval, ...) go to torch.amp.GradScaler."""
        return torch.amp.GradScaler(self.device_type, enabled=self.dtype == torch.float16, **kwargs)
