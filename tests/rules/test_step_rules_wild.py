"""The training-step rules on code shaped the way people write it (issue 11):
trainer classes, step methods and helpers, devices from argparse / configs /
`self.device`, checkpoints saved by helpers, running sums started together.
Each case is written from the anti-pattern's description; the negatives are
look-alikes that must stay untouched. Rewrites are run where they can be: safe
ones print the same lines, numeric ones stay within tolerance of the original
computed in float64."""

from __future__ import annotations

import contextlib
import io
import textwrap

import pytest
import torch

from codemod.config import Settings
from codemod.engine import process_source
from codemod.result import Level
from tests.rules.scripts import one_thread

IMPORTS = """\
import copy
import gc
import os
import tempfile
import torch
import torch.nn as nn
import torch.nn.functional as F
"""


def apply(code: str, select: str, level: Level = Level.UNSAFE, **config):
    source = IMPORTS + textwrap.dedent(code)
    settings = Settings(level=level, select=tuple(select.split(","))).with_overrides(**config)
    result = process_source(source.encode(), "wild.py", settings)
    assert result.error is None, result.error
    again = process_source(result.new_source, "wild.py", settings)
    assert not again.pending and again.new_source == result.new_source, "not idempotent"
    compile(result.new_source, "wild.py", "exec")
    return source, result.new_source.decode(), result.findings


def only(findings, code: str):
    found = [f for f in findings if f.code == code]
    assert len(found) == 1, [(f.code, f.line, f.message) for f in findings]
    return found[0]


def run(source: str, **env) -> list[str]:
    out = io.StringIO()
    with one_thread(), contextlib.redirect_stdout(out):
        exec(compile(source, "<wild>", "exec"), {"__name__": "__main__"})
    return out.getvalue().splitlines()


# -- PM301 ----------------------------------------------------------------------------------

TRAINER_LOCAL_DEVICE = """\
class Trainer:
    def __init__(self, model, device, lr=0.05):
        self.model = model.to(device)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=lr)

    def fit(self, batches):
        losses = []
        for x, y in batches:
            self.opt.zero_grad()
            out = self.model(x)
            loss = F.mse_loss(out, y)
            loss.backward()
            self.opt.step()
            losses.append(loss.detach())
        return losses


if __name__ == "__main__":
    torch.manual_seed(0)
    DTYPE = torch.float32
    # wide enough that a float32 step keeps the device busy (512 x 512 over 256 rows: 7 us)
    net = nn.Sequential(nn.Linear(8, 512), nn.Tanh(), nn.Linear(512, 512), nn.Tanh(), nn.Linear(512, 1)).to(DTYPE)
    data = [(torch.randn(256, 8).to(DTYPE), torch.randn(256, 1).to(DTYPE)) for _ in range(12)]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print("losses", [float(v) for v in Trainer(net, device).fit(data)])
"""


def losses_of(lines: list[str]) -> torch.Tensor:
    line = next(line for line in lines if line.startswith("losses"))
    return torch.tensor(eval(line.split(" ", 1)[1]), dtype=torch.float64)


def test_pm301_trainer_moving_its_model_in_init_gets_a_policy_where_the_device_is(monkeypatch):
    """The device is a local of __init__: the policy is built there, next to the move,
    and the forward pass in another method reads it as an attribute (no NameError);
    under bf16 autocast the losses stay within tolerance of the float64 original."""
    source, new, findings = apply(TRAINER_LOCAL_DEVICE, "PM301", Level.NUMERIC)
    assert only(findings, "PM301").applied
    assert "        self.precision = Precision.for_device(device)\n" in new
    assert "with self.precision.autocast():" in new
    monkeypatch.setenv("PERFMOD_AMP", "bf16")  # force CPU autocast
    got = losses_of(run(new))
    reference = losses_of(run(source.replace("DTYPE = torch.float32", "DTYPE = torch.float64")))
    assert not torch.equal(got, reference)
    assert ((got - reference).abs() / reference.abs()).max() < 2e-2  # bf16 keeps 8 significant bits


