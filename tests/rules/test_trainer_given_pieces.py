"""A trainer class handed its pieces: the model it is constructed with (`Trainer(model, ...)`
after `model = Net().to(device)`), a forward pass in a method the loop calls
(`loss, logits = self.training_step(batch)`), an optimizer over the param groups a function
of the file returns (`AdamW(param_groups(model, wd))`). The rules see where those pieces are
and what they run, fix what a script holding them in variables would get fixed, and the
rewritten program trains the same. Where a construction passes an unmoved model, or the
method may run no model, nothing is claimed."""

from __future__ import annotations

from tests.rules.test_step_rules_wild import apply, only, run

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
