"""The project's own modules: which file of the project an imported function comes
from, and small summaries of that function that the rules need in the file that
calls it.

    from .utils import extract          # relative: from the file's package
    from mypkg.data import make_loader  # absolute: `mypkg` is a folder (or module) at the
    import mypkg.io as io               #   project root, or beside the file

The project root is `settings.root` (the folder of the pyproject.toml the
settings came from), else the nearest folder above the file that holds a
pyproject.toml, setup.py, setup.cfg or .git. Only files of the project are read;
a name that resolves to nothing there (an installed library, a missing file, a
class) is unknown. A file is parsed at most once per process while its size and
modification time stay the same; a file that cannot be read or parsed is unknown,
never an error.

Summaries, each computed once per function and only when a rule asks:

- `saver`: the function writes a checkpoint with one of torch_facts.SAVE_FUNCTIONS
  (`torch.save`, safetensors' `save_file`), itself or through functions it calls
  (of its module, or of the project, a few calls deep);
- `grad_reader`: where the function reads a parameter's `.grad` or takes a norm over
  the gradients (torch_facts.GRAD_NORMS), itself or through the functions it calls (of
  its module, or of the project, a few calls deep);
- `passes_through`: every value it returns is its argument or a part of it
  (an item, an attribute, the same tensor in another dtype), and it moves nothing:
  what the argument holds on the host, the result holds on the host;
- `yields_items_of`: a generator that yields the items of its argument
  (`for b in loader: yield b`, `it = iter(loader) ... yield next(it)`);
- `returned`: what a call gives, from its module's own analysis (where the module calls
  the function itself, with its parameters holding what any caller may pass, not what
  those calls pass) or from its return annotation;
- `loaders_made`: the DataLoader constructions of its module that it returns;
- `pure`: the function is pure by its own module's rules (`purity`), so that a call of
  it may be made once;
- `attribute_values`: for a class, what its methods assign to `self.<attribute>`
  (the tokenizer an `LMWrapper` builds in its `__init__`), read in its module;
- `batches_copied`: what becomes of the batches of a loader passed to one of its
  parameters: copied to a device in a loop of its module fed by that parameter, itself
  or in a function it hands the parameter to (of its module or of the project, a few
  calls deep), and whether the loader's dataset is changed on the way
  (`dl.dataset.set_epoch(epoch)`).

The other direction, for a function of this file that other modules call:

- `importer_arguments`: what the modules beside this file that import it pass to a
  parameter of one of its functions, in a call of it or as the target of a process they
  start (`mp.Process(target=train, args=(rank, model, kwargs))`, `mp.spawn(train, args=...)`):
  a training function in `train.py` whose loader settings come from `main.py`;
- `package_calls`: the calls of one of its functions in the other modules of its package
  (the top-level package folder that holds the file, at any depth: `from pkg.data import
  make_loader` in `pkg/train/run.py`), each with the module it is in, so that what the
  callers do with the result (a DataLoader it builds) can be asked there; and what they
  pass to one of its parameters (`package_arguments`), also in the calls of a
  `functools.partial` of it (the partial's arguments first). The package's files are read as
  text first, and parsed only when they name this module; each function's callers are
  looked for once per process, whichever file asks (`_Package`).

`Project.dependencies()` lists the files the answers for one file were read from,
so that a cached result is not served after one of them changes.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import libcst as cst

from codemod.analysis.bindings import Partial, argument_for
from codemod.analysis.names import imported_from, member, method_name, stored_targets
from codemod.analysis.torch_facts import (
    FILE_ONLY_FUNCTIONS,
    FILE_ONLY_MODULES,
    GRAD_NORMS,
    MOVING_METHODS,
    PATH_READ_METHODS,
    PROCESS_STARTS,
    PURE_BUILTINS,
    READ_ONLY_METHODS,
    READING_METHODS,
    SAME_PLACE_METHODS,
    SAVE_FUNCTIONS,
)
from codemod.result import Stamp  # in a module without libcst: a cached result's check reads it

if TYPE_CHECKING:
    from codemod.analysis.values import Fact
    from codemod.config import Settings
    from codemod.context import FileContext

ROOT_MARKERS = ("pyproject.toml", "setup.py", "setup.cfg", ".git")
MAX_DEPTH = 4  # summaries of one kind nested on a chain of calls (module to module)
MAX_MODULES = 64  # parsed modules kept per process
MAX_BYTES = 2_000_000  # larger files are not parsed (unknown)
_NEXT_DEFINITION = re.compile(rb"^(?:@|def\b|async\b|class\b|if\b)", re.M)  # a top-level def ends before it
MAX_RE_EXPORTS = 3  # `from .inner import f` in a package's __init__, followed this deep
MAX_IMPORTERS = 200  # files beside a file read for the modules that import it
MAX_PACKAGE_FILES = 400  # files of a package read (as text) for the modules that import a module of it
MAX_PACKAGES = 8  # packages whose files and callers are kept per process
SKIPPED_FOLDERS = {"__pycache__", "node_modules", "site-packages"}  # and hidden folders: `.venv`, `.git`


class _Module:
    """One parsed file of the project, with its own analysis (built when first asked)."""

    def __init__(self, path: str, stamp: Stamp, data: bytes | None, settings: Settings) -> None:
        self.path, self.stamp, self.settings = path, stamp, settings
        self._data = data
        self._context: FileContext | None = None
        self._parsed = False
        self.project: Project | None = None
        self.summaries: dict[tuple[str, str], object] = {}

    @property
    def context(self) -> FileContext | None:
        if not self._parsed:
            self._parsed = True
            self._context = _parse(self._data, self.path, self.settings)
            self._data = None
            if self._context is not None:
                self.project = Project(self._context)
        return self._context

    def mentions(self, *words: bytes) -> bool:
        """Does the module's text hold one of `words` (read before or after parsing)?"""
        if self._data is not None:
            return any(word in self._data for word in words)
        return self._context is not None and any(word.decode() in self._context.code for word in words)

    def may_yield(self, name: str) -> bool:
        """Can the function `name` of this module be a generator: does the text of its
        top-level `def` hold `yield`? True when it has no such `def` (it may be imported)."""
        if self._data is None:
            return self._context is not None
        found = re.search(rb"^(?:async[ \t]+)?def[ \t]+" + re.escape(name.encode()) + rb"\b", self._data, re.M)
        if found is None:
            return True
        end = _NEXT_DEFINITION.search(self._data, found.end())  # module-level code before it is kept: a superset
        return b"yield" in self._data[found.end() : end.start() if end is not None else len(self._data)]

    def may_define(self, name: str) -> bool:
        """Can `name` be a function of this module, defined or imported there? Read from its
        text before it is parsed, so that a module a file imports only classes or constants
        from (`Config(...)`) is never parsed."""
        if self._parsed or self._data is None:
            return self._parsed and self._context is not None
        data, word = self._data, re.escape(name.encode())
        if re.search(rb"\bdef\s+" + word + rb"\b", data):
            return True
        if re.search(rb"\bclass\s+" + word + rb"\b", data):
            return False
        return b"import" in data and re.search(rb"\b" + word + rb"\b", data) is not None

    def function(self, name: str) -> cst.FunctionDef | None:
        """The top-level `def name` of this module (the last one wins)."""
        if not self.may_define(name):
            return None
        return self._last_top_level(cst.FunctionDef, name)

    def classdef(self, name: str) -> cst.ClassDef | None:
        """The top-level `class name` of this module (the last one wins); its text is read
        first, so that a module without one is not parsed."""
        if self._data is not None and not re.search(rb"\bclass\s+" + re.escape(name.encode()) + rb"\b", self._data):
            return None
        return self._last_top_level(cst.ClassDef, name)

    def _last_top_level(self, kind: type, name: str):
        context = self.context
        if context is None:
            return None
        found = None
        for statement in context.module.body:
            if isinstance(statement, kind) and statement.name.value == name:
                found = statement
        return found

    def imported_as(self, name: str) -> str | None:
        """The dotted name a top-level absolute import of this module binds `name` to
        (`import torch.nn as nn`, `from torch import nn`, `import torch`); None when none does."""
        context = self.context
        found = None
        for statement in context.module.body if context is not None else ():
            if not isinstance(statement, cst.SimpleStatementLine):
                continue
            for small in statement.body:
                if isinstance(small, cst.Import):
                    for alias in small.names:
                        dotted = cst.Module([]).code_for_node(alias.name)
                        if alias.asname is not None:
                            if isinstance(alias.asname.name, cst.Name) and alias.asname.name.value == name:
                                found = dotted
                        elif dotted.split(".")[0] == name:
                            found = name
                elif (
                    isinstance(small, cst.ImportFrom)
                    and not small.relative
                    and not isinstance(small.names, cst.ImportStar)
                ):
                    for alias in small.names:
                        bound = alias.asname.name if alias.asname is not None else alias.name
                        if isinstance(bound, cst.Name) and bound.value == name and isinstance(alias.name, cst.Name):
                            found = member(imported_from(small), alias.name.value)
        return found

    def re_exports(self, name: str) -> list[str]:
        """The qualified names a top-level import of this module may bind `name` to: the
        one a `from x import f [as name]` binds, else `x.name` for each `from x import *`."""
        stars = self.mentions(b"import *")
        if not stars and not self.may_define(name):
            return []
        context = self.context
        if context is None:
            return []
        starred = []
        for statement in context.module.body:
            if not isinstance(statement, cst.SimpleStatementLine):
                continue
            for small in statement.body:
                if not isinstance(small, cst.ImportFrom):
                    continue
                if isinstance(small.names, cst.ImportStar):
                    starred.append(member(imported_from(small), name))
                    continue
                for alias in small.names:
                    bound = alias.asname.name if alias.asname is not None else alias.name
                    if isinstance(bound, cst.Name) and bound.value == name and isinstance(alias.name, cst.Name):
                        return [member(imported_from(small), alias.name.value)]  # `from .unet_model import UNet`
        return starred


