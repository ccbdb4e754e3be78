"""PM402 over parameters that are not (only) a model's: tensors made to be
trained (`requires_grad=True`, `requires_grad_()`, `nn.Parameter(...)`) and
kept in lists, and models reached through other names. Written from the
anti-pattern: an Adam, AdamW or SGD whose parameters all sit on one CUDA
device steps without fused kernels; when the device of some parameter cannot
be told, the rule says which and fixes nothing."""

from __future__ import annotations

import textwrap

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level
from codemod.rules.unfused_optimizer import UnfusedOptimizer
from tests.rules.scripts import losses, max_relative_difference, rewrite

HEADER = """\
import torch
import torch.nn as nn
device = "cuda" if torch.cuda.is_available() else "cpu"
"""


def run(body: str):
    source = HEADER + textwrap.dedent(body)
    settings = Settings(select=("PM402",), level=Level.NUMERIC)
    result = process_source(source.encode(), "<test>", settings, [UnfusedOptimizer])
    assert result.error is None, result.error
    return source, result


def fixed(body: str) -> str:
    source, result = run(body)
    assert [f.code for f in result.findings] == ["PM402"], result.findings
    assert result.findings[0].applied, result.findings[0].message
    new = result.new_source.decode()
    again = process_source(new.encode(), "<again>", Settings(select=("PM402",), level=Level.NUMERIC))
    assert not again.findings, "a second run must find nothing"
    return new


def reported(body: str) -> str:
    source, result = run(body)
    assert [f.code for f in result.findings] == ["PM402"], result.findings
    finding = result.findings[0]
    assert not finding.fixable and not finding.applied
    assert result.new_source is None or result.new_source.decode() == source
    return finding.message


def untouched(body: str) -> None:
    source, result = run(body)
    assert result.findings == [], [f.message for f in result.findings]


# -- fixed --------------------------------------------------------------------------


def test_a_list_of_tensors_made_on_the_device_gets_fused():
    new = fixed(
        """
        w = torch.randn(8, 4, device=device, requires_grad=True)
        b = torch.zeros(4, device=device).requires_grad_()
        gain = nn.Parameter(torch.ones(1, device=device))
        opt = torch.optim.Adam([w, b, gain], lr=1e-3)
        """
    )
    assert "opt = torch.optim.Adam([w, b, gain], lr=1e-3, fused=True)" in new


def test_a_tensor_made_on_the_host_and_then_moved_is_where_it_was_moved():
    new = fixed(
        """
        w = torch.randn(8, 4) * 0.01
        w = w.to(device).requires_grad_()
        opt = torch.optim.SGD([w], lr=0.1, momentum=0.9)
        """
    )
    assert "momentum=0.9, fused=True)" in new


def test_model_parameters_extended_into_lists_and_added_together():
    new = fixed(
        """
        encoder = nn.Linear(4, 8)
        heads = nn.ModuleDict({"a": nn.Linear(8, 1), "b": nn.Linear(8, 1)})
        encoder.to(device)
        heads.to(device)
        shared = []
        own = []
        for name in ["a", "b"]:
            own.extend(heads[name].parameters())
        shared.extend(encoder.parameters())
        everything = shared + own
        opt = torch.optim.AdamW(everything, lr=3e-4, weight_decay=0)
        """
    )
    assert "weight_decay=0, fused=True)" in new


def test_model_parameters_and_new_tensors_together():
    new = fixed(
        """
        model = nn.Linear(4, 2).to(device)
        temperature = torch.full((1,), 0.07, device=device).requires_grad_()
        prompts = [nn.Parameter(torch.randn(16, device=device)) for _ in range(4)]
        opt = torch.optim.AdamW(list(model.parameters()) + [temperature] + prompts)
        """
    )
    assert "+ prompts, fused=True)" in new


def test_a_model_reached_through_a_wrapper_and_its_module():
    new = fixed(
        """
        from torch.nn.parallel import DistributedDataParallel

        def train(distributed):
            model = nn.Linear(4, 4)
            model.to(device)
            wrapped = DistributedDataParallel(model) if distributed else model
            inner = wrapped.module if distributed else wrapped
            trainable = [p for p in inner.parameters() if p.requires_grad]
            return torch.optim.Adam(trainable, lr=1e-3)
        """
    )
    assert "torch.optim.Adam(trainable, lr=1e-3, fused=True)" in new