STEP_HELPER = """\
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = nn.Linear(256, 256).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)

def step(x, y):
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()

for x, y in [(torch.randn(4, 256), torch.randint(0, 256, (4,)))]:
    step(x.to(device), y.to(device))
"""


def test_pm301_step_in_a_helper_is_wrapped_there_and_the_policy_built_once():
    _, new, findings = apply(STEP_HELPER, "PM301", Level.NUMERIC)
    assert only(findings, "PM301").applied
    assert "model = nn.Linear(256, 256).to(device)\nprecision = Precision.for_device(device)\n" in new
    assert "    with precision.autocast():\n        loss = F.cross_entropy(model(x), y)\n" in new


@pytest.mark.parametrize(
    "forward,why",
    [
        ("    loss = F.binary_cross_entropy(torch.sigmoid(model(x)), y)\n", "BCEWithLogitsLoss"),
        (
            "    probs = torch.softmax(model(x), -1)\n    action = torch.distributions.Categorical(probs=probs).sample()\n"
            "    loss = -torch.log(probs[0, action])\n",
            "decides what runs next",
        ),
    ],
    ids=["bce-on-probabilities", "sampled-action"],
)
def test_pm301_reports_forward_passes_autocast_would_break(forward, why):
    code = (
        "device = torch.device('cuda')\nmodel = nn.Linear(8, 2).to(device)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor x, y in data:\n"
        + forward
        + "    loss.backward()\n    opt.step()\n    opt.zero_grad()\n"
    )
    _, new, findings = apply(code, "PM301", Level.NUMERIC)
    finding = only(findings, "PM301")
    assert not finding.fixable and why in finding.message
    assert "autocast" not in new.split("for x, y")[1]


@pytest.mark.parametrize(
    "code",
    [
        # autocast entered by the model's own forward
        "class Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.fc = nn.Linear(8, 2)\n"
        "    @torch.autocast('cuda', dtype=torch.bfloat16)\n    def forward(self, x):\n        return self.fc(x)\n"
        "model = Net().cuda()\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for x, y in data:\n    loss = F.cross_entropy(model(x), y)\n    loss.backward()\n    opt.step()\n    opt.zero_grad()\n",
        # a context manager defined in the user's own package
        "from mylib.precision import amp_autocast\nmodel = nn.Linear(8, 2).cuda()\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor x, y in data:\n    with amp_autocast():\n"
        "        loss = F.cross_entropy(model(x), y)\n    loss.backward()\n    opt.step()\n    opt.zero_grad()\n",
        # no forward pass: a loss of the parameters alone
        "w = torch.zeros(3, device='cuda', requires_grad=True)\nopt = torch.optim.SGD([w], lr=0.1)\n"
        "for target in data:\n    loss = ((w - target) ** 2).sum()\n    loss.backward()\n    opt.step()\n    opt.zero_grad()\n",
    ],
    ids=["autocast-in-forward", "imported-context-manager", "no-forward-pass"],
)
def test_pm301_no_finding(code):
    _, _, findings = apply(code, "PM301", Level.NUMERIC)
    assert not findings, [(f.line, f.message) for f in findings]


def test_pm301_exact_float32_is_reported():
    code = (
        "torch.use_deterministic_algorithms(True)\nmodel = nn.Linear(8, 2).cuda()\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor x, y in data:\n"
        "    loss = F.cross_entropy(model(x), y)\n    loss.backward()\n    opt.step()\n    opt.zero_grad()\n"
    )
    _, _, findings = apply(code, "PM301", Level.NUMERIC)
    assert "exact float32" in only(findings, "PM301").message


# -- PM402 ----------------------------------------------------------------------------------

FIT = (
    "opt = torch.optim.AdamW(model.parameters(), lr=1e-3)\nfor x in data:\n    model(x).sum().backward()\n"
    "    opt.step()\n    opt.zero_grad()\n"
)