_MODULES: OrderedDict[str, _Module] = OrderedDict()


def _parse(data: bytes | None, path: str, settings: Settings) -> FileContext | None:
    from codemod.context import FileContext

    if data is None:
        return None
    try:
        module = cst.parse_module(data)
        code = data.decode(module.encoding)
    except Exception:  # a file this libcst or Python cannot read: unknown
        return None
    return FileContext(module, path, settings, code)


def _load(path: str, settings: Settings) -> _Module | None:
    """The module of the project file `path`, parsed once while it stays unchanged."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    known = _MODULES.get(path)
    if known is not None and known.stamp.size == info.st_size and known.stamp.mtime_ns == info.st_mtime_ns:
        _MODULES.move_to_end(path)
        return known
    data: bytes | None = None
    digest = ""
    if info.st_size <= MAX_BYTES:
        try:
            with open(path, "rb") as handle:
                data = handle.read()
            digest = hashlib.sha256(data).hexdigest()
        except OSError:
            data = None
    loaded = _Module(path, Stamp(path, info.st_size, info.st_mtime_ns, digest), data, settings)
    _MODULES[path] = loaded
    while len(_MODULES) > MAX_MODULES:
        _MODULES.popitem(last=False)
    return loaded


@dataclass(frozen=True)
class Function:
    """A top-level function of a project module."""

    module: _Module
    node: cst.FunctionDef
    qualified: str  # as the calling file names it: `pkg.data.make_loader`, `.utils.extract`

    @property
    def context(self) -> FileContext:
        return self.module.context

    @property
    def where(self) -> str:
        """`path:line` of its `def`."""
        return f"{self.module.path}:{self.context.line(self.node)}"


@dataclass(frozen=True)
class PassThrough:
    """A function whose result is its argument `param`, or a part of it."""

    param: cst.Param
    whole: bool  # every return is the argument itself
    items: bool  # every return is an item (`x[k]`) of it


@dataclass(frozen=True)
class Site:
    """A place in a project file: the function it is in, the file (absolute) and the line."""

    function: str
    path: str
    line: int
    text: str = ""  # the source of the node, for a message


@dataclass(frozen=True)
class BatchUse:
    """What a function does with the batches of a loader passed to one of its parameters."""

    copy: Site | None  # the first copy of a batch to a device (`batch.to(device)`), if any
    loop: Site | None  # the loop whose batches that copy moves
    trains: bool  # that loop calls backward() (itself or in a function of its module)
    cuda: bool  # every such copy provably goes to CUDA
    dataset_change: Site | None  # `dl.dataset.set_epoch(epoch)`: the loader's dataset changed on the way


@dataclass(frozen=True)
class Built:
    """A module a project class builds: its qualified name (`torch.nn.LSTM`; `torch.nn.*`
    for `getattr(nn, rnn_type)(...)`, a class of `torch.nn` picked at run time) and where."""

    name: str
    site: Site


@dataclass
class _Walk:
    """The summaries being computed on this thread's call chain (cycles, depth)."""

    active: list = field(default_factory=list)


_WALK = _Walk()


@dataclass
class _Callers:
    """The calls of one top-level function in the other modules of its package."""

    read: list[_Module]  # the modules whose text names it, parsed to find them
    calls: list[tuple[_Module, cst.Call, int | Partial, bool]]  # as `_calls_of` gives them, module first
    path: str  # the function's file
    name: str
    _named_otherwise: bool | None = None

    def named_otherwise(self) -> bool:
        """Does a module of the package name the function other than as what it calls
        (handed on as a value, called where perfmod cannot see)?"""
        if self._named_otherwise is None:
            self._named_otherwise = any(
                _named_uncalled(module, self.path, self.name, [(c, o) for m, c, o, _ in self.calls if m is module])
                for module in self.read
            )
        return self._named_otherwise


class _Package:
    """The Python files of one package (the outermost folder with an `__init__.py`, at any
    depth; or the modules of a folder in none), and the calls of its top-level functions in
    its other modules, each function's looked for once, when first asked: every file of the
    project that asks is answered from here while no file or folder of it changes."""

    def __init__(self, folder: str, nested: bool, paths: list[str], folders: list[str]) -> None:
        self.folder, self.nested, self.paths = folder, nested, paths
        self.stamps = _stamps(sorted(set(folders) | set(paths)))
        self._texts: dict[str, bytes | None] = {}
        self._importers: dict[str, list[_Module]] = {}
        self._callers: dict[tuple[str, str], _Callers] = {}

    def unchanged(self) -> bool:
        return _stamps([stamp.path for stamp in self.stamps]) == self.stamps

    def importers(self, own: str, imports: Callable[[str, bytes], bool], settings: Settings) -> list[_Module]:
        """The modules whose text imports the module `own` (`imports(path, text)`)."""
        if own not in self._importers:
            stem, found = Path(own).stem.encode(), []
            for path in self.paths:
                data = self._text(path) if path != own else None
                if data is not None and stem in data and imports(path, data):
                    module = _load(path, settings)
                    if module is not None:
                        found.append(module)  # parsed when a call of it is looked for
            self._importers[own] = found
        return self._importers[own]

    def callers(self, own: str, name: str, importers: list[_Module]) -> _Callers:
        """The calls of the function `name` of the module `own` in `importers` (its importers
        here), looked for in the modules whose text names it."""
        key = (own, name)
        if key not in self._callers:
            read = [module for module in importers if module.mentions(name.encode()) and module.context is not None]
            calls = [(module, *call) for module in read for call in _calls_of(module, own, name)]
            self._callers[key] = _Callers(read, calls, own, name)
        return self._callers[key]

    def _text(self, path: str) -> bytes | None:
        if path not in self._texts:
            try:
                with open(path, "rb") as handle:
                    self._texts[path] = handle.read(MAX_BYTES + 1)
            except OSError:
                self._texts[path] = None
        return self._texts[path]


_PACKAGES: OrderedDict[tuple[str, bool], _Package] = OrderedDict()


def _package(folder: Path, nested: bool) -> _Package:
    """The package at `folder` (`nested`: a package, at any depth; else the modules of the
    folder), read again when one of its files or folders changed."""
    key = (str(folder), nested)
    known = _PACKAGES.get(key)
    if known is None or not known.unchanged():
        if nested:
            paths, folders = _python_files(folder, MAX_PACKAGE_FILES)
        else:
            paths, folders = (
                [os.path.abspath(p) for p in sorted(folder.glob("*.py"))[:MAX_PACKAGE_FILES]],
                [str(folder)],
            )
        known = _PACKAGES[key] = _Package(str(folder), nested, paths, folders)
        while len(_PACKAGES) > MAX_PACKAGES:
            _PACKAGES.popitem(last=False)
    _PACKAGES.move_to_end(key)
    return known


