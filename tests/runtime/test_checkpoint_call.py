"""AsyncCheckpointer.call: a project's own checkpoint helper run in the background thread,
on a snapshot of its arguments."""

import json
import os
import threading

import pytest
import torch

from runtime import checkpoint
from runtime.checkpoint import AsyncCheckpointer


def save_latest(save_dir, artifacts, fn="unused", verbose=False):
    """A helper in the shape of a keep-latest checkpoint manager: makes the folder, writes
    each artifact by its suffix, returns what it wrote (the result is dropped)."""
    os.makedirs(save_dir, exist_ok=True)
    for name, obj in artifacts.items():
        path = os.path.join(save_dir, name)
        if name.endswith(".pt"):
            torch.save(obj, path)
        else:
            with open(path, "w") as f:
                json.dump(obj, f)
    return sorted(artifacts)


def test_the_helper_writes_the_arguments_as_they_were_at_the_call(tmp_path):
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    started, release = threading.Event(), threading.Event()

    def gated(save_dir, artifacts, **kwargs):
        started.set()
        assert release.wait(5)
        return save_latest(save_dir, artifacts, **kwargs)

    config = {"step": 1, "names": ["a"]}
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    with AsyncCheckpointer() as ckpt:
        assert (
            ckpt.call(gated, tmp_path / "run", {"model.pt": model.state_dict(), "config.json": config}, fn="x") is None
        )
        assert started.wait(5)
        model(torch.randn(3, 4)).sum().backward()  # training goes on: the live tensors change in place
        optimizer.step()
        config["names"].append("b")
        assert not torch.equal(model.weight, expected["weight"])
        release.set()
    saved = torch.load(tmp_path / "run" / "model.pt")
    assert all(torch.equal(saved[k], expected[k]) for k in expected)
    assert json.loads((tmp_path / "run" / "config.json").read_text()) == {"step": 1, "names": ["a"]}


def test_an_error_of_the_helper_is_raised_by_the_next_flush(tmp_path):
    def failing(path):
        raise OSError(f"cannot write {path}")

    ckpt = AsyncCheckpointer()
    ckpt.call(failing, tmp_path / "x")
    with pytest.raises(OSError, match="cannot write"):
        ckpt.flush()
    ckpt.close()


def test_only_rank_0_runs_the_helper(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(checkpoint.dist, "get_rank", lambda group=None: 1)
    with AsyncCheckpointer() as ckpt:
        ckpt.call(save_latest, tmp_path / "run", {"w.pt": torch.ones(2)})
    assert not (tmp_path / "run").exists()
