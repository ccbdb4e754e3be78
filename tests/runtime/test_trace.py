"""runtime.trace, in this process: what the hooks record, when they stop, what they write."""

import json
import math

import pytest
import torch

from runtime import trace
from runtime.trace import Tracer, TraceStop


def run_steps(tracer: Tracer, losses, batch=None):
    for value in losses:
        tracer.batch(batch)
        tracer.loss(value)
        tracer.stepped()


def test_stops_after_n_steps_with_status_0_and_writes_the_losses(tmp_path):
    out = tmp_path / "trace.json"
    tracer = Tracer(out=str(out), steps=3, warmup=1)
    losses = [torch.tensor(2.5), torch.tensor(1.25, dtype=torch.bfloat16), torch.tensor(0.1)]
    with pytest.raises(TraceStop) as stop:
        run_steps(tracer, losses, torch.zeros(4, 7))
    assert isinstance(stop.value, SystemExit) and stop.value.code == 0
    assert not isinstance(stop.value, Exception)  # `except Exception` in a script does not swallow it
    data = json.loads(out.read_text())
    assert data["completed"] and data["steps"] == 3
    assert data["losses"] == [2.5, 1.25, torch.tensor(0.1).item()]  # float32 0.1, read back exactly
    assert data["timed_steps"] == 2 and data["elapsed_s"] > 0
    assert data["steps_per_s"] == pytest.approx(2 / data["elapsed_s"])
    assert data["samples_per_step"] == [4, 4, 4] and data["samples_per_s"] == pytest.approx(4 * data["steps_per_s"])
    assert data["tokens_per_s"] is None  # float inputs are not token ids
    assert data["peak_memory_kind"] == "rss" and data["peak_memory_bytes"] > 2**20
    assert data["device"].startswith("cpu") and data["torch"] == torch.__version__
    assert not list(tmp_path.glob("*.part"))


def test_hooks_return_their_argument_unchanged(tmp_path):
    tracer = Tracer(out=str(tmp_path / "t.json"), steps=10, warmup=1)
    loss, ids = torch.tensor(1.0, requires_grad=True) * 3, torch.ones(2, 5, dtype=torch.long)
    assert tracer.loss(loss) is loss and tracer.batch(ids) is ids and tracer.stepped("value") == "value"
    assert tracer.losses[0].requires_grad is False  # a detached copy: no graph kept alive


def test_token_ids_count_tokens_and_micro_batches_add_up(tmp_path):
    tracer = Tracer(out=str(tmp_path / "t.json"), steps=2, warmup=1)
    for _ in range(2):  # two optimizer steps of three micro-batches of (B=2, T=5) token ids
        for _ in range(3):
            tracer.batch(torch.ones(2, 5, dtype=torch.long))
            tracer.loss(torch.tensor(1.0))
        with pytest.raises(TraceStop) if tracer.done == 1 else _nothing():
            tracer.stepped()
    data = json.loads((tmp_path / "t.json").read_text())
    assert data["samples_per_step"] == [6, 6] and len(data["losses"]) == 6
    assert data["tokens_per_s"] == pytest.approx(30 * data["steps_per_s"])


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_unknown_batches_give_no_rate(tmp_path):
    tracer = Tracer(out=str(tmp_path / "t.json"), steps=2, warmup=1)
    with pytest.raises(TraceStop):
        run_steps(tracer, [torch.tensor(1.0), torch.tensor(2.0)], batch={"ids": torch.ones(2, 3)})
    data = json.loads((tmp_path / "t.json").read_text())
    assert data["samples_per_step"] == [None, None] and data["samples_per_s"] is None
    assert data["steps_per_s"] is not None


def test_an_early_end_is_written_as_incomplete_and_nan_as_null(tmp_path):
    tracer = Tracer(out=str(tmp_path / "t.json"), steps=10, warmup=2)
    run_steps(tracer, [torch.tensor(1.0), torch.tensor(math.nan), torch.tensor(math.inf)])
    tracer.write(completed=False)
    data = json.loads((tmp_path / "t.json").read_text())
    assert not data["completed"] and data["steps"] == 3
    assert data["losses"] == [1.0, None, None]
    assert data["timed_steps"] == 0 and data["steps_per_s"] is None


def test_stepping_after_the_stop_ends_the_process(tmp_path, monkeypatch):
    class Exited(BaseException):
        pass

    def exit_now(status):
        raise Exited(status)

    monkeypatch.setattr(trace.os, "_exit", exit_now)
    tracer = Tracer(out=str(tmp_path / "t.json"), steps=2, warmup=1)
    with pytest.raises(TraceStop):
        run_steps(tracer, [torch.tensor(1.0), torch.tensor(2.0)])
    with pytest.raises(Exited) as exited:
        tracer.stepped()  # a script that caught TraceStop and trained on
    assert exited.value.args == (0,)


