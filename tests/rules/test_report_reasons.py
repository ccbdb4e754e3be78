"""Reports on public training code whose reason did not hold, each as a small program in
the shape of the code it came from, beside the program one change away where the
finding (or the other reason) is right, so that each test can fail: a policy that
never leaves the CPU, a step that already waited for the GPU, a loss module given
to the training function, a model that is a parameter or `self`, full-batch and
environment loops, a generator of random batches, a model built in an `if`, a loop
trained through accelerate, an `.item()` only logged, and loader settings chosen
between two dicts."""

from __future__ import annotations

from pathlib import Path

import torch

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level
from tests.rules.scripts import losses

PM103_FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "rules" / "PM103"


def findings(source: str, code: str) -> list:
    result = process_source(source.encode(), "train.py", Settings(select=(code,), level=Level.UNSAFE))
    assert result.error is None, result.error
    return [f for f in result.findings if f.code == code]


def messages(source: str, code: str) -> list[str]:
    return [f.message for f in findings(source, code)]


# -- PM404: reading a value waits for a GPU only where there is one ------------------------------

POLICY = """\
from itertools import count

import torch
import torch.nn.functional as F
from torch.distributions import Categorical


class Policy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.affine = torch.nn.Linear(4, 2)
        self.saved = []

    def forward(self, x):
        return F.softmax(self.affine(x), dim=-1)


policy = Policy()
optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)


def select_action(state):
    state = torch.from_numpy(state).float().unsqueeze(0)
    m = Categorical(policy(state))
    action = m.sample()
    policy.saved.append(m.log_prob(action))
    return action.item()


def main(env):
    for episode in count(1):
        state, _ = env.reset()
        for t in range(100):
            state, reward, done, _, _ = env.step(select_action(state))
            if done:
                break
        loss = torch.cat(policy.saved).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        del policy.saved[:]
"""


def test_a_policy_that_never_leaves_the_cpu_waits_for_no_gpu():
    assert findings(POLICY, "PM404") == []
    on_gpu = POLICY.replace("policy = Policy()", "policy = Policy().cuda()").replace(
        ".float().unsqueeze(0)", ".float().unsqueeze(0).cuda()"
    )
    (found,) = findings(on_gpu, "PM404")
    assert "`action.item()` waits for the GPU every step" in found.message


TIMED = """\
import time

import torch

device = "cuda" if torch.cuda.is_available() else "cpu"
device_type = "cuda" if device.startswith("cuda") else "cpu"
model = torch.nn.Linear(8, 1).to(device)
optimizer = torch.optim.AdamW(model.parameters())
for step in range(100):
    t0 = time.time()
    x = torch.randn(4, 8, device=device)
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if device_type == "cuda":
        torch.cuda.synchronize()
    dt = time.time() - t0
    print(f"step {step} | loss {loss.item():.6f} | dt {dt * 1000:.2f}ms")
"""


def test_a_step_that_already_synchronized_for_its_timing_is_not_reported():
    assert findings(TIMED, "PM404") == []
    # Work queued after the synchronize is waited for by the read again, but reading it
    # later would not let the step run ahead: the synchronize waits every step anyway.
    queued = TIMED.replace("    dt = time.time() - t0\n", "    dt = time.time() - t0\n    norm = model.weight.norm()\n")
    assert [m for m in messages(queued, "PM404") if "waits for the device on every step anyway" in m]
    # A synchronize that only some steps run does not spare the others.
    sometimes = TIMED.replace('if device_type == "cuda":', "if step % 10 == 0:")
    assert messages(sometimes, "PM404")
    # A read in a loop of the step waits, on its later passes, for work queued after it.
    nested = TIMED.replace(
        '    print(f"step {step} | loss {loss.item():.6f} | dt {dt * 1000:.2f}ms")\n',
        "    for k in range(2):\n        print(loss.item())\n        loss = model(x).pow(2).mean()\n",
    )
    assert messages(nested, "PM404")


