"""PM102, run: where the device may be the CPU, the rewritten script pins only
when the batches go to CUDA, so it trains as before on either, and a CPU run
gets no warning that pinning was asked for with no accelerator present."""

import contextlib
import io
import warnings
from pathlib import Path

import pytest
import torch

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level
from codemod.rules.unpinned_loader_batches_to_cuda import UnpinnedLoaderToCuda

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "rules" / "PM102"


def train(source: str) -> tuple[list[torch.Tensor], list[str]]:
    namespace = {"__name__": "fixture"}
    exec(compile(source, "<fixture>", "exec"), namespace)
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("always")
        model = namespace["main"]()
    return [p.detach().clone() for p in model.parameters()], [str(w.message) for w in caught]


def test_cpu_run_of_the_rewritten_script_trains_the_same_without_a_pinning_warning():
    before = (FIXTURES / "mnist_style_kwargs.in.py").read_text()
    after = (FIXTURES / "mnist_style_kwargs.out.py").read_text()
    assert '"pin_memory": device.type == "cuda"' in after
    (old, _), (new, messages) = train(before), train(after)
    assert all(torch.equal(a, b) for a, b in zip(old, new))
    assert not [m for m in messages if "pin_memory" in m]


def test_an_unconditional_pin_on_the_cpu_is_what_warns():
    """The warning the conditional value avoids, as torch 2.13 gives it."""
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(4.0)), pin_memory=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches = [x for (x,) in loader]
    assert any("'pin_memory' argument is set as true but no accelerator is found" in str(w.message) for w in caught)
    assert torch.equal(torch.cat(batches), torch.arange(4.0))


def test_each_guard_of_the_left_alone_fixture_is_what_keeps_its_loader():
    """Without its guard (explicit pin_memory, CUDA dataset, moving collate_fn) each
    loader of left_alone.in.py would be reported: the fixture is not vacuous."""
    source = (FIXTURES / "left_alone.in.py").read_text()
    guards = [
        ", pin_memory=True)",
        "TensorDataset(features.to(device), labels.to(device))",
        "    collate_fn=lambda samples: [t.to(device, non_blocking=True) for t in default_collate(samples)],\n",
    ]
    replacements = [")", "TensorDataset(features, labels)", ""]
    for guard, replacement in zip(guards, replacements):
        assert guard in source
        result = process_source(
            source.replace(guard, replacement).encode(), "<test>", Settings(select=("PM102",)), [UnpinnedLoaderToCuda]
        )
        assert len(result.findings) == 1, guard


def test_many_rebindings_of_a_loader_stay_fast():
    """A name bound many times to itself made the loader look-up exponential in its
    depth limit (found on torch's own sources); memoized, it is linear."""
    import time

    from codemod.config import Settings
    from codemod.engine import process_source
    from codemod.rules.unpinned_loader_batches_to_cuda import UnpinnedLoaderToCuda

    rebinds = "".join(f"if flag{i}:\n    loader = loader\n" for i in range(25))
    source = (
        "import torch\nfrom torch.utils.data import DataLoader\nloader = DataLoader([1])\n"
        + rebinds
        + "for x in loader:\n    x = x.cuda()\n"
    )
    start = time.process_time()
    result = process_source(source.encode(), "t.py", Settings(select=("PM102",)), [UnpinnedLoaderToCuda])
    assert time.process_time() - start < 10
    assert [f.code for f in result.findings] == ["PM102"]


F_STRING_SCRIPT = """\
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
dataset = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
print(f"loss {sum(float(x.to(device).sum()) for x, y in DataLoader(dataset, batch_size=8))}")
"""


def test_a_loader_inside_a_double_quoted_f_string_gets_a_value_python_3_10_reads():
    """`pin_memory=device.type == "cuda"` inside `f"..."` is a SyntaxError before Python
    3.12 (issue 22); the value takes the quote the f-string leaves free, and the
    rewritten script prints what the original did."""
    from tests.rules.scripts import f_string_quotes_reused, losses, rewrite

    after = rewrite(F_STRING_SCRIPT, [UnpinnedLoaderToCuda])
    assert "pin_memory=device.type == 'cuda'" in after
    assert not f_string_quotes_reused(after)
    assert torch.equal(losses(after), losses(F_STRING_SCRIPT))