class Project:
    """The project modules one file imports from, and the summaries it asks for."""

    def __init__(self, context: FileContext) -> None:
        self.context = context
        self._used: dict[str, _Module] = {}
        self._tops: dict[str, bool] = {}
        self._functions: dict[str, Function | None] = {}
        self._imports: bool | None = None
        self._importers: list[_Module] | None = None
        self._importer_call_lists: dict[cst.FunctionDef, list[tuple[_Module, cst.Call, int | Partial, bool]]] = {}
        self._package_importers: list[_Module] | None = None
        self._package_index: _Package | None = None
        self._scanned: list[Stamp] = []  # the package's files and folders read for its importers
        path = context.path
        self.folder: Path | None = None
        self.root: Path | None = None
        if path and not path.startswith("<"):
            self.folder = Path(os.path.abspath(path)).parent
            root = context.settings.root
            self.root = Path(os.path.abspath(root)) if root is not None else _marked_root(self.folder)

    # -- which function a call calls ---------------------------------------------------

    def function(self, func: cst.BaseExpression) -> Function | None:
        """The project function `func` (the callee of a call) names, if any."""
        if self.folder is None:
            return None
        for name in sorted(self.context.names.of(func)):
            found = self._resolve(name, 0)
            if found is not None:
                return found
        return None

    def modules_built(self, func: cst.BaseExpression) -> tuple[Built, ...] | None:
        """The modules that the project class `func` names (`RNNModel` of `from model import
        RNNModel`) builds in its methods, and those the classes of its module that it builds
        build in turn; None when `func` names no class of the project."""
        module, classdef = self._project_class(func)
        if module is None or classdef is None:
            return None
        return _summary(module, ("built", classdef.name.value), lambda: _built(module, classdef))
        for name in sorted(self.context.names.of(func)):
            path = self._module_path(name)
            module = _load(path, self.context.settings) if path is not None else None
            classdef = module.class_def(name.rpartition(".")[2]) if module is not None else None
            if classdef is not None:
                self._used[path] = module
                return _summary(
                    module,
                    ("built", classdef.name.value),
                    lambda module=module, classdef=classdef: _built(module, classdef),
                )
        return None

    def imports_project(self) -> bool:
        """Does the file import from a module of the project (a relative import, or a
        package at the project root or beside the file)? Cheap: rules ask it first."""
        if self._imports is None:
            self._imports = self.folder is not None and any(
                top is None or self._is_project_top(top)
                for statement in self.context.index.find((cst.Import, cst.ImportFrom))
                for top in _imported_tops(statement)
            )
        return self._imports

    def shown(self, function: Function, node: cst.CSTNode | None = None) -> str:
        """`path:line` of `node` (a node of the function's module; its `def` by default), the
        path relative to the project root."""
        line = function.context.line(node if node is not None else function.node)
        return f"{self._relative(function.module.path)}:{line}"

    def shown_in(self, context: FileContext, node: cst.CSTNode) -> str:
        """`path:line` of `node` of another module's `context`, the path relative to the project root."""
        return f"{self._relative(context.path)}:{context.line(node)}"

    def shown_site(self, site: Site) -> str:
        """`path:line` of a Site, the path relative to the project root."""
        return f"{self._relative(site.path)}:{site.line}"

    @staticmethod
    def dotted(path: str) -> str:
        """The name the project file `path` is imported by: `pkg.train` for `pkg/train.py` in
        the package `pkg` (its folders up to the outermost with an `__init__.py`), `train`
        for a `train.py` in no package."""
        file = Path(os.path.abspath(path))
        parts = [] if file.stem == "__init__" else [file.stem]
        folder = file.parent
        while (folder / "__init__.py").is_file() and folder.parent != folder:
            parts.insert(0, folder.name)
            folder = folder.parent
        return ".".join(parts)

    def _relative(self, path: str) -> str:
        """`path` relative to the project root (as it is when there is none, or on another drive)."""
        if self.root is None:
            return path
        try:
            return os.path.relpath(path, self.root)
        except ValueError:
            return path

    def called(self, call: cst.Call) -> Function | None:
        return self.function(call.func)

    def may_give_loaders(self, call: cst.Call) -> bool:
        """Can the project function `call` calls give a DataLoader: does the text of its
        module build one (`DataLoader`), or its own text yield (a generator of its argument's
        items)?
        Answered from the text, so that a module is not parsed for every call of a
        project function whose result the loader analysis follows."""
        for name in sorted(self.context.names.of(call.func)):
            path = self._module_path(name)
            if path is None:
                continue
            module = _load(path, self.context.settings)
            if module is not None and (module.mentions(b"DataLoader") or module.may_yield(name.rpartition(".")[2])):
                return True
        return False

    def matrix_products(self, func: cst.BaseExpression, only_matmuls: bool = False) -> bool | None:
        """Does calling `func`, a class or function of a project module (a model class, a
        function that builds a model), multiply matrices (with `only_matmuls`, those cuBLAS
        runs)? Answered by that module's own analysis (`Training.matrix_products_in`); None
        when `func` is not the project's, or when that module cannot tell."""
        function = self.function(func)
        if function is not None:
            module, node = function.module, function.node
        else:
            module, node = self._project_class(func)
            if node is None:
                return None
        return _summary(
            module,
            ("matrix products", node.name.value, only_matmuls),
            lambda: _matrix_products(module, node, only_matmuls),
        )

    def class_of(self, func: cst.BaseExpression) -> tuple[FileContext, cst.ClassDef] | None:
        """The class of a project module that `func` names (`ComponentModel` of `from
        pkg.models import ComponentModel`), with that module's own analysis."""
        module, node = self._project_class(func)
        if module is None or node is None or module.context is None:
            return None
        return module.context, node

    def attribute_values(
        self, func: cst.BaseExpression, attribute: str
    ) -> list[tuple[FileContext, cst.BaseExpression]] | None:
        """What an object of the project class `func` names holds in `self.<attribute>`: the
        values its methods assign there (`self.tokenizer = AutoTokenizer.from_pretrained(...)`
        in `LMWrapper.__init__`), each with its module's analysis, which reads them; None when
        `func` names no class of the project or one assignment cannot be followed."""
        module, node = self._project_class(func)
        if module is None or node is None or module.context is None:
            return None
        context = module.context
        values = _summary(
            module,
            ("attribute", node.name.value, attribute),
            lambda: context.kinds.class_attribute_values(node, attribute),
        )
        return [(context, value) for value in values] if values else None

    def network_tables(self, func: cst.BaseExpression, methods: tuple[str, ...]) -> list | None:
        """The tables of small networks (`self.ci_fns`) that the project class `func` names
        holds and that its methods `methods` call (`analysis/network_tables.py`, read in the
        class's module); None when `func` names no class of the project."""
        module, node = self._project_class(func)
        if module is None or node is None or module.context is None:
            return None
        from codemod.analysis.network_tables import called_tables

        context = module.context
        return _summary(
            module,
            ("network tables", node.name.value, methods),
            lambda: called_tables(context, node, list(methods)),
        )

    def _project_class(self, func: cst.BaseExpression) -> tuple[_Module | None, cst.ClassDef | None]:
        if self.folder is None:
            return None, None
        for name in sorted(self.context.names.of(func)):
            found = self._locate(name, 0, cst.ClassDef)
            if found is not None:
                return found
        return None, None

    def star_member(self, module: str, name: str) -> str | None:
        """What `name` is in the project module `module` this file star-imports (`from .parts
        import *`), where that module binds it by an absolute import of its own (`import
        torch.nn as nn`: `torch.nn`); None otherwise (a class of its own is found by name)."""
        path = self._module_path(member(module, name))
        loaded = _load(path, self.context.settings) if path is not None else None
        if loaded is None or not loaded.mentions(b"import"):
            return None
        self._used[path] = loaded
        return loaded.imported_as(name)

    def imported_module_mentioning(self, *words: bytes) -> str | None:
        """The first project module this file imports (`import pkg.setup`, `from .setup
        import f`, `from . import setup`) whose text holds one of `words`, as a path
        relative to the project root; None when none does. Read from the text: a setting
        the project makes in a module of its own (`allow_tf32`) without parsing it."""
        if not self.imports_project():
            return None
        for statement in self.context.index.find((cst.Import, cst.ImportFrom)):
            for name in _probe_names(statement):
                path = self._module_path(name)
                module = _load(path, self.context.settings) if path is not None else None
                if module is not None:
                    self._used[path] = module
                    if module.mentions(*words):
                        return self._relative(path)
        return None

    def _module_path(self, name: str) -> str | None:
        """The file of the module a dotted, possibly relative, function name comes from."""
        dots = len(name) - len(name.lstrip("."))
        parts = name[dots:].split(".")
        if len(parts) < 2 or not all(parts) or self.folder is None:
            return None
        if dots:
            base = self.folder
            for _ in range(dots - 1):
                base = base.parent
            bases = [base]
        elif self._is_project_top(parts[0]):
            bases = [b for b in (self.root, self.root / "src" if self.root else None, self.folder) if b is not None]
        else:
            return None
        return next((p for p in (_module_file(base, parts[:-1]) for base in bases) if p is not None), None)

    def _resolve(self, name: str, depth: int) -> Function | None:
        key = name
        if key in self._functions:
            return self._functions[key]
        self._functions[key] = None
        found = self._find(name, depth)
        self._functions[key] = found
        return found

    def _find(self, name: str, depth: int) -> Function | None:
        found = self._locate(name, depth, cst.FunctionDef)
        return Function(found[0], found[1], name) if found is not None else None

    def _locate(self, name: str, depth: int, kind: type) -> tuple[_Module, cst.CSTNode] | None:
        """The module and the top-level `def` or `class` (`kind`) the dotted `name` is,
        followed through the imports that re-export it (`from .resnet import *` in a
        package's `__init__`)."""
        path = self._module_path(name)
        module = _load(path, self.context.settings) if path is not None else None
        if module is None:
            return None
        self._used[path] = module
        short = name.rpartition(".")[2]
        node = module.function(short) if kind is cst.FunctionDef else module.classdef(short)
        if node is not None:
            return module, node
        if depth >= MAX_RE_EXPORTS:
            return None
        for target in module.re_exports(short):
            found = module.project._locate(target, depth + 1, kind) if module.project is not None else None
            if found is not None:
                return found
        return None

    def _is_project_top(self, top: str) -> bool:
        """Is `top` a package or module of the project (at its root, in `src/`, or beside the file)?"""
        known = self._tops.get(top)
        if known is None:
            known = False
            for base in (self.root, self.root / "src" if self.root else None, self.folder):
                if base is not None and ((base / top).is_dir() or (base / f"{top}.py").is_file()):
                    known = True
                    break
            self._tops[top] = known
        return known

    # -- the modules that import this one ------------------------------------------------

    def importer_arguments(
        self, function: cst.FunctionDef, param: cst.Param
    ) -> list[tuple[FileContext, cst.BaseExpression]] | None:
        """What the modules beside this file that import it pass to `param` of `function`
        (a top-level function of this file): (the importer's context, the argument there)
        for each call of it and each process started with it as the target; None when no
        such module calls it, or when a call hides the argument (`*args`, a default taken)."""
        found = []
        for module, call, offset, _started in self._importer_calls(function):
            value = argument_for(call, function, param, offset)
            if value is None:
                return None
            found.append((module.context, value))
        return found or None

    def called_from_importers(self, function: cst.FunctionDef) -> bool:
        """Does a module beside this file that imports it call `function` (a top-level
        function of this file), or start processes with it?"""
        return bool(self._importer_calls(function))

    def started_in_processes(self, function: cst.FunctionDef) -> str | None:
        """The module beside this file (its path relative to the project root) that starts
        processes running `function` (`mp.Process(target=train, ...)`), if one does."""
        return next(
            (self._relative(module.path) for module, _, _, started in self._importer_calls(function) if started),
            None,
        )

    def _importer_calls(self, function: cst.FunctionDef) -> list[tuple[_Module, cst.Call, int | Partial, bool]]:
        """The calls of `function` in the modules beside this file that name it, with how
        many leading parameters the caller fills (a process started by `mp.spawn` gets its
        rank first) and whether it starts processes. A process's target gets the `args=`
        tuple as its call."""
        if function not in self._importer_call_lists:
            found = []
            if self.context.index.first_enclosing(function, (cst.ClassDef,)) is None:
                own, name = os.path.abspath(self.context.path), function.name.value
                for module in self._modules_beside():
                    if module.mentions(name.encode()):
                        self._used[module.path] = module
                        found.extend((module, *call) for call in _calls_of(module, own, name))
            self._importer_call_lists[function] = found
        return self._importer_call_lists[function]

    def _modules_beside(self) -> list[_Module]:
        """The parsable modules in this file's folder whose text names this file's module
        (read once per file)."""
        if self._importers is None:
            self._importers = []
            own = os.path.abspath(self.context.path) if self.folder is not None else None
            stem = Path(own).stem if own is not None else "__init__"
            if stem != "__init__":
                for path in sorted(self.folder.glob("*.py"))[:MAX_IMPORTERS]:
                    module = _load(str(path), self.context.settings) if str(path) != own else None
                    if module is not None and module.mentions(stem.encode()) and module.context is not None:
                        self._importers.append(module)
        return self._importers

    def package_calls(self, function: cst.FunctionDef) -> list[tuple[_Module, cst.Call]]:
        """The calls of `function` (a top-level function of this file) in the other modules
        of this file's package that import it, at any depth of the package, each with its
        module (whose own analysis says what the caller does with the result). Not the calls
        of a `functools.partial` of it: what such a call passes is not its own arguments alone
        (`package_arguments` reads them)."""
        callers = self._package_callers(function)
        return (
            [
                (module, call)
                for module, call, offset, started in callers.calls
                if isinstance(offset, int) and not started
            ]
            if callers
            else []
        )

    def package_arguments(
        self, function: cst.FunctionDef, param: cst.Param
    ) -> list[tuple[FileContext, cst.Call, cst.BaseExpression]] | None:
        """What the other modules of this file's package pass to `param` of `function` (a
        top-level function of this file): (the caller's context, the call, the argument
        there) for each call, none when no module calls it; None when a call hides the
        argument (`*args`, a default taken), or when a module starts processes with it
        (their arguments are not followed) or names it otherwise."""
        callers = self._package_callers(function)
        if callers is None or callers.named_otherwise():
            return None  # handed on as a value: called where perfmod cannot see
        found = []
        for module, call, offset, started in callers.calls:
            value = argument_for(call, function, param, offset)
            if started or value is None:
                return None
            found.append((module.context, call, value))
        return found

    def _package_callers(self, function: cst.FunctionDef) -> _Callers | None:
        """The calls of `function`, a top-level function of this file, in the other modules
        of its package, looked up in the package's index (`_Package`); None for a method or
        a nested function."""
        if self.context.index.first_enclosing(function, (cst.ClassDef, cst.FunctionDef)) is not None:
            return None
        package = self._package()
        if package is None:
            return _Callers([], [], os.path.abspath(self.context.path), function.name.value)
        callers = package.callers(os.path.abspath(self.context.path), function.name.value, self.package_importers())
        for module in callers.read:
            self._used[module.path] = module
        return callers

    def package_importers(self) -> list[_Module]:
        """The modules of this file's package (the outermost folder with an
        `__init__.py` around it; the file's folder when it is in none) whose text imports
        this file's module: `import pkg.data`, `from pkg.data import f`, `from pkg import
        data`, or a relative import. Read as text first, at most MAX_PACKAGE_FILES files,
        so that only the modules that name it are parsed."""
        if self._package_importers is None:
            package = self._package()
            own, settings = os.path.abspath(self.context.path), self.context.settings
            self._package_importers = package.importers(own, self._imports_this(), settings) if package else []
        return self._package_importers

    def _package(self) -> _Package | None:
        """This file's package, read once per process (`_PACKAGES`) while none of its files
        and folders changes; None for a file in no folder, or a package's `__init__.py`."""
        if self.folder is None or Path(self.context.path).stem == "__init__":
            return None
        if self._package_index is None:
            package = self.folder
            while (package / "__init__.py").is_file() and (package.parent / "__init__.py").is_file():
                package = package.parent
            nested = (package / "__init__.py").is_file()
            self._package_index = _package(package if nested else self.folder, nested)
            # The answers depend on every file read and on which files there are: a module
            # that starts importing this one, or a new module, makes them stale.
            self._scanned = self._package_index.stamps
        return self._package_index

    def _imports_this(self) -> Callable[[str, bytes], bool]:
        """Does the text of a module of the package (at a path) import this one?"""
        own = os.path.abspath(self.context.path)
        stem = Path(own).stem.encode()
        package = self._package_index
        if not package.nested:  # no package: `import data` / `from data import f` beside it
            beside = re.compile(rb"\b(?:import|from)\s+" + re.escape(stem) + rb"\b")
            return lambda path, data: beside.search(data) is not None
        parts = list(self.folder.relative_to(Path(package.folder).parent).parts)
        dotted, parent = ".".join(parts).encode() + b"." + stem, ".".join(parts).encode()
        absolute = re.compile(
            re.escape(dotted) + rb"|\bfrom\s+" + re.escape(parent) + _NAMES_IMPORTED + re.escape(stem) + rb"\b"
        )
        return lambda path, data: absolute.search(data) is not None or _imports_relatively(path, data, own)

    # -- what the answers were read from --------------------------------------------------

    def dependencies(self) -> list[Stamp]:
        """The project files the answers for this file were read from, also through
        the modules they led to."""
        seen: dict[str, Stamp] = {}
        todo = list(self._used.values())
        while todo:
            module = todo.pop()
            if module.path in seen:
                continue
            seen[module.path] = module.stamp
            if module.project is not None:
                todo.extend(module.project._used.values())
        for stamp in self._scanned:
            seen.setdefault(stamp.path, stamp)
        own = os.path.abspath(self.context.path) if self.folder is not None else None
        return [stamp for path, stamp in sorted(seen.items()) if path != own]

    # -- summaries ---------------------------------------------------------------------------

    def saver(self, function: Function) -> str | None:
        """The checkpoint writer `function` calls (`torch.save`), itself or through the
        functions it calls; None when it calls none that perfmod can see."""
        return _summary(function.module, ("saver", function.node.name.value), lambda: _saver(function))

    def grad_reader(self, function: Function) -> str | None:
        """`path:line` (relative to the project root) where `function`, or a function it
        calls, reads a `.grad` or takes a gradient norm; None when perfmod sees none."""
        return _summary(function.module, ("grad reader", function.node.name.value), lambda: _grad_reader(function))

    def file_effects(self, function: Function) -> str | None:
        """Why a call of `function` may do more than write files and print (change its
        arguments or the module's state, call what perfmod does not know); None when it
        does nothing else, itself or through the functions it calls, so that it may run
        in a background thread on copies of its arguments."""
        why = _summary(function.module, ("file effects", function.node.name.value), lambda: _file_effects(function))
        if why is None:
            return f"perfmod cannot follow `{function.node.name.value}` to its end"
        return why or None

    def pure(self, func: cst.BaseExpression) -> bool:
        """Is `func` (the callee of a call) a function of another module of the project that
        is pure there, by the rules that make a function of that module pure (`purity`)?
        False when perfmod cannot tell: not the project's, a cycle, too many modules deep."""
        function = self.function(func)
        if function is None:
            return False
        return bool(_summary(function.module, ("pure", function.node.name.value), lambda: _pure(function)))

    def passes_through(self, function: Function) -> PassThrough | None:
        return _summary(function.module, ("through", function.node.name.value), lambda: _passes_through(function))

    def yields_items_of(self, function: Function) -> cst.Param | None:
        return _summary(function.module, ("yields", function.node.name.value), lambda: _yields_items_of(function))

    def argument(self, call: cst.Call, function: Function, param: cst.Param) -> cst.BaseExpression | None:
        """What `call` passes to `param` of the project function it calls."""
        return argument_for(call, function.node, param)

    def returned(self, function: Function, path: tuple[int, ...] = ()) -> Fact | None:
        """What a call of `function` gives (the element at `path` of the tuple it returns),
        as its module's analysis sees it; None when perfmod cannot tell."""
        key = ("returned", function.node.name.value, path)
        return _summary(function.module, key, lambda: _returned(function, path))

    def device_types(self, function: Function, written: bool = False) -> frozenset[str] | None:
        """The device types (`"cuda"`, `"cpu"`, ...) every return of `function` may name, as
        its module's analysis follows them (`Training.device_types`); None when one cannot
        be told."""
        key = ("device_types", function.node.name.value, written)
        return _summary(function.module, key, lambda: _device_types(function, written))

    def annotated(self, function: Function, path: tuple[int, ...] = ()) -> Fact | None:
        """What the return annotation of `function` says a call gives (`-> Tensor`,
        `-> tuple[DataLoader, Tokenizer]` at `path`); None when it says nothing perfmod knows."""
        annotation = function.node.returns.annotation if function.node.returns is not None else None
        for index in path:
            parts = _tuple_annotation(function.context, annotation)
            annotation = parts[index] if parts is not None and index < len(parts) else None
        if annotation is None:
            return None
        from codemod.analysis.values import Kind

        fact = function.context.kinds.annotation_fact(annotation)
        return None if fact.kind is Kind.UNKNOWN else fact

    def arity(self, function: Function) -> int | None:
        """How many values the tuple `function` returns holds: every `return` a tuple of
        that many, or a `tuple[A, B]` return annotation; None otherwise."""
        returns, yields = function.context.kinds.exits(function.node)
        sizes = {
            len(r.value.elements)
            for r in returns
            if isinstance(r.value, (cst.Tuple, cst.List))
            and not any(isinstance(e, cst.StarredElement) for e in r.value.elements)
        }
        if (
            not yields
            and returns
            and len(sizes) == 1
            and all(isinstance(r.value, (cst.Tuple, cst.List)) for r in returns)
        ):
            return sizes.pop()
        annotation = function.node.returns.annotation if function.node.returns is not None else None
        parts = _tuple_annotation(function.context, annotation)
        return len(parts) if parts else None

    def loaders_made(self, function: Function, path: tuple[int, ...] = ()) -> list[cst.Call]:
        """The DataLoader constructions of its module that `function` returns (at `path`)."""
        key = ("loaders", function.node.name.value, path)
        return _summary(function.module, key, lambda: _loaders_made(function, path)) or []

    def batches_copied(self, function: Function, param: cst.Param) -> BatchUse | None:
        """What `function` does with the batches of the loader passed to `param`: a loop of its
        module fed by `param` copies them to a device, there or in a function `function`
        hands `param` to; None when perfmod sees neither a copy nor a change of its dataset."""
        return _batches_copied(function, param)