BENCH = """\
import torch

profile = False
model = torch.nn.Linear(8, 1).cuda()
optimizer = torch.optim.AdamW(model.parameters())
if profile:
    for k in range(10):
        loss = model(torch.randn(4, 8).cuda()).pow(2).mean()
        loss.backward()
        optimizer.step()
        lossf = loss.item()
        print(f"{k} loss: {lossf:.4f}")
else:
    for k in range(20):
        loss = model(torch.randn(4, 8).cuda()).pow(2).mean()
        loss.backward()
        optimizer.step()
        lossf = loss.item()
        print(f"{k} loss: {lossf:.4f}")
"""


def test_a_read_in_the_other_branch_is_not_a_read_outside_the_loop():
    found = messages(BENCH, "PM404")
    assert len(found) == 2
    assert all("`lossf` is logged every step (`print`, line" in m for m in found), found
    assert not any("outside the loop" in m for m in found)


# -- PM506: what is compiled, and why not here --------------------------------------------------

IMAGENET = """\
import torch
import torch.nn as nn


def train(train_loader, model, criterion, optimizer, device):
    model.train()
    for images, target in train_loader:
        images, target = images.to(device), target.to(device)
        loss = criterion(model(images), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def main(pretrained, loader):
    device = torch.device("cuda")
    if pretrained:
        model = nn.Sequential(nn.Linear(8, 4), nn.LayerNorm(4), nn.GELU())
    else:
        model = nn.Sequential(nn.Linear(8, 4), nn.LayerNorm(4), nn.Tanh())
    model.to(device)
    criterion = nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        train(loader, model, criterion, optimizer, device)
"""


def test_a_loss_module_given_to_the_training_function_is_not_a_model_to_compile():
    found = messages(IMAGENET, "PM506")
    assert not any("criterion" in m for m in found), found
    (model,) = found
    assert "`train` trains it, given it at line 25" in model and "global" not in model  # compiled in `main`


FORWARD_FORWARD = """\
import torch


class Layer(torch.nn.Linear):
    def __init__(self, n_in, n_out):
        super().__init__(n_in, n_out)
        self.opt = torch.optim.Adam(self.parameters(), lr=0.03)

    def train_layer(self, x_pos, x_neg):
        for i in range(100):
            g_pos = self.forward(x_pos).pow(2).mean(1)
            g_neg = self.forward(x_neg).pow(2).mean(1)
            loss = torch.log1p(torch.exp(torch.cat([-g_pos + 2.0, g_neg - 2.0]))).mean()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()


layers = [Layer(8, 8).cuda(), Layer(8, 8).cuda()]
for layer in layers:
    layer.train_layer(torch.randn(4, 8).cuda(), torch.randn(4, 8).cuda())
"""


def test_a_module_that_trains_itself_is_not_read_as_a_global():
    (found,) = messages(FORWARD_FORWARD, "PM506")
    assert "`train_layer` trains the module it is a method of" in found
    assert "a call of `.forward` bypasses the compiled module" in found
    assert "global" not in found


SNLI = """\
import sys

import torch

device = torch.device("cuda")
if len(sys.argv) > 1:
    model = torch.load(sys.argv[1], map_location=device)
else:
    model = torch.nn.Linear(8, 3)
    model.to(device)
criterion = torch.nn.CrossEntropyLoss()
opt = torch.optim.Adam(model.parameters())
for epoch in range(2):
    for x, y in [(torch.randn(4, 8).cuda(), torch.randint(0, 3, (4,)).cuda())]:
        loss = criterion(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def test_a_model_built_in_a_resume_or_new_if_is_said_to_be_built_there():
    (found,) = messages(SNLI, "PM506")
    assert "it is built inside the `if` statement at line 6" in found and "global" not in found
    (refused,) = messages(SNLI, "PM601")
    assert "`model` is built inside the `if` statement at line 6" in refused
    assert "not built in the function" not in refused


FEDAVG = """\
import copy