def test_a_tensor_attribute_made_on_the_device_in_init():
    new = fixed(
        """
        class Calibrator:
            def __init__(self):
                self.scale = nn.Parameter(torch.ones(3, device=device))

            def fit(self):
                return torch.optim.Adam([self.scale], lr=0.1)
        """
    )
    assert "torch.optim.Adam([self.scale], lr=0.1, fused=True)" in new


# -- reported, not fixed ------------------------------------------------------------------


def test_a_tensor_on_a_device_that_cannot_be_told_is_reported():
    message = reported(
        """
        def fit(target_device):
            w = torch.randn(3, device=target_device, requires_grad=True)
            return torch.optim.Adam([w])
        x = torch.zeros(1).cuda()
        """
    )
    assert "`target_device`" in message and "cannot be told" in message


def test_a_tensor_of_unknown_origin_is_named():
    message = reported(
        """
        def fit(weights):
            return torch.optim.Adam([weights, torch.zeros(1, device=device, requires_grad=True)])
        """
    )
    assert "`weights`" in message and "cannot be told" in message


def test_a_host_tensor_trained_with_a_model_on_the_device_is_reported():
    message = reported(
        """
        model = nn.Linear(4, 2).to(device)
        scale = torch.ones(1, requires_grad=True)
        opt = torch.optim.AdamW(list(model.parameters()) + [scale])
        """
    )
    assert "`scale` is on the host" in message


# -- left alone ---------------------------------------------------------------------------


def test_tensors_on_two_different_cuda_devices_are_left_alone():
    untouched(
        """
        a = torch.randn(3, device="cuda:0", requires_grad=True)
        b = torch.randn(3, device="cuda:1", requires_grad=True)
        opt = torch.optim.Adam([a, b])
        """
    )


def test_tensors_that_stay_on_the_host_get_the_cpu_fused_kernel():
    new = fixed(
        """
        w = nn.Parameter(torch.randn(8, 4) * 0.01)
        b = nn.Parameter(torch.zeros(4))
        opt = torch.optim.Adam([w, b], lr=0.1)
        batch = torch.zeros(2, 8).cuda()
        """
    )
    assert "opt = torch.optim.Adam([w, b], lr=0.1, fused=True)" in new


def test_tensors_made_under_a_default_device_are_only_reported():
    message = reported(
        """
        torch.set_default_device(device)
        w = nn.Parameter(torch.randn(8, 4) * 0.01)
        opt = torch.optim.Adam([w], lr=0.1)
        """
    )
    assert "cannot be told" in message


def test_an_explicit_implementation_is_kept():
    untouched(
        """
        w = torch.randn(3, device=device, requires_grad=True)
        opt = torch.optim.Adam([w], foreach=True)
        opt2 = torch.optim.SGD([w], lr=0.1, fused=False)
        """
    )


def test_optimizers_without_fused_kernels_are_left_alone():
    untouched(
        """
        w = torch.randn(3, device=device, requires_grad=True)
        opt = torch.optim.RMSprop([w])
        opt2 = torch.optim.Adagrad([w])
        """
    )


def test_complex_parameters_are_left_alone():
    untouched(
        """
        z = torch.randn(3, dtype=torch.complex64, device=device, requires_grad=True)
        opt = torch.optim.Adam([z])
        """
    )


# -- run ------------------------------------------------------------------------------------

SCRIPT = """\
import torch

device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
x = torch.randn(64, 8, device=device)
y = x @ torch.randn(8, 1, device=device) + 0.1
left = (torch.randn(8, 4) * 0.1).to(device).requires_grad_()
right = torch.nn.Parameter(torch.randn(4, 1, device=device) * 0.1)
bias = torch.zeros(1, device=device, requires_grad=True)
optimizer = torch.optim.AdamW([left, right, bias], lr=1e-2, weight_decay=0.01)
for step in range(20):
    loss = torch.nn.functional.mse_loss(x @ left @ right + bias, y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print("step", step, "loss", repr(loss.item()))
"""


def test_the_fused_rewrite_of_a_tensor_fit_trains_within_tolerance():
    new = rewrite(SCRIPT, [UnfusedOptimizer])
    assert "weight_decay=0.01, fused=True\n)" in new
    before, after = losses(SCRIPT), losses(new)
    assert len(before) == 20
    assert max_relative_difference(after, before) < 1e-5