# The names a `from x import` statement imports: one line, or a parenthesized list of lines.
_NAMES_IMPORTED = rb"\s+import\s+(?:\([^)]*|[^\n]*)\b"
_RELATIVE_IMPORT = re.compile(rb"\bfrom\s+(\.+)([\w.]*)\s+import\s+(\([^)]*\)|[^\n]*)")


def _imports_relatively(path: str, data: bytes, own: str) -> bool:
    """Does the module at `path` (its text `data`) import the module `own` relatively:
    `from .data import f`, `from . import data`, `from ..sub import (a, data)`, each
    resolved from the importer's folder? A package's modules nearly all import something
    relatively, and a module's name (`utils`, `data`) is often another module's too."""
    target, stem = os.path.splitext(own)[0], Path(own).stem
    for match in _RELATIVE_IMPORT.finditer(data):
        base = os.path.dirname(path)
        for _ in range(len(match.group(1)) - 1):
            base = os.path.dirname(base)
        module = os.path.join(base, *match.group(2).decode().split(".")) if match.group(2) else base
        if module == target:
            return True
        names = re.findall(rb"\w+", match.group(3))
        if os.path.join(module, stem) == target and stem.encode() in names:
            return True
    return False


def _calls_of(module: _Module, path: str, name: str) -> list[tuple[cst.Call, int | Partial, bool]]:
    """The calls in `module` of the function `name` of the file `path`, direct, through a
    `functools.partial` of it, or as the target of a process it starts (each with the
    parameters its caller fills first, or the partial's arguments that come first, and
    whether it starts processes). A process whose arguments cannot be read is a call with
    `*args`: it passes nothing perfmod can see."""
    context, project = module.context, module.project

    def names_it(expr: cst.BaseExpression) -> bool:
        # Only a callee spelled with the function's name is resolved: resolving one reads
        # the module it comes from, and a large module calls many.
        if not any(qualified.rpartition(".")[2] == name for qualified in context.names.of(expr)):
            return False
        called = project.function(expr)
        return called is not None and called.module.path == path and called.node.name.value == name

    found = []
    for call in context.index.find(cst.Call):
        if names_it(call.func):
            found.append((call, 0, False))
            continue
        if context.kinds.partial_of(call) is not None and names_it(call.args[0].value):
            # `step = partial(train, loader=...)`: its calls (one handed on is named otherwise)
            for through in context.kinds.partial_calls(call.args[0].value) or ():
                found.append((through, Partial(context.kinds.partial_of(through.func)[1]), False))
            continue
        start = next((PROCESS_STARTS[n] for n in context.names.of(call.func) if n in PROCESS_STARTS), None)
        if start is None:
            continue
        position, keyword = start.position, start.keyword
        target = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == keyword), None)
        plain = [a.value for a in call.args if a.keyword is None and not a.star]
        if target is None and len(plain) > position:
            target = plain[position]
        if target is None or not names_it(target):
            continue
        args = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == "args"), None)
        if args is None and start.index_first and len(plain) > 1:
            args = plain[1]  # spawn(fn, args, ...)
        elements = args.elements if isinstance(args, (cst.Tuple, cst.List)) else None
        if elements is None or any(isinstance(e, cst.StarredElement) for e in elements):
            elements = [cst.StarredElement(cst.Name("args"))]
        # The elements themselves, so that each stays a node of the importer's tree.
        arguments = [cst.Arg(e.value, star="*" if isinstance(e, cst.StarredElement) else "") for e in elements]
        # the process index comes first: the call fills one parameter itself
        found.append((cst.Call(target, arguments), 1 if start.index_first else 0, True))
    return found