@pytest.mark.parametrize(
    "setup",
    [
        "import argparse\nparser = argparse.ArgumentParser()\n"
        "parser.add_argument('--device', default='cuda', choices=['cuda', 'cpu'])\nargs = parser.parse_args()\n"
        "model = nn.Linear(4, 4).to(torch.device(args.device))\n",
        "from dataclasses import dataclass, field\n@dataclass\nclass Cfg:\n"
        "    device: str = field(default_factory=lambda: 'cuda' if torch.cuda.is_available() else 'cpu')\n"
        "cfg = Cfg()\nmodel = nn.Linear(4, 4).to(cfg.device)\n",
        "def pick_device():\n    if torch.cuda.is_available():\n        return torch.device('cuda')\n"
        "    if torch.backends.mps.is_available():\n        return torch.device('mps')\n    return torch.device('cpu')\n"
        "model = nn.Linear(4, 4).to(pick_device())\n",
        "base = nn.Linear(4, 4).cuda()\nmodel = copy.deepcopy(base)\n",
    ],
    ids=["argparse-choices", "dataclass-config", "cuda-mps-or-cpu", "deep-copy"],
)
def test_pm402_fuses_on_devices_followed_through_the_program(setup):
    _, new, findings = apply(setup + FIT, "PM402", Level.NUMERIC)
    assert only(findings, "PM402").applied and "lr=1e-3, fused=True)" in new


@pytest.mark.parametrize(
    "setup,why",
    [
        (
            "import argparse\nparser = argparse.ArgumentParser()\nparser.add_argument('--device', default='cuda')\n"
            "args = parser.parse_args()\nmodel = nn.Linear(4, 4).to(args.device)\n",
            "cannot be told",
        ),
        ("torch.backends.cuda.matmul.allow_tf32 = False\nmodel = nn.Linear(4, 4).cuda()\n", "exact float32"),
    ],
    ids=["argparse-any-device", "exact-float32"],
)
def test_pm402_reports_what_it_cannot_decide(setup, why):
    _, new, findings = apply(setup + FIT, "PM402", Level.NUMERIC)
    finding = only(findings, "PM402")
    assert not finding.fixable and why in finding.message and "fused" not in new.split("opt =")[1].split("\n")[0]


def test_pm402_guards_a_model_that_accelerator_prepare_places():
    """`accelerator.prepare` moves the model to the device accelerate picks at launch: the
    guard names that device's type."""
    setup = "from accelerate import Accelerator\naccelerator = Accelerator()\nmodel = nn.Linear(4, 4)\nx = torch.zeros(1).cuda()\n"
    fit = FIT.replace("for x in data", "model, opt = accelerator.prepare(model, opt)\nfor x in data")
    _, new, findings = apply(setup + fit, "PM402", Level.NUMERIC)
    assert only(findings, "PM402").applied
    assert 'fused=accelerator.device.type in ("cuda", "cpu")' in new


def test_pm402_mps_or_cpu_gets_fused_kernels_of_either():
    setup = (
        "model = nn.Linear(4, 4).to('mps' if torch.backends.mps.is_available() else 'cpu')\nx = torch.zeros(1).cuda()\n"
    )
    _, new, findings = apply(setup + FIT, "PM402", Level.NUMERIC)
    assert only(findings, "PM402").applied and "fused=True" in new


@pytest.mark.parametrize(
    "setup",
    [
        "model = nn.Linear(4, 4).to('xla')\n",
        "model = nn.Linear(4, 4)\nmodel.to(args.device)\n",
        "from transformers import AutoModel\nmodel = AutoModel.from_pretrained('gpt2')\n",
        "class Base(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.body = nn.Linear(4, 4).to(args.device)\n\n\nclass Net(Base):\n    pass\n\n\nmodel = Net()\n",
    ],
    ids=["no-fused-kernels", "moved-after-to-any-device", "built-by-a-library", "placed-by-an-inherited-init"],
)
def test_pm402_host_fix_needs_the_model_to_stay_on_a_fused_device(setup):
    _, new, findings = apply(setup + FIT, "PM402", Level.NUMERIC)
    assert not any(f.applied for f in findings) and "fused" not in new


# -- PM401 ----------------------------------------------------------------------------------

RESET_HEAD = """\
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 3))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
data = [(torch.randn(8, 6), torch.randint(0, 3, (8,))) for _ in range(6)]
for x, y in data:
    loss = F.cross_entropy(model(x), y)
"""
RESET_TAIL = "    loss.backward()\n    opt.step()\n    print('loss', repr(loss.item()))\n"


