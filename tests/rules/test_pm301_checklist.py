"""PM301, written from the rule's description: where autocast counts as already
on, where there is no forward pass to speed up, where the step lives, what
autocast refuses, where the precision policy is built, and a loss finished
under an `if` / `with` / `try` in the step."""

from __future__ import annotations

import sys
import textwrap

import torch

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level
from codemod.rules.forward_without_autocast import ForwardWithoutAutocast
from tests.rules.scripts import losses, max_relative_difference, rewrite


def check(source: str):
    source = textwrap.dedent(source)
    settings = Settings(select=("PM301",), level=Level.NUMERIC)
    result = process_source(source.encode(), "train.py", settings, [ForwardWithoutAutocast])
    assert result.error is None, result.error
    new = result.new_source.decode() if result.new_source is not None else source
    return result.findings, new


STEP = """
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        {enter}
        {indent}out = model(x)
        {indent}loss = F.cross_entropy(out, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
"""
HEAD = """\
import torch
import torch.nn as nn
import torch.nn.functional as F

device = torch.device("cuda")
model = nn.Linear(8, 3).to(device)
opt = torch.optim.AdamW(model.parameters())
loader = [(torch.randn(4, 8), torch.randint(0, 3, (4,)))]
"""


def step(enter: str = "") -> str:
    body = STEP.format(enter=enter, indent="    " if enter else "")
    return textwrap.indent(textwrap.dedent(body), "    ")


def test_autocast_entered_through_a_helper_of_the_file_counts_as_present():
    found, _ = check(
        HEAD
        + "def mixed():\n    return torch.autocast('cuda', dtype=torch.bfloat16)\n\n"
        + "def train():\n"
        + step("with mixed():")
    )
    assert found == []


def test_autocast_entered_through_a_context_manager_defined_in_the_file_counts_as_present():
    found, _ = check(
        HEAD
        + "import contextlib\n\n@contextlib.contextmanager\ndef low_precision():\n"
        + "    with torch.autocast(device_type='cuda', dtype=torch.float16):\n        yield\n\n"
        + "def train():\n"
        + step("with low_precision():")
    )
    assert found == []


def test_autocast_from_a_context_manager_of_another_module_counts_as_present():
    found, _ = check(
        HEAD + "from lab.precision import autocast_context\n\ndef train():\n" + step("with autocast_context():")
    )
    assert found == []


def test_a_loop_without_a_forward_pass_gets_no_finding():
    found, _ = check(
        """\
        import torch

        w = torch.zeros(8, device="cuda", requires_grad=True)
        opt = torch.optim.SGD([w], lr=0.1)
        target = torch.ones(8, device="cuda")
        for step in range(100):
            loss = ((w - target) ** 2).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
        """
    )
    assert found == []


def test_a_training_step_in_its_own_method_is_found():
    found, new = check(
        """\
        import torch
        import torch.nn as nn
        import torch.nn.functional as F


        class Trainer:
            def __init__(self, model, device):
                self.device = device
                self.model = model.to(device)
                self.opt = torch.optim.AdamW(self.model.parameters())

            def train_step(self, batch):
                x, y = batch
                logits = self.model(x.to(self.device))
                loss = F.cross_entropy(logits, y.to(self.device))
                self.opt.zero_grad()
                loss.backward()
                self.opt.step()
                return loss.detach()

            def fit(self, loader, epochs):
                for epoch in range(epochs):
                    for batch in loader:
                        self.train_step(batch)
        """
    )
    assert [f.code for f in found] == ["PM301"] and found[0].applied, [f.message for f in found]
    # The policy is built where the model is moved, from the name the device has there.
    assert "        self.model = model.to(device)\n        self.precision = Precision.for_device(device)\n" in new
    assert "        with self.precision.autocast():\n            logits = self.model(" in new


def test_the_device_of_a_trainer_is_spelled_as_the_method_that_moves_the_model_knows_it():
    found, new = check(
        """\
        import torch
        import torch.nn as nn


        class Trainer:
            def __init__(self):
                self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
                self.model = nn.Linear(512, 512)

            def setup(self):
                self.model.to(self.device)
                self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)

            def train_step(self, x):
                loss = self.model(x.to(self.device)).pow(2).mean()
                self.opt.zero_grad()
                loss.backward()
                self.opt.step()

            def fit(self, batches):
                self.setup()
                for x in batches:
                    self.train_step(x)
        """
    )
    assert found and found[0].applied, [f.message for f in found]
    assert "        self.model.to(self.device)\n        self.precision = Precision.for_device(self.device)\n" in new


def test_binary_cross_entropy_on_probabilities_is_reported_with_the_logits_alternative():
    found, new = check(
        HEAD
        + "def train():\n"
        + step().replace("loss = F.cross_entropy(out, y)", "loss = F.binary_cross_entropy(torch.sigmoid(out), y)")
    )
    assert len(found) == 1 and not found[0].fixable
    assert "binary_cross_entropy" in found[0].message and "BCEWithLogits" in found[0].message
    assert "autocast" not in new.split("def train")[1]