import torch

global_model = torch.nn.Linear(8, 1).cuda()
for rnd in range(3):
    for client in range(4):
        local = copy.deepcopy(global_model)
        opt = torch.optim.SGD(local.parameters(), lr=0.1)
        step = 0
        while step < 5:
            loss = local(torch.randn(4, 8).cuda()).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
"""


def test_a_model_copied_for_every_client_is_said_to_be_built_anew():
    (found,) = messages(FEDAVG, "PM506")
    assert "built anew on every pass of the loop at line 7" in found


# -- PM601: what stands in the way of splitting the batches ---------------------------------------

FULL_BATCH = """\
import torch
import torch.nn.functional as F


def train_iter(epoch, model, optimizer, inputs, labels):
    model.train()
    optimizer.zero_grad()
    loss = F.nll_loss(F.log_softmax(model(inputs), dim=1), labels)
    loss.backward()
    optimizer.step()


def main():
    features, labels = torch.randn(50, 8), torch.randint(0, 3, (50,))
    model = torch.nn.Linear(8, 3)
    optimizer = torch.optim.Adam(model.parameters())
    for epoch in range(20):
        train_iter(epoch + 1, model, optimizer, features, labels)
"""


def test_full_batch_training_has_no_batches_to_split():
    (found,) = messages(FULL_BATCH, "PM601")
    assert "every step trains on the same data (full-batch training" in found
    assert "use a DataLoader" not in found


ENVIRONMENT = (
    POLICY.replace("from itertools import count\n", "from itertools import count\n\nimport gymnasium as gym\n")
    .replace("def main(env):", "def main():")
    .replace("optimizer = torch.optim", "env = gym.make('CartPole-v1')\noptimizer = torch.optim")
    + '\n\nif __name__ == "__main__":\n    main()\n'
)


def test_episodes_from_an_environment_are_not_dataset_batches():
    (found,) = messages(ENVIRONMENT, "PM601")
    assert "each step's data comes from `env.reset()`" in found and "use a DataLoader" not in found


RANDOM_COPY = """\
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def cycle():
    while True:
        src = torch.randint(2, 18, (32, 16)).long().to(DEVICE)
        yield src, torch.cat((src, src), 1)


model = torch.nn.Embedding(18, 8).to(DEVICE)
optim = torch.optim.Adam(model.parameters())
for i in range(100):
    src, tgt = next(cycle())
    loss = model(src).pow(2).mean()
    loss.backward()
    optim.step()
    optim.zero_grad()
    if i % 10 == 0:
        sample, _ = next(cycle())
"""


def test_random_batches_from_a_generator_want_a_seed_per_rank():
    (found,) = messages(RANDOM_COPY, "PM601")
    assert "each step draws its batch at random (`torch.randint(2, 18, (32, 16))`, line 8)" in found
    assert "its own seed" in found and "use a DataLoader" not in found


# -- PM301: who owns the precision, and what decides control flow ---------------------------------

ACCELERATE = """\
import torch
from accelerate import Accelerator

accelerator = Accelerator(cpu=False)
model = torch.nn.Linear(8, 1)
optim = torch.optim.Adam(model.parameters())
model, optim = accelerator.prepare(model, optim)
for i in range(100):
    loss = model(torch.randn(4, 8, device=accelerator.device)).pow(2).mean()
    accelerator.backward(loss / 4)
    optim.step()
    optim.zero_grad()
"""


def test_a_loop_trained_through_accelerate_is_told_to_set_its_mixed_precision():
    (found,) = findings(ACCELERATE, "PM301")
    assert not found.applied
    assert "runs through `Accelerator` (line 4)" in found.message and "`mixed_precision=`" in found.message
    assert "computed outside the block" not in found.message
    told = ACCELERATE.replace("Accelerator(cpu=False)", 'Accelerator(cpu=False, mixed_precision="bf16")')
    assert findings(told, "PM301") == []


COUNTED = """\
import torch