def _named_uncalled(module: _Module, path: str, name: str, calls: list[tuple[cst.Call, int | Partial]]) -> bool:
    """Does `module` name the function `name` of the file `path` other than as what one of
    `calls` calls, itself or through the partial it calls (`register(train)`,
    `steps = {"train": train}`)?"""
    context, project = module.context, module.project
    called = {id(o.made[0].args[0].value if isinstance(o, Partial) else call.func) for call, o in calls}
    for node in context.index.find((cst.Name, cst.Attribute)):
        last = node.attr if isinstance(node, cst.Attribute) else node
        if last.value != name or id(node) in called or isinstance(context.parents.get(node), cst.Attribute):
            continue
        if isinstance(context.parents.get(node), (cst.ImportAlias, cst.FunctionDef)):
            continue
        function = project.function(node)
        if function is not None and function.module.path == path and function.node.name.value == name:
            return True
    return False


def _batches_copied(function: Function, param: cst.Param) -> BatchUse | None:
    key = ("copied", function.node.name.value, function.context.line(function.node), param.name.value)
    return _summary(function.module, key, lambda: _find_batches_copied(function, param))


def _site(function: Function, name: str, node: cst.CSTNode) -> Site:
    context = function.context
    text = context.source(node)
    return Site(name, function.module.path, context.line(node), text if len(text) <= 80 else "")


def _find_batches_copied(function: Function, param: cst.Param) -> BatchUse | None:
    from codemod.analysis.values import Place

    context, module = function.context, function.module
    loaders = context.loaders
    name = function.node.name.value
    copy = loop = None
    trains = cuda = False
    places: list = []
    for fed, target in loaders.param_feeds(function.node, param):
        copies = loaders.copies_to_device(fed, target)
        if not copies:
            continue
        places += [found.place for found in copies]
        fed_trains = loaders.trains(fed)
        if copy is None or (fed_trains and not trains):
            copy, loop, trains = _site(function, name, copies[0].call), _site(function, name, fed), fed_trains
    changed = loaders.dataset_change(function.node, param)
    change = _site(function, name, changed) if changed is not None else None
    for _call, callee, callee_param in loaders.param_handoffs(function.node, param):
        if isinstance(callee, cst.FunctionDef):
            inner = _batches_copied(Function(module, callee, callee.name.value), callee_param)
        else:
            inner = module.project.batches_copied(callee, callee_param) if module.project is not None else None
        if inner is None:
            continue
        change = change or inner.dataset_change
        if inner.copy is not None and (copy is None or (inner.trains and not trains)):
            copy, loop, trains, cuda = inner.copy, inner.loop, inner.trains, inner.cuda
            places = []
    if places:
        cuda = all(place is Place.CUDA for place in places)
    if copy is None and change is None:
        return None
    return BatchUse(copy, loop, trains, cuda if copy is not None else False, change)