def test_the_device_comes_from_the_function_that_builds_the_policy():
    found, new = check(
        """\
        import torch
        import torch.nn as nn


        def main(steps):
            dev = "cuda" if torch.cuda.is_available() else "cpu"
            net = nn.Linear(256, 256).to(dev)
            opt = torch.optim.SGD(net.parameters(), lr=0.1)
            for step in range(steps):
                x = torch.randn(4096, 256, device=dev)
                loss = net(x).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
        """
    )
    assert found and found[0].applied
    assert "    precision = Precision.for_device(dev)\n    for step in range(steps):" in new


NESTED = """\
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
model = nn.Sequential(nn.Linear(16, 1024), nn.GELU(), nn.Linear(1024, 1024), nn.GELU(), nn.Linear(1024, 4)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
aux_weight = 0.1
data = torch.Generator().manual_seed(1)
for step in range(12):
    x = torch.randn(256, 16, generator=data).to(device)
    y = torch.randint(0, 4, (256,), generator=data).to(device)
    logits = model(x)
    loss = F.cross_entropy(logits, y)
    if aux_weight > 0:
        # keep the logits small
        loss = loss + aux_weight * logits.pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print("step", step, "loss", repr(loss.item()))
"""


def test_a_loss_finished_under_an_if_is_wrapped_with_the_if_and_trains_within_tolerance(monkeypatch):
    new = rewrite(NESTED, [ForwardWithoutAutocast])
    assert (
        "    with precision.autocast():\n        logits = model(x)\n        loss = F.cross_entropy(logits, y)\n"
        "        if aux_weight > 0:\n            # keep the logits small\n" in new
    )
    monkeypatch.setenv("PERFMOD_AMP", "bf16")
    got, want = losses(new), losses(NESTED)
    assert len(want) == 12 and not torch.equal(got, want)  # autocast did run
    assert max_relative_difference(got, want) < 5e-3


def test_an_if_that_tests_the_forward_output_blocks_the_fix_and_says_so():
    found, new = check(NESTED.replace("    if aux_weight > 0:\n", "    if logits.abs().max() > 10:\n"))
    assert len(found) == 1 and not found[0].fixable
    assert "tests `logits`" in found[0].message and "in lower precision" in found[0].message
    assert "autocast" not in new


# -- the model's class: passed in by the caller, or in another module of the project --------

NETS = """\
import torch.nn as nn


class Recurrent(nn.Module):
    def __init__(self, cell, vocab, width):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.cell = getattr(nn, cell)(width, width, batch_first=True)
        self.out = nn.Linear(width, vocab)

    def forward(self, x):
        return self.out(self.cell(self.embed(x))[0])


class Bag(nn.Module):
    def __init__(self, vocab, width):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.out = nn.Linear(width, vocab)

    def forward(self, x):
        return self.out(self.embed(x).relu())
"""
TRAIN_WITH = """\
import torch
import torch.nn.functional as F
from nets_for_pm301 import {cls}


def train(model, batches, device):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step, x in enumerate(batches):
        x = x.to(device)
        logits = model(x)
        loss = F.cross_entropy(logits.flatten(0, 1), x.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        print("step", step, "loss", repr(loss.item()))


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = {build}.to(device)
    train(model, [torch.randint(0, 16, (4, 6)) for _ in range(6)], device)


if __name__ == "__main__":
    main()
"""


def _project_script(tmp_path, cls: str, build: str, nets: str = NETS):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    (tmp_path / "nets_for_pm301.py").write_text(nets)
    path = tmp_path / "train.py"
    path.write_text(TRAIN_WITH.format(cls=cls, build=build))
    settings = Settings(select=("PM301",), level=Level.NUMERIC)
    return process_source(path.read_bytes(), str(path), settings, [ForwardWithoutAutocast])


def test_a_model_class_of_another_module_that_picks_its_torch_nn_class_at_run_time_is_not_fixed(tmp_path):
    # `getattr(nn, cell)` may be nn.LSTM / nn.GRU / nn.RNN, which CUDA autocast runs in float16
    # whatever dtype: with bf16 there would be no gradient scaler for them.
    result = _project_script(tmp_path, "Recurrent", 'Recurrent("LSTM", 16, 8)')
    assert result.error is None and len(result.findings) == 1 and not result.findings[0].fixable
    message = result.findings[0].message
    assert "`getattr(nn, cell)` (nets_for_pm301.py:8)" in message and "may be a cuDNN RNN" in message
    assert not result.changed


def test_a_model_class_of_another_module_without_an_rnn_passed_to_the_training_function_is_fixed(tmp_path, monkeypatch):
    # 64 wide: its products do 16 flops per byte they move, above the 12.5 below which PM301
    # reports a model bound by memory (now that a class of another module is sized)
    result = _project_script(tmp_path, "Bag", "Bag(64, 64)")
    assert result.error is None and [f.applied for f in result.findings] == [True]
    new, old = result.new_source.decode(), (tmp_path / "train.py").read_text()
    assert "        with precision.autocast():\n            logits = model(x)\n" in new
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "nets_for_pm301", raising=False)
    monkeypatch.setenv("PERFMOD_AMP", "bf16")
    got, want = losses(new), losses(old)
    assert len(want) == 6 and not torch.equal(got, want)  # autocast did run
    assert max_relative_difference(got, want) < 2e-2
    monkeypatch.delitem(sys.modules, "nets_for_pm301", raising=False)


