"""Where PM302 turns TF32 on, written from the rule's description: once, at
start-up of the entry script (the `if __name__ == "__main__":` block or the top
of the `main()` it calls); never at import time of a module that only defines
training code; never in a function that runs once per epoch."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level
from codemod.rules.float32_matmul_without_tf32 import Float32MatmulWithoutTf32

LINE = 'torch.set_float32_matmul_precision("high")'

EPOCH = """\
import argparse

import torch
import torch.nn as nn


def train_one_epoch(model, opt, batches, device):
    for x in batches:
        loss = model(x.to(device)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    device = torch.device("cuda")
    model = nn.Linear(512, 512).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [torch.randn(1024, 512) for _ in range(10)]
    for epoch in range(args.epochs):
        train_one_epoch(model, opt, batches, device)
"""


def fixed(source: str) -> str:
    source = textwrap.dedent(source)
    settings = Settings(select=("PM302",), level=Level.NUMERIC)
    result = process_source(source.encode(), "train.py", settings, [Float32MatmulWithoutTf32])
    assert result.error is None, result.error
    assert [f.code for f in result.findings] == ["PM302"], [f.message for f in result.findings]
    assert result.findings[0].applied, result.findings[0].message
    new = result.new_source.decode()
    assert new.count(LINE) == 1, new
    again = process_source(new.encode(), "train.py", settings, [Float32MatmulWithoutTf32])
    assert again.findings == [], "a second run must find nothing"
    return new


def function_of(source: str, line_text: str) -> str | None:
    """The `def` whose body holds the line `line_text` (None: module level)."""
    owner = None
    for line in source.splitlines():
        if line.startswith("def "):
            owner = line.split("(")[0][4:]
        elif line and not line[0].isspace():
            owner = None
        if line.strip() == line_text:
            return owner
    raise AssertionError(f"{line_text} not in the source")


def test_it_goes_at_the_top_of_main_not_in_the_function_run_each_epoch():
    new = fixed(EPOCH + '\n\nif __name__ == "__main__":\n    main()\n')
    assert function_of(new, LINE) == "main"
    assert "def main():\n    " + LINE + "\n" in new


def test_without_main_it_goes_in_the_entry_block():
    source = EPOCH.replace("def main():", "def run():") + '\n\nif __name__ == "__main__":\n    run()\n'
    new = fixed(source)
    assert function_of(new, LINE) in ("run", None)
    assert function_of(new, LINE) != "train_one_epoch"
    if function_of(new, LINE) is None:  # then inside the entry block, not at import time
        assert new.index('if __name__ == "__main__":') < new.index(LINE)


def test_a_library_module_is_never_changed_at_import_time():
    """A module that only defines training functions (imported by a launcher):
    nothing at module level; at the top of the function that starts training."""
    new = fixed(EPOCH)
    assert function_of(new, LINE) == "main"
    module_level = [line for line in new.splitlines() if line.strip() == LINE and not line.startswith(" ")]
    assert module_level == []


def test_a_script_that_trains_at_module_level_gets_it_after_its_imports():
    new = fixed(
        """\
        import torch
        import torch.nn as nn

        model = nn.Linear(512, 512).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(10):
            loss = model(torch.randn(1024, 512).cuda()).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        """
    )
    assert new.startswith("import torch\nimport torch.nn as nn\n\n" + LINE + "\n")


def test_a_script_that_already_chooses_a_precision_is_left_alone():
    source = EPOCH.replace("def main():\n", "def main():\n    torch.backends.cuda.matmul.allow_tf32 = False\n")
    settings = Settings(select=("PM302",), level=Level.NUMERIC)
    result = process_source(source.encode(), "train.py", settings, [Float32MatmulWithoutTf32])
    assert result.findings == [] and (result.new_source is None or result.new_source.decode() == source)


def test_a_library_function_that_runs_another_training_phase_gets_it_once():
    """`fit` runs a warm-up phase (its own training loop) and then the main loop: the
    line goes once, at the top of `fit`, not again in the warm-up it calls."""
    new = fixed(
        """\
        import torch
        import torch.nn as nn


        def warm_up(model, opt, batches):
            for x in batches:
                loss = model(x).abs().mean()
                opt.zero_grad()
                loss.backward()
                opt.step()


        def fit(model, batches, device):
            model.cuda()
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            warm_up(model, opt, batches[:2])
            for x in batches:
                loss = model(x.to(device)).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
        """
    )
    assert function_of(new, LINE) == "fit"


def test_a_choice_made_in_a_project_module_the_script_imports_is_left_alone(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    (tmp_path / "setup_env.py").write_text(
        "import torch\n\n\ndef configure():\n    torch.backends.cuda.matmul.allow_tf32 = True\n"
    )
    source = EPOCH.replace("import torch.nn as nn\n", "import torch.nn as nn\nfrom setup_env import configure\n")
    script = tmp_path / "train.py"
    script.write_text(source)
    settings = Settings(select=("PM302",), level=Level.NUMERIC, root=tmp_path)
    result = process_source(source.encode(), str(script), settings, [Float32MatmulWithoutTf32])
    assert result.findings == []
    (tmp_path / "setup_env.py").write_text("def configure():\n    pass\n")  # no choice there: the rule fixes
    result = process_source(source.encode(), str(script), settings, [Float32MatmulWithoutTf32])
    assert [f.applied for f in result.findings] == [True]


def test_a_narrow_model_of_a_project_that_chooses_the_precision_elsewhere_gets_no_finding(tmp_path):
    """The program's own choice outranks the sizes: with TF32 set in a project module, a
    step of narrow products is no finding at all, not a report of why it is not fixed."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    source = EPOCH.replace("import torch.nn as nn\n", "import torch.nn as nn\nfrom setup_env import configure\n")
    source = source.replace("nn.Linear(512, 512)", "nn.Linear(8, 8)").replace(
        "torch.randn(1024, 512)", "torch.randn(4, 8)"
    )
    script = tmp_path / "train.py"
    script.write_text(source)
    settings = Settings(select=("PM302",), level=Level.NUMERIC, root=tmp_path)
    (tmp_path / "setup_env.py").write_text("def configure():\n    pass\n")
    result = process_source(source.encode(), str(script), settings, [Float32MatmulWithoutTf32])
    assert [f.applied for f in result.findings] == [False]  # narrow: reported, not fixed
    (tmp_path / "setup_env.py").write_text(
        "import torch\n\n\ndef configure():\n    torch.backends.cuda.matmul.allow_tf32 = True\n"
    )
    result = process_source(source.encode(), str(script), settings, [Float32MatmulWithoutTf32])
    assert result.findings == []


def test_training_in_spawned_workers_gets_it_where_each_worker_starts():
    new = fixed(
        """\
        import torch
        import torch.multiprocessing as mp
        import torch.nn as nn


        def worker(rank, steps):
            model = nn.Linear(512, 512).cuda(rank)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(steps):
                model(torch.randn(1024, 512, device=rank)).sum().backward()
                opt.step()


        def main():
            mp.spawn(worker, args=(10,), nprocs=2)


        if __name__ == "__main__":
            main()
        """
    )
    assert function_of(new, LINE) == "worker"


STEP = """\
import torch
import torch.nn as nn


def train_step(model, opt, x):
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss


def train_epoch(model, opt, batches, device):
    for x in batches:
        train_step(model, opt, x.to(device))


def main():
    device = torch.device("cuda")
    model = nn.Linear(512, 512).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [torch.randn(1024, 512) for _ in range(10)]
    for epoch in range(3):
        train_epoch(model, opt, batches, device)
"""


def test_never_in_the_step_function_the_loop_calls_each_iteration():
    """`train_step` runs once per step and `train_epoch` once per epoch: the line goes
    at the top of `main`, which calls them, and runs once per process."""
    for source in (STEP + '\n\nif __name__ == "__main__":\n    main()\n', STEP):
        new = fixed(source)
        assert function_of(new, LINE) == "main", new


def test_a_step_function_called_from_the_loop_of_main():
    start, end = STEP.index("def train_epoch"), STEP.index("def main")
    source = (STEP[:start] + STEP[end:]).replace(
        "        train_epoch(model, opt, batches, device)\n",
        "        for x in batches:\n            train_step(model, opt, x.to(device))\n",
    )
    for tail in ('\n\nif __name__ == "__main__":\n    main()\n', ""):
        new = fixed(source + tail)
        assert function_of(new, LINE) == "main", new


def test_a_step_function_called_from_a_loop_at_module_level():
    source = """\
    import torch
    import torch.nn as nn


    def train_step(model, opt, x):
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


    model = nn.Linear(512, 512).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(3):
        for _ in range(10):
            train_step(model, opt, torch.randn(1024, 512).cuda())
    """
    new = fixed(source)
    assert function_of(new, LINE) is None
    assert new.index(LINE) > new.index("import torch.nn as nn") and new.index(LINE) < new.index("def train_step")


def test_a_step_with_micro_batches_in_a_function_the_loop_calls():
    """Gradient accumulation inside `train_step`: its micro-batch loop runs backward, the
    step loop is the caller's; the line still goes at the top of `main`."""
    new = fixed(
        """\
        import torch
        import torch.nn as nn


        def train_step(model, opt, micro_batches):
            opt.zero_grad()
            for x in micro_batches:
                loss = model(x.cuda()).pow(2).mean() / len(micro_batches)
                loss.backward()
            opt.step()


        def main():
            model = nn.Linear(512, 512).cuda()
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for step in range(10):
                train_step(model, opt, [torch.randn(1024, 512)] * 2)


        if __name__ == "__main__":
            main()
        """
    )
    assert function_of(new, LINE) == "main"


def test_an_epoch_function_called_from_a_loop_in_the_main_block():
    source = STEP.split("def main():")[0] + (
        'if __name__ == "__main__":\n'
        "    model = nn.Linear(512, 512).cuda()\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    for epoch in range(3):\n"
        '        train_epoch(model, opt, [torch.randn(1024, 512)], "cuda")\n'
    )
    new = fixed(source)
    assert new.index('if __name__ == "__main__":\n    ' + LINE) > 0


def test_folds_of_epochs_of_steps():
    """main runs a fold per loop iteration, a fold an epoch per iteration, an epoch a step
    per iteration: the line goes once, in main."""
    source = STEP.replace("def main():", "def run_fold(fold):").replace(
        "    for epoch in range(3):\n        train_epoch(model, opt, batches, device)\n",
        "    for epoch in range(3):\n        train_epoch(model, opt, batches, device)\n\n\n"
        "def main():\n    for fold in range(5):\n        run_fold(fold)\n",
    )
    new = fixed(source + '\n\nif __name__ == "__main__":\n    main()\n')
    assert function_of(new, LINE) == "main", new


TRAINER = """\
import torch
import torch.nn as nn


class Trainer:
    def __init__(self, device):
        self.model = nn.Linear(512, 512).to(device)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)

    def fit(self, X, epochs=3):
        for epoch in range(epochs):
            for x in X.split(4):
                loss = self.model(x).pow(2).mean()
                self.opt.zero_grad()
                loss.backward()
                self.opt.step()


if __name__ == "__main__":
    torch.manual_seed(0)
    trainer = Trainer("cuda")
    trainer.fit(torch.randn(64, 512))
"""


def test_a_trainer_method_the_entry_block_calls_gets_it_in_the_entry_block():
    """`trainer.fit(...)` is a method of a class, which may run many times and reads as
    library code: the process-wide setting goes in the entry point that calls it."""
    new = fixed(TRAINER)
    assert 'if __name__ == "__main__":\n    ' + LINE + "\n    torch.manual_seed(0)\n" in new, new
    assert function_of(new, LINE) is None


LIGHTNING = """\
import argparse

import lightning as L
import torch
import torch.nn as nn


class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(512, 512)

    def training_step(self, batch, batch_idx):
        return self.layer(batch).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--accelerator", default="gpu")
    args = ap.parse_args()
    trainer = L.Trainer(accelerator=args.accelerator, max_epochs=2)
    trainer.fit(Net(), [torch.randn(1024, 512)])


if __name__ == "__main__":
    main()
"""


def test_a_lightning_trainer_whose_accelerator_option_defaults_to_the_gpu():
    new = fixed(LIGHTNING)
    assert "def main():\n    " + LINE + "\n" in new, new


def test_a_lightning_trainer_on_the_cpu_or_auto_is_left_alone():
    settings = Settings(select=("PM302",), level=Level.NUMERIC)
    for accelerator in ('"cpu"', '"auto"'):
        source = LIGHTNING.replace('default="gpu"', f"default={accelerator}")
        result = process_source(source.encode(), "train.py", settings, [Float32MatmulWithoutTf32])
        assert result.error is None and result.findings == [], [f.message for f in result.findings]


def test_a_main_that_imports_torch_itself_gets_it_after_that_import(tmp_path):
    """Lazy imports (a fast `--help`): `import torch` inside main() makes `torch` local to
    main, so the line goes after that block of imports, and no module-level import is
    added. The rewritten script runs."""
    source = textwrap.dedent(
        """\
        def main():
            import torch
            import torch.nn as nn

            device = "cuda" if torch.cuda.is_available() else "cpu"
            model = nn.Linear(256, 256).to(device)
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            for _ in range(2):
                loss = model(torch.randn(1024, 256, device=device)).square().mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
            print(torch.get_float32_matmul_precision())


        if __name__ == "__main__":
            main()
        """
    )
    new = fixed(source)
    assert new.startswith("def main():\n    import torch\n    import torch.nn as nn\n    " + LINE + "\n"), new
    script = tmp_path / "train.py"
    script.write_text(new)
    ran = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "high"