def _summary(module: _Module, key: tuple, compute):
    """A summary of `module`, computed once; unknown (None) in a cycle, or past MAX_DEPTH
    summaries of its kind on the chain (each kind counts its own calls: a summary that asks
    another kind on its way, `passes_through` of a helper while following where batches are
    copied, does not spend the depth of the summary it serves)."""
    if key in module.summaries:
        return module.summaries[key]
    marker = (module.path, key)
    if marker in _WALK.active or sum(1 for _, other in _WALK.active if other[0] == key[0]) >= MAX_DEPTH:
        return None
    _WALK.active.append(marker)
    try:
        found = compute()
    finally:
        _WALK.active.pop()
    module.summaries[key] = found
    return found


def _pure(function: Function) -> bool:
    context = function.context
    return context is not None and context.purity.is_pure(function.node)


def _matrix_products(module: _Module, node: cst.ClassDef | cst.FunctionDef, only_matmuls: bool) -> bool | None:
    context = module.context
    return context.training.matrix_products_in(node, only_matmuls) if context is not None else None


def _built(module: _Module, classdef: cst.ClassDef) -> tuple[Built, ...]:
    from codemod.analysis.names import sole_definition

    context = module.context
    found: list[Built] = []
    todo, seen = [classdef], {classdef}
    while todo:
        current = todo.pop(0)
        built = [base.value for base in current.bases]  # what a base class of the module builds counts too
        for call in context.index.find(cst.Call, within=current):
            text = context.source(call.func)
            site = Site(current.name.value, module.path, context.line(call), text if len(text) <= 80 else "")
            found.extend(Built(name, site) for name in sorted(context.names.may_name(call)))
            built.append(call.func)
        for func in built:
            inner = sole_definition(context.scopes, func, cst.ClassDef)
            if inner is not None and inner not in seen:
                seen.add(inner)
                todo.append(inner)
            elif inner is None and module.project is not None:  # a class of another module of the project
                found.extend(module.project.modules_built(func) or ())
    return tuple(found)


def _own_calls(context: FileContext, function: cst.FunctionDef) -> list[cst.Call]:
    return [
        call
        for call in context.index.find(cst.Call, within=function.body)
        if context.index.first_enclosing(call, (cst.FunctionDef, cst.Lambda)) is function
    ]


def _saver(function: Function) -> str | None:
    context = function.context
    for call in _own_calls(context, function.node):
        found = context.names.of(call) & SAVE_FUNCTIONS
        if found:
            return f"`{sorted(found)[0]}`"
    found = _in_callees(function, "saver", _saver, Project.saver)
    return f"{found[0]} in `{found[1]}`" if found is not None else None


def _grad_reader(function: Function) -> str | None:
    from codemod.analysis.grad_resets import grad_resets  # grad_resets asks this module

    context, module = function.context, function.module
    project = module.project
    where = project._relative(module.path) if project is not None else module.path
    read = next(iter(grad_resets(context).grad_reads(function.node)), None)
    if read is not None:
        return f"{where}:{context.line(read)}"
    for call in _own_calls(context, function.node):
        if context.names.of(call.func) & GRAD_NORMS:
            return f"{where}:{context.line(call)}"
    found = _in_callees(function, "grad reader", _grad_reader, Project.grad_reader)
    return found[0] if found is not None else None


def _in_callees(function: Function, key: str, summary, of_project) -> tuple[str, str] | None:
    """The first answer of `summary` for a function of the file that `function` calls
    (cached per module under `key`), or of `of_project` for a function of another module
    of the project it calls; with the name of that function."""
    context, module = function.context, function.module
    for call in _own_calls(context, function.node):
        local = context.kinds.local_callee(call)
        if local is not None and context.kinds.class_of(local) is None:
            name = local.name.value
            inner = _summary(module, (key, name), lambda local=local: summary(Function(module, local, "")))
        else:
            other = module.project.called(call) if module.project is not None else None
            name = other.qualified if other is not None else ""
            inner = of_project(module.project, other) if other is not None else None
        if inner is not None:
            return inner, name
    return None


def _file_effects(function: Function) -> str:
    """ "" when `function` only writes files and prints (see Project.file_effects), else why not."""
    context, node = function.context, function.node
    problem = _unfollowed_form(context, node)
    if problem is not None:
        return problem
    made = _owned_locals(context, node)
    for target in _changed_targets(context, node):
        if not _made_by_function(context, made, _root_name(target)):
            code = context.module.code_for_node(target).strip()
            return f"`{node.name.value}` changes `{code}`, which it does not make itself"
    for call in _own_calls(context, node):
        effects = _call_file_effects(function, call, made)
        if effects:
            return effects
    return ""


def _unfollowed_form(context: FileContext, node: cst.FunctionDef) -> str | None:
    """Why `_file_effects` does not follow a function of this form (decorated, a method, one
    that rebinds outer names, defines its own functions or reads changing module state);
    None when it does."""
    name = node.name.value
    if node.decorators or node.asynchronous is not None or any(context.kinds.exits(node)[1]):
        return f"`{name}` is decorated, asynchronous or a generator"
    if context.kinds.class_of(node) is not None:
        return f"`{name}` is a method"
    if next(iter(context.index.find((cst.Global, cst.Nonlocal), within=node.body)), None) is not None:
        return f"`{name}` rebinds names outside it (`global`)"
    if next(iter(context.index.find((cst.FunctionDef, cst.Lambda, cst.ClassDef), within=node.body)), None):
        return f"`{name}` defines functions or classes of its own"
    state = _module_state_read(context, node)
    if state is not None:
        return f"`{name}` reads `{state}`, a value of its module that a background call would read later"
    return None


def _made_by_function(context: FileContext, made: set[str], root: cst.Name | None) -> bool:
    """Made by the function: a name bound only to what it makes (`made`), or a read that only
    such bindings reach (`path = Path(path)` before `path.parent.mkdir()`)."""
    if root is None:
        return False
    if root.value in made:
        return True
    reaching = context.kinds.reaching(root)
    return bool(reaching) and all(_fresh_binding(context, binding.node) for binding in reaching)


def _call_file_effects(function: Function, call: cst.Call, made: set[str]) -> str:
    """ "" when `call` in `function` only writes files and prints, else why not: a library
    function known to, a method of what the function made, a function followed to its end."""
    context, module, name = function.context, function.module, function.node.name.value
    func = call.func
    qualified = context.names.of(call)
    if _writes_files_only(qualified):
        return ""
    if isinstance(func, cst.Attribute) and (not qualified or not isinstance(func.value, (cst.Name, cst.Attribute))):
        return _method_file_effects(context, func, made, name)
    local = context.kinds.local_callee(call) if isinstance(func, cst.Name) else None
    if local is not None:
        inner = _summary(module, ("file effects", local.name.value), lambda: _file_effects(Function(module, local, "")))
    else:
        other = module.project.called(call) if module.project is not None else None
        if other is None:
            return f"`{name}` calls `{context.module.code_for_node(func).strip()}`, which perfmod does not know"
        inner = module.project.file_effects(other) or ""
    return f"perfmod cannot follow `{name}` to its end" if inner is None else inner


def _writes_files_only(qualified: set[str]) -> bool:
    """Is a library function of these names known to only write files and print (or to
    have no effect: a pure builtin, an exception), `torch.save` included?"""
    if qualified & (FILE_ONLY_FUNCTIONS | PURE_BUILTINS) or any(
        q.rpartition(".")[0] in FILE_ONLY_MODULES or _builtin_exception(q) for q in qualified
    ):
        return True
    saves = qualified & SAVE_FUNCTIONS
    return bool(saves) and all(q.startswith("torch.") for q in saves)


def _method_file_effects(context: FileContext, func: cst.Attribute, made: set[str], name: str) -> str:
    """ "" when a method call is of a string, of a file, path or list the function made, or
    only reads; else why it may change what it reads."""
    receiver = func.value
    if (
        isinstance(receiver, (cst.SimpleString, cst.FormattedString, cst.ConcatenatedString))
        or _made_by_function(context, made, _root_name(receiver))
        or (isinstance(receiver, cst.Call) and _made_here(context, receiver))
    ):
        return ""
    if func.attr.value in READ_ONLY_METHODS | PATH_READ_METHODS:
        return ""
    return f"`{name}` calls `{context.module.code_for_node(func).strip()}`, which may change what it reads"


