"""A trainer class handed its pieces: the model it is constructed with (`Trainer(model, ...)`
after `model = Net().to(device)`), a forward pass in a method the loop calls
(`loss, logits = self.training_step(batch)`), an optimizer over the param groups a function
of the file returns (`AdamW(param_groups(model, wd))`). The rules see where those pieces are
and what they run, fix what a script holding them in variables would get fixed, and the
rewritten program trains the same. Where a construction passes an unmoved model, or the
method may run no model, nothing is claimed."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from tests.rules.test_step_rules_wild import IMPORTS, apply, only, run

HAS_CXX = any(shutil.which(c) for c in ("g++", "c++", "clang++"))

GIVEN_TRAINER = """\
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(512, 1024), nn.GELU(), nn.Linear(1024, 4))

    def forward(self, x):
        return self.body(x)


def param_groups(model, weight_decay):
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.ndim < 2 else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


class Trainer:
    def __init__(self, model, optimizer, device):
        self.model = model
        self.optimizer = optimizer
        self.device = device

    def training_step(self, x, y):
        logits = self.model(x)
        return F.cross_entropy(logits, y), logits

    def fit(self, steps):
        losses = []
        for step in range(steps):
            x = torch.randn(256, 512, device=self.device)
            y = torch.randint(0, 4, (256,), device=self.device)
            loss, logits = self.training_step(x, y)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            losses.append(loss.detach())
        return losses


if __name__ == "__main__":
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = Net().to(device)
    optimizer = torch.optim.AdamW(param_groups(model, 0.01), lr=1e-3)
    trainer = Trainer(model, optimizer, device)
    print(torch.stack(trainer.fit(5)).tolist())
"""


def test_the_forward_in_a_method_of_a_trainer_given_its_moved_model_runs_under_autocast():
    source, new, findings = apply(GIVEN_TRAINER, "PM301")
    assert only(findings, "PM301").applied
    assert "with precision.autocast():\n                loss, logits = self.training_step(x, y)" in new
    assert run(new) == run(source)  # on the CPU the policy leaves float32 as it is


def test_an_optimizer_over_the_param_groups_a_function_returns_is_fused_where_the_model_is():
    source, new, findings = apply(GIVEN_TRAINER, "PM402")
    assert only(findings, "PM402").applied
    assert "torch.optim.AdamW(param_groups(model, 0.01), lr=1e-3, fused=True)" in new
    assert run(new) == run(source)


def test_a_trainer_also_constructed_with_an_unmoved_model_is_not_placed():
    twice = GIVEN_TRAINER.replace(
        "    trainer = Trainer(model, optimizer, device)\n",
        "    trainer = Trainer(model, optimizer, device)\n    Trainer(Net(), optimizer, device).fit(2)\n",
    )
    _, new, findings = apply(twice, "PM301")
    assert "autocast" not in new
    assert "cannot tell which device" in only(findings, "PM301").message


def test_a_method_that_runs_the_model_without_gradients_is_no_forward_pass():
    no_grad = GIVEN_TRAINER.replace(
        "    def training_step(self, x, y):\n        logits = self.model(x)\n",
        "    def training_step(self, x, y):\n        with torch.no_grad():\n            logits = self.model(x)\n",
    )
    _, new, findings = apply(no_grad, "PM301")
    assert "autocast" not in new and not [f for f in findings if f.code == "PM301" and f.applied]


# -- PM506: the model the trainer is given is compiled where it is built ----------------------

FUSIBLE_NET = """\
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(512, 1024), nn.GELU(), nn.Linear(1024, 512))
        self.norm = nn.LayerNorm(512)
        self.head = nn.Linear(512, 4)

    def forward(self, x):
        return self.head(self.norm(x + self.body(x)))
"""
COMPILE_TRAINER = FUSIBLE_NET + GIVEN_TRAINER[GIVEN_TRAINER.index("\n\ndef param_groups") :]


def test_the_model_a_trainer_is_constructed_with_is_compiled_where_it_is_built():
    _, new, findings = apply(COMPILE_TRAINER, "PM506")
    finding = only(findings, "PM506")
    assert finding.applied and "`Trainer` trains it, given it at line" in finding.message
    assert "    model = Net().to(device)\n    model.compile()\n" in new


@pytest.mark.slow
@pytest.mark.skipif(not HAS_CXX, reason="torch.compile's inductor backend needs a C++ compiler on CPU")
def test_the_compiled_trainer_trains_like_the_eager_one():
    source, new, _ = apply(COMPILE_TRAINER, "PM506")
    eager = torch.tensor(json.loads(run(source)[-1]))
    torch._dynamo.reset()
    compiled = torch.tensor(json.loads(run(new)[-1]))
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-5)


def test_a_trainer_constructed_with_two_models_is_not_compiled_for_one_of_them():
    twice = COMPILE_TRAINER.replace(
        "    trainer = Trainer(model, optimizer, device)\n",
        "    trainer = Trainer(model, optimizer, device)\n    Trainer(Net().to(device), optimizer, device).fit(1)\n",
    )
    _, new, findings = apply(twice, "PM506")
    assert ".compile()" not in new and not only(findings, "PM506").applied


OWN_MODEL_TRAINER = """\
class Trainer:
    def __init__(self):
        self.model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
        self.loss_fn = nn.CrossEntropyLoss()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)

    def train_step(self, x, y):
        loss = self.loss_fn(self.model(x), y)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()

    def fit(self, steps):
        for _ in range(steps):
            self.train_step(torch.randn(8, 16), torch.randint(0, 4, (8,)))


