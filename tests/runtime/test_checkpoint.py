import atexit
import copy
import threading
import time

import pytest
import torch

from runtime import checkpoint
from runtime.checkpoint import AsyncCheckpointer


def assert_same(a, b):
    """Equal values, types and structure; tensors bit for bit."""
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert a.device == b.device and a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert a == b


def trained(seed=0):
    """A model and an AdamW optimizer with state after one step."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    train_step(model, optimizer, torch.randn(4, 8))
    return model, optimizer


def train_step(model, optimizer, x):
    optimizer.zero_grad()
    model(x).square().mean().backward()
    optimizer.step()


def state_of(model, optimizer, step):
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "step": step,
        "history": [1.5, (2, "x"), None],
        "seen_shards": {0, 1},
    }


@pytest.fixture
def gated_torch_save(monkeypatch):
    """torch.save that waits for `release` before writing; `started` is set when it is called."""
    started, release = threading.Event(), threading.Event()
    real_save = torch.save

    def gated_save(obj, f):
        started.set()
        assert release.wait(5)
        real_save(obj, f)

    monkeypatch.setattr(torch, "save", gated_save)
    return started, release


def test_file_holds_the_state_at_save_time(tmp_path, gated_torch_save):
    started, release = gated_torch_save
    model, optimizer = trained()
    state = state_of(model, optimizer, step=1)
    expected = copy.deepcopy(state)
    with AsyncCheckpointer() as ckpt:
        ckpt.save(state, tmp_path / "ckpt.pt")
        assert started.wait(5)
        # Training goes on before the file is written: parameters and AdamW moments change in place.
        train_step(model, optimizer, torch.randn(4, 8))
        state["seen_shards"].add(2)
        assert not torch.equal(model[0].weight, expected["model"]["0.weight"])
        release.set()
    assert_same(torch.load(tmp_path / "ckpt.pt"), expected)  # weights_only=True, the default


def test_adamw_state_round_trips(tmp_path):
    model, optimizer = trained()
    with AsyncCheckpointer() as ckpt:
        ckpt.save(state_of(model, optimizer, step=1), tmp_path / "ckpt.pt")
    restored_model, restored_optimizer = trained(seed=1)
    loaded = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    restored_model.load_state_dict(loaded["model"])
    restored_optimizer.load_state_dict(loaded["optimizer"])
    x = torch.randn(4, 8)
    train_step(model, optimizer, x)
    train_step(restored_model, restored_optimizer, x)
    assert_same(restored_model.state_dict(), model.state_dict())
    assert_same(restored_optimizer.state_dict(), optimizer.state_dict())


def test_tied_weights_are_saved_once_and_stay_shared(tmp_path):
    embedding, head = torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False)
    head.weight = embedding.weight
    state = {"embedding": embedding.state_dict(), "head": head.state_dict()}
    with AsyncCheckpointer() as ckpt:
        ckpt.save(state, tmp_path / "ckpt.pt")
    loaded = torch.load(tmp_path / "ckpt.pt")
    assert_same(loaded, state)
    assert loaded["head"]["weight"].data_ptr() == loaded["embedding"]["weight"].data_ptr()


@pytest.mark.parametrize("surfaced_by", ["flush", "save"])
def test_failed_write_keeps_the_previous_file_and_raises_later(tmp_path, monkeypatch, surfaced_by):
    path = tmp_path / "ckpt.pt"
    ckpt = AsyncCheckpointer()
    ckpt.save({"step": 1, "w": torch.ones(3)}, path)
    ckpt.flush()

    real_save = torch.save

    def save_failing_at_step_2(obj, f):
        if obj["step"] == 2:
            f.write(b"half a checkpoint")
            raise OSError("disk full")
        real_save(obj, f)

    monkeypatch.setattr(torch, "save", save_failing_at_step_2)
    ckpt.save({"step": 2, "w": torch.zeros(3)}, path)  # fails in the background
    with pytest.raises(OSError, match="disk full"):
        ckpt.flush() if surfaced_by == "flush" else ckpt.save({"step": 3}, path)
    assert torch.load(path)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]

    ckpt.flush()  # raised once, not again
    ckpt.save({"step": 4}, path)
    ckpt.close()
    assert torch.load(path) == {"step": 4}


@pytest.mark.parametrize("target", ["missing/ckpt.pt", "a_folder"])
def test_unwritable_target_raises_and_leaves_no_temp_file(tmp_path, target):
    (tmp_path / "a_folder").mkdir()
    ckpt = AsyncCheckpointer()
    ckpt.save({"w": torch.ones(2)}, tmp_path / target)
    with pytest.raises(OSError):  # no such folder; cannot replace a folder by a file
        ckpt.close()
    assert [p.name for p in tmp_path.iterdir()] == ["a_folder"]
    assert list((tmp_path / "a_folder").iterdir()) == []


def test_second_save_waits_for_the_first_write(tmp_path, gated_torch_save):
    started, release = gated_torch_save
    ckpt = AsyncCheckpointer()
    ckpt.save({"step": 1}, tmp_path / "1.pt")
    assert started.wait(5)
    second = threading.Thread(target=ckpt.save, args=({"step": 2}, tmp_path / "2.pt"))
    second.start()
    second.join(0.2)
    assert second.is_alive() and not (tmp_path / "1.pt").exists()
    release.set()
    second.join(5)
    assert not second.is_alive() and (tmp_path / "1.pt").exists()
    ckpt.close()
    assert torch.load(tmp_path / "2.pt") == {"step": 2}


class Unsnapshottable:
    def __deepcopy__(self, memo):
        raise AssertionError("snapshotted on a rank that does not write")


@pytest.mark.parametrize("rank", [0, 1])
def test_only_rank_0_writes(tmp_path, monkeypatch, rank):
    monkeypatch.setattr(checkpoint.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(checkpoint.dist, "get_rank", lambda group=None: rank)
    state = {"w": torch.ones(2)} if rank == 0 else {"w": torch.ones(2), "x": Unsnapshottable()}
    with AsyncCheckpointer() as ckpt:
        ckpt.save(state, tmp_path / "ckpt.pt")
    assert (tmp_path / "ckpt.pt").exists() == (rank == 0)


def test_leaving_the_with_block_on_an_error_still_writes(tmp_path, monkeypatch):
    real_save = torch.save
    monkeypatch.setattr(torch, "save", lambda obj, f: (time.sleep(0.1), real_save(obj, f)))
    with pytest.raises(KeyError), AsyncCheckpointer() as ckpt:
        ckpt.save({"step": 7}, tmp_path / "ckpt.pt")
        raise KeyError("training failed")
    assert torch.load(tmp_path / "ckpt.pt") == {"step": 7}


def test_write_errors_surface_at_interpreter_exit(tmp_path, monkeypatch):
    registered = []
    monkeypatch.setattr(atexit, "register", registered.append)
    monkeypatch.setattr(atexit, "unregister", registered.remove)
    ckpt = AsyncCheckpointer()
    ckpt.save({"step": 1}, tmp_path / "missing" / "ckpt.pt")
    (at_exit,) = registered
    with pytest.raises(FileNotFoundError):
        at_exit()
    ckpt.close()
    assert registered == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_state_is_snapshotted_to_cpu(tmp_path):
    model = torch.nn.Linear(256, 256).cuda()
    expected = {k: v.cpu() for k, v in model.state_dict().items()}
    with AsyncCheckpointer() as ckpt:
        ckpt.save(model.state_dict(), tmp_path / "ckpt.pt")
        with torch.no_grad():
            model.weight.add_(1)  # queued on the stream right after the copies
    loaded = torch.load(tmp_path / "ckpt.pt")
    assert_same(dict(loaded), expected)


@pytest.mark.parametrize("rank", ["0", "1"])
def test_before_a_process_group_torchruns_rank_decides(tmp_path, monkeypatch, rank):
    """Under torchrun, a script that saves before joining a group still writes once."""
    monkeypatch.setenv("RANK", rank)
    with AsyncCheckpointer() as ckpt:
        ckpt.save({"w": torch.ones(2)}, tmp_path / "ckpt.pt")
    assert (tmp_path / "ckpt.pt").exists() == (rank == "0")


def test_wait_for_writes_waits_for_every_open_checkpointer_and_raises_after(tmp_path, gated_torch_save):
    started, release = gated_torch_save
    failing, slow = AsyncCheckpointer(), AsyncCheckpointer()
    failing.save({"step": 1}, tmp_path / "missing" / "a.pt")  # no such folder: fails once it runs
    slow.save({"step": 1}, tmp_path / "b.pt")
    assert started.wait(5)
    raised = []

    def wait():
        try:
            checkpoint.wait_for_writes()
        except OSError as error:
            raised.append(error)

    waiting = threading.Thread(target=wait)
    waiting.start()
    waiting.join(0.2)
    assert waiting.is_alive()  # the slow write is still gated
    release.set()
    waiting.join(5)
    assert not waiting.is_alive() and torch.load(tmp_path / "b.pt") == {"step": 1}
    assert [type(error) for error in raised] == [FileNotFoundError]  # the failed write, raised after the wait
    for ckpt in (failing, slow):
        ckpt.close()
        assert ckpt not in checkpoint._open
    checkpoint.wait_for_writes()  # none open: returns at once