def _module_state_read(context: FileContext, function: cst.FunctionDef) -> str | None:
    """A name of the module that `function` reads and that may hold a value that changes:
    anything but an import, a def or class, and a constant (bound once, at the top level,
    to literals: `SUFFIXES = (".tmp", ".bak")`, `KEEP = {"config.json"}`) that no
    statement of the module changes."""
    from libcst.metadata import Assignment as Bound
    from libcst.metadata import GlobalScope

    from codemod.analysis.names import names_read

    seen: set[str] = set()
    for read in names_read(function.body):
        if read.value in seen:
            continue
        seen.add(read.value)
        scope = context.scopes.get(read)
        if scope is None:
            continue
        for binding in scope[read.value]:
            if not isinstance(binding.scope, GlobalScope) or not isinstance(binding, Bound):
                continue
            holder = context.bindings.statement(binding.node) if isinstance(binding.node, cst.Name) else binding.node
            if isinstance(holder, (cst.Import, cst.ImportFrom, cst.FunctionDef, cst.ClassDef)):
                continue
            if (
                isinstance(holder, (cst.Assign, cst.AnnAssign))
                and _literal(holder.value)
                and len(scope[read.value]) == 1
                and not _changed_in_module(context, read.value)
            ):
                continue
            if isinstance(holder, cst.ExceptHandler) or holder is None:
                continue
            if isinstance(holder, cst.Assign) and isinstance(holder.value, cst.Name) and holder.value.value == "None":
                continue  # the fallback of an optional import (`torch = None`): read, never written here
            if context.kinds.is_logger(read):
                continue  # a call in the background writes a log, as `print` does
            return read.value
    return None


def _literal(value: cst.BaseExpression | None) -> bool:
    """Literals, and tuples, lists, sets and dicts of literals."""
    if isinstance(value, (cst.SimpleString, cst.ConcatenatedString, cst.Integer, cst.Float, cst.Imaginary)):
        return True
    if isinstance(value, cst.Name):
        return value.value in ("True", "False", "None")
    if isinstance(value, cst.UnaryOperation):
        return _literal(value.expression)
    if isinstance(value, (cst.Tuple, cst.List, cst.Set)):
        return all(not isinstance(e, cst.StarredElement) and _literal(e.value) for e in value.elements)
    if isinstance(value, cst.Dict):
        return all(isinstance(e, cst.DictElement) and _literal(e.key) and _literal(e.value) for e in value.elements)
    return False


def _changed_in_module(context: FileContext, name: str) -> bool:
    """Does a statement of the module change the value bound to `name` (a method that
    mutates it, an item or attribute assigned, `global name`)?"""
    from codemod.analysis.torch_facts import MUTATING_METHODS

    for node in context.index.find((cst.Attribute, cst.Subscript, cst.Global)):
        if isinstance(node, cst.Global):
            if any(item.name.value == name for item in node.names):
                return True
            continue
        if not (isinstance(node.value, cst.Name) and node.value.value == name):
            continue
        parent = context.parents.get(node)
        if isinstance(node, cst.Attribute) and node.attr.value in MUTATING_METHODS and isinstance(parent, cst.Call):
            return True
        if isinstance(parent, (cst.AssignTarget, cst.AugAssign, cst.Del)):
            return True
    return False


def _fresh_binding(context: FileContext, target: cst.CSTNode) -> bool:
    """`name = <a value the function makes>`, the name the whole target."""
    statement = context.bindings.statement(target)
    return (
        isinstance(statement, (cst.Assign, cst.AnnAssign))
        and isinstance(target, cst.Name)
        and any(t.target is target for t in (statement.targets if isinstance(statement, cst.Assign) else [statement]))
        and _made_here(context, statement.value)
    )


def _builtin_exception(qualified: str) -> bool:
    """`builtins.RuntimeError` and the like: making one (to raise it) changes nothing."""
    module, _, name = qualified.rpartition(".")
    return module == "builtins" and name.endswith(("Error", "Exception", "Warning"))


def _root_name(node: cst.BaseExpression) -> cst.Name | None:
    while isinstance(node, (cst.Attribute, cst.Subscript)):
        node = node.value
    return node if isinstance(node, cst.Name) else None


def _changed_targets(context: FileContext, function: cst.FunctionDef) -> list[cst.BaseExpression]:
    """Attribute and subscript targets the function assigns, augments or deletes."""
    found = []
    for node in context.index.find((cst.Assign, cst.AugAssign, cst.AnnAssign, cst.Del), within=function.body):
        targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
        found += [target for target in stored_targets(targets) if isinstance(target, (cst.Attribute, cst.Subscript))]
    return found


def _owned_locals(context: FileContext, function: cst.FunctionDef) -> set[str]:
    """Names of the function bound only to what it makes: a call that is not a method of
    something else (`open(...)`, `list(...)`, `os.path.join(...)`), a display or a
    comprehension, a string; `with open(...) as f` too. Never a parameter."""
    bound: dict[str, bool] = {}
    params = {p.name.value for p in _params(function).values()}
    for node in context.index.find(
        (cst.Assign, cst.AnnAssign, cst.WithItem, cst.For, cst.AugAssign), within=function.body
    ):
        if isinstance(node, cst.WithItem):
            if node.asname is None or not isinstance(node.asname.name, cst.Name):
                continue
            pairs = [(node.asname.name, node.item)]
        elif isinstance(node, cst.For):
            pairs = [(n, None) for n in context.index.find(cst.Name, within=node.target)]
        elif isinstance(node, cst.Assign):
            pairs = [(t.target, node.value) for t in node.targets]
        else:
            pairs = [(node.target, node.value)]
        for target, value in pairs:
            names = [target] if isinstance(target, cst.Name) else list(context.index.find(cst.Name, within=target))
            fresh = len(names) == 1 and names[0] is target and _made_here(context, value)
            for name in names:
                if isinstance(name, cst.Name):
                    bound[name.value] = bound.get(name.value, True) and fresh
    return {name for name, fresh in bound.items() if fresh and name not in params}


def _made_here(context: FileContext, value: cst.BaseExpression | None) -> bool:
    """A value the function makes: a display, a comprehension, a literal, an operation, or
    a call of a builtin or of an imported module's function (`open(...)`, `list(...)`,
    `os.path.join(...)`); not a method of something else, nor a name."""
    if value is None:
        return False
    if isinstance(value, (cst.List, cst.Dict, cst.Set, cst.ListComp, cst.DictComp, cst.SetComp, cst.Tuple)):
        return True
    if isinstance(value, (cst.SimpleString, cst.FormattedString, cst.ConcatenatedString, cst.Integer, cst.Float)):
        return True
    if isinstance(value, (cst.BinaryOperation, cst.Comparison, cst.UnaryOperation)):
        return True
    return isinstance(value, cst.Call) and bool(context.names.of(value))


def _params(function: cst.FunctionDef) -> dict[str, cst.Param]:
    params = function.params
    return {p.name.value: p for p in (*params.posonly_params, *params.params, *params.kwonly_params)}


def _local_values(context: FileContext, name: cst.Name, function: cst.FunctionDef) -> list[cst.BaseExpression] | None:
    """The values every binding of the local `name` of `function` assigns; None unless all
    are plain `name = value` statements of the function."""
    values = context.bindings.values(name)
    if not values:
        return None
    for assignment in context.bindings.assignments(name) or ():
        if context.index.first_enclosing(assignment.node, (cst.FunctionDef, cst.Lambda)) is not function:
            return None
    return values


def _passes_through(function: Function) -> PassThrough | None:
    context, node = function.context, function.node
    kinds = context.kinds
    returns, yields = kinds.exits(node)
    if yields or not returns or any(r.value is None for r in returns):
        return None
    for call in _own_calls(context, node):
        if method_name(call) in MOVING_METHODS:
            return None  # it may move (a part of) its argument before returning it
    for target in context.index.find((cst.AssignTarget, cst.AugAssign, cst.AnnAssign), within=node.body):
        written = target.target
        if isinstance(written, (cst.Subscript, cst.Attribute)):
            return None  # it may replace a part of its argument
    params = _params(node)
    if not _only_read(context, node, params):
        return None
    found: set[str] = set()
    hows: set[str] = set()
    todo = [(r.value, "whole") for r in returns]
    seen: set[int] = set()
    while todo:
        expr, how = todo.pop()
        if id(expr) in seen or len(seen) > 64:
            continue
        seen.add(id(expr))
        if isinstance(expr, cst.Subscript):
            todo.append((expr.value, "item" if how in ("whole", "item") else how))
        elif isinstance(expr, cst.Attribute):
            todo.append((expr.value, "part"))
        elif isinstance(expr, cst.Call) and method_name(expr) in SAME_PLACE_METHODS:
            todo.append((expr.func.value, "part"))
        elif isinstance(expr, cst.IfExp):
            todo += [(expr.body, how), (expr.orelse, how)]
        elif isinstance(expr, cst.Name) and expr.value in params and context.bindings.param_of(expr) is not None:
            found.add(expr.value)
            hows.add(how)
        elif isinstance(expr, cst.Name):
            values = _local_values(context, expr, node)
            if values is None:
                return None
            todo += [(value, how) for value in values]
        else:
            return None
    if len(found) != 1:
        return None
    return PassThrough(params[found.pop()], whole=hows == {"whole"}, items=hows == {"item"})