Trainer().fit(3)
"""


def test_a_model_the_trainer_builds_and_runs_in_a_method_gets_the_reason_compiling_it_gains_nothing():
    _, new, findings = apply(OWN_MODEL_TRAINER, "PM506")
    finding = only(findings, "PM506")  # the loss module the method calls is no model
    assert not finding.applied and "`self.model` is trained in eager mode, but its forward runs" in finding.message
    assert finding.line == OWN_MODEL_TRAINER.splitlines().index(
        "        self.model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))"
    ) + 1 + len(IMPORTS.splitlines())


# -- PM103: a batch the trainer copies whole in a helper is prefetched -------------------------

HELPER_COPY_TRAINER = """\
class Trainer:
    def __init__(self, model, loader, device):
        self.model = model
        self.loader = loader
        self.device = device
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def _to_device(self, batch):
        return [t.to(self.device) for t in batch]

    def fit(self):
        losses = []
        for batch in self.loader:
            x, y = self._to_device(batch)
            loss = F.mse_loss(self.model(x), y)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            losses.append(loss.detach())
        return losses


if __name__ == "__main__":
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = TensorDataset(torch.randn(4096, 512), torch.randn(4096, 1))
    loader = DataLoader(data, batch_size=1024, shuffle=True, pin_memory=True)
    model = nn.Linear(512, 1).to(device)
    print(torch.stack(Trainer(model, loader, device).fit()).tolist())
"""


def test_a_batch_a_trainer_method_copies_whole_is_prefetched_and_bound_as_it_comes():
    source, new, findings = apply(
        "from torch.utils.data import DataLoader, TensorDataset\n" + HELPER_COPY_TRAINER, "PM103"
    )
    assert only(findings, "PM103").applied
    assert "for batch in DevicePrefetcher(self.loader, self.device):\n            x, y = batch\n" in new
    assert run(new) == run(source)


def test_a_helper_that_does_more_than_copy_is_not_taken_out():
    more = HELPER_COPY_TRAINER.replace(
        "[t.to(self.device) for t in batch]", "[t.to(self.device).double() for t in batch]"
    )
    _, new, findings = apply("from torch.utils.data import DataLoader, TensorDataset\n" + more, "PM103")
    finding = only(findings, "PM103")
    assert "DevicePrefetcher" not in new and not finding.applied
    # reported on the loop that copies the batch through the helper, which the message names
    assert new.splitlines()[finding.line - 1].strip() == "for batch in self.loader:"
    assert "in `_to_device` (line" in finding.message


def test_a_helper_returning_a_tuple_of_the_copies_is_a_whole_copy_too():
    as_tuple = HELPER_COPY_TRAINER.replace(
        "[t.to(self.device) for t in batch]", "tuple(t.to(self.device) for t in batch)"
    )
    source, new, findings = apply("from torch.utils.data import DataLoader, TensorDataset\n" + as_tuple, "PM103")
    assert only(findings, "PM103").applied and "x, y = batch\n" in new
    sorted_copies = HELPER_COPY_TRAINER.replace(
        "[t.to(self.device) for t in batch]", "sorted(t.to(self.device) for t in batch)"
    )
    _, new, _ = apply("from torch.utils.data import DataLoader, TensorDataset\n" + sorted_copies, "PM103")
    assert "DevicePrefetcher" not in new  # another order: no plain copy


def test_a_trainer_constructed_twice_is_told_to_compile_each_model_where_it_is_built():
    twice = COMPILE_TRAINER.replace(
        "    trainer = Trainer(model, optimizer, device)\n",
        "    trainer = Trainer(model, optimizer, device)\n    Trainer(Net().to(device), optimizer, device).fit(1)\n",
    )
    _, _, findings = apply(twice, "PM506")
    message = only(findings, "PM506").message
    assert "each of 2 constructions of `Trainer`" in message and "compile each where it is built" in message


def test_pm601_names_the_model_handed_to_the_trainer_as_why_it_does_not_wrap_it():
    _, new, findings = apply(GIVEN_TRAINER, "PM601")
    finding = only(findings, "PM601")
    assert not finding.applied and "`self.model` holds the model its class is given" in finding.message
    assert "wrap it in DistributedDataParallel before it is handed over" in finding.message
