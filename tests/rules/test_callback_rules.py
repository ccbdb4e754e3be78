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


FIRED_BY_NAME = (
    CALLBACK_TRAINER.replace(
        """            for cb in self.callbacks:
                cb.on_step_end(self, step, loss)
        return losses
""",
        """            self._fire("on_step_end", step, loss)
        self._fire("on_train_end")
        return losses

    def _fire(self, event, *args):
        for cb in self.callbacks:
            handler = getattr(cb, event, None)
            if handler is not None:
                handler(self, *args)
""",
    )
    .replace(
        """class Janitor(Callback):
    def on_step_end(self, trainer, step, loss):
        gc.collect()
""",
        """class Janitor(Callback):
    def on_step_end(self, trainer, step, loss):
        gc.collect()

    def on_train_end(self, trainer):
        gc.collect()


class Logger:
    def __init__(self, every):
        self.every = every

    def on_step_end(self, trainer, step, loss):
        if step % self.every == 0:
            print(step, loss.item())
""",
    )
    .replace("[Checkpoint(path), Janitor()]", "[Checkpoint(path), Janitor(), Logger(2)]")
)


def test_events_fired_by_name_reach_the_callbacks_that_run_every_step_only(tmp_path, monkeypatch):
    source, new, findings = apply(FIRED_BY_NAME, "PM403,PM404,PM405")
    fixed = sorted((f.code, f.line) for f in findings if f.applied)
    assert [code for code, _ in fixed] == ["PM403", "PM405"], [(f.code, f.line, f.message) for f in findings]
    assert new.count("gc.collect()") == 1  # the one at the end of training stays
    assert not [f for f in findings if f.code == "PM404"]  # `loss.item()` is read every other step
    monkeypatch.setenv("CHECKPOINT_DIR", str(tmp_path))
    assert run(new) == run(source)


LOGGING_HELPER = """\
def log(step, loss, every=10):
    if step % every == 0:
        print(step, loss.item())


def main():
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = nn.Linear(8, 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(30):
        loss = model(torch.randn(4, 8, device=device)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        log(step, loss)
"""


def test_a_read_a_helper_makes_only_at_log_time_is_not_every_step():
    _, _, findings = apply(LOGGING_HELPER, "PM404")
    assert not findings
    _, _, findings = apply(LOGGING_HELPER.replace("    if step % every == 0:\n        print", "    print"), "PM404")
    assert "waits for the GPU every step" in only(findings, "PM404").message


def test_a_path_kept_in_an_attribute_of_any_name_is_followed_to_what_the_constructions_pass():
    named = (
        CALLBACK_TRAINER.replace("self.path", "self.target")
        .replace("def __init__(self, path):", "def __init__(self, where):")
        .replace("self.target = path", "self.target = where")
    )
    assert "self.target = where" in named
    _, new, findings = apply(named, "PM405")
    assert only(findings, "PM405").applied and "checkpointer.save(" in new
    opened = named.replace("[Checkpoint(path), Janitor()]", "[Checkpoint(open(path, 'ab')), Janitor()]")
    _, new, findings = apply(opened, "PM405")
    finding = only(findings, "PM405")
    assert not finding.applied and "is a file path and not an open file" in finding.message