device = torch.device("cuda")
model = torch.nn.Linear(8, 3).to(device)
criterion = torch.nn.CrossEntropyLoss()
opt = torch.optim.Adam(model.parameters())
n_correct, n_total = 0, 0
for it in range(100):
    x, y = torch.randn(4, 8, device=device), torch.randint(0, 3, (4,), device=device)
    answer = model(x)
    n_correct += (answer.argmax(1) == y).sum().item()
    n_total += 4
    train_acc = 100.0 * n_correct / n_total
    loss = criterion(answer, y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    print("acc {:.2f}".format(train_acc))
"""


def test_an_item_only_counted_for_the_log_does_not_decide_what_runs():
    found = findings(COUNTED, "PM301")
    assert found and not any("decides what runs next" in f.message for f in found)
    steering = COUNTED.replace('    print("acc {:.2f}".format(train_acc))\n', "    if train_acc > 99:\n        break\n")
    assert any("decides what runs next" in m for m in messages(steering, "PM301"))


# -- PM103: loader settings chosen between two dicts -----------------------------------------------


def test_settings_chosen_between_two_dicts_are_seen_and_the_prefetched_loop_trains_the_same():
    source = (PM103_FIXTURES / "conditional_kwargs.in.py").read_text()
    (found,) = findings(source, "PM103")
    assert found.applied
    before = losses(source)
    after = losses((PM103_FIXTURES / "conditional_kwargs.out.py").read_text())
    assert len(before) == 2 * 6
    assert torch.equal(after, before)


def test_a_permutation_drawn_by_an_epoch_function_is_said_so():
    """`train_one_epoch` draws its own permutation, and main calls it once an epoch: the
    permutation is new each epoch (not "drawn once"), and the DataLoader would belong to the
    caller, so the loop is reported with that reason."""
    source = (
        "import torch\nimport torch.nn.functional as F\n\n"
        "def train_one_epoch(model, opt, X, Y, bs):\n    perm = torch.randperm(X.shape[0])\n"
        "    for start in range(0, X.shape[0] - bs + 1, bs):\n        idx = perm[start:start + bs]\n"
        "        loss = F.mse_loss(model(X[idx]), Y[idx])\n        opt.zero_grad()\n        loss.backward()\n"
        "        opt.step()\n\n"
        "def main():\n    X, Y = torch.randn(64, 4), torch.randn(64, 1)\n    model = torch.nn.Linear(4, 1)\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    for epoch in range(3):\n"
        "        train_one_epoch(model, opt, X, Y, 16)\n\nmain()\n"
    )
    (message,) = messages(source, "PM202")
    assert "drawn on each call of `train_one_epoch`, which its callers make once an epoch" in message


def test_a_read_a_helper_hands_to_host_code_is_said_to_be_needed_there():
    """REINFORCE: `run_episode` reads `action.item()` to step a Python environment, every
    step: the report says why it stays, not to call the function at log time."""
    source = (
        "import torch\n\nclass Env:\n    def step(self, action):\n        return [0.0] * 4, 1.0, action == 1\n\n"
        "def run_episode(env, policy, device):\n    obs, done, logps = [0.0] * 4, False, []\n"
        "    while not done:\n        dist = torch.distributions.Categorical(logits=policy(torch.tensor(obs, device=device)))\n"
        "        action = dist.sample()\n        logps.append(dist.log_prob(action))\n"
        "        obs, reward, done = env.step(action.item())\n    return logps\n\n"
        "device = torch.device('cuda')\npolicy = torch.nn.Linear(4, 2).to(device)\n"
        "opt = torch.optim.Adam(policy.parameters())\n"
        "for episode in range(3):\n    loss = -torch.stack(run_episode(Env(), policy, device)).sum()\n"
        "    opt.zero_grad()\n    loss.backward()\n    opt.step()\n"
    )
    (message,) = messages(source, "PM404")
    assert "its value is handed to `env.step`" in message and "log time" not in message
