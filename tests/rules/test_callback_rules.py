"""Rules over what a trainer's callbacks do on every step (`for cb in self.callbacks:
cb.on_step_end(...)`): a checkpoint callback's save goes to the background (PM405), a
memory callback's `gc.collect()` goes (PM403), and the rewritten program trains the same
and writes the same checkpoint. Where the list of callbacks is not all known, the
callbacks' code is not claimed to run in the step."""

from __future__ import annotations

import pytest
import torch

from tests.rules.test_step_rules_wild import apply, only, run

CALLBACK_TRAINER = """\
class Callback:
    def on_step_end(self, trainer, step, loss):
        pass


class Checkpoint(Callback):
    def __init__(self, path):
        self.path = path

    def on_step_end(self, trainer, step, loss):
        torch.save({"model": trainer.model.state_dict(), "step": step}, self.path)


class Janitor(Callback):
    def on_step_end(self, trainer, step, loss):
        gc.collect()


class Trainer:
    def __init__(self, model, callbacks):
        self.model = model
        self.opt = torch.optim.SGD(model.parameters(), lr=0.05)
        self.callbacks = callbacks

    def fit(self, steps):
        losses = []
        for step in range(steps):
            x = torch.randn(8, 16)
            loss = self.model(x).square().mean()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            losses.append(loss.detach())
            for cb in self.callbacks:
                cb.on_step_end(self, step, loss)
        return losses


if __name__ == "__main__":
    torch.manual_seed(0)
    width = int(os.environ.get("WIDTH", "16"))
    path = os.path.join(os.environ["CHECKPOINT_DIR"], "last.pt")
    trainer = Trainer(nn.Linear(width, 4), [Checkpoint(path), Janitor()])
    print(torch.stack(trainer.fit(6)).tolist())
"""


def test_a_checkpoint_callback_saves_in_the_background_and_the_program_trains_the_same(tmp_path, monkeypatch):
    source, new, findings = apply(CALLBACK_TRAINER, "PM405")
    finding = only(findings, "PM405")
    assert finding.applied and "`on_step_end` runs in the training loop" in finding.message
    assert "checkpointer.save(" in new and "checkpointer.flush()" in new
    printed, saved = {}, {}
    for name, text in (("before", source), ("after", new)):
        folder = tmp_path / name
        folder.mkdir()
        monkeypatch.setenv("CHECKPOINT_DIR", str(folder))
        printed[name] = run(text)
        saved[name] = torch.load(folder / "last.pt", weights_only=True)
    assert printed["after"] == printed["before"]
    assert saved["after"]["step"] == saved["before"]["step"] == 5
    for key, tensor in saved["before"]["model"].items():
        assert torch.equal(saved["after"]["model"][key], tensor)


def test_a_memory_callback_collects_no_garbage_on_every_step(tmp_path, monkeypatch):
    source, new, findings = apply(CALLBACK_TRAINER, "PM403")
    assert only(findings, "PM403").applied and "gc.collect()" not in new
    monkeypatch.setenv("CHECKPOINT_DIR", str(tmp_path))
    assert run(new) == run(source)


@pytest.mark.parametrize(
    "old,new",
    [
        ("[Checkpoint(path), Janitor()]", "[Checkpoint(path), Janitor(), *extra_callbacks()]"),
        ("    print(torch.stack", "    trainer.callbacks.append(load_plugin())\n    print(torch.stack"),
    ],
    ids=["unknown-items", "appended-elsewhere"],
)
def test_callbacks_of_a_list_not_all_known_are_not_claimed(old, new):
    assert old in CALLBACK_TRAINER
    _, rewritten, findings = apply(CALLBACK_TRAINER.replace(old, new), "PM403,PM405")
    assert not [f for f in findings if f.code in ("PM403", "PM405")]
    assert "gc.collect()" in rewritten and "checkpointer" not in rewritten