@pytest.mark.parametrize(
    "reset",
    [
        "    [p.grad.zero_() for p in model.parameters() if p.grad is not None]\n",
        "    grads = [p.grad for p in model.parameters() if p.grad is not None]\n    if grads:\n"
        "        torch._foreach_zero_(grads)\n",
        "    for p in model.parameters():\n        p.grad = torch.zeros_like(p)\n",
        "    for group in opt.param_groups:\n        for p in group['params']:\n            if p.grad is not None:\n"
        "                p.grad.fill_(0.0)\n",
    ],
    ids=["comprehension", "foreach-zero", "zeros-like", "param-groups"],
)
def test_pm401_hand_written_resets_become_zero_grad_and_train_the_same(reset):
    """Every parameter gets a gradient in every step, so setting them to None
    trains bit for bit like zero-filling them."""
    source, new, findings = apply(RESET_HEAD + reset + RESET_TAIL, "PM401")
    assert only(findings, "PM401").applied
    assert "zero_grad()" in new and "_foreach_zero_" not in new and "fill_" not in new and "zeros_like" not in new
    assert run(new) == run(source)


def test_pm401_a_later_loop_over_the_same_name_does_not_block_the_fix():
    code = (
        RESET_HEAD
        + "    for p in model.parameters():\n        p.grad.zero_()\n"
        + RESET_TAIL
        + ("for p in model.parameters():\n    print(p.shape)\n")
    )
    _, _, findings = apply(code, "PM401")
    assert only(findings, "PM401").applied


def test_pm401_buffers_set_up_before_training_are_not_a_reset():
    code = (
        "model = nn.Linear(4, 4)\nfor p in model.parameters():\n    p.grad = torch.zeros_like(p)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor x in data:\n    model(x).sum().backward()\n"
        "    opt.step()\n"
    )
    _, _, findings = apply(code, "PM401")
    assert not findings


def test_pm401_an_optimizer_passed_in_whose_step_needs_grads_is_reported():
    code = (
        "class Sign(torch.optim.Optimizer):\n    def __init__(self, params):\n        super().__init__(params, {})\n"
        "    def step(self):\n        for group in self.param_groups:\n            for p in group['params']:\n"
        "                p.add_(p.grad.sign(), alpha=-0.01)\n"
        "def train(model, loader, optimizer):\n    for x in loader:\n        optimizer.zero_grad(set_to_none=False)\n"
        "        model(x).sum().backward()\n        optimizer.step()\n"
        "net = nn.Linear(4, 4)\ntrain(net, [], Sign(net.parameters()))\n"
    )
    _, _, findings = apply(code, "PM401")
    finding = only(findings, "PM401")
    assert not finding.fixable and "without a None check" in finding.message


# -- PM403 ----------------------------------------------------------------------------------

STEP = "    loss = model(x).sum()\n    loss.backward()\n    opt.step()\n    opt.zero_grad()\n"
CLEAN_HEAD = (
    "device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\nmodel = nn.Linear(4, 4).to(device)\n"
    "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
)


@pytest.mark.parametrize(
    "guard",
    ["if device.type == 'cuda':", "if str(device).startswith('cuda'):", "if use_cuda:"],
    ids=["device-type", "device-string", "flag"],
)
def test_pm403_guards_that_ask_for_cuda_go_with_the_call(guard):
    code = (
        CLEAN_HEAD
        + "use_cuda = torch.cuda.is_available()\nfor x in data:\n"
        + STEP
        + f"    {guard}\n        torch.cuda.empty_cache()\n"
    )
    _, new, findings = apply(code, "PM403")
    assert only(findings, "PM403").applied and "empty_cache" not in new and guard not in new


def test_pm403_clean_up_in_a_helper_the_step_calls():
    code = (
        "def free_memory():\n    gc.collect()\n    if torch.cuda.is_available():\n        torch.cuda.empty_cache()\n"
        + CLEAN_HEAD
        + "for x in data:\n"
        + STEP
        + "    free_memory()\n"
    )
    _, new, findings = apply(code, "PM403")
    assert [f.applied for f in findings if f.code == "PM403"] == [True, True]
    assert "gc.collect()" not in new and "empty_cache" not in new and "free_memory()" in new


