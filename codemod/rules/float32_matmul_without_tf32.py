from __future__ import annotations

import libcst as cst

from codemod.analysis import match as m
from codemod.analysis.lightning import lightning_trainers
from codemod.analysis.names import is_main_guard, names_read
from codemod.analysis.sizes import launch_bound, sizes_of, widest_memory_bound
from codemod.edits import Edit, InsertAfter, InsertBefore
from codemod.rule import Invalid, Level, Rule, Valid

ENABLE_TF32 = 'torch.set_float32_matmul_precision("high")'

IMPORTS = "import torch\nimport torch.nn as nn\n"
MODEL = "model = nn.Linear(512, 512).to(device)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
LOOP = (
    "for x, y in data:\n"
    "    loss = nn.functional.mse_loss(model(x.to(device)), y.to(device))\n"
    "    loss.backward()\n"
    "    opt.step()\n"
    "    opt.zero_grad()\n"
)
FORWARD = "    loss = nn.functional.mse_loss(model(x.to(device)), y.to(device))\n"
SCRIPT_BODY = 'device = torch.device("cuda")\ndata = [(torch.randn(4, 512), torch.randn(4, 512))]\n' + MODEL + LOOP
EMBEDDING_BAG = (
    "class Bag(nn.Module):\n"
    "    def __init__(self, vocab, dim):\n"
    "        super().__init__()\n"
    "        self.emb = nn.Embedding(vocab, dim)\n\n"
    "    def forward(self, ids):\n"
    "        return self.emb(ids).sum(dim=1)\n\n\n"
)
EMBEDDING_SCRIPT = SCRIPT_BODY.replace("nn.Linear(512, 512)", "Bag(100, 1)").replace(
    "torch.randn(4, 512)", "torch.randint(0, 100, (4, 8))"
)


LIGHTNING = """\
import lightning as L
import torch
from torch import nn


class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(512, 512)

    def training_step(self, batch, batch_idx):
        return self.layer(batch).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main():
    trainer = L.Trainer(accelerator="gpu", max_epochs=2)
    trainer.fit(Net(), [torch.randn(4, 512)])


if __name__ == "__main__":
    main()
"""


NO_FLOAT32_MATMUL = (
    "the models the training step runs make no float32 matrix product that TF32 is off for "
    "(cuDNN's convolutions and recurrent layers use TF32 already)"
)


def _imports_only(statement: cst.BaseStatement) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and all(
        isinstance(small, (cst.Import, cst.ImportFrom)) for small in statement.body
    )


def _indented(code: str) -> str:
    return "".join(f"    {line}" if line.strip() else line for line in code.splitlines(keepends=True))


