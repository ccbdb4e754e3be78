"""What PM506 compiles: what runs the forward on every step, written from the rule's
description (a model called in the loop; not a parameter table read for its weights, nor
a module whose forward never runs), and where it says to compile what it cannot."""

import textwrap

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level
from codemod.rules.uncompiled_model import UncompiledModel


def findings(source: str):
    settings = Settings(select=("PM506",), level=Level.NUMERIC)
    result = process_source(textwrap.dedent(source).encode(), "t.py", settings, [UncompiledModel])
    assert result.error is None, result.error
    return [(f.line, f.fixable, f.message) for f in result.findings], result.new_source.decode()


def test_a_parameter_table_and_a_module_read_for_its_weights_are_not_compiled():
    found, new = findings("""\
        import torch
        import torch.nn as nn

        class Biases(nn.Module):
            def __init__(self, n):
                super().__init__()
                self.item = nn.Parameter(torch.zeros(n))

            def forward(self, i):
                return self.item[i]

        factors = nn.ParameterDict({"user": nn.Parameter(torch.randn(5, 3))})
        biases = Biases(5)
        opt = torch.optim.SGD(list(factors.parameters()) + list(biases.parameters()), lr=0.1)
        for step in range(3):
            i = torch.randint(0, 5, (4,))
            loss = (factors["user"][i].sum(-1) + biases.item[i]).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        """)
    assert found == [] and ".compile()" not in new


def test_the_model_a_helper_calls_is_compiled_after_it_is_built_and_moved():
    found, new = findings("""\
        import torch

        def loss_of(net, x):
            return net(x).pow(2).mean()

        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        model.to("cpu")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(2):
            model.train()
            for x in [torch.randn(2, 4)]:
                loss = loss_of(model, x)
                opt.zero_grad()
                loss.backward()
                opt.step()
        """)
    assert [(line, fixable) for line, fixable, _ in found] == [(7, True)]
    assert 'model.to("cpu")\nmodel.compile()\nopt = ' in new  # not in the epoch loop, where it would run again


TRAINED_BY_A_HELPER = """\
    import torch

    def train(model, opt):
        for x in [torch.randn(2, 4)]:
            loss = model(x).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()

    def main():
        net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).to("cpu")
        for epoch in range(2):
            train(net, torch.optim.SGD(net.parameters(), lr=0.1))
    """


def test_a_model_given_to_the_function_that_trains_it_is_compiled_where_its_one_caller_builds_it():
    found, new = findings(TRAINED_BY_A_HELPER)
    assert [(line, fixable) for line, fixable, _ in found] == [(11, True)], found
    assert "`train` trains it, given it at line 13" in found[0][2]
    assert (
        'net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).to("cpu")\n    net.compile()\n    for epoch'
        in new
    )  # not in the epoch loop


def test_a_model_given_by_two_callers_is_reported_where_the_first_builds_it():
    source = TRAINED_BY_A_HELPER + "\n\n    def other(model):\n        train(model, None)\n"
    found, new = findings(source)
    assert [(line, fixable) for line, fixable, _ in found] == [(11, False)] and ".compile()" not in new
    assert "(which is given it)" in found[0][2]


def test_a_model_the_caller_may_bind_again_before_the_call_is_not_compiled_there():
    source = TRAINED_BY_A_HELPER.replace(
        "        for epoch in range(2):\n",
        "        if torch.cuda.is_available():\n            net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).cuda()\n"
        "        for epoch in range(2):\n",
    )
    found, new = findings(source)
    assert [(line, fixable) for line, fixable, _ in found] == [(11, False)] and ".compile()" not in new


def test_a_model_the_caller_binds_again_in_its_epoch_loop_is_not_compiled_where_it_is_first_built():
    source = TRAINED_BY_A_HELPER.replace(
        "lr=0.1))\n",
        "lr=0.1))\n            net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.Tanh(), torch.nn.Linear(8, 1))  # the next epoch trains another module\n",
    )
    found, new = findings(source)
    assert [(line, fixable) for line, fixable, _ in found] == [(11, False)] and ".compile()" not in new


def test_a_global_model_trained_in_a_function_is_reported_where_it_is_moved():
    found, _ = findings("""\
        import torch

        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        if torch.cuda.is_available():
            model.cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def train():
            for x in [torch.randn(2, 4)]:
                loss = model(x).sum()
                opt.zero_grad()
                loss.backward()
                opt.step()
        """)
    assert [(line, fixable) for line, fixable, _ in found] == [(5, False)]