@pytest.mark.parametrize(
    "call_site,why",
    [
        ("    if step % 50 == 0:\n        free_memory()\n", "period was chosen"),
        ("    free_memory()\nfree_memory()\n", "also called outside the training loop"),
    ],
    ids=["periodic-call", "also-called-after-training"],
)
def test_pm403_helper_clean_up_left_in_place(call_site, why):
    code = (
        "def free_memory():\n    gc.collect()\n" + CLEAN_HEAD + "for step, x in enumerate(data):\n" + STEP + call_site
    )
    _, new, findings = apply(code, "PM403")
    finding = only(findings, "PM403")
    assert not finding.fixable and why in finding.message and "gc.collect()" in new


# -- PM404 ----------------------------------------------------------------------------------

# On the GPU where there is one (PM404 reports nothing in a program that stays on the CPU).
SYNC_HEAD = """\
torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
model = nn.Linear(6, 3).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
data = [(torch.randn(8, 6).to(device), torch.randint(0, 3, (8,)).to(device)) for _ in range(9)]
"""


def test_pm404_sums_started_together_from_a_helper_that_returns_two_losses():
    code = (
        SYNC_HEAD
        + """\
def compute_loss(model, x, y):
    logits = model(x)
    ce = F.cross_entropy(logits, y)
    reg = 1e-3 * sum((p ** 2).sum() for p in model.parameters())
    return ce + reg, ce

for epoch in range(2):
    total, ce_total, correct = 0.0, 0.0, 0
    for x, y in data:
        loss, ce = compute_loss(model, x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        total += loss.item()
        ce_total += ce.item()
        correct += (model(x).argmax(1) == y).sum().item()
    print(epoch, total / len(data), ce_total / len(data), correct)
"""
    )
    source, new, findings = apply(code, "PM404")
    assert [f.applied for f in findings if f.code == "PM404"] == [True, True, True]
    assert run(new) == run(source)  # bit for bit


def test_pm404_value_from_a_step_method_moved_to_log_time():
    code = (
        SYNC_HEAD
        + """\
class Trainer:
    def __init__(self, model, opt):
        self.model, self.opt, self.step = model, opt, 0

    def train_step(self, x, y):
        logits = self.model(x)
        loss = F.cross_entropy(logits, y)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return loss, logits

    def fit(self, data):
        for x, y in data:
            loss, logits = self.train_step(x, y)
            acc = (logits.argmax(-1) == y).float().mean().item()
            self.step += 1
            if self.step % 3 == 0:
                print(self.step, repr(acc))

Trainer(model, opt).fit(data)
"""
    )
    source, new, findings = apply(code, "PM404")
    assert only(findings, "PM404").applied
    assert run(new) == run(source)


def test_pm404_sync_in_an_evaluation_helper_the_step_runs_is_reported_there():
    code = (
        SYNC_HEAD
        + """\
def accuracy(model, x, y):
    return (model(x).argmax(1) == y).float().mean().item()

for step, (x, y) in enumerate(data):
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    acc = accuracy(model, x, y)
    if step % 100 == 0:
        print(acc)
"""
    )
    _, _, findings = apply(code, "PM404")
    helper = [f for f in findings if f.code == "PM404" and "`accuracy` runs it" in f.message]
    assert len(helper) == 1 and not helper[0].fixable


def test_pm404_a_helper_called_only_at_log_time_is_fine():
    code = (
        SYNC_HEAD
        + """\
def accuracy(model, x, y):
    return (model(x).argmax(1) == y).float().mean().item()

for step, (x, y) in enumerate(data):
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 100 == 0:
        print(accuracy(model, x, y))
"""
    )
    _, _, findings = apply(code, "PM404")
    assert not findings


# -- PM405 ----------------------------------------------------------------------------------

