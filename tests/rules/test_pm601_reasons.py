"""PM601's reasons, each checked against the script it is given: what it refuses, it
refuses for the reason that holds there, and what it used to refuse for a reason that
did not hold (an evaluation loss summed, a model built in the `__main__` block, a model
moved under a second name) it rewrites (the fixture pairs and their runs under torchrun
are in test_fixture_pairs.py and test_pm601_execution.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level
from codemod.rules.single_process_training.examples import LOOP, SCRIPT

PM601 = Settings(select=("PM601",), level=Level.UNSAFE)
REFUSED = "cannot make it torchrun-ready: "


def finding(source: str):
    result = process_source(source.encode(), "train.py", PM601)
    assert result.error is None, result.error
    (found,) = [f for f in result.findings if f.code == "PM601"]
    return found, result


def reason(source: str) -> str:
    found, result = finding(source)
    assert not found.applied and result.new_source in (None, source.encode()), found.message
    return found.message.split(REFUSED, 1)[1]


def rewritten(source: str) -> str:
    found, result = finding(source)
    assert found.applied, found.message
    return result.new_source.decode()


EVALUATION = LOOP + (
    "    with torch.no_grad():\n"
    "        val = sum(torch.nn.functional.mse_loss(model(x), y, reduction='sum') for x, y in loader)\n"
    "    print(val.item())\n"
)


def test_a_summed_evaluation_loss_is_not_the_training_loss():
    assert "DistributedDataParallel(model)" in rewritten(EVALUATION)


@pytest.mark.parametrize(
    "spelling",
    [
        "loss = torch.nn.functional.mse_loss(model(x), y, reduction='sum')",
        "loss = criterion(model(x), y)",
        "loss, extra = summed(model(x), y)",
    ],
    ids=["functional", "loss-module", "helper-tuple"],
)
def test_a_summed_training_loss_is_the_reason(spelling):
    source = (
        "def summed(out, y):\n"
        "    return torch.nn.functional.mse_loss(out, y, reduction='sum'), 0\n"
        "criterion = torch.nn.MSELoss(reduction='sum')\n"
    )
    source = LOOP.replace("model = torch", source + "model = torch").replace(
        "loss = torch.nn.functional.mse_loss(model(x), y)", spelling
    )
    assert reason(source).startswith('the loss is summed over the batch (reduction="sum")')


MAIN_BLOCK = """\
import torch
from torch.utils.data import DataLoader, TensorDataset


def train(epochs):
    for epoch in range(epochs):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()


if __name__ == "__main__":
    dataset = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    loader = DataLoader(dataset, batch_size=8, shuffle=True)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train(2)
