"""PM601 on `while` training loops that take their batches with `next(it)`: the rule's
example `while step < max_steps:` over `iter(loader)`, restarted on StopIteration, is
rewritten (a DistributedSampler told each new pass), and the rewrite, run alone in this
process, trains bit for bit like the original over more steps than one pass holds.
"""

from __future__ import annotations

import atexit

import pytest
import torch

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level
from codemod.rules.single_process_training.examples import WHILE_STEPS

PM601 = Settings(select=("PM601",), level=Level.UNSAFE)
TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def rewrite(source: str) -> str:
    result = process_source(source.encode(), "train.py", PM601)
    assert result.error is None, result.error
    assert [f.code for f in result.findings if f.applied] == ["PM601"], [f.message for f in result.findings]
    return result.new_source.decode()


def trained(source: str, monkeypatch) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Run `source` as a script in this process: each step's loss and the final weights."""
    losses: list[float] = []
    source = source.replace("    step += 1\n", "    step += 1\n    losses.append(loss.item())\n")
    namespace = {"__name__": "__main__", "losses": losses}
    with monkeypatch.context() as patch, torch.random.fork_rng():
        for name in TORCHRUN_VARS:
            patch.delenv(name, raising=False)
        patch.setattr(atexit, "register", lambda *args, **kwargs: None)  # nothing outlives the test
        exec(compile(source, "train.py", "exec"), namespace)
    return losses, {k: v.clone() for k, v in namespace["model"].state_dict().items()}


def test_a_while_loop_over_next_of_a_loader_trains_alone_bit_for_bit_like_the_original(monkeypatch):
    new = rewrite(WHILE_STEPS)
    assert "sampler.set_epoch(sampler.epoch + 1)\n        batches = iter(loader)" in new
    before, after = trained(WHILE_STEPS, monkeypatch), trained(new, monkeypatch)
    assert len(before[0]) == 20  # 8 batches a pass: two new passes started
    assert after[0] == before[0]
    assert after[1].keys() == before[1].keys()
    assert all(torch.equal(after[1][k], v) for k, v in before[1].items())


@pytest.mark.parametrize(
    "change, reason",
    [
        (
            ("batches = iter(loader)", "batches = forever(loader)"),
            "the batches come from `forever(loader)`, which starts the DataLoader's passes itself",
        ),
        (("while step < max_steps:", "while step < max_steps and loss.item() > 0.01:"), "depends on each rank's own"),
    ],
)
def test_a_while_loop_it_cannot_split_is_reported_with_the_reason(change, reason):
    source = WHILE_STEPS.replace(*change).replace(
        "step, max_steps",
        "def forever(loader):\n    while True:\n        for x, y in loader:\n            yield x, 2 * y\n\n\nstep, max_steps",
    )
    source = source.replace("batches = iter(loader)\nwhile", "batches = iter(loader)\nloss = torch.ones(())\nwhile")
    result = process_source(source.encode(), "train.py", PM601)
    assert result.new_source == source.encode()
    assert [f.code for f in result.findings] == ["PM601"]
    assert reason in result.findings[0].message, result.findings[0].message


CYCLES = {
    "for": "def cycle(dl):\n    while True:\n        for b in dl:\n            yield b\n\n\n",
    "yield from": "def cycle(dl):\n    while True:\n        yield from dl\n\n\n",
}


@pytest.mark.parametrize("form", CYCLES)
def test_a_generator_that_cycles_the_loader_tells_the_sampler_each_pass_and_trains_alone_bit_for_bit(form, monkeypatch):
    source = WHILE_STEPS.replace("step, max_steps", CYCLES[form] + "step, max_steps").replace(
        "batches = iter(loader)\nwhile", "batches = cycle(loader)\nwhile"
    )
    source = source.replace(
        "    try:\n        x, y = next(batches)\n    except StopIteration:\n"
        "        batches = iter(loader)\n        x, y = next(batches)\n",
        "    x, y = next(batches)\n",
    )
    new = rewrite(source)
    assert (
        "if isinstance(dl.sampler, DistributedSampler):\n            dl.sampler.set_epoch(dl.sampler.epoch + 1)" in new
    )
    before, after = trained(source, monkeypatch), trained(new, monkeypatch)
    assert len(before[0]) == 20 and after[0] == before[0]
    assert all(torch.equal(after[1][k], v) for k, v in before[1].items())
    # Under torchrun each pass ends with a new epoch for the sampler: 2.5 passes, epochs 0, 1, 2.
    namespace: dict = {}
    exec(compile(new[new.index("def cycle") : new.index("step, max_steps")], "train.py", "exec"), namespace)
    dataset = torch.utils.data.TensorDataset(torch.arange(8.0))
    sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=1, rank=0, seed=0)
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, sampler=sampler)
    namespace["DistributedSampler"] = torch.utils.data.DistributedSampler
    batches = namespace["cycle"](loader)
    orders = [next(batches)[0].tolist() for _ in range(5)]
    assert sampler.epoch == 2
    assert sorted(orders[0] + orders[1]) == sorted(orders[2] + orders[3]) == list(range(8))
    assert orders[:2] != orders[2:4]  # epoch 1 reshuffled
