from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from codemod.analysis.loaders import PIN_MEMORY_POSITION, Returned
from codemod.analysis.names import has_star_kwargs, kwarg, positional, string_quote_at
from codemod.analysis.project import Function, Site, project_of
from codemod.analysis.sizes import sizes_of
from codemod.analysis.values import Place
from codemod.edits import AddKeyword
from codemod.rule import Invalid, Level, Rule, Valid

PREAMBLE = """\
import torch
from torch.utils.data import DataLoader, TensorDataset
dataset = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
"""


@dataclass
class _Feeds:
    """What the rule learned about one DataLoader construction."""

    copies: list[cst.Call] = field(default_factory=list)  # the `.to(...)` / `.cuda()` calls of its batches
    places: list[Place] = field(default_factory=list)  # where its batches are copied to
    devices: list[cst.BaseExpression] = field(default_factory=list)  # the device expressions of those copies


class UnpinnedLoaderToCuda(Rule):
    """
    ## What it does
    Finds `torch.utils.data.DataLoader`s whose batches the script copies to a
    CUDA device (`for x, y in loader: x = x.to(device)`, also through
    `enumerate`, `tqdm` and `zip`, and through helper functions that build and
    return the loader) and that do not pass `pin_memory`, and adds it.

    A loader that a function of a module returns (`def make_loaders(cfg): ...
    return train, val`) is pinned in that module, where it is built, when a
    module of the package that calls the function copies its batches to a
    device (in its loop, through a generator that yields them, or in a
    function it hands the loader to); when another caller loops over the
    batches without copying any to a device, it is reported there instead,
    naming that caller: pinning would only cost it a copy. The files that call
    it then say nothing of it. Otherwise (a file of another package), a loader
    built by a function of another module whose batches this file copies is
    reported at that call, with the file and line of the DataLoader to change:
    perfmod does not edit another file. So is a loader (built here, or by such a factory) that
    this file passes to a function of another module whose loop copies its
    batches to a device, itself or through the functions it hands the loader
    to (`run(model, train_loader)` whose `_optimize` does `x.to(device)`): the
    message names that function and the line of the copy. A loader built in
    this file gets the fix there: pinning changes no value, and every check
    that decides it (an explicit choice, `*args`, data or a `collate_fn` that
    may be on a device, a subclass) is made on the construction, which is here.

    ## Why is this bad?
    A batch in ordinary (pageable) host memory cannot be copied to the GPU by
    DMA directly: the driver first copies it into a pinned staging buffer, and
    the copy blocks the host even with `non_blocking=True`. With
    `pin_memory=True` the loader puts each batch in page-locked memory (in a
    background thread when `num_workers > 0`), the host-to-device copy runs at
    full PCIe/NVLink bandwidth, and with PM101's `non_blocking=True` it
    overlaps with the compute already queued. Pinning pays off together with
    those non-blocking copies; on its own it mostly saves the staging copy.
    Pinned host-to-device copies reach up to about twice the bandwidth of
    pageable ones (NVIDIA, "How to Optimize Data Transfers in CUDA C/C++").

    ## Example
    ```python
    loader = DataLoader(dataset, batch_size=64, shuffle=True)
    for x, y in loader:
        x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
    ```
    Use instead:
    ```python
    loader = DataLoader(dataset, batch_size=64, shuffle=True, pin_memory=True)
    for x, y in loader:
        x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
    ```

    A loader whose batches perfmod can size and finds under 1.25 MB (a copy
    of under 50 us at 25 GB/s, ten kernel launches), feeding only loops that
    read a value to the host every step (`loss.item()`), is reported without
    a fix: the host waits for the device at that read every step anyway, so
    pinning can only save part of a copy that short, and pinning itself
    copies each batch once more on the host. So is a loader, of any batch
    size, whose batches are copied only every few steps (an evaluation under
    `if step % 500 == 0:`, in the loop or in a function called only there)
    or only outside the training loop (an accuracy pass after each epoch or
    after training), with the host waiting for the device right after each
    copy (the evaluation loop reads `loss.item()` every batch). Where such a
    loader takes its settings from the same `**dict` as a loader the rule
    pins, pinning that dict pins both, and nothing is said of the first.

    So is a loader of known batch size feeding only steps whose matrix
    products alone (those of the models perfmod can size, over the rows of
    the batch) take more than 100 times what a blocking copy of a batch can
    cost, even on an A100's bf16 tensor cores: the report states both times.

    ## Fix safety
    Safe: pinning copies each batch into page-locked memory; the values are
    the same bit for bit. The value written follows where the batches go:
    `True` when every copy provably targets CUDA (`.cuda()`, `"cuda:0"`,
    `torch.device("cuda")`); `device.type == "cuda"` when they go to a
    `device = torch.device(...)` that may be the CPU and that is defined before
    the loader, so a CPU run neither pins for nothing nor warns; otherwise
    `torch.cuda.is_available()`, which pins whenever a GPU is present (on a
    machine with a GPU and a run forced onto the CPU that pins for nothing,
    harmlessly). Inside an f-string the `"cuda"` literal takes the quote the
    f-string leaves free (before Python 3.12 an f-string's braces cannot hold its
    own quote); inside f-strings that use both, the value is
    `torch.cuda.is_available()`, which needs no string. Loaders built with `**loader_kwargs` get the entry in that
    dict when it is a literal (or `dict(...)`) of this file used only for
    DataLoaders; otherwise the loader is reported without a fix.

    Left alone: calls that already pass `pin_memory` (any value), loaders whose
    batches are never copied to a device, datasets that hold CUDA tensors
    (`TensorDataset(x.cuda())`, `torch.load` without `map_location`) or whose
    class in this file moves data to a device, and `collate_fn`s that do
    (pinning a CUDA tensor raises), and DataLoader subclasses that override
    `__init__` or `__iter__`. A local class merely named `DataLoader` is not
    torch's.
    """

    CODE = "PM102"
    NAME = "unpinned-loader-batches-to-cuda"
    LEVEL = Level.SAFE
    # "import": a loader made by a function of another module of the project needs no mention here.
    REQUIRES = ("DataLoader", "import")
    # PM202 turns hand-made batching into a DataLoader, which this rule then configures:
    # it runs on PM202's output, so that one run leaves nothing pending.
    AFTER = ("PM202",)
    MESSAGE = (
        "DataLoader batches are copied to CUDA from pageable memory; pass pin_memory so the copies can be asynchronous"
    )
    GAIN = "pinned copies reach up to ~2x the bandwidth of pageable ones (NVIDIA); with PM101 they overlap compute"

    VALID = [
        Valid(
            PREAMBLE + "loader = DataLoader(dataset, pin_memory=False)\nfor x, y in loader:\n    x = x.cuda()\n",
            "an explicit choice is kept",
        ),
        Valid(
            PREAMBLE + "kwargs = {'num_workers': 1, 'pin_memory': True} if torch.cuda.is_available() else {}\n"
            "loader = DataLoader(dataset, batch_size=8, **kwargs)\nfor x, y in loader:\n    x = x.cuda()\n",
            "the script pins where it copies to the GPU, through a dict chosen by device",
        ),
        Valid(
            PREAMBLE + "loader = DataLoader(dataset)\nfor x, y in loader:\n    print(x.sum())\n",
            "batches stay on the host",
        ),
        Valid(
            PREAMBLE + "loader = DataLoader(dataset)\nfor x, y in loader:\n    x = x.to(torch.float16)\n", "dtype only"
        ),
        Valid(
            PREAMBLE + "cuda_set = TensorDataset(torch.randn(64, 8).cuda())\nloader = DataLoader(cuda_set)\n"
            "for (x,) in loader:\n    x = x.cuda()\n",
            "pinning a CUDA tensor raises",
        ),
        Valid(
            PREAMBLE + "class DataLoader:\n    def __init__(self, ds):\n        self.ds = ds\n    def __iter__(self):\n"
            "        return iter(self.ds)\nloader = DataLoader(dataset)\nfor x, y in loader:\n    x = x.cuda()\n",
            "a local class named DataLoader",
        ),
        Valid(
            PREAMBLE + "class Prefetching(DataLoader):\n    def __iter__(self):\n        return super().__iter__()\n"
            "loader = Prefetching(dataset)\nfor x, y in loader:\n    x = x.cuda()\n",
            "a subclass that overrides __iter__",
        ),
        Valid(
            PREAMBLE + "class OnDevice(torch.utils.data.Dataset):\n    def __len__(self):\n        return 8\n"
            "    def __getitem__(self, i):\n        return torch.randn(8).to('cuda')\n"
            "loader = DataLoader(OnDevice())\nfor x in loader:\n    x = x.cuda()\n",
            "the dataset moves data to the device",
        ),
        Valid(
            PREAMBLE + "device = torch.device('cuda')\n"
            "loader = DataLoader(dataset, collate_fn=lambda b: [t.to(device) for t in torch.utils.data.default_collate(b)])\n"
            "for x, y in loader:\n    x = x.to(device)\n",
            "the collate_fn moves batches to the device",
        ),
        Valid(
            PREAMBLE + "kwargs = {'batch_size': 8}\nkwargs.update({'pin_memory': False})\n"
            "loader = DataLoader(dataset, **kwargs)\nfor x, y in loader:\n    x = x.cuda()\n",
            "the kwargs dict sets pin_memory",
        ),
        Valid(
            PREAMBLE + "kwargs = {'batch_size': 8}\nkwargs['pin_memory'] = True\n"
            "loader = DataLoader(dataset, **kwargs)\nfor x, y in loader:\n    x = x.cuda()\n",
            "the kwargs dict sets pin_memory by subscript",
        ),
        Valid(
            PREAMBLE + "loader = DataLoader(dataset, 8, True, None, None, 0, None, False)\n"
            "for x, y in loader:\n    x = x.cuda()\n",
            "pin_memory passed by position",
        ),
        Valid(
            PREAMBLE + "def make_loader(ds):\n    return DataLoader(ds, batch_size=8)\n"
            "on_gpu = TensorDataset(torch.randn(64, 8, device='cuda'))\n"
            "for (x,) in make_loader(on_gpu):\n    x = x.cuda()\n",
            "a helper given a CUDA dataset",
        ),
        Valid(
            PREAMBLE + "full = TensorDataset(torch.randn(64, 8).cuda())\n"
            "train_set, val_set = torch.utils.data.random_split(full, [48, 16])\n"
            "loader = DataLoader(train_set)\nfor (x,) in loader:\n    x = x.cuda()\n",
            "a split of a CUDA dataset",
        ),
        Valid(
            PREAMBLE + "saved = TensorDataset(*torch.load('features.pt'))\n"
            "loader = DataLoader(saved)\nfor x, y in loader:\n    x = x.cuda()\n",
            "torch.load without map_location may give CUDA tensors",
        ),
    ]
    INVALID = [
        Invalid(
            PREAMBLE
            + "loader = DataLoader(dataset, batch_size=8)\nfor x, y in loader:\n    x, y = x.cuda(), y.cuda()\n",
            PREAMBLE + "loader = DataLoader(dataset, batch_size=8, pin_memory=True)\nfor x, y in loader:\n"
            "    x, y = x.cuda(), y.cuda()\n",
        ),
        Invalid(
            PREAMBLE.replace(
                "from torch.utils.data import DataLoader, TensorDataset",
                "import torch.utils.data as tud\nfrom torch.utils.data import TensorDataset",
            )
            + "device = torch.device('cuda:0')\nloader = tud.DataLoader(dataset)\n"
            "for step, (x, y) in enumerate(loader):\n    x = x.to(device)\n",
            PREAMBLE.replace(
                "from torch.utils.data import DataLoader, TensorDataset",
                "import torch.utils.data as tud\nfrom torch.utils.data import TensorDataset",
            )
            + "device = torch.device('cuda:0')\nloader = tud.DataLoader(dataset, pin_memory=True)\n"
            "for step, (x, y) in enumerate(loader):\n    x = x.to(device)\n",
            "a module alias, through enumerate",
        ),
        Invalid(
            PREAMBLE + "from torch.utils.data import DataLoader as DL\n"
            "device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n"
            "loader = DL(dataset)\nfor batch in loader:\n    batch = [t.to(device) for t in batch]\n",
            PREAMBLE + "from torch.utils.data import DataLoader as DL\n"
            "device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n"
            'loader = DL(dataset, pin_memory=device.type == "cuda")\nfor batch in loader:\n'
            "    batch = [t.to(device) for t in batch]\n",
            "a device that may be the CPU",
        ),
        Invalid(
            PREAMBLE + "def train(device):\n    loader = torch.utils.data.DataLoader(dataset)\n"
            "    for x, y in loader:\n        x = x.to(device)\n",
            PREAMBLE
            + "def train(device):\n    loader = torch.utils.data.DataLoader(dataset, pin_memory=torch.cuda.is_available())\n"
            "    for x, y in loader:\n        x = x.to(device)\n",
            "a device the rule cannot place",
        ),
        Invalid(
            PREAMBLE
            + "train_kwargs = {'batch_size': 8, 'shuffle': True}\nloader = DataLoader(dataset, **train_kwargs)\n"
            "for x, y in loader:\n    x = x.cuda()\n",
            PREAMBLE + "train_kwargs = {'batch_size': 8, 'shuffle': True, 'pin_memory': True}\n"
            "loader = DataLoader(dataset, **train_kwargs)\nfor x, y in loader:\n    x = x.cuda()\n",
            "the entry goes in the kwargs dict",
        ),
        Invalid(
            PREAMBLE + "loader_kwargs = dict(batch_size=8)\nloader = DataLoader(dataset, **loader_kwargs)\n"
            "for x, y in loader:\n    x = x.cuda()\n",
            PREAMBLE
            + "loader_kwargs = dict(batch_size=8, pin_memory=True)\nloader = DataLoader(dataset, **loader_kwargs)\n"
            "for x, y in loader:\n    x = x.cuda()\n",
        ),
        Invalid(
            PREAMBLE + "def make_loader(**kwargs):\n    return DataLoader(dataset, **kwargs)\n"
            "for x, y in make_loader(batch_size=8):\n    x = x.cuda()\n",
            None,
            "kwargs the rule cannot see",
        ),
        Invalid(
            PREAMBLE + "def make_loader(ds, bs):\n    return DataLoader(ds, batch_size=bs)\n"
            "train_loader = make_loader(dataset, 8)\nfor x, y in train_loader:\n    x = x.cuda()\n",
            PREAMBLE + "def make_loader(ds, bs):\n    return DataLoader(ds, batch_size=bs, pin_memory=True)\n"
            "train_loader = make_loader(dataset, 8)\nfor x, y in train_loader:\n    x = x.cuda()\n",
            "built in a helper function",
        ),
        Invalid(
            PREAMBLE + "import argparse\nargs = argparse.Namespace(device='cuda')\n"
            "loader = DataLoader(dataset)\nfor x, y in loader:\n    x = x.to(args.device)\n",
            PREAMBLE + "import argparse\nargs = argparse.Namespace(device='cuda')\n"
            "loader = DataLoader(dataset, pin_memory=torch.cuda.is_available())\nfor x, y in loader:\n"
            "    x = x.to(args.device)\n",
            "a device attribute",
        ),
        Invalid(
            PREAMBLE + "import types\ncfg = types.SimpleNamespace(train_device='cuda:1')\n"
            "loader = DataLoader(dataset)\nfor x, y in loader:\n    x = x.to(cfg.train_device)\n",
            PREAMBLE + "import types\ncfg = types.SimpleNamespace(train_device='cuda:1')\n"
            "loader = DataLoader(dataset, pin_memory=torch.cuda.is_available())\nfor x, y in loader:\n"
            "    x = x.to(cfg.train_device)\n",
            "an attribute named like a device",
        ),
        Invalid(
            PREAMBLE + "class Loader(DataLoader):\n    def steps(self):\n        return len(self)\n"
            "loader = Loader(dataset)\nfor x, y in loader:\n    x = x.cuda()\n",
            PREAMBLE + "class Loader(DataLoader):\n    def steps(self):\n        return len(self)\n"
            "loader = Loader(dataset, pin_memory=True)\nfor x, y in loader:\n    x = x.cuda()\n",
            "a subclass that keeps DataLoader's __init__ and __iter__",
        ),
        Invalid(
            PREAMBLE + "base = {'batch_size': 8}\nkwargs = {**base, 'shuffle': True}\n"
            "loader = DataLoader(dataset, **kwargs)\nfor x, y in loader:\n    x = x.cuda()\n",
            None,
            "a dict with contents the rule cannot see",
        ),
        Invalid(
            PREAMBLE + "kwargs = {'batch_size': 8}\nprint(kwargs)\n"
            "loader = DataLoader(dataset, **kwargs)\nfor x, y in loader:\n    x = x.cuda()\n",
            None,
            "a dict other code sees too",
        ),
        Invalid(
            PREAMBLE
            + "options = (8, True)\nloader = DataLoader(dataset, *options)\nfor x, y in loader:\n    x = x.cuda()\n",
            None,
            "*args may pass pin_memory",
        ),
        Invalid(
            PREAMBLE + "other = DataLoader(dataset)\nloader = DataLoader(dataset)\n"
            "for (x, y), (u, v) in zip(loader, other):\n    x = x.cuda()\n",
            PREAMBLE + "other = DataLoader(dataset)\nloader = DataLoader(dataset, pin_memory=True)\n"
            "for (x, y), (u, v) in zip(loader, other):\n    x = x.cuda()\n",
            "only the zipped loader whose batches move",
        ),
        Invalid(
            PREAMBLE + "device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n"
            'print(f"{sum(1 for x, y in DataLoader(dataset) if x.to(device).sum() > 0)} batches")\n',
            PREAMBLE + "device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n"
            "print(\n    f\"{sum(1 for x, y in DataLoader(dataset, pin_memory=device.type == 'cuda') "
            'if x.to(device).sum() > 0)} batches"\n)\n',
            "in a double-quoted f-string the literal takes single quotes (Python 3.10 and 3.11 read no others)",
        ),
        Invalid(
            PREAMBLE + "device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n"
            "print(f\"{f'{sum(1 for x, y in DataLoader(dataset) if x.to(device).sum() > 0)}'} batches\")\n",
            PREAMBLE + "device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n"
            "print(\n    f\"{f'{sum(1 for x, y in DataLoader(dataset, pin_memory=torch.cuda.is_available()) "
            "if x.to(device).sum() > 0)}'} batches\"\n)\n",
            "in f-strings that use both quotes, the value that needs no string literal",
        ),
        Invalid(
            PREAMBLE + "settings = dict(batch_size=8)\ntrain = DataLoader(dataset, shuffle=True, **settings)\n"
            "val = DataLoader(dataset, **settings)\nfor x, y in train:\n    x = x.cuda()\n"
            "for x, y in val:\n    x = x.cuda()\n",
            PREAMBLE + "settings = dict(batch_size=8, pin_memory=True)\n"
            "train = DataLoader(dataset, shuffle=True, **settings)\n"
            "val = DataLoader(dataset, **settings)\nfor x, y in train:\n    x = x.cuda()\n"
            "for x, y in val:\n    x = x.cuda()\n",
            "settings two loaders share get pin_memory once",
        ),
    ]

    def visit_Module(self, node: cst.Module) -> None:
        loaders = self.context.loaders
        feeds: dict[int, _Feeds] = {}
        self._feeds = feeds
        for key, copies in loaders.device_copies.items():
            found = feeds[key] = _Feeds()
            for copy in copies:
                found.copies.append(copy.call)
                found.places.append(copy.place)
                found.devices.append(copy.device)
        for loader in loaders.constructions:
            found = feeds.get(id(loader))
            if found is not None and found.places:
                self._check(loader, found)
            elif loaders.pinned_where_built(loader):
                self._check_returned(loaders.returned[id(loader)])
        for loader, function, call in loaders.external.values():
            found = feeds.get(id(loader))
            if found is not None and found.places:
                self._check_elsewhere(loader, function, call, found)
        seen: set[tuple[int, int]] = set()  # one construction there, called twice here: two loaders
        for handoff in loaders.handoffs:
            found = feeds.get(id(handoff.loader))
            key = (id(handoff.loader), id(handoff.factory))
            if key in seen or (found is not None and found.places) or loaders.pinned_where_built(handoff.loader):
                continue  # reported above, where this file copies its batches or returns the loader
            seen.add(key)
            self._check_handed_off(handoff)

    def _check_returned(self, returned: Returned) -> None:
        """A DataLoader of this file that a function of it returns to the other modules of its
        package, one of which copies its batches to the GPU: fixed here, where it is built,
        unless another caller keeps its batches on the host (pinning would cost it a copy)."""
        project, copier = project_of(self.context), returned.copier
        message = (
            f"this DataLoader, returned on line {self.context.line(returned.exit)} to "
            f"{project.shown_site(copier.call)}, has no pin_memory; its batches are copied to the GPU from pageable "
            f"memory by {self._copier(copier.use.copy, copier.function)}"
        )
        host = returned.kept_on_host
        kept = (
            None
            if host is None
            else f"`{host.function.qualified}` ({project.shown_site(host.call)}) takes its batches too and copies "
            f"none of them to a device in its loop on line {host.host.line}, where pinning would only cost a copy"
        )
        feed = _Feeds(places=[Place.CUDA if returned.copied_to_cuda else Place.UNKNOWN], devices=[None])
        self._check(returned.loader, feed, message, kept)

    def _copier(self, copy: Site, function: Function) -> str:
        """`name` (path:line[, reached through `function`]) of a copy made in another module."""
        where = project_of(self.context).shown_site(copy)
        if copy.function != function.node.name.value:
            return f"`{copy.function}` ({where}, reached through `{function.qualified}`)"
        return f"`{function.qualified}` ({where})"

    def _check_handed_off(self, handoff) -> None:
        """A DataLoader (built here, or by a factory of another module) that this file passes
        to a project function whose loop copies its batches to a device. Reported at the
        construction here, with the fix (pin_memory only changes where the batches wait: the
        same precondition checks as for a loop of this file, all made on the construction, and
        a value that pins only when a GPU is present unless the copies provably go to CUDA);
        at the factory call for a loader of another module, not fixed."""
        loaders, project = self.context.loaders, project_of(self.context)
        loader, use = handoff.loader, handoff.use
        copied = f"its batches are copied to the GPU from pageable memory by {self._copier(use.copy, handoff.function)}"
        external = loaders.external.get(id(loader))
        if not loaders.is_construction_here(loader):
            if external is None:
                return
            _, factory, call = external
            call = handoff.factory or call
            there = factory.context.loaders
            if kwarg(loader, "pin_memory") is not None or any(arg.star for arg in loader.args):
                return
            if there.pinned_where_built(loader):
                return  # pinned where it is built, which sees this file's copies among its callers'
            if there.is_torch_loader(loader) and positional(loader, PIN_MEMORY_POSITION) is not None:
                return
            if there.may_not_batch_on_host(loader):
                return
            self.report(
                call,
                f"the DataLoader built by `{factory.qualified}` ({project.shown(factory, loader)}) has no pin_memory; "
                f"{copied}, passed on line {self.context.line(handoff.call)}: pass pin_memory=True there "
                "(not fixed: perfmod does not edit another file)",
            )
            return
        feed = _Feeds(places=[Place.CUDA if use.cuda else Place.UNKNOWN], devices=[None])
        self._check(
            loader,
            feed,
            f"this DataLoader has no pin_memory; {copied} (line {self.context.line(handoff.call)} passes it)",
        )

    def _check_elsewhere(self, loader: cst.Call, function, call: cst.Call, feed: _Feeds) -> None:
        """A DataLoader built in another module of the project (`loader`, by `function`, called
        here as `call`) whose batches this file copies to the GPU: reported here, where the
        copies are; the fix belongs in that module, which this rule does not edit."""
        there = function.context.loaders
        if there.passes_option(loader, ("pin_memory",), PIN_MEMORY_POSITION) or there.may_not_batch_on_host(loader):
            return
        if there.pinned_where_built(loader):
            return  # pinned where it is built, which sees this file's copies among its callers'
        project = project_of(self.context)
        self.report(
            call,
            f"the DataLoader built by `{function.qualified}` ({project.shown(function, loader)}) has no pin_memory; "
            f"its batches are copied to the GPU from pageable memory here (line {self.context.line(feed.copies[0])}): "
            "pass pin_memory=True there (not fixed: perfmod does not edit another file)",
        )

    # -- the decision ------------------------------------------------------------------------

    def _check(self, loader: cst.Call, feed: _Feeds, message: str | None = None, kept: str | None = None) -> None:
        """`kept`: why pinning would cost another user of the batches (reported, not fixed)."""
        loaders = self.context.loaders
        if kwarg(loader, "pin_memory") is not None:
            return
        if loaders.is_torch_loader(loader) and positional(loader, PIN_MEMORY_POSITION) is not None:
            return
        if loaders.may_not_batch_on_host(loader):
            return
        if any(arg.star == "*" for arg in loader.args):
            self.report(loader, self.MESSAGE + "; `*args` may already pass pin_memory, so it is not added")
            return
        if message is None:
            line = self.context.line(feed.copies[0])
            message = f"this DataLoader's batches are copied to the GPU from pageable memory (line {line})"
        if kept is not None:
            self.report(loader, f"{message}; not pinned: {kept}")
            return
        if loaders.collate_unread(loader):
            collate = self.context.source(loaders.collate(loader))
            self.report(
                loader,
                f"{message}; not pinned: perfmod cannot read its collate_fn `{collate}`, and pinning raises on a "
                "batch that a collate_fn has already put on the GPU: pass pin_memory=True if it returns CPU tensors",
            )
            return
        if has_star_kwargs(loader):
            self._fix_through_kwargs(loader, feed, message)
            return
        if self._reported_small(loader, feed, message):
            return
        message += "; pass pin_memory"
        value, imports = self._pin_value(feed, loader)
        self.report(loader, message, edits=[AddKeyword(loader, "pin_memory", value)], imports=imports)

    def _reported_small(self, loader: cst.Call, feed: _Feeds, message: str, shared: cst.CSTNode | None = None) -> bool:
        """Is pinning not worth it (`_small_batches`)? Then reported, unless another loader's fix
        pins the settings dict literal `shared` this one takes too: then nothing is said."""
        small = self._small_batches(loader, feed)
        if small is not None and (shared is None or not self._pinned_alongside(loader, shared)):
            self.report(loader, f"{message}; not pinned: {small}")
        return small is not None

    def _small_batches(self, loader: cst.Call, feed: _Feeds) -> str | None:
        """Why pinning buys nothing: small batches read back every step, or copies made every
        few steps and waited on (`Sizes.overlap_buys_nothing`); None otherwise."""
        return sizes_of(self.context).overlap_buys_nothing(loader, feed.copies)

    def _pinned_alongside(self, loader: cst.Call, literal: cst.CSTNode) -> bool:
        """Does another loader that takes its settings from the same dict literal get them
        pinned (its batches go to the GPU and are worth pinning), pinning this one's too?"""
        loaders = self.context.loaders
        for other in loaders.constructions:
            feed = self._feeds.get(id(other))
            if other is loader or feed is None or not feed.places or not loaders.pinnable(other):
                continue
            stars = [arg for arg in other.args if arg.star == "**"]
            found = loaders.kwargs_literal(stars[0].value) if len(stars) == 1 else None
            if found is not None and found[0] is literal and self._small_batches(other, feed) is None:
                return True
        return False

    def _pin_value(self, feed: _Feeds, at: cst.CSTNode) -> tuple[cst.BaseExpression, list[tuple[str, str | None]]]:
        """`True` for CUDA; `device.type == "cuda"` for a torch.device visible at `at`
        (in the quote an f-string around `at` leaves free); else `torch.cuda.is_available()`."""
        if all(place is Place.CUDA for place in feed.places):
            return cst.Name("True"), []
        device = self.context.training.placement.shared_device_name(feed.devices, at)
        # Inside an f-string the literal takes the quote the f-string does not use (Python
        # before 3.12 reads no f-string's own quote in its braces); inside f-strings that use
        # both, the value that needs no string.
        quote = string_quote_at(self.context.index, at)
        if device is not None and quote is not None:
            return cst.Comparison(
                left=cst.Attribute(value=cst.Name(device), attr=cst.Name("type")),
                comparisons=[
                    cst.ComparisonTarget(operator=cst.Equal(), comparator=cst.SimpleString(f"{quote}cuda{quote}"))
                ],
            ), []
        return cst.parse_expression("torch.cuda.is_available()"), [("torch", None)]

    def _fix_through_kwargs(self, loader: cst.Call, feed: _Feeds, message: str) -> None:
        loaders = self.context.loaders
        stars = [arg for arg in loader.args if arg.star == "**"]
        literals = [loaders.kwargs_literal(arg.value) for arg in stars]
        if any(literal is not None and "pin_memory" in literal[1] for literal in literals):
            return  # already set through the dict
        shared = literals[0][0] if len(stars) == 1 and literals[0] is not None else None
        if self._reported_small(loader, feed, message, shared):
            return
        message += "; pass pin_memory"
        if len(stars) != 1 or literals[0] is None or literals[0][2]:
            name = self.context.source(stars[0].value)
            self.report(loader, message + f"; `**{name}` cannot be seen whole here, so it is not changed")
            return
        literal, _, _ = literals[0]
        value, imports = self._pin_value(feed, literal)
        self.report(
            loader,
            message + " (added to the kwargs dict)",
            edits=[AddKeyword(literal, "pin_memory", value)],
            imports=imports,
        )