def test_install_reads_the_environment_seeds_and_runs_once(tmp_path, monkeypatch):
    monkeypatch.setattr(trace, "_tracer", None)
    monkeypatch.setattr(trace.atexit, "register", lambda *args, **kwargs: None)
    monkeypatch.setenv(trace.OUT_VAR, str(tmp_path / "t.json"))
    monkeypatch.setenv(trace.STEPS_VAR, "7")
    monkeypatch.setenv(trace.WARMUP_VAR, "3")
    monkeypatch.setenv(trace.SEED_VAR, "5")
    first = trace.install()
    drawn = torch.rand(3)
    torch.manual_seed(5)
    assert torch.equal(drawn, torch.rand(3))
    assert (first.steps, first.warmup) == (7, 3) and trace.install() is first


def test_install_without_verify_says_what_it_is_for(monkeypatch):
    monkeypatch.setattr(trace, "_tracer", None)
    monkeypatch.delenv(trace.OUT_VAR, raising=False)
    with pytest.raises(RuntimeError, match="perfmod verify"):
        trace.install()


def test_a_spawned_worker_that_imports_the_script_again_writes_nothing(tmp_path, monkeypatch):
    registered = []
    monkeypatch.setattr(trace, "_tracer", None)
    monkeypatch.setattr(trace.atexit, "register", lambda *args, **kwargs: registered.append(args))
    monkeypatch.setattr(trace.multiprocessing, "parent_process", lambda: object())  # as in a worker
    monkeypatch.setenv(trace.OUT_VAR, str(tmp_path / "t.json"))
    monkeypatch.setenv(trace.STEPS_VAR, "7")
    trace.install().write(completed=False)
    assert registered == [] and not (tmp_path / "t.json").exists()


def test_under_torchrun_each_rank_writes_its_own_file(tmp_path, monkeypatch):
    monkeypatch.setattr(trace, "_tracer", None)
    monkeypatch.setattr(trace.atexit, "register", lambda *args, **kwargs: None)
    monkeypatch.setenv(trace.OUT_VAR, str(tmp_path / "t.json"))
    monkeypatch.setenv(trace.STEPS_VAR, "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    tracer = trace.install()
    assert tracer.out == str(tmp_path / "t.rank1.json") == trace.rank_path(str(tmp_path / "t.json"), 1)
    with pytest.raises(TraceStop):
        run_steps(tracer, [torch.tensor(1.0), torch.tensor(2.0)], torch.zeros(3, 2))
    data = json.loads((tmp_path / "t.rank1.json").read_text())
    assert (data["rank"], data["world_size"]) == (1, 2) and not (tmp_path / "t.json").exists()
    # This process never joined a group: verify --nproc tells a script that is not torchrun-ready by it.
    assert data["process_group"] == {"initialized": False, "world_size": None, "backend": None}
    assert data["samples_per_step"] == [3, 3] and data["tokens_per_step"] == [None, None]


def test_pinned_shuffle_makes_a_shuffling_loader_draw_the_distributed_samplers_global_batches(monkeypatch):
    from torch.utils.data import DataLoader, DistributedSampler, RandomSampler

    # Restored after the test: pin_shuffle patches the classes for the whole process.
    monkeypatch.setattr(RandomSampler, "__iter__", RandomSampler.__iter__)
    monkeypatch.setattr(DistributedSampler, "__init__", DistributedSampler.__init__)
    trace.pin_shuffle(7)
    trace.pin_shuffle(7)  # once only: not wrapped twice
    dataset = list(range(40))
    loader = DataLoader(dataset, batch_size=8, shuffle=True)
    samplers = [DistributedSampler(dataset, num_replicas=2, rank=rank, seed=123) for rank in (0, 1)]
    assert [s.seed for s in samplers] == [7, 7]  # the script's seed gives way to verify's
    for epoch in range(2):
        for sampler in samplers:
            sampler.set_epoch(epoch)
        ranks = [list(DataLoader(dataset, batch_size=4, sampler=s)) for s in samplers]
        global_batches = [sorted(a.tolist() + b.tolist()) for a, b in zip(*ranks)]
        assert [sorted(batch.tolist()) for batch in loader] == global_batches
    assert [b.tolist() for b in loader] != [b.tolist() for b in loader]  # passes 3 and 4: seeds 9 and 10
    with_replacement = RandomSampler(dataset, replacement=True)
    assert len(list(with_replacement)) == 40  # not a permutation: left as torch draws it