def _only_read(context: FileContext, function: cst.FunctionDef, params: dict[str, cst.Param]) -> bool:
    """Is every parameter of `function` only read in its body: indexed, asked for a part, or
    passed to a builtin (`isinstance`, `len`), never handed to another function or changed
    through one of its methods, which could move what the function returns?"""
    index, parents = context.index, context.parents
    for name in index.find(cst.Name, within=function.body):
        if name.value not in params or context.bindings.param_of(name) is None:
            continue
        parent = parents.get(name)
        if isinstance(parent, cst.Attribute) and parent.value is name:
            call = parents.get(parent)
            if isinstance(call, cst.Call) and call.func is parent and parent.attr.value not in READING_METHODS:
                return False
        elif isinstance(parent, cst.Arg):
            call = parents.get(parent)
            if isinstance(call, cst.Call) and not any(n.startswith("builtins.") for n in context.names.of(call)):
                return False
    return True


def _yields_items_of(function: Function) -> cst.Param | None:
    return yielded_items_of(function.context, function.node)


def yielded_items_of(context: FileContext, node: cst.FunctionDef) -> cst.Param | None:
    """The parameter of the generator `node` whose items it yields (`for b in loader: yield
    b`, `it = iter(loader) ... yield next(it)`), if it yields nothing else."""
    returns, yields = context.kinds.exits(node)
    if not yields or any(r.value is not None for r in returns):
        return None
    params = _params(node)
    sources: set[str] = set()
    for found in yields:
        value = found.value
        if isinstance(value, cst.From):
            iterable = value.item
        elif isinstance(value, cst.Call) and context.names.is_(value.func, "next", "builtins.next") and value.args:
            iterable = value.args[0].value
        elif isinstance(value, cst.Name):
            loop = context.index.first_enclosing(found, (cst.For, cst.FunctionDef))
            if not (
                isinstance(loop, cst.For) and isinstance(loop.target, cst.Name) and loop.target.value == value.value
            ):
                return None
            iterable = loop.iter
        else:
            return None
        source = _iterated_param(context, iterable, node, params)
        if source is None:
            return None
        sources.add(source)
    return params[sources.pop()] if len(sources) == 1 else None


def _iterated_param(context: FileContext, expr, function: cst.FunctionDef, params: dict, depth: int = 0) -> str | None:
    """The parameter `expr` iterates: the parameter, `iter(param)`, or a local bound only to those."""
    if depth > 3:
        return None
    if isinstance(expr, cst.Call) and context.names.is_(expr.func, "iter", "builtins.iter") and len(expr.args) == 1:
        return _iterated_param(context, expr.args[0].value, function, params, depth + 1)
    if not isinstance(expr, cst.Name):
        return None
    if expr.value in params and context.bindings.param_of(expr) is not None:
        return expr.value
    values = _local_values(context, expr, function)
    if not values:
        return None
    found = {_iterated_param(context, value, function, params, depth + 1) for value in values}
    return found.pop() if len(found) == 1 and None not in found else None


def _returned(function: Function, path: tuple[int, ...]) -> Fact | None:
    from codemod.analysis.values import UNKNOWN, Kind, Kinds

    context, node = function.context, function.node
    kinds = context.kinds
    returns, yields = kinds.exits(node)
    if yields or not returns or any(r.value is None for r in returns):
        return None
    if kinds.callers(node) is not None:  # read apart from its module's calls, which fill its parameters there
        kinds = _summary(function.module, ("any caller", node.name.value), lambda: Kinds(context, any_caller=node))
    result = None
    for found in returns:
        value = found.value
        for index in path:
            if not isinstance(value, (cst.Tuple, cst.List)) or index >= len(value.elements):
                return None
            if any(isinstance(e, cst.StarredElement) for e in value.elements):
                return None
            value = value.elements[index].value
        fact = kinds.fact(value)
        result = fact if result is None else result.join(fact)
    if result is None or result.kind is Kind.UNKNOWN:
        return None
    return result if result != UNKNOWN else None


def _device_types(function: Function, written: bool) -> frozenset[str] | None:
    context, node = function.context, function.node
    returns, yields = context.kinds.exits(node)
    if yields or not returns or any(r.value is None for r in returns):
        return None
    if _params(node) and context.loops.call_sites(node):
        return None  # its parameters would hold what its own module passes, not what this call does
    training = context.training
    found: frozenset[str] = frozenset()
    for value in (r.value for r in returns):
        types = training.device_types(value, written=written)
        if types is None:
            return None
        found |= types
    return found


def _loaders_made(function: Function, path: tuple[int, ...]) -> list[cst.Call]:
    context = function.context
    loaders = context.loaders
    if not loaders.constructions:
        return []
    found = []
    for value in context.kinds.returned(function.node):
        if not loaders.only_loaders(value, path, 0):
            return []
        found.extend(loaders.sources(value, path, 0))
    return list({id(call): call for call in found}.values())


def _imported_tops(statement: cst.Import | cst.ImportFrom) -> list[str | None]:
    """The top packages an import reads from; None for a relative import."""
    if isinstance(statement, cst.ImportFrom):
        modules = [] if statement.relative else [statement.module]
        if statement.relative:
            return [None]
    else:
        modules = [alias.name for alias in statement.names]
    tops = []
    for module in modules:
        while isinstance(module, cst.Attribute):
            module = module.value
        if isinstance(module, cst.Name):
            tops.append(module.value)
    return tops


def _probe_names(statement: cst.Import | cst.ImportFrom) -> list[str]:
    """Dotted names whose module part (all but the last) is a module the import reads:
    `from a.b import c` gives `a.b.c` (module `a.b`) and `a.b.c.*` (a submodule `c`)."""
    code = cst.Module([]).code_for_node
    if isinstance(statement, cst.Import):
        return [f"{code(alias.name)}.*" for alias in statement.names]
    module = imported_from(statement)
    if isinstance(statement.names, cst.ImportStar):
        return [f"{module}.*"]
    return [
        name
        for alias in statement.names
        for name in (member(module, code(alias.name)), f"{member(module, code(alias.name))}.*")
    ]


def _tuple_annotation(context: FileContext, annotation) -> list[cst.BaseExpression] | None:
    """The members of a `tuple[A, B]` / `Tuple[A, B]` annotation (not `tuple[A, ...]`)."""
    if not isinstance(annotation, cst.Subscript):
        return None
    if not context.names.is_(annotation.value, "builtins.tuple", "tuple", "typing.Tuple"):
        return None
    parts = [e.slice.value for e in annotation.slice if isinstance(e.slice, cst.Index)]
    if len(parts) != len(annotation.slice) or any(isinstance(p, cst.Ellipsis) for p in parts):
        return None
    return parts


def _module_file(base: Path, parts: list[str]) -> str | None:
    folder = base.joinpath(*parts[:-1]) if len(parts) > 1 else base
    last = parts[-1]
    for candidate in (folder / f"{last}.py", folder / last / "__init__.py"):
        if candidate.is_file():
            return os.path.abspath(candidate)
    return None


def _stamps(paths: list[str]) -> list[Stamp]:
    """Size and time of each file or folder (a folder's time changes when a file is
    added or removed); without a digest, so a changed time is a change."""
    found = []
    for path in paths:
        try:
            info = os.stat(path)
        except OSError:
            continue
        found.append(Stamp(path, info.st_size, info.st_mtime_ns, ""))
    return found


def _python_files(folder: Path, limit: int) -> tuple[list[str], list[str]]:
    """The `.py` files under `folder` (hidden and cache folders skipped), in a fixed
    order, at most `limit` of them; and the folders walked to find them."""
    found: list[str] = []
    walked: list[str] = []
    for current, folders, files in os.walk(folder):
        walked.append(os.path.abspath(current))
        folders[:] = sorted(f for f in folders if not f.startswith(".") and f not in SKIPPED_FOLDERS)
        for name in sorted(files):
            if name.endswith(".py"):
                found.append(os.path.abspath(os.path.join(current, name)))
                if len(found) >= limit:
                    return found, walked
    return found, walked


@lru_cache(maxsize=1024)
def _marked_root(folder: Path) -> Path:
    """The nearest folder at or above `folder` with a project marker. Without one: the
    folder that holds the outermost package around `folder` (where `import pkg.mod`
    finds it), or `folder` itself when it is no package."""
    for candidate in (folder, *folder.parents):
        if any((candidate / marker).exists() for marker in ROOT_MARKERS):
            return candidate
    package = folder
    while (package / "__init__.py").is_file() and package.parent != package:
        package = package.parent
    return package


def project_of(context: FileContext) -> Project:
    """The file's Project, built once and shared by every rule and analysis."""
    return context.shared("project", Project)


def project_dependencies(context: FileContext) -> list[Stamp]:
    """The project files the analysis of `context` read (none when it never looked)."""
    project = context._shared.get("project")
    return project.dependencies() if project is not None else []