SAVE_HEAD = """\
torch.manual_seed(0)
out_dir = os.environ.get("CHECKPOINT_DIR") or tempfile.mkdtemp()
model = nn.Linear(4, 2)
opt = torch.optim.Adam(model.parameters(), lr=0.1)
data = [torch.randn(8, 4) for _ in range(6)]
"""
TRAIN_AND_SAVE = """\
for epoch in range(3):
    for x in data:
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    save_checkpoint(model, opt, epoch, os.path.join(out_dir, f"epoch_{epoch}.pt"))
"""
HELPER = """\
def save_checkpoint(model, optimizer, epoch, path):
    torch.save({"epoch": epoch, "model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)

"""


def test_pm405_a_helper_the_training_loop_calls_saves_in_the_background(tmp_path, monkeypatch):
    # a width the code does not show: Linear(4, 2) and Adam's moments (120 bytes), saved once
    # an epoch, are sized and only reported
    head = SAVE_HEAD.replace("nn.Linear(4, 2)", 'nn.Linear(int(os.environ.get("WIDTH", "4")), 2)')
    source, new, findings = apply(head + HELPER + TRAIN_AND_SAVE, "PM405")
    assert only(findings, "PM405").applied
    assert "checkpointer.save(\n        {" in new and new.rstrip().endswith("checkpointer.flush()")
    files = {}
    for name, text in (("before", source), ("after", new)):
        folder = tmp_path / name
        folder.mkdir()
        monkeypatch.setenv("CHECKPOINT_DIR", str(folder))
        run(text)
        files[name] = {p.name: torch.load(p, weights_only=True) for p in sorted(folder.iterdir())}
    assert sorted(files["after"]) == sorted(files["before"]) == ["epoch_0.pt", "epoch_1.pt", "epoch_2.pt"]
    for name, saved in files["before"].items():
        for key, tensor in saved["model"].items():
            assert torch.equal(files["after"][name]["model"][key], tensor)


@pytest.mark.parametrize(
    "change,why",
    [
        (
            lambda code: code + "save_checkpoint(model, opt, 99, os.path.join(out_dir, 'final.pt'))\n",
            "stays synchronous",
        ),
        (lambda code: code.replace("path)\n\n", "path)\n    os.replace(path, path + '.done')\n\n"), "is used at line"),
    ],
    ids=["also-called-after-training", "file-used-right-after"],
)
def test_pm405_helper_saves_left_synchronous(change, why):
    code = change(SAVE_HEAD + HELPER + TRAIN_AND_SAVE)
    _, new, findings = apply(code, "PM405")
    if "final.pt" in code:  # not every call is in a training loop: not PM405's
        assert not findings and "checkpointer" not in new
        return
    finding = only(findings, "PM405")
    assert not finding.fixable and why in finding.message


@pytest.mark.parametrize(
    "save,why",
    [
        ("    save_file(model.state_dict(), os.path.join(out_dir, f'{epoch}.safetensors'))\n", "safetensors"),
        ("    model.save_pretrained(os.path.join(out_dir, str(epoch)))\n", "folder of files"),
    ],
    ids=["safetensors", "save-pretrained"],
)
def test_pm405_other_savers_are_reported(save, why):
    code = (
        "from safetensors.torch import save_file\n" + SAVE_HEAD + "for epoch in range(3):\n    for x in data:\n"
        "        loss = model(x).pow(2).mean()\n        loss.backward()\n        opt.step()\n"
        + save
        + "    tokenizer.save_pretrained(out_dir)\n"
    )
    _, _, findings = apply(code, "PM405")
    finding = only(findings, "PM405")  # the tokenizer's files are not a checkpoint
    assert not finding.fixable and why in finding.message


def test_pm405_the_file_read_after_the_loop_is_flushed_first():
    code = (
        SAVE_HEAD
        + """\
best = os.path.join(out_dir, "best.pt")
for epoch in range(3):
    for x in data:
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        torch.save(model.state_dict(), best)
model.load_state_dict(torch.load(best))
"""
    )  # saved every step: a checkpoint this small saved per epoch is only reported
    _, new, findings = apply(code, "PM405")
    assert only(findings, "PM405").applied
    assert "checkpointer.flush()\nmodel.load_state_dict(torch.load(best))" in new