def test_with_hooks_the_loss_function_and_a_table_of_small_networks_are_reported():
    found, new = findings("""\
        import torch
        import torch.nn as nn
        import torch.nn.functional as F

        def kl(pred, ref):
            return F.kl_div(F.log_softmax(pred, -1), F.log_softmax(ref, -1), log_target=True, reduction="batchmean")

        target = nn.Linear(4, 4)
        handle = target.register_forward_hook(lambda m, i, o: o * 2)
        gates = nn.ModuleDict({"a": nn.Linear(4, 4), "b": nn.Linear(4, 4)})
        opt = torch.optim.SGD(gates.parameters(), lr=0.1)
        for step in range(3):
            x = torch.randn(2, 4)
            out = target(x) + gates["a"](x) + gates["b"](x)
            loss = kl(out, x)
            opt.zero_grad()
            loss.backward()
            opt.step()
        """)
    lines = sorted((line, fixable) for line, fixable, _ in found)
    assert (5, False) in lines and (10, False) in lines, found  # kl, the ModuleDict
    assert all(not fixable for _, fixable in lines) and ".compile()" not in new


HELPER_PROGRAM = """\
import torch
import torch.nn as nn
import torch.nn.functional as F


def train_one_epoch(model, opt, log):
    for step in range(3):
        x = torch.randn(8, 16)
        loss = F.mse_loss(model(x), x)
        opt.zero_grad()
        loss.backward()
        opt.step()
        log.append(loss.item())


def main(log):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.ReLU(), nn.Linear(32, 16)).to("cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        train_one_epoch(model, opt, log)
"""


def test_the_compile_in_the_caller_compiles_the_module_the_helper_trains():
    """Blind test 7, #8: the rewritten program compiles once, before training, the very module
    `train_one_epoch` trains (the compile itself is recorded, not run: what it does to a
    module is test_pm506_execution's), and trains as before."""
    import torch

    found, new = findings(HELPER_PROGRAM)
    assert [(line, fixable) for line, fixable, _ in found] == [(18, True)]
    compile_in_place, compiled = torch.nn.Module.compile, []
    logs = []
    try:
        torch.nn.Module.compile = lambda self, *a, **kw: compiled.append(
            (self, [p.detach().clone() for p in self.parameters()])
        )
        for source in (HELPER_PROGRAM, new):
            namespace, log = {}, []
            exec(compile(source, "<program>", "exec"), namespace)
            namespace["main"](log)
            logs.append(log)
    finally:
        torch.nn.Module.compile = compile_in_place
    eager, rewritten = logs
    assert len(eager) == 6 and rewritten == eager
    ((module, at_compile),) = compiled  # once, not once per epoch
    assert all(not torch.equal(p, q) for p, q in zip(module.parameters(), at_compile))  # it is the one trained


def test_the_draws_of_a_model_class_of_another_module_are_read_where_it_is_defined(tmp_path):
    """A dropout of the class (`nn.Dropout(0.1)` in nets.py) would draw other numbers
    compiled: the fix is unsafe; without it the fix is numeric."""
    from pathlib import Path

    (tmp_path / "nets.py").write_text(
        "import torch.nn as nn\n\n\nclass Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.body = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.1))\n\n"
        "    def forward(self, x):\n        return self.body(x)\n"
    )
    train = Path(tmp_path / "train.py")
    train.write_text(
        textwrap.dedent(TRAINED_BY_A_HELPER)
        .replace("import torch\n", "import torch\n\nfrom nets import Net\n")
        .replace(
            'torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).to("cpu")',
            'Net().to("cpu")',
        )
    )
    settings = Settings(select=("PM506",), level=Level.UNSAFE)
    result = process_source(train.read_bytes(), str(train), settings, [UncompiledModel])
    (finding,) = result.findings
    assert finding.applied and finding.level is Level.UNSAFE, finding
    assert "its random ops (`Dropout`)" in finding.message  # read in nets.py
    (tmp_path / "nets.py").write_text((tmp_path / "nets.py").read_text().replace("nn.Dropout(0.1)", "nn.ReLU()"))
    result = process_source(train.read_bytes(), str(train), settings, [UncompiledModel])
    (finding,) = result.findings
    assert finding.applied and finding.level is Level.NUMERIC and "random" not in finding.message, finding


LONE = """\
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = MODEL.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        for x in [torch.randn(8, 16)]:
            loss = model(x.to(device)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    """


def test_a_model_that_is_one_layer_of_one_operator_is_reported_not_compiled():
    for layer, model in (("Linear", "torch.nn.Linear(16, 4)"), ("Conv1d", "torch.nn.Conv1d(8, 4, 3)")):
        found, new = findings(LONE.replace("MODEL", model))
        assert [(line, fixable) for line, fixable, _ in found] == [(4, False)] and ".compile()" not in new
        assert f"it is a single `nn.{layer}`, one operator of torch" in found[0][2]