def test_an_rnn_built_by_a_base_class_from_a_third_module_of_the_project_is_found(tmp_path):
    (tmp_path / "cells_for_pm301.py").write_text(
        "import torch.nn as nn\n\n\nclass Cell(nn.Module):\n"
        "    def __init__(self, width):\n        super().__init__()\n        self.rnn = nn.LSTM(width, width)\n"
    )
    nets = "from cells_for_pm301 import Cell\n\n\nclass Stack(Cell):\n    pass\n"
    result = _project_script(tmp_path, "Stack", "Stack(8)", nets=nets)
    assert result.error is None and len(result.findings) == 1 and not result.findings[0].fixable
    assert "`nn.LSTM` (cells_for_pm301.py:7), a cuDNN RNN" in result.findings[0].message


def test_a_script_that_casts_to_its_own_compute_dtype_gets_no_finding():
    # nanochat's form: no autocast, the model casts its activations to COMPUTE_DTYPE and a
    # GradScaler exists only when that dtype is float16. The forward does not run in
    # float32 on a GPU with bf16, and autocast would only add casts around its own.
    own = """\
        import torch
        import torch.nn.functional as F

        COMPUTE_DTYPE = torch.bfloat16 if torch.cuda.is_available() else torch.float32


        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(8, 4)

            def forward(self, x):
                x = x.to(COMPUTE_DTYPE)
                return F.linear(x, self.fc.weight.to(x.dtype), self.fc.bias.to(x.dtype))


        device = torch.device("cuda")
        model = Net().to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        scaler = torch.amp.GradScaler() if COMPUTE_DTYPE == torch.float16 else None
        loader = [(torch.randn(4, 8), torch.randint(0, 4, (4,))) for _ in range(3)]
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = F.cross_entropy(model(x).float(), y)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                opt.step()
            opt.zero_grad()
        """
    findings, _ = check(own)
    assert findings == []
    findings, _ = check(own.replace(" if COMPUTE_DTYPE == torch.float16 else None", ""))
    assert [f.message for f in findings if "scales the loss but no autocast is on" in f.message]


CAST_PARTS = """\
import torch
import torch.nn as nn
import torch.nn.functional as F

device = torch.device("cuda")
model = nn.Sequential(nn.Embedding(50, 16), nn.Linear(16, 50)).to(device)
for part in model.modules():
    {cast}
model = torch.compile(model)
opt = torch.optim.AdamW(model.parameters())
for step in range(10):
    ids = torch.randint(0, 50, (4, 8), device=device)
    loss = F.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_a_model_whose_parts_a_loop_casts_to_bfloat16_gets_no_finding():
    cast = "if isinstance(part, (nn.Embedding, nn.Linear)):\n        part.weight.data = part.weight.data.bfloat16()"
    found, _ = check(CAST_PARTS.format(cast=cast))
    assert found == []


def test_a_loop_over_the_parts_that_casts_nothing_in_place_leaves_the_finding():
    found, _ = check(CAST_PARTS.format(cast="copy = part.weight.data.bfloat16()"))
    assert [f.code for f in found] == ["PM301"]


LOSSES = """\
import torch.nn.functional as F


def compute_loss(x, y, net):
    return F.cross_entropy(net(x), y)
"""
HANDED_OPTIMIZER = """\
import torch
import torch.nn as nn

from losses_for_pm301 import compute_loss


def train(net, optimizer, device, data):
    for step, (x, y) in enumerate(data):
        loss = compute_loss(x.to(device), y.to(device), net)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print("step", step, "loss", repr(loss.item()))


if __name__ == "__main__":
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 5))
    model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [(torch.randn(64, 512), torch.randint(0, 5, (64,))) for _ in range(10)]
    train(model, opt, device, batches)
"""


def test_a_model_the_main_block_moves_before_building_the_optimizer_it_hands_over_is_wrapped(tmp_path, monkeypatch):
    # The forward runs in another module's function: the model is known by the optimizer alone.
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    (tmp_path / "losses_for_pm301.py").write_text(LOSSES)
    path = tmp_path / "train.py"
    path.write_text(HANDED_OPTIMIZER)
    settings = Settings(select=("PM301",), level=Level.NUMERIC)
    result = process_source(path.read_bytes(), str(path), settings, [ForwardWithoutAutocast])
    assert result.error is None and [f.applied for f in result.findings] == [True], result.findings
    new = result.new_source.decode()
    assert "    precision = Precision.for_device(device)\n    for step" in new
    assert (
        "        with precision.autocast():\n            loss = compute_loss(x.to(device), y.to(device), net)\n" in new
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PERFMOD_AMP", "bf16")
    got, want = losses(new), losses(HANDED_OPTIMIZER)
    assert len(want) == 10 and not torch.equal(got, want)  # autocast did run
    assert max_relative_difference(got, want) < 5e-3
    monkeypatch.delitem(sys.modules, "losses_for_pm301", raising=False)