"""


def test_a_model_built_in_the_main_block_is_wrapped_there():
    new = rewritten(MAIN_BLOCK)
    assert (
        "    model = torch.nn.Linear(8, 1)\n    if world.distributed:\n        model = DistributedDataParallel(model)\n"
        in new
    )


def test_a_global_model_of_a_function_called_twice_is_refused_for_that():
    source = MAIN_BLOCK.replace("    train(2)\n", "    train(1)\n    train(1)\n")
    assert "is not built in the function that trains it" in reason(source)


MOVED = LOOP.replace("model = torch.nn.Linear(8, 1)\n", "model = torch.nn.Linear(8, 1)\nm = model.to('cpu')\n")


def test_a_model_moved_under_a_second_name_is_wrapped_under_the_name_the_loop_runs():
    new = rewritten(MOVED.replace("mse_loss(model(x), y)", "mse_loss(m(x), y)"))
    assert "m = model.to('cpu')\nif world.distributed:\n    m = DistributedDataParallel(m)\n" in new
    assert "SGD(model.parameters()" in new  # the same parameters: DDP wraps that module


def test_a_model_run_under_both_names_is_refused_for_that():
    source = MOVED.replace("mse_loss(model(x), y)", "mse_loss(m(x), y) + model(x).mean()")
    assert "gives the model a second name, and the loop runs it as both" in reason(source)


def test_sparse_embedding_gradients_are_the_reason():
    source = LOOP.replace("torch.nn.Linear(8, 1)", "torch.nn.EmbeddingBag(8, 1, sparse=True)").replace(
        "model(x)", "model(x.long().clamp(0, 7))"
    )
    assert "sparse=True)` gives the model sparse gradients" in reason(source)


ZOO_MODEL = LOOP.replace("import torch\n", "import torch\nfrom torchvision import models\n").replace(
    "torch.nn.Linear(8, 1)", "torch.nn.Sequential(torch.nn.Flatten(), models.{builder}(num_classes=1))"
)


@pytest.mark.parametrize(
    "builder,because",
    [
        ("resnet18", "`models.resnet18` holds BatchNorm"),
        ("vgg19_bn", "`models.vgg19_bn` holds BatchNorm"),
        ("vgg19", None),  # VGG without `_bn` has no BatchNorm: wrapped in DDP
    ],
)
def test_a_model_of_the_zoo_holds_batch_norm_unless_it_is_one_known_without(builder, because):
    source = ZOO_MODEL.format(builder=builder)
    if because is None:
        assert "DistributedDataParallel(model)" in rewritten(source)
    else:
        assert reason(source).startswith(because)


def test_an_optimizer_of_tensors_alone_trains_no_model_for_ddp_to_wrap():
    source = (
        "import torch\n\nimage = torch.zeros(1, 3, 8, 8).requires_grad_(True)\n"
        "style = torch.rand(1, 3, 8, 8)\nopt = torch.optim.Adam([image], lr=0.1)\n"
        "for step in range(10):\n    loss = (image - style).pow(2).mean()\n"
        "    opt.zero_grad()\n    loss.backward()\n    opt.step()\n"
    )
    assert reason(source) == (
        "the optimizer trains tensors (`image`), not the parameters of a model: there is no model for "
        "DistributedDataParallel to wrap"
    )


FULL_BATCH = """\
import numpy as np
import torch

