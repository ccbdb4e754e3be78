"""runtime.distributed alone (this process) and under torchrun (2 processes, gloo, one
launch whose ranks record what they saw: tests/runtime/distributed_worker.py)."""

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from runtime import checkpoint, distributed
from runtime.checkpoint import AsyncCheckpointer
from runtime.distributed import World

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture
def alone(monkeypatch):
    """A plain `python` run: none of torchrun's variables."""
    for name in TORCHRUN_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def rank_1_of_2(monkeypatch):
    """Rank 1 of a 2-process torchrun launch, before setup() joins the group."""
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")


# -- one process ---------------------------------------------------------------------------------


def test_alone_setup_joins_nothing_and_returns_the_scripts_device(alone):
    expected = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert distributed.setup() == expected
    assert distributed.setup("cpu") == torch.device("cpu")
    assert not dist.is_initialized()
    assert distributed.world() == World(rank=0, local_rank=0, size=1)
    assert not distributed.world().distributed and distributed.world().main
    assert distributed.is_main() and distributed.seed_offset() == 0


def test_alone_reductions_are_the_identity_and_print0_prints(alone, capsys):
    loss = torch.tensor(2.5, requires_grad=True) * 2
    assert distributed.all_reduce_mean(loss) is loss  # the same tensor: nothing copied, nothing synced
    assert distributed.all_reduce_mean(0.25) == 0.25
    assert distributed.local_batch_size(33) == 33
    distributed.barrier()
    distributed.print0("step", 1, sep="=")
    assert capsys.readouterr().out == "step=1\n"


def test_torchrun_variables_say_the_rank_before_setup(rank_1_of_2, capsys):
    assert distributed.world() == World(rank=1, local_rank=1, size=2)
    assert not distributed.is_main() and distributed.seed_offset() == 1
    distributed.print0("not on rank 1")
    assert capsys.readouterr().out == ""
    assert distributed.local_batch_size(32) == 16
    with pytest.raises(ValueError, match="a global batch of 33 does not split evenly over 2 processes"):
        distributed.local_batch_size(33)
    with pytest.raises(ValueError, match="process group has not been initialized"):  # setup() was not called
        distributed.all_reduce_mean(1.0)


def test_loader_options_are_the_scripts_alone_and_this_ranks_share_under_torchrun(alone, monkeypatch):
    dataset = torch.utils.data.TensorDataset(torch.arange(64))
    options = {"batch_size": 8, "shuffle": True, "drop_last": True}
    assert distributed.loader_options(dataset, options, seed=3) == options
    for name, value in (("RANK", "1"), ("LOCAL_RANK", "1"), ("WORLD_SIZE", "2")):
        monkeypatch.setenv(name, value)
    shared = distributed.loader_options(dataset, options, seed=3)
    assert options == {"batch_size": 8, "shuffle": True, "drop_last": True}  # the script's dict is left as it was
    sampler = shared.pop("sampler")
    assert shared == {"batch_size": 4, "drop_last": True}
    assert isinstance(sampler, torch.utils.data.DistributedSampler)
    assert (sampler.num_replicas, sampler.rank, sampler.shuffle, sampler.seed) == (2, 1, True, 3)
    batches = list(torch.utils.data.DataLoader(dataset, **distributed.loader_options(dataset, {"batch_size": 8})))
    assert torch.cat([b[0] for b in batches]).tolist() == list(range(1, 64, 2))  # rank 1's half, in order
    with pytest.raises(ValueError, match="a sampler of its own"):
        distributed.loader_options(dataset, {"batch_size": 8, "sampler": sampler})
    with pytest.raises(ValueError, match="one sample a step"):
        distributed.loader_options(dataset, {"shuffle": True})


def test_local_device_is_the_local_ranks_gpu_where_the_process_sees_several(monkeypatch):
    """Without a GPU: what local_device picks, with torch.cuda's counts faked."""
    assert distributed.local_device("cpu") == torch.device("cpu")
    assert distributed.local_device("cuda:3") == torch.device("cuda", 3)  # an explicit index stays
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setenv("LOCAL_RANK", "2")
    assert distributed.local_device("cuda") == torch.device("cuda", 2)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # a launcher that shows each process its own GPU
    assert distributed.local_device("cuda") == torch.device("cuda", 0)
    monkeypatch.delenv("LOCAL_RANK")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert distributed.local_device(torch.device("cuda")) == torch.device("cuda", 0)  # alone: the current GPU


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch._dynamo's imports, not ours
def test_unwrap_strips_data_parallel_and_compile_in_any_nesting():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    compiled = torch.compile(torch.nn.DataParallel(model))  # compiles lazily: nothing runs here
    assert distributed.unwrap(compiled) is model
    assert distributed.unwrap(torch.nn.DataParallel(torch.compile(model))) is model
    assert distributed.unwrap(model) is model
    assert list(distributed.unwrap(compiled).state_dict()) == ["0.weight", "0.bias"]
    assert list(compiled.state_dict()) == ["_orig_mod.module.0.weight", "_orig_mod.module.0.bias"]