class Float32MatmulWithoutTf32(Rule):
    """
    ## What it does
    Finds training scripts that use CUDA and never choose a float32 matmul
    precision, and enables TF32 once at start-up with
    `torch.set_float32_matmul_precision("high")`, in the entry point: at the
    top of the function that the `if __name__ == "__main__":` block calls to
    train (or of that block itself); right after the imports of a script
    that trains at module level; in a module that only defines training
    functions, at the top of the function that starts training (never at
    import time, and never in a function called once per epoch: there, at
    the top of its caller). Training that runs in worker processes
    (`torch.multiprocessing.spawn(worker, ...)`, `Process(target=worker)`)
    gets it at the top of the worker function: a spawned process does not
    inherit the setting from the process that started it. A Lightning
    `Trainer(accelerator="gpu")` (or an option whose default is `"gpu"`)
    without `precision=`, whose LightningModule multiplies matrices, trains
    in float32 on CUDA too: the line goes where that Trainer is built and
    run, by the same placement.

    ## Why is this bad?
    By default float32 matrix multiplications on CUDA use full IEEE float32,
    which on Ampere and newer GPUs runs on the general CUDA cores at a fraction
    of the speed of the tensor cores (A100: 19.5 TFLOPS in float32 against 156
    in TF32). TF32 keeps float32's range and rounds the inputs of each product
    to a 10-bit mantissa, which deep learning training tolerates. Typical gain:
    1.5-3x on matmul-bound float32 training on Ampere or newer; nothing on
    older GPUs, where the setting has no effect.

    Why this spelling (checked against torch 2.13):
    - `torch.set_float32_matmul_precision("high")` sets both the new
      per-backend flag (`torch.backends.cuda.matmul.fp32_precision == "tf32"`)
      and the legacy one (`torch.backends.cuda.matmul.allow_tf32 == True`), so
      code and libraries that read either agree. torch's own compiler warning
      recommends this call.
    - Setting the new API directly
      (`torch.backends.cuda.matmul.fp32_precision = "tf32"`) makes any later
      `torch.get_float32_matmul_precision()` raise a RuntimeError about mixing
      the legacy and new APIs, and torch's inductor autotuning still calls
      that getter; so the rule does not write it.
    - `torch.backends.cuda.matmul.allow_tf32 = True` still works without a
      warning, but torch's CUDA notes say the `allow_tf32` flags will be
      deprecated in favour of the `fp32_precision` ones.
    - cuDNN convolutions and recurrent layers (`nn.LSTM`, `nn.GRU`,
      `nn.RNN`) already use TF32 by default (`torch.backends.cudnn.allow_tf32`
      is True; `torch.backends.cudnn.rnn.fp32_precision` is `"tf32"`), and the
      float32 matmul precision does not change them, so nothing is needed
      there.

    ## Example
    ```python
    import torch

    model = Net().cuda()
    for x, y in loader:
        ...
    ```
    Use instead:
    ```python
    import torch

    torch.set_float32_matmul_precision("high")
    model = Net().cuda()
    for x, y in loader:
        ...
    ```

    A script whose every float32 matrix product perfmod can size and finds
    too narrow for TF32 to matter is reported without a fix. A product of
    a (m x k) by a (k x n) matrix does 2mkn flops and moves 4(mk + kn + mn)
    bytes: k*n / (2(k + n)) flops per byte when m is large. An A100 does
    19.5 TFLOPS in plain float32 over 1.55 TB/s of memory, 12.5 flops per
    byte; a product below that waits for memory even without TF32, so the
    faster arithmetic of TF32 buys nothing. A step whose models are all
    `torch.nn` layers with known widths (`nn.Linear(20, 1)`, 10 classes on
    a 24-wide layer) is such a step; so is one whose models make no matrix
    product but those of convolutions and recurrent layers, whatever their
    widths (cuDNN already runs those in TF32), and the recurrent layers'
    products are left out of the widths weighed below. So is a
    step whose products are all too short to keep the GPU busy: where the
    batch the models are called on is known (a DataLoader's `batch_size`
    and its dataset's items, a tensor made in the step), each product runs
    over its rows (samples, times positions for a batch of token ids), and
    one whose device time in plain float32 is under the 5 us the host takes
    to launch a kernel leaves the GPU waiting for the host whatever its
    precision: a 512-wide MLP at batch 32 runs its widest product in about
    0.4 us. Any product of unknown width (a `@`, `torch.matmul`, a model
    perfmod cannot size) keeps the fix, and so does a batch perfmod cannot
    size, or one large enough to keep the GPU busy.

    ## Fix safety
    Numeric: matmuls round their inputs to TF32, so losses differ from
    float32 by about 1e-3 relative per product and drift apart slowly over
    training; `perfmod verify` compares them. On CPU the setting also asks
    oneDNN for reduced-precision float32 matmuls, which only CPUs with such
    units honour (on an AVX-512 CPU without them results were bit for bit
    the same).

    Not reported when:
    - the file has no training loop (an inference script may need exact
      float32);
    - every training loop trains a float64 model, or a float16 or bfloat16
      one (`.half()`, `.bfloat16()`, `dtype=torch.bfloat16`), or runs its
      forward under a CUDA autocast to a 16-bit dtype that no option turns
      off: TF32 touches float32 matmuls only;
    - the training step multiplies no matrices: a model of embedding
      lookups, elementwise operations and reductions, with no `nn.Linear`,
      convolution, attention or recurrent layer and no `matmul`, `@`,
      `einsum` or `F.linear`, in the step, in the model's classes or in the
      layers they build. A model whose code perfmod cannot read (one from
      another library, one loaded from a file) counts as multiplying
      matrices;
    - the file shows no sign of CUDA (a `"cuda"` device string, `.cuda()`, a
      `torch.cuda` call other than `is_available()`);
    - it already sets `allow_tf32`, `fp32_precision` or
      `set_float32_matmul_precision` anywhere, to any value, or a module of
      the project that it imports does.
    """

    CODE = "PM302"
    NAME = "float32-matmul-without-tf32"
    LEVEL = Level.NUMERIC
    REQUIRES = ("backward", "Trainer")
    MESSAGE = "float32 matmuls on CUDA run without TF32 tensor cores; enable TF32 once at start-up"
    GAIN = "1.5-3x on matmul-bound float32 training on Ampere or newer GPUs"

    VALID = [
        Valid(
            IMPORTS + SCRIPT_BODY.replace(".to(device)", ""),
            "a device named but never used: the model and its matrix products stay on the CPU",
        ),
        Valid(
            LIGHTNING.replace('accelerator="gpu", ', ""),
            'a Lightning Trainer left at accelerator "auto": not known to train on a GPU',
        ),
        Valid(
            LIGHTNING.replace("max_epochs=2", 'max_epochs=2, precision="bf16-mixed"'),
            "a Lightning Trainer that runs the step in bfloat16",
        ),
        Valid(
            IMPORTS + 'device = torch.device("cuda")\nmodel = nn.Linear(512, 512).to(device)\n'
            "print(model(torch.randn(2, 512, device=device)))\n",
            "no training loop",
        ),
        Valid(IMPORTS + SCRIPT_BODY.replace('"cuda"', '"cpu"'), "no CUDA in sight"),
        Valid(IMPORTS + SCRIPT_BODY.replace(".to(device)\nopt", ".double().to(device)\nopt"), "a float64 model"),
        Valid(IMPORTS + "torch.backends.cuda.matmul.allow_tf32 = True\n" + SCRIPT_BODY, "already on, legacy flag"),
        Valid(
            IMPORTS + "torch.backends.cudnn.allow_tf32 = False\n" + SCRIPT_BODY, "an explicit choice, even for cuDNN"
        ),
        Valid(IMPORTS + 'torch.set_float32_matmul_precision("highest")\n' + SCRIPT_BODY, "exact float32 asked for"),
        Valid(IMPORTS + 'torch.backends.cuda.matmul.fp32_precision = "ieee"\n' + SCRIPT_BODY, "new API"),
        Valid(
            IMPORTS
            + "from torch import set_float32_matmul_precision as precision\nprecision('medium')\n"
            + SCRIPT_BODY,
            "imported under another name",
        ),
        Valid(
            IMPORTS + "\n\n" + EMBEDDING_BAG + EMBEDDING_SCRIPT,
            "the model looks up embeddings and sums them: no matrix product for TF32 to speed up",
        ),
        Valid(
            IMPORTS + SCRIPT_BODY.replace("nn.Linear(512, 512)", "nn.Sequential(nn.Embedding(100, 8), nn.Tanh())"),
            "torch's layers without a matrix product",
        ),
        Valid(
            IMPORTS + SCRIPT_BODY.replace("nn.Linear(512, 512)", "nn.Linear(512, 512, dtype=torch.bfloat16)"),
            "a bfloat16 model: its matmuls are not float32",
        ),
        Valid(
            IMPORTS
            + SCRIPT_BODY.replace(
                FORWARD,
                '    with torch.autocast("cuda", dtype=torch.bfloat16):\n    ' + FORWARD.replace("\n", "\n    "),
            ),
            "the forward runs under bfloat16 autocast",
        ),
    ]
    INVALID = [
        Invalid(
            IMPORTS
            + "import sys\n\nclass Net(nn.Module):\n    def __init__(self, width):\n        super().__init__()\n"
            + "        self.body = nn.Sequential(nn.Conv2d(3, width, 3), nn.ReLU(), nn.Conv2d(width, 512, 1))\n\n"
            + "    def forward(self, x):\n        return self.body(x).mean((2, 3))\n\n\n"
            + SCRIPT_BODY.replace("nn.Linear(512, 512)", "Net(int(sys.argv[1]))").replace(
                "randn(4, 512), ", "randn(4, 3, 8, 8), "
            ),
            None,
            "convolutions of widths perfmod cannot tell: cuDNN runs them in TF32 already",
        ),
        Invalid(
            LIGHTNING,
            LIGHTNING.replace("def main():\n", "def main():\n    " + ENABLE_TF32 + "\n"),
            "a Lightning Trainer on the GPU: at the top of the function that builds and runs it",
        ),
        Invalid(
            IMPORTS + "\n" + SCRIPT_BODY,
            IMPORTS + "\n" + ENABLE_TF32 + "\n" + SCRIPT_BODY,
            "a script: right after the imports, before its first statement",
        ),
        Invalid(
            IMPORTS
            + "\n\ndef main():\n"
            + '    """Train."""\n'
            + _indented(SCRIPT_BODY)
            + '\n\nif __name__ == "__main__":\n    main()\n',
            IMPORTS
            + "\n\ndef main():\n"
            + '    """Train."""\n    '
            + ENABLE_TF32
            + "\n"
            + _indented(SCRIPT_BODY)
            + '\n\nif __name__ == "__main__":\n    main()\n',
            "the loop is in main(): at its top, after the docstring",
        ),
        Invalid(
            "from torch import nn, optim\n\nclass Trainer:\n    def fit(self, model, data):\n"
            "        # move to the GPU\n        model = model.cuda()\n        opt = optim.SGD(model.parameters(), lr=0.1)\n"
            "        for x, y in data:\n            model(x).sum().backward()\n            opt.step()\n",
            "import torch\nfrom torch import nn, optim\n\nclass Trainer:\n    def fit(self, model, data):\n"
            "        " + ENABLE_TF32 + "\n"
            "        # move to the GPU\n        model = model.cuda()\n        opt = optim.SGD(model.parameters(), lr=0.1)\n"
            "        for x, y in data:\n            model(x).sum().backward()\n            opt.step()\n",
            "a method; torch is imported for the call",
        ),
        Invalid(
            IMPORTS
            + "\ndef pretrain(model, opt, data):\n"
            + _indented(LOOP)
            + "\ndef finetune(model, opt, data):\n"
            + _indented(LOOP)
            + 'device = "cuda"\n',
            IMPORTS
            + "\ndef pretrain(model, opt, data):\n    "
            + ENABLE_TF32
            + "\n"
            + _indented(LOOP)
            + "\ndef finetune(model, opt, data):\n    "
            + ENABLE_TF32
            + "\n"
            + _indented(LOOP)
            + 'device = "cuda"\n',
            "a library module with two training functions: at the top of each, never at import time",
        ),
        Invalid(
            IMPORTS
            + "\ndef train_epoch(model, opt, data):\n"
            + _indented(LOOP)
            + "\ndef main():\n    model = nn.Linear(512, 512).cuda()\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "    for epoch in range(3):\n        train_epoch(model, opt, [])\n"
            + '\n\nif __name__ == "__main__":\n    main()\n',
            IMPORTS
            + "\ndef train_epoch(model, opt, data):\n"
            + _indented(LOOP)
            + "\ndef main():\n    "
            + ENABLE_TF32
            + "\n    model = nn.Linear(512, 512).cuda()\n"
            "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "    for epoch in range(3):\n        train_epoch(model, opt, [])\n"
            + '\n\nif __name__ == "__main__":\n    main()\n',
            "the entry point main(), not the function it calls once per epoch",
        ),
        Invalid(
            IMPORTS
            + "\ndef train(model, opt, data):\n"
            + _indented(LOOP)
            + '\n\nif __name__ == "__main__":\n    net = nn.Linear(512, 512).cuda()\n'
            "    train(net, torch.optim.SGD(net.parameters(), lr=0.1), [])\n",
            IMPORTS
            + "\ndef train(model, opt, data):\n    "
            + ENABLE_TF32
            + "\n"
            + _indented(LOOP)
            + '\n\nif __name__ == "__main__":\n    net = nn.Linear(512, 512).cuda()\n'
            "    train(net, torch.optim.SGD(net.parameters(), lr=0.1), [])\n",
            "the function the main block calls to train",
        ),
        Invalid(
            IMPORTS
            + "\nclass Trainer:\n    def fit(self, model, opt, data):\n"
            + _indented(_indented(LOOP))
            + '\n\nif __name__ == "__main__":\n    net = nn.Linear(512, 512).cuda()\n'
            "    Trainer().fit(net, torch.optim.SGD(net.parameters(), lr=0.1), [])\n",
            IMPORTS
            + "\nclass Trainer:\n    def fit(self, model, opt, data):\n"
            + _indented(_indented(LOOP))
            + '\n\nif __name__ == "__main__":\n    '
            + ENABLE_TF32
            + "\n    net = nn.Linear(512, 512).cuda()\n"
            "    Trainer().fit(net, torch.optim.SGD(net.parameters(), lr=0.1), [])\n",
            "the main block itself when it trains through objects",
        ),
        Invalid(
            IMPORTS
            + "import torch.multiprocessing as mp\n\n\ndef worker(rank):\n"
            + _indented(SCRIPT_BODY)
            + '\n\nif __name__ == "__main__":\n    mp.spawn(worker, nprocs=2)\n',
            IMPORTS
            + "import torch.multiprocessing as mp\n\n\ndef worker(rank):\n    "
            + ENABLE_TF32
            + "\n"
            + _indented(SCRIPT_BODY)
            + '\n\nif __name__ == "__main__":\n    mp.spawn(worker, nprocs=2)\n',
            "training in spawned processes: where each starts, not in the parent that spawns them",
        ),
        Invalid(
            IMPORTS + "\n\n" + EMBEDDING_BAG.replace(".sum(dim=1)", " @ self.emb.weight.T") + EMBEDDING_SCRIPT,
            IMPORTS
            + "\n\n"
            + ENABLE_TF32
            + "\n"
            + EMBEDDING_BAG.replace(".sum(dim=1)", " @ self.emb.weight.T")
            + EMBEDDING_SCRIPT,
            "the model's forward multiplies by the embedding matrix",
        ),
        Invalid(
            IMPORTS
            + "import transformers\n\n"
            + SCRIPT_BODY.replace("nn.Linear(512, 512)", 'transformers.AutoModel.from_pretrained("bert-base-uncased")'),
            IMPORTS
            + "import transformers\n\n"
            + ENABLE_TF32
            + "\n"
            + SCRIPT_BODY.replace("nn.Linear(512, 512)", 'transformers.AutoModel.from_pretrained("bert-base-uncased")'),
            "a model of another library: what its forward runs is not known, so TF32 is enabled",
        ),
        Invalid(
            IMPORTS
            + "\nuse_amp = False\n"
            + SCRIPT_BODY.replace(
                FORWARD,
                '    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_amp):\n    '
                + FORWARD.replace("\n", "\n    "),
            ),
            IMPORTS
            + "\n"
            + ENABLE_TF32
            + "\nuse_amp = False\n"
            + SCRIPT_BODY.replace(
                FORWARD,
                '    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_amp):\n    '
                + FORWARD.replace("\n", "\n    "),
            ),
            "autocast that an option may turn off: the matmuls may run in float32",
        ),
    ]

    def visit_Module(self, node: cst.Module) -> None:
        training = self.context.training
        if not training.loops:
            return self._check_trainers(node)
        if training.cuda_use is None or all(training.placement.trains_on_host(each.loop) for each in training.loops):
            return  # nothing runs on CUDA, whatever device the script names
        if all(
            loop.float64 is not None
            or training.reduced_precision(loop) is not None
            or training.multiplies_matrices(loop) is False
            for loop in training.loops
        ):
            return  # TF32 changes float32 matrix products only: none here, or all in another dtype
        if training.matmul_precision_chosen:
            return  # the program chooses it (on or off), here or in a module of its own
        if all(
            loop.float64 is not None
            or training.reduced_precision(loop) is not None
            or training.runs_float32_matmuls(loop) is False
            for loop in training.loops
        ):
            self.report(training.loops[0].loop, f"{self.MESSAGE}; not fixed: {NO_FLOAT32_MATMUL}")
            return
        narrow = self._narrow_products(training)
        if narrow is not None:
            self.report(training.loops[0].loop, f"{self.MESSAGE}; not fixed: {narrow}")
            return
        enable = cst.parse_statement(ENABLE_TF32 + "\n")
        loop = training.loops[0].loop  # reported at the training loop, fixed at start-up
        edits = self._at_startup(node, [self._entry_of(each.loop) for each in training.loops], loop, enable)
        if edits:
            self.report(loop, edits=edits, imports=[("torch", None)])
        else:
            self.report(
                loop,
                f"{self.MESSAGE} (not fixed: perfmod cannot tell where this program starts; "
                "enable TF32 once in its entry point)",
            )

    def _check_trainers(self, module: cst.Module) -> None:
        """A Lightning `Trainer(...)` that trains on a CUDA GPU, in float32 (no `precision=`),
        a LightningModule of this file whose step multiplies matrices: TF32 is turned on
        at start-up as for a loop of the script's own."""
        trainers = lightning_trainers(self.context)
        training = self.context.training
        for build in trainers.builds:
            if (
                build.precision is not None
                or build.plugins is not None
                or not build.modules
                or build.star is not None  # it may set the precision
                or not trainers.accelerator(build).on_cuda
                or not any(training.matrix_products_in(cls, only_matmuls=True) for cls in build.modules)
            ):
                continue
            if training.matmul_precision_chosen:
                return
            enable = cst.parse_statement(ENABLE_TF32 + "\n")
            edits = self._at_startup(module, [self._entry_of(build.call)], build.call, enable)
            if edits:
                return self.report(build.call, edits=edits, imports=[("torch", None)])
            return self.report(
                build.call,
                f"{self.MESSAGE} (not fixed: perfmod cannot tell where this program starts; "
                "enable TF32 once in its entry point)",
            )

    def _narrow_products(self, training) -> str | None:
        """Why TF32 buys nothing when every training loop's float32 matrix products are
        known and all bound by memory, or each takes less device time over its loop's batch
        than its launch; None when some may gain."""
        sizes = sizes_of(self.context)
        found = [sizes.step_matmul_products(loop.loop) for loop in training.loops]
        if any(products is None for products in found):
            return None
        products = [product for products in found for product in products]
        if not products:
            return NO_FLOAT32_MATMUL
        recurrent = any(sizes.step_work(loop.loop).recurrent for loop in training.loops)
        every = (
            "cuDNN runs the recurrent layers' products in TF32 already, and every other float32 matrix product"
            if recurrent
            else "every float32 matrix product"
        )
        why = widest_memory_bound(tuple(products))
        if why:
            return f"{every} of the step is too narrow for TF32 to speed up: {why}"
        launched = [launch_bound(each, sizes.step_rows(loop.loop)) for each, loop in zip(found, training.loops)]
        if not all(launched):
            return None
        return f"{every} of the step is too short for TF32 to save time: {launched[0]}"

    # -- where start-up is -------------------------------------------------------------

    def _at_startup(
        self, module: cst.Module, holders: list, trained: cst.CSTNode, enable: cst.BaseStatement
    ) -> list[Edit]:
        """The edits that enable TF32 once at start-up of the entry script: at the top of
        the function of the module its `if __name__ == "__main__":` block calls (or of that
        block, which also holds a call of a method that trains);
        after the imports of a script that trains at module level; at the top of the
        functions that start training in a library module (never at its import time,
        never in a function called once per epoch)."""
        steps = self.context.loops
        guard = next((s for s in module.body if isinstance(s, cst.If) and is_main_guard(s.test)), None)
        workers = [f for f in steps.spawned_functions() if any(h is f or self._reaches(f, h) for h in holders)]
        if workers:  # each worker process starts afresh: the setting goes where it starts
            return [self._at_top(function, enable.deep_clone()) for function in workers]
        if guard is not None:
            for call in steps.own_calls(guard.body):
                function = steps.callee(call)
                if (
                    function is not None
                    # a function of the module, not a method (`trainer.fit()`, which may run many times)
                    and self.context.index.top_level(function) is function
                    and any(h is function or self._reaches(function, h) for h in holders)
                ):
                    return [self._at_top(function, enable)]
            return [self._at_top(guard, enable)]
        if None in holders or self._runs_at_module_level(module):
            first_statement = self.context.index.top_level(trained)
            body = list(module.body[: module.body.index(first_statement) + 1])
            last_import = max(
                (i for i, statement in enumerate(body) if _imports_only(statement)),
                default=-1,
            )
            # Before the first statement after the imports: the blank lines that
            # separate them from the code stay above the new line.
            return [InsertBefore(body[last_import + 1], (enable,))]
        entries = list(dict.fromkeys(holders))
        # A training function that another one runs (a warm-up phase before the main loop)
        # starts with its caller: the line goes once, at the top of the caller.
        entries = [f for f in entries if not any(o is not f and self._reaches(o, f) for o in entries)]
        return [self._at_top(function, enable.deep_clone()) for function in entries]  # a node of its own each

    def _entry_of(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        """The function that starts the training `node` belongs to: the outermost function
        around it, or, when that is called from a loop of this file (once per epoch), the
        function holding that loop. None at module level."""
        steps = self.context.loops
        seen: set[cst.CSTNode] = set()
        function = self.context.index.outermost_enclosing(node, cst.FunctionDef)
        while function is not None and function not in seen:
            seen.add(function)
            in_loops = [
                call
                for call in steps.call_sites(function)
                if self.context.index.first_enclosing(call, (cst.For, cst.While)) is not None
            ]
            if not in_loops:
                return function
            caller = self.context.index.outermost_enclosing(in_loops[0], cst.FunctionDef)
            if caller is None:
                return None  # called from a loop at module level: a script
            function = caller
        return function

    def _reaches(self, function: cst.FunctionDef, target: cst.FunctionDef | None) -> bool:
        return target is not None and (
            target in self.context.loops.functions_reached(function.body) or self.context.inside(target, function)
        )

    def _runs_at_module_level(self, module: cst.Module) -> bool:
        """Does the module do work when it runs (a script), beyond defining names?"""
        for statement in module.body:
            if isinstance(statement, (cst.For, cst.While, cst.With, cst.Try)):
                return True
            if isinstance(statement, cst.SimpleStatementLine) and any(
                isinstance(small, cst.Expr) and isinstance(small.value, cst.Call) for small in statement.body
            ):
                return True
        return False

    def _at_top(self, owner: cst.CSTNode, enable: cst.BaseStatement) -> Edit:
        """At the top of `owner`'s body: after its docstring, and after its own imports of
        the names the line reads (`import torch` inside `main()`)."""
        body = owner.body.body
        docstring = m.matches(
            body[0], m.SimpleStatementLine(body=[m.Expr(value=m.SimpleString() | m.ConcatenatedString())])
        )
        bound = self.context.bindings.prefix_binding(body, [n.value for n in names_read(enable)])
        ahead = max(bound, int(docstring))
        while bound and ahead < len(body) and _imports_only(body[ahead]):
            ahead += 1  # below the rest of its block of imports
        return InsertAfter(body[ahead - 1], (enable,)) if ahead else InsertBefore(body[0], (enable,))