x_train = np.random.rand(15, 1).astype(np.float32)
y_train = (2 * x_train + 1).astype(np.float32)
model = torch.nn.Linear(1, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(60):
    inputs = {inputs}
    targets = torch.from_numpy(y_train)
    loss = torch.nn.functional.mse_loss(model(inputs), targets)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_a_loop_that_gives_the_model_the_same_tensors_every_step_is_full_batch_training():
    assert reason(FULL_BATCH.format(inputs="torch.from_numpy(x_train)")).startswith(
        "every step trains on the same data (full-batch training: `range(60)` counts the steps"
    )
    for varying in (
        "torch.from_numpy(x_train[epoch % 15 :])",
        "torch.from_numpy(x_train).clone()\n    inputs.add_(epoch)",
    ):
        assert reason(FULL_BATCH.format(inputs=varying)).startswith(
            "it cannot tell where the batches of `range(60)` come from"
        )


def test_batches_taken_with_next_in_a_loop_over_a_counter_are_named_as_the_reason():
    source = LOOP.replace(
        "for epoch in range(3):\n    for x, y in loader:\n",
        "batches = iter(loader)\nfor step in range(8):\n    if True:\n        x, y = next(batches)\n",
    )
    assert reason(source).startswith(
        "the batches come from `next(batches)` of a DataLoader, taken by hand in a loop over `range(8)`"
    )


def test_a_generator_that_repacks_the_batches_is_told_apart_from_one_that_yields_them_whole():
    generator = "def cycle(dl):\n    while True:\n        for x, y in dl:\n            yield x, y\n\n"
    source = LOOP.replace(
        "for epoch in range(3):\n    for x, y in loader:\n",
        generator + "batches = cycle(loader)\nfor step in range(8):\n    if True:\n        x, y = next(batches)\n",
    )
    found = reason(source)
    assert found.startswith("the batches come from `next(batches)` of a DataLoader, taken by hand in a loop over")
    assert "a generator of this file that yields the loader's batches whole" in found


def test_epochs_in_a_comprehension_are_the_reason():
    source = (
        LOOP.replace("for epoch in range(3):\n", "def epoch_pass():\n").replace(
            "\n    for x, y in loader:", "\n    for x, y in loader:"
        )
        + "    return loss.item()\n\nhistory = [epoch_pass() for _ in range(3)]\n"
    )
    assert reason(source).startswith("the epochs run in a comprehension")


TUTORIAL = Path(__file__).resolve().parents[2] / "fixtures" / "rules" / "PM601" / "tutorial_trainer.in.py"
TUTORIAL_DEVICE = '    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")\n'


def test_the_tutorial_trainer_is_rewritten_where_its_objects_are_built():
    new = rewritten(TUTORIAL.read_text())
    assert "        self.model = model.to(gpu_id)\n        if world.distributed:\n" in new
    assert "            if isinstance(self.train_data.sampler, DistributedSampler):\n" in new
    assert "    device = distributed.setup(" in new  # the device the script chose, set up per rank


def test_the_tutorial_s_gpu_0_becomes_each_process_s_gpu_and_another_index_is_the_reason():
    """The tutorial itself writes `device = 0`: the GPU one process uses by default, which
    "cuda" names as well, and which setup() makes each process's own; GPU 1 is a choice."""
    source = TUTORIAL.read_text()
    assert TUTORIAL_DEVICE in source
    new = rewritten(source.replace(TUTORIAL_DEVICE, "    device = 0\n"))
    assert '    device = distributed.setup("cuda")\n' in new
    new = rewritten(source.replace(TUTORIAL_DEVICE, '    device = 0 if torch.cuda.is_available() else "cpu"\n'))
    assert '    device = distributed.setup("cuda" if torch.cuda.is_available() else "cpu")\n' in new
    assert reason(source.replace(TUTORIAL_DEVICE, "    device = 1\n")).startswith("the device is GPU 1")


def test_a_loader_of_dict_options_gets_them_for_its_process_and_its_sampler_the_epoch():
    source = LOOP.replace(
        "loader = DataLoader(dataset, batch_size=32, shuffle=True)",
        "options = dict(batch_size=32, shuffle=True)\nloader = DataLoader(dataset, **options)",
    )
    new = squeezed(rewritten(source))
    assert squeezed("loader = DataLoader(dataset, **distributed.loader_options(dataset, options))") in new
    assert squeezed("if isinstance(loader.sampler, DistributedSampler): loader.sampler.set_epoch(epoch)") in new
    beside = source.replace("DataLoader(dataset, **options)", "DataLoader(dataset, batch_size=32, **options)")
    assert reason(beside).startswith("the DataLoader takes `*args`/`**kwargs` beside its own batch or sampler")


REPLACEMENT = LOOP.replace(
    "loader = DataLoader(dataset, batch_size=32, shuffle=True)",
    "torch.manual_seed(0)\n"
    "sampler = RandomSampler(dataset, replacement=True, num_samples=128)\n"
    "loader = DataLoader(dataset, batch_size=32, sampler=sampler)",
).replace("DataLoader, TensorDataset", "DataLoader, RandomSampler, TensorDataset")


def squeezed(source: str) -> str:
    """`source` without whitespace: what it says, however its lines were split."""
    return "".join(source.split())


def test_a_sampler_drawing_with_replacement_draws_each_ranks_share_from_its_own_seed():
    new = squeezed(rewritten(REPLACEMENT))
    assert squeezed("RandomSampler(dataset, replacement=True, num_samples=distributed.local_batch_size(128))") in new
    assert squeezed("DataLoader(dataset, batch_size=distributed.local_batch_size(32), sampler=sampler)") in new
    assert squeezed("if world.distributed: torch.manual_seed(0 + distributed.seed_offset())\nfor epoch") in new
    weighted = REPLACEMENT.replace(
        "RandomSampler(dataset, replacement=True, num_samples=128)", "WeightedRandomSampler(torch.ones(256), 128)"
    ).replace("RandomSampler,", "WeightedRandomSampler,")
    assert squeezed("WeightedRandomSampler(torch.ones(256), distributed.local_batch_size(128))") in squeezed(
        rewritten(weighted)
    )


@pytest.mark.parametrize(
    ("sampler", "why"),
    [
        ("RandomSampler(dataset)", "without replacement it draws a permutation"),
        ("RandomSampler(dataset, replacement=True)", "it draws len(dataset) indices an epoch"),
        (
            "RandomSampler(dataset, replacement=True, num_samples=128, generator=torch.Generator())",
            "a generator of its own",
        ),
        ("SequentialSampler(dataset)", "split it over the ranks by hand"),
    ],
    ids=["permutation", "no-count", "own-generator", "sequential"],
)
def test_other_samplers_of_the_scripts_own_are_the_reason(sampler, why):
    source = REPLACEMENT.replace("RandomSampler(dataset, replacement=True, num_samples=128)", sampler).replace(
        "RandomSampler,", "RandomSampler, SequentialSampler,"
    )
    assert why in reason(source)


def test_losses_kept_in_a_list_are_logged_as_their_mean_over_the_ranks():
    source = LOOP.replace("opt = torch", "losses = []\nopt = torch").replace(
        "        opt.step()\n",
        "        opt.step()\n        losses.append(loss.detach())\n"
        "    print(f'epoch {epoch} last {losses[-1].item():.4f} of {len(losses)}')\n"
        "print('all', torch.stack(losses).tolist(), losses)\n",
    )
    new = squeezed(rewritten(source))
    assert squeezed("{distributed.all_reduce_mean(losses[-1]).item():.4f} of {len(losses)}") in new
    assert squeezed("print0('all', distributed.all_reduce_mean(torch.stack(losses)).tolist(), losses)") in new


def _save_then_reload(setup: str, path: str) -> str:
    """LOOP saving a checkpoint each epoch at `path` and reading it straight back
    (weight averaging), after the lines `setup`."""
    return (
        "import argparse, os, tempfile, time, uuid\n"
        + setup
        + LOOP
        + f"    path = {path}\n"
        + "    torch.save(model.state_dict(), path)\n"
        + "    snap = torch.load(path)\n"
    )


@pytest.mark.parametrize(
    ("setup", "path", "because"),
    [
        # every process makes its own folder: rank 1 would read a file rank 0 wrote elsewhere
        ("tmp = tempfile.mkdtemp()\n", 'os.path.join(tmp, f"ep{epoch}.pt")', "temporary folder"),
        ("def out_dir():\n    return tempfile.mkdtemp()\n", 'out_dir() + "/last.pt"', "temporary folder"),
        ("", 'f"ckpt-{uuid.uuid4().hex}.pt"', "`uuid.uuid4()`, which differs in every process"),
        ('stamp = time.strftime("%H%M%S")\n', 'f"run-{stamp}.pt"', '`time.strftime("%H%M%S")`, which differs'),
        ("", 'f"ckpt-{os.getpid()}.pt"', "`os.getpid()`, which differs in every process"),
    ],
    ids=["mkdtemp", "helper-mkdtemp", "uuid", "clock", "pid"],
)
def test_a_checkpoint_read_back_from_a_path_of_each_process_is_refused(setup, path, because):
    assert because in reason(_save_then_reload(setup, path))


@pytest.mark.parametrize(
    ("setup", "path"),
    [
        (
            "parser = argparse.ArgumentParser()\nparser.add_argument('--out', default='ckpt')\n"
            "args = parser.parse_args([])\n",
            'os.path.join(args.out, f"ep{epoch}.pt")',
        ),
        ('out = os.environ.get("OUT_DIR", ".")\n', 'os.path.join(out, "last.pt")'),
    ],
    ids=["argparse", "environment"],
)
def test_a_checkpoint_read_back_from_a_shared_path_waits_for_rank_0(setup, path):
    after = rewritten(_save_then_reload(setup, path))
    assert "distributed.barrier()\n    snap = torch.load(path)" in after
    assert "distributed.is_main()" in after


def _model_lines(source: str) -> list[str]:
    """The lines from the model's build to the optimizer, stripped."""
    lines = [line.strip() for line in source.splitlines()]
    start = next(i for i, line in enumerate(lines) if line.startswith("model = torch.nn."))
    end = next(i for i, line in enumerate(lines) if line.startswith("opt = "))
    return lines[start:end]


def test_the_model_is_compiled_before_it_is_wrapped_when_pm506_runs_too():
    """PM506 and PM601 in one run: `model.compile()` on the model itself, then the DDP
    wrap (as both pages say), not a compile of the wrapper."""
    two_layers = "torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8), torch.nn.Tanh(), torch.nn.Linear(8, 1))"  # one Linear has nothing to fuse
    source = SCRIPT.replace("torch.nn.Linear(8, 1)", two_layers)
    result = process_source(source.encode(), "train.py", Settings(select=("PM506", "PM601"), level=Level.UNSAFE))
    assert {f.code for f in result.findings if f.applied} == {"PM506", "PM601"}
    assert _model_lines(result.new_source.decode()) == [
        f"model = {two_layers}.to(device)",
        "model.compile()",
        "if world.distributed:",
        "model = DistributedDataParallel(model)",
    ]


@pytest.mark.parametrize("compiled", ["model.compile()", "model = torch.compile(model)"])
def test_a_model_compiled_already_is_wrapped_after_its_compile(compiled):
    source = SCRIPT.replace(
        "    model = torch.nn.Linear(8, 1).to(device)\n",
        f"    model = torch.nn.Linear(8, 1).to(device)\n    {compiled}\n",
    )
    assert _model_lines(rewritten(source)) == [
        "model = torch.nn.Linear(8, 1).to(device)",
        compiled,
        "if world.distributed:",
        "model = DistributedDataParallel(model)",
    ]


OUTSIDE_TRAINER = """\
import torch
from torch.utils.data import DataLoader, TensorDataset


class Trainer:
    def __init__(self, device):
        self.model = torch.nn.Linear(8, 1).to(device)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)

    def step(self, x, y):
        loss = (self.model(x) - y).pow(2).mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()


if __name__ == "__main__":
    trainer = Trainer("cpu")
    loader = DataLoader(TensorDataset(torch.randn(64, 8), torch.randn(64, 1)), batch_size=8)
    for epoch in range(2):
        for x, y in loader:
            trainer.step(x, y)
"""


def test_a_trainer_whose_method_a_loop_outside_it_calls_is_named_in_the_reason():
    why = reason(OUTSIDE_TRAINER)
    assert "`self.model` is an attribute of `Trainer`, whose methods the loop calls from outside the class" in why


def test_a_save_on_the_line_of_its_if_is_refused_for_that_not_as_part_of_a_larger_statement():
    save = '        torch.save(model.state_dict(), "last.pt")\n'
    one_line = SCRIPT.replace(save, save.replace("torch.save", "if epoch == 2: torch.save"))
    assert reason(one_line).startswith("`torch.save` is on the line of its `if`; put it on a line of its own")
    in_a_list = SCRIPT.replace(save, save.replace("torch.save", "saved = [torch.save").replace(")\n", ")]\n"))
    assert "`torch.save` is part of a larger statement" in reason(in_a_list)


# The loop is a method of another class (a small trainer's `fit`), given the module whose
# methods build the optimizer from `self.model` and run the step.
TRAINER_OF_A_MODULE = """\
import torch


class LitModel:
    def __init__(self):
        self.model = torch.nn.Linear(8, 1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.model.parameters(), lr=0.1)

    def training_step(self, batch):
        x, y = batch
        return (self.model(x) - y).pow(2).mean()


class MiniTrainer:
    def fit(self, module, batches):
        opt = module.configure_optimizers()
        module.model.train()
        for batch in batches:
            loss = module.training_step(batch)
            opt.zero_grad()
            loss.backward()
            opt.step()


if __name__ == "__main__":
    module = LitModel()
    trainer = MiniTrainer()
    trainer.fit(module, [(torch.randn(4, 8), torch.randn(4, 1))])
"""


def test_a_model_attribute_of_the_class_a_trainer_is_given_is_named_with_that_class():
    """`self.model` is `LitModel`'s (it builds the optimizer), not the trainer's, whose `fit`
    runs the loop: the reason names the class whose methods the loop calls."""
    why = reason(TRAINER_OF_A_MODULE)
    assert "`self.model` is an attribute of `LitModel`, whose methods the loop calls from outside the class" in why


def test_a_model_built_inline_in_a_trainer_method_call_is_named_as_such():
    """`trainer.fit(Net())`: the method's `self` is the receiver, so the call passes `Net()`
    as `module`, and the reason is that the model is built inline in the call."""
    source = """\
import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 1)

    def forward(self, x):
        return self.fc(x)


class MiniTrainer:
    def fit(self, module, batches):
        opt = torch.optim.SGD(module.parameters(), lr=0.1)
        for x, y in batches:
            loss = (module(x) - y).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()


if __name__ == "__main__":
    MiniTrainer().fit(Net(), [(torch.randn(4, 8), torch.randn(4, 1))])
"""
    why = reason(source)
    assert "the model is `Net()`; PM601 wraps models held in a variable or `self.` attribute" in why


def test_the_models_children_are_read_through_unwrap_since_ddp_s_child_is_the_model():
    save = '        torch.save(model.state_dict(), "last.pt")\n'
    source = SCRIPT.replace(save, save + "        print(len(list(model.children())))\n")
    assert "distributed.unwrap(model).children()" in rewritten(source)


@pytest.mark.parametrize("set_up", ["model.share_memory()", "model.cpu()", "model.type(torch.float32)"])
def test_the_model_is_wrapped_after_each_of_nn_modules_set_ups_in_place(set_up):
    built = "    model = torch.nn.Linear(8, 1).to(device)\n"
    source = SCRIPT.replace(built, f"{built}    {set_up}\n")
    assert _model_lines(rewritten(source)) == [
        "model = torch.nn.Linear(8, 1).to(device)",
        set_up,
        "if world.distributed:",
        "model = DistributedDataParallel(model)",
    ]


def test_a_call_of_an_nn_module_method_in_the_loop_is_no_forward_through_another_method():
    step = "            opt.step()\n"
    source = SCRIPT.replace(step, step + "            summary = model.extra_repr()\n")
    assert "DistributedDataParallel(model)" in rewritten(source)


# A two-tower recommender's step (the blind program neg_pinned_gather_batches):
# the 256 rows of a permutation slice joined with 64 hard negatives the same every step.
HARD_NEGATIVES = Path(__file__).resolve().parents[2] / "fixtures" / "wild" / "blind11" / "neg_pinned_gather_batches.py"


def test_rows_joined_to_the_share_of_each_batch_are_the_reason():
    """Splitting only the sampled rows would give every rank all 64 hard negatives: at two
    ranks they would weigh twice what the sampled rows do in the averaged gradient."""
    assert reason(HARD_NEGATIVES.read_text()).startswith(
        "`torch.cat([pairs[idx], hard])` adds `hard`, which is not part of each rank's share of the batch"
    )


@pytest.mark.parametrize(
    "join",
    [
        "x = torch.cat([x, extra])",
        "x = torch.cat((x, torch.zeros(4, 8)), dim=0)",
        "y = torch.cat([y, torch.zeros(4, 1)], 0)",
    ],
)
def test_rows_joined_to_a_loaders_batch_are_the_reason(join):
    source = SCRIPT.replace("    model = ", "    extra = torch.randn(4, 8)\n    model = ").replace(
        "        for x, y in loader:\n", f"        for x, y in loader:\n            {join}\n"
    )
    assert "which is not part of each rank's share of the batch" in reason(source)


def test_features_joined_to_each_row_of_the_batch_are_no_reason():
    source = SCRIPT.replace(
        "        for x, y in loader:\n",
        "        for x, y in loader:\n            x = torch.cat([x[:, :4], torch.ones(len(x), 4)], dim=1)\n",
    )
    assert "DistributedDataParallel(model)" in rewritten(source)


def test_the_losses_a_step_function_returns_are_logged_as_their_mean_over_the_ranks():
    source = SCRIPT.replace(
        "def main():\n",
        "def train_step(model, opt, x, y):\n"
        "    loss = torch.nn.functional.mse_loss(model(x), y)\n"
        "    opt.zero_grad()\n    loss.backward()\n    opt.step()\n    return loss.detach()\n\n\n"
        "def main():\n",
    ).replace(
        "            loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))\n"
        "            opt.zero_grad()\n            loss.backward()\n            opt.step()\n",
        "            loss = train_step(model, opt, x.to(device), y.to(device))\n",
    )
    assert "train_step(model, opt" in source
    assert 'f"epoch {epoch} loss {distributed.all_reduce_mean(loss).item():.4f}"' in rewritten(source)


FROZEN_ENCODER = """\
import torch
import torch.nn as nn

device = "cuda" if torch.cuda.is_available() else "cpu"
encoder = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()).to(device)
encoder.eval()
for p in encoder.parameters():
    p.requires_grad_(False)
with torch.no_grad():
    feats = encoder(torch.randn(64, 3, 16, 16, device=device))
labels = torch.randint(0, 4, (64,), device=device)
probe = nn.Linear(8, 4).to(device)
opt = torch.optim.SGD(probe.parameters(), lr=0.1)
for step in range(10):
    loss = nn.functional.cross_entropy(probe(feats), labels)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_batch_norm_of_a_frozen_encoder_in_eval_mode_is_no_obstacle():
    found, _ = finding(FROZEN_ENCODER)
    assert "BatchNorm" not in found.message, found.message
    for trained in (
        ("encoder.eval()\n", "encoder.train()\n"),
        ("encoder.eval()\n", "encoder.eval()\nnets = [encoder]\n"),
    ):
        assert "`nn.BatchNorm2d` holds BatchNorm" in reason(FROZEN_ENCODER.replace(*trained)), trained


def test_a_draw_per_sample_in_an_augmentation_helper_is_no_batch_draw():
    # blind13's distillation: `torch.randint(0, 9, (2,))` in a loop over the images of a batch
    # draws two crop offsets per image; split "over the ranks" it would unpack one value into two
    source = (
        "import torch\nimport torch.nn.functional as F\n\n"
        "def augment(x):\n    out = torch.empty_like(x)\n    padded = F.pad(x, (4, 4, 4, 4))\n"
        "    for i in range(x.shape[0]):\n        dy, dx = torch.randint(0, 9, (2,)).tolist()\n"
        "        out[i] = padded[i, :, dy:dy + 8, dx:dx + 8]\n    return out\n\n"
        "def main():\n    data, labels = torch.randn(64, 3, 8, 8), torch.randint(0, 4, (64,))\n"
        "    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(192, 4)).cuda()\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    for step in range(10):\n        x = augment(data[:16]).cuda()\n"
        "        loss = F.cross_entropy(model(x), labels[:16].cuda())\n"
        "        opt.zero_grad()\n        loss.backward()\n        opt.step()\n\n"
        "if __name__ == '__main__':\n    main()\n"
    )
    found, result = finding(source)
    assert "local_batch_size(2)" not in (result.new_source or b"").decode()