def test_cleanup_alone_waits_for_the_checkpoint_write_in_flight(alone, tmp_path, monkeypatch):
    started, release = threading.Event(), threading.Event()
    real_save = torch.save

    def gated_save(obj, f):
        started.set()
        assert release.wait(5)
        real_save(obj, f)

    monkeypatch.setattr(torch, "save", gated_save)
    ckpt = AsyncCheckpointer()
    ckpt.save({"step": 3}, tmp_path / "last.pt")
    assert started.wait(5)
    cleanup = threading.Thread(target=distributed.cleanup)
    cleanup.start()
    cleanup.join(0.3)
    assert cleanup.is_alive() and not (tmp_path / "last.pt").exists()  # waiting for the write
    release.set()
    cleanup.join(5)
    assert not cleanup.is_alive() and torch.load(tmp_path / "last.pt") == {"step": 3}
    ckpt.close()
    assert ckpt not in checkpoint._open
    distributed.cleanup()  # twice, and with nothing open: nothing to do


# -- two processes -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """One torchrun launch of distributed_worker.py: (exit status, stdout, stderr, {rank: results}, folder)."""
    out = tmp_path_factory.mktemp("ranks")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    for name in TORCHRUN_VARS:
        env.pop(name, None)
    process = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            str(Path(__file__).with_name("distributed_worker.py")),
            str(out),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    ranks = {
        rank: json.loads((out / f"rank{rank}.json").read_text())
        for rank in (0, 1)
        if (out / f"rank{rank}.json").exists()
    }
    return process.returncode, process.stdout, process.stderr, ranks, out


def test_two_ranks_join_one_gloo_group_and_see_their_place(two_ranks):
    _, _, stderr, ranks, _ = two_ranks
    assert sorted(ranks) == [0, 1], stderr
    for rank, seen in ranks.items():
        assert seen["device"] == "cpu" and seen["initialized"] and seen["backend"] == "gloo"
        assert seen["world"] == [rank, rank, 2] and seen["seed_offset"] == rank
        assert seen["is_main"] == (rank == 0)
        assert seen["local_batch"] == 16
        assert seen["uneven"] == "a global batch of 33 does not split evenly over 2 processes; use a multiple of 2"
        assert seen["prefetch_device"] == "cpu"


def test_all_reduce_mean_averages_tensors_and_numbers_without_touching_the_input(two_ranks):
    ranks = two_ranks[3]
    for rank, seen in ranks.items():
        assert seen["mean"] == [1.5, 3.0] and seen["mean_float"] == 0.5 and seen["mean_is_new"]
        assert seen["mine_after"] == [float(rank + 1), 2.0 * (rank + 1)]


def test_print0_prints_once(two_ranks):
    stdout = two_ranks[1]
    assert [line for line in stdout.splitlines() if line.startswith("printed by")] == ["printed by rank 0"]


def test_ddp_is_unwrapped_to_the_module_with_equal_weights_and_averaged_gradients(two_ranks):
    ranks = two_ranks[3]
    for seen in ranks.values():
        assert seen["unwrapped_is_model"] and seen["keys"] == ["weight", "bias"]  # no "module." prefix
    assert ranks[0]["weight"] == ranks[1]["weight"]  # rank 0's, broadcast by DDP over rank 1's own seed
    assert ranks[0]["grad"] == ranks[1]["grad"] == [3.0] * 8  # sum over 3 rows of ones, averaged


def test_only_rank_0_writes_and_the_barrier_waits_for_its_write(two_ranks):
    ranks = two_ranks[3]
    for seen in ranks.values():  # rank 1 read the file right after the barrier, while rank 0 wrote for 0.5 s
        assert seen["exists_after_barrier"] and seen["saved_by"] == 0


def test_an_error_on_one_rank_ends_the_run_after_its_checkpoint_write(two_ranks):
    returncode, _, stderr, ranks, out = two_ranks
    assert returncode != 0 and "RuntimeError: training failed on rank 0" in stderr
    assert torch.load(out / "last.pt") == {"step": "last"}  # written during cleanup(), before the exit
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []  # no temporary file left
    for seen in ranks.values():
        assert seen["initialized_at_exit"] is False  # cleanup() destroyed the group on both ranks
    assert "exitcode  : -6" not in stderr and "terminate called" not in stderr  # no abort at exit (gloo)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_alone_on_a_gpu_the_prefetcher_and_setup_use_the_current_gpu(alone):
    from runtime.data import DevicePrefetcher

    assert distributed.setup() == torch.device("cuda") and not dist.is_initialized()
    current = torch.device("cuda", torch.cuda.current_device())
    assert distributed.local_device("cuda") == current
    batches = list(DevicePrefetcher([torch.ones(2, pin_memory=True)], "cuda"))
    assert batches[0].device == current