def test_a_layer_with_more_than_one_operator_or_a_sequential_of_layers_is_compiled():
    for model in (
        "torch.nn.Sequential(torch.nn.Linear(16, 4), torch.nn.LayerNorm(4), torch.nn.GELU())",
        "torch.nn.BatchNorm1d(16)",
    ):
        found, new = findings(LONE.replace("MODEL", model))
        assert [(line, fixable) for line, fixable, _ in found] == [(4, True)]
        assert "model = " + model + ".to(device)\nmodel.compile()\n" in new


NET = """\
    import torch.nn as nn
    import torch.nn.functional as F


    class Net(nn.Module):
        def __init__(self, d_in, hidden, d_out):
            super().__init__()
            self.fc1 = nn.Linear(d_in, hidden)
            self.relu = nn.ReLU()
            self.fc2 = nn.Linear(hidden, d_out)

        def forward(self, x):
            out = self.fc1(x)
            out = self.relu(out)
            out = self.fc2(out)
            return out


"""
CHAIN_CLASS = LONE.replace("MODEL", "Net(16, 32, 4)").replace("    device = ", NET + "    device = ", 1)


def test_a_chain_of_layers_with_a_product_between_any_two_other_operations_is_reported_not_compiled():
    models = (
        (
            "torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.LeakyReLU(0.2), torch.nn.Linear(8, 1), torch.nn.Sigmoid())",
            "`nn.Linear`, `nn.LeakyReLU` and `nn.Sigmoid`",
        ),
        (
            "torch.nn.Sequential(torch.nn.Conv1d(16, 8, 1), torch.nn.ReLU(), torch.nn.Conv1d(8, 1, 1))",
            "`nn.Conv1d` and `nn.ReLU`",
        ),
    )
    for model, layers in models:
        found, new = findings(
            LONE.replace("MODEL", model).replace(
                "torch.randn(8, 16)", "torch.randn(8, 16, 1)" if "Conv" in model else "torch.randn(8, 16)"
            )
        )
        assert [(line, fixable) for line, fixable, _ in found] == [(4, False)], model
        assert f"its forward runs {layers} layers with a matrix product or convolution" in found[0][2]
        assert ".compile()" not in new
    found, new = findings(CHAIN_CLASS)
    assert [(line, fixable) for line, fixable, _ in found] == [(22, False)] and ".compile()" not in new
    assert "`nn.Linear` and `nn.ReLU` layers" in found[0][2]
    functional = CHAIN_CLASS.replace(
        "            out = self.relu(out)\n            out = self.fc2(out)\n            return out\n",
        "            return self.fc2(F.relu(out).view(out.size(0), -1))\n",
    )
    found, new = findings(functional)
    assert [(line, fixable) for line, fixable, _ in found] == [(20, False)] and ".compile()" not in new


def test_a_chain_with_two_operations_side_by_side_is_compiled():
    """What torch.compile fuses: two operations that meet with no product between them."""
    for forward in (
        "            out = self.relu(out)\n            out = torch.sigmoid(out)\n",  # two activations
        "            out = self.relu(out) + x.mean()\n",  # an activation and an add
        "            out = self.relu(out)[:, :16]\n",  # code this reading does not follow
    ):
        source = CHAIN_CLASS.replace("            out = self.relu(out)\n", forward)
        found, new = findings(source)
        assert [fixable for _, fixable, _ in found] == [True], forward
        assert "model.compile()" in new
    norm = (
        "torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 1))"
    )
    found, new = findings(LONE.replace("MODEL", norm))
    assert [(line, fixable) for line, fixable, _ in found] == [(4, True)] and "model.compile()" in new


LIGHTNING_LIKE = """\
    import torch
    import torch.nn as nn
    import torch.nn.functional as F


    class Lit(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 1))

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch):
            x, y = batch
            return F.mse_loss(self(x), y)


    class Trainer:
        def __init__(self, device):
            self.device = device

        def fit(self, module, batches):
            module.to(self.device)
            opt = torch.optim.SGD(module.parameters(), lr=0.1)
            for batch in batches:
                loss = module.training_step(batch)
                opt.zero_grad()
                loss.backward()
                opt.step()


    Trainer("cpu").fit(Lit(), [(torch.randn(4, 8), torch.randn(4, 1))])
    """


def test_a_step_method_of_the_model_that_runs_its_forward_compiles_the_model():
    found, new = findings(LIGHTNING_LIKE)
    assert [(line, fixable) for line, fixable, _ in found] == [(24, True)]
    assert "        module.to(self.device)\n        module.compile()\n" in new
    bypassed = LIGHTNING_LIKE.replace("F.mse_loss(self(x), y)", "F.mse_loss(self.net(x), y)")
    found, new = findings(bypassed)
    assert not any(fixable for _, fixable, _ in found) and "compile()" not in new  # its forward never runs