SHARED_SETTINGS_SCRIPT = """\
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
train_set = TensorDataset(torch.randn(64, 65536), torch.randn(64, 1))
val_set = TensorDataset(torch.randn(16, 65536), torch.randn(16, 1))
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = torch.nn.Linear(65536, 1).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader_kwargs = SETTINGS
train_loader = DataLoader(train_set, shuffle=True, **loader_kwargs)
val_loader = DataLoader(val_set, **loader_kwargs)
for x, y in train_loader:
    x, y = x.to(device), y.to(device)
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"train loss {loss.item()!r}")
with torch.no_grad():
    total = 0.0
    for x, y in val_loader:
        x, y = x.to(device), y.to(device)
        total = total + torch.nn.functional.mse_loss(model(x), y)
    print(f"val loss {total.item()!r}")
"""


@pytest.mark.parametrize("settings", ["dict(batch_size=8, num_workers=0)", '{"batch_size": 8, "num_workers": 0}'])
def test_settings_two_loaders_share_get_pin_memory_once(settings):
    """Both loaders' findings add the same entry to the one settings object: written
    twice, `dict(...)` raised `keyword argument repeated` and a literal held a
    duplicate key (issue 22). Written once, the script trains as before."""
    from tests.rules.scripts import losses, rewrite

    before = SHARED_SETTINGS_SCRIPT.replace("SETTINGS", settings)
    after = rewrite(before, [UnpinnedLoaderToCuda])
    assert after.count("pin_memory") == 1, after
    assert torch.equal(losses(after), losses(before))


def test_a_loader_not_worth_pinning_that_shares_the_settings_of_one_pinned_gets_no_report():
    """The validation pass after training reads every batch back, so pinning its loader buys
    nothing; but the training loader's fix adds pin_memory to the settings both share, so
    a report saying it is not pinned would be false: the rule says nothing of it."""
    read_every_batch = SHARED_SETTINGS_SCRIPT.replace("SETTINGS", '{"batch_size": 8, "num_workers": 0}').replace(
        '        total = total + torch.nn.functional.mse_loss(model(x), y)\n    print(f"val loss {total.item()!r}")\n',
        '        print(f"val loss {torch.nn.functional.mse_loss(model(x), y).item()!r}")\n',
    )
    assert 'print(f"val loss {torch.nn.functional' in read_every_batch
    settings = Settings(select=("PM102",), level=Level.SAFE)
    result = process_source(read_every_batch.encode(), "<fixture>", settings, [UnpinnedLoaderToCuda])
    assert [(f.line, f.applied) for f in result.findings] == [(11, True)]
    assert result.new_source.decode().count("pin_memory") == 1


COMMENTED_ARGUMENTS = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
loader = DataLoader(
    TensorDataset(torch.randn(16, 4)),
    batch_size=8,
    # a two-line comment
    # above the last argument
    shuffle=False,
)
other = DataLoader(  # the eval loader
    TensorDataset(torch.randn(16, 4)),  # the data
    # a comment before the bracket
)
settings = {
    "batch_size": 4,
    # above the last entry
    "shuffle": False,  # at the end of its line
}
third = DataLoader(TensorDataset(torch.randn(16, 4)), **settings)
for loop in (loader, other, third):
    for (x,) in loop:
        x = x.to(device)
"""


def test_pin_memory_goes_on_a_line_of_its_own_and_no_comment_is_copied_or_moved():
    result = process_source(COMMENTED_ARGUMENTS.encode(), "<commented>", Settings(select=("PM102",)))
    assert result.error is None, result.error
    new = result.new_source.decode()
    pin = 'pin_memory=device.type == "cuda"'
    assert (
        "    batch_size=8,\n    # a two-line comment\n    # above the last argument\n    shuffle=False,\n"
        f"    {pin},\n)\n"
    ) in new
    assert (
        "other = DataLoader(  # the eval loader\n    TensorDataset(torch.randn(16, 4)),  # the data\n"
        f"    {pin},\n    # a comment before the bracket\n)\n"
    ) in new
    assert (
        '    # above the last entry\n    "shuffle": False,  # at the end of its line\n'
        '    "pin_memory": device.type == "cuda",\n}\n'
    ) in new
    for comment in (
        "# a two-line comment",
        "# the eval loader",
        "# the data",
        "# above the last entry",
        "# at the end",
    ):
        assert new.count(comment) == 1, comment
    exec(compile(new, "<commented>", "exec"), {"__name__": "commented"})
