"""Which calls tokenize text, which tokenizers perfmod knows to be pure, and where the
texts a training step tokenizes come from.

- `tokenizes(call)`: does `call` tokenize text: a known tokenizer, a tokenizer's method
  (`encode`, `apply_chat_template`, ...) on something that is not a model and given no
  tensor, a callee
  named like a tokenizer, an instance of a `*Tokenizer` class, or a function of this
  file (not a model's method) that tokenizes?
- `calls_in(node)`: the calls under `node` that tokenize text.
- `tokenizer_call(call)`: (known, receiver): known when `call` is `tok(...)` or
  `tok.<pure method>(...)` on a tokenizer a known library built (Hugging Face,
  tiktoken: the tables in torch_facts), and so pure; receiver is `tok` for any call
  shaped like that.
- `is_known(expr)`: is `expr` a tokenizer a known library built (followed through
  names, parameters, `self` attributes and the attributes of objects of the project's
  classes: `ctx.wrapper.tokenizer` of an `LMWrapper` of another module whose `__init__`
  builds it, and whose other methods only read it)?
- `origin(expr)`: for a known tokenizer, the library and where it is built, for a message;
  `library(expr)`: the module of that library (`transformers`).
- `kept_after_init(value)`: is the tokenizer `value`, assigned to `self.<attr>` in a
  class's `__init__`, only read by the class's other methods?
- `changed_in(receiver, region)`: why the known tokenizer `receiver` may change in
  `region` (a method other than a tokenizing one is called on it there), or None.
- `from_corpus(expr, loop)`: does `expr` take its text from data kept outside the step
  (`texts[i]`, a batch the loop hands out) rather than make it in the step?
- `made_in_step(expr, loop)`: is `expr` text the step makes (decoded or generated ids,
  a string formatted from the step's values)?
- `corpus_of(text)`, `reads_only(expr, var)`, `call_parts(call)`: the shapes
  `docs[i]`, `t` or `docs[t]`, and what a call evaluates besides its callee's name.

Whether a function of the file is pure is `purity`'s answer; whether a value is the
same on every iteration of a loop is `variance`'s; the texts of a fixed corpus are
`corpus`'s. Built once per file (FileContext.shared).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from codemod.analysis.names import method_name
from codemod.analysis.project import project_of
from codemod.analysis.tensor_layout import layouts
from codemod.analysis.torch_facts import (
    ATTRIBUTE_READERS,
    DETOKENIZER_METHODS,
    PURE_BUILTINS,
    TOKENIZER_BUILDERS,
    TOKENIZER_CLASS_WORD,
    TOKENIZER_LIBRARIES,
    TOKENIZER_METHODS,
    TOKENIZER_READERS,
)
from codemod.analysis.values import Kind

if TYPE_CHECKING:
    from codemod.context import FileContext

KEY = "tokenizers"
# Spellings of a callee that tokenizes: `tokenizer(...)`, `tokenize(...)`, `apply_chat_template(...)`.
TOKENIZING_WORDS = ("tokeniz", "chat_template")
RANDOM_PICKS = ("random.sample", "random.choice", "random.choices")


def tokenizers(context: FileContext) -> Tokenizers:
    return context.shared(KEY, Tokenizers)


class Tokenizers:
    def __init__(self, context: FileContext) -> None:
        self.context = context
        self._scopes = context.scopes
        self._bindings = context.bindings
        self._index = context.index
        self._known: dict[int, bool] = {}  # id(expr) -> is_known(expr)
        self._kept: dict[int, bool] = {}  # id(value) -> kept_after_init(value)

    def tokenizes(self, call: cst.Call, depth: int = 0) -> bool:
        """Does `call` tokenize text: a known tokenizer, a tokenizer's method (`encode`,
        `apply_chat_template`, ...) on something that is not a model, a callee named like a
        tokenizer (`tokenizer(...)`, `tokenize(...)`, an instance of a `*Tokenizer` class), or
        a function of this file (not a model's method) that tokenizes?"""
        func = call.func
        kinds = self.context.kinds
        if kinds.fact(func).kind is Kind.MODULE:
            return False  # `self.encoder(x)`: a model
        if isinstance(func, cst.Attribute):
            receiver = func.value
            if isinstance(receiver, (cst.SimpleString, cst.FormattedString, cst.ConcatenatedString)):
                return False  # `"text".encode()`: bytes
            if kinds.fact(receiver).kind is Kind.MODULE and not kinds.attribute_origins(func):
                return False  # `vae.encode(x)`: a model's method (`self.tokenizer(...)` is an attribute's call)
        if any(kinds.fact(arg.value).kind is Kind.TENSOR for arg in call.args):
            return False  # `vae.encode(images)` of a library's model: a tensor in, not text
        if self.tokenizer_call(call)[0]:
            return True
        spelled = (
            func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else ""
        )
        if isinstance(func, cst.Attribute) and spelled in TOKENIZER_METHODS:
            return True
        if any(word in spelled.lower() for word in TOKENIZING_WORDS):
            return True
        classdef = kinds.instance_class(func) if isinstance(func, cst.Name) else None
        if (
            classdef is not None
            and "tokeniz" in classdef.name.value.lower()
            and kinds.class_fact(classdef).kind is not Kind.MODULE
        ):
            return True
        callee = kinds.local_callee(call)
        if callee is None or depth >= 2 or kinds.class_of(callee) is not None:
            return False
        return any(self.tokenizes(inner, depth + 1) for inner in self._index.find(cst.Call, within=callee.body))

    def calls_in(self, node: cst.CSTNode) -> list[cst.Call]:
        """The calls under `node` (itself included) that tokenize text (`tokenizes`), in
        document order."""
        return [call for call in self._index.find(cst.Call, within=node) if self.tokenizes(call)]

    def from_corpus(self, expr: cst.BaseExpression, loop: cst.CSTNode) -> bool:
        """Does `expr` take its text from data kept outside the step (picked by the step's
        indices, `texts[i]`, or handed out by the loop, `for batch in loader`), rather than
        make it in the step (`tok.decode(model.generate(...))`)? Followed through at most
        six names bound in the step (`rendered` from `messages` from `user_text` from ...),
        each binding once."""
        return self._from_corpus(expr, loop, 0, set())

    def _from_corpus(self, expr: cst.BaseExpression, loop: cst.CSTNode, depth: int, seen: set[int]) -> bool:
        if depth > 6:
            return False
        if isinstance(expr, cst.Name):
            return self._name_from_corpus(expr, loop, depth, seen)
        if isinstance(expr, cst.Call):
            return self._call_from_corpus(expr, loop, depth, seen)
        if isinstance(expr, cst.Subscript) and isinstance(expr.value, cst.Name) and not _literal_keys(expr):
            if not self._bound_inside(expr.value, loop):
                return True  # `texts[i]` (`cfg["prompt"]` is one setting, not a pick)
        parts = _inner_parts(expr) + _element_parts(expr)
        return any(self._from_corpus(part, loop, depth, seen) for part in parts)

    def _name_from_corpus(self, name: cst.Name, loop: cst.CSTNode, depth: int, seen: set[int]) -> bool:
        """Is a binding of `name` in the step the loop's own target, or a value from the corpus?"""
        if layouts(self.context).is_number(name):
            return False  # the step's counter, a size: no text of a corpus
        for node in self._nodes_bound_inside(name, loop):
            if id(node) in seen:
                continue
            seen.add(id(node))  # (a name bound many times in the step is followed once per binding)
            statement = self._bindings.statement(node)
            if statement is loop or (isinstance(statement, cst.For) and self._index.inside(loop, statement)):
                return True  # the loop's own target: a batch of the loader or list it iterates
            value = _bound_from(statement)
            if value is not None and self._from_corpus(value, loop, depth + 1, seen):
                return True
        return False

    def _call_from_corpus(self, call: cst.Call, loop: cst.CSTNode, depth: int, seen: set[int]) -> bool:
        """`random.choice(texts)` of a list kept outside the step, or a call given text from the
        corpus that is not a model's or a detokenizer's."""
        if self.context.names.is_(call.func, *RANDOM_PICKS):
            first = call.args[0].value if call.args else None
            return isinstance(first, cst.Name) and not self._bound_inside(first, loop)
        if self.context.kinds.fact(call.func).kind is Kind.MODULE or method_name(call) in DETOKENIZER_METHODS:
            return False
        parts = [a.value for a in call.args]
        if isinstance(call.func, cst.Attribute):
            parts.append(call.func.value)
        return any(self._from_corpus(part, loop, depth, seen) for part in parts)

    def made_in_step(self, expr: cst.BaseExpression, loop: cst.CSTNode, depth: int = 0) -> bool:
        """Is `expr` text the step makes: decoded or generated ids, a value computed by a
        call given a model, or a string formatted from the step's values?"""
        if depth > 6:
            return False
        if _formats_text(expr):
            return True  # f"Step {step}: ...", "%d" % step
        if isinstance(expr, cst.Call):
            return self._call_made_in_step(expr, loop, depth)
        if isinstance(expr, cst.Name):
            return self._name_made_in_step(expr, loop, depth)
        return any(self.made_in_step(part, loop, depth + 1) for part in _inner_parts(expr))

    def _call_made_in_step(self, call: cst.Call, loop: cst.CSTNode, depth: int) -> bool:
        """A detokenizer's or a model's call, one given a model, or one given text the step makes."""
        kinds = self.context.kinds
        if method_name(call) in DETOKENIZER_METHODS or kinds.fact(call.func).kind is Kind.MODULE:
            return True
        if any(kinds.fact(a.value).kind is Kind.MODULE for a in call.args):
            return True
        parts = [a.value for a in call.args] + ([call.func.value] if isinstance(call.func, cst.Attribute) else [])
        return any(self.made_in_step(part, loop, depth + 1) for part in parts)

    def _name_made_in_step(self, name: cst.Name, loop: cst.CSTNode, depth: int) -> bool:
        """Is `name` bound in the step (other than as the loop's target) to text the step makes?"""
        for node in self._nodes_bound_inside(name, loop):
            statement = self._bindings.statement(node)
            value = _bound_from(statement) if statement is not loop else None
            if value is not None and self.made_in_step(value, loop, depth + 1):
                return True
        return False

    def _bound_inside(self, name: cst.Name, loop: cst.CSTNode) -> bool:
        return bool(self._nodes_bound_inside(name, loop))

    def _nodes_bound_inside(self, name: cst.Name, loop: cst.CSTNode) -> list[cst.CSTNode]:
        """The nodes that bind `name` inside `loop`."""
        scope = self._scopes.get(name)
        nodes = (getattr(a, "node", None) for a in scope[name.value]) if scope is not None else ()
        return [node for node in nodes if isinstance(node, cst.CSTNode) and self._index.inside(node, loop)]

    def changed_in(self, receiver: cst.BaseExpression, region: cst.CSTNode) -> str | None:
        """Why a known tokenizer `receiver` may change in `region` (a method other than a
        tokenizing one is called on it there), or None."""
        for other in self._index.find(cst.Call, within=region):
            if not (isinstance(other.func, cst.Attribute) and other.func.value.deep_equals(receiver)):
                continue
            if method_name(other) not in TOKENIZER_METHODS:
                return f"`{self.context.source(other.func)}` may change the tokenizer in the loop"
        return None

    def tokenizer_call(self, call: cst.Call) -> tuple[bool, cst.BaseExpression | None]:
        """(known, receiver): known when `call` is `tok(...)` or `tok.<pure method>(...)` on a
        tokenizer built by a known library; receiver is `tok` for any call shaped like
        that (a method named like a tokenizer's, or a call of a name with "token" in it)."""
        if isinstance(call.func, cst.Attribute) and call.func.attr.value in TOKENIZER_METHODS:
            return self.is_known(call.func.value), call.func.value
        if isinstance(call.func, (cst.Name, cst.Attribute)):
            if self.is_known(call.func):
                return True, call.func
            if "token" in self.context.source(call.func).lower().rsplit(".", 1)[-1]:
                return False, call.func
        return False, None

    def is_known(self, expr: cst.BaseExpression, depth: int = 0) -> bool:
        """Is `expr` a tokenizer a known library built (followed through names, parameters,
        `self` attributes and the attributes of objects of the project's classes)?"""
        if depth > 4:
            return False
        known = self._known.get(id(expr)) if depth == 0 else None
        if known is None:
            origins = self._origins(expr)
            known = bool(origins) and all(
                (context is self.context or tokenizers(context).kept_after_init(value))
                and tokenizers(context)._builds(value, depth)
                for context, value in origins
            )
            if depth == 0:
                self._known[id(expr)] = known
        return known

    def kept_after_init(self, value: cst.BaseExpression) -> bool:
        """`value` is assigned to `self.<attr>` in `__init__` of a class of this file, and
        the class's other methods only read that attribute: they call it, call on it only
        methods that change nothing, read its attributes, or hand it to `getattr` or a pure
        builtin; nothing else (no store into it, no other name for it). Asked of a class of
        another module, whose methods the loop's own analysis does not follow."""
        if id(value) not in self._kept:
            self._kept[id(value)] = self._compute_kept(value)
        return self._kept[id(value)]

    def _compute_kept(self, value: cst.BaseExpression) -> bool:
        context = self.context
        statement = context.parents.get(value)
        init = context.index.first_enclosing(value, cst.FunctionDef)
        classdef = context.kinds.class_of(init) if init is not None else None
        if not isinstance(statement, cst.Assign) or classdef is None or init.name.value != "__init__":
            return False
        target = statement.targets[0].target
        if not isinstance(target, cst.Attribute):
            return False
        for method in context.index.find(cst.FunctionDef, within=classdef):
            if method is init or not method.params.params:
                continue
            owner = method.params.params[0].name.value
            for node in context.index.find(cst.Attribute, within=method):
                if (
                    node.attr.value == target.attr.value
                    and isinstance(node.value, cst.Name)
                    and node.value.value == owner
                    and not _read_only(context, node)
                ):
                    return False
        return True

    def origin(self, expr: cst.BaseExpression, depth: int = 0) -> str | None:
        """For a known tokenizer `expr`, the library and where it is built: "the Hugging Face
        tokenizer built in `LMWrapper.__init__` (pkg/models.py:665)"; None when not known."""
        if depth > 4 or not self.is_known(expr):
            return None
        context, value = self._origins(expr)[0]
        if isinstance(value, (cst.Name, cst.Attribute)):
            return tokenizers(context).origin(value, depth + 1)
        library = TOKENIZER_LIBRARIES[tokenizers(context)._library_of(value)]
        where = (
            project_of(self.context).shown_in(context, value)
            if context is not self.context
            else f"line {context.line(value)}"
        )
        function = context.index.first_enclosing(value, cst.FunctionDef)
        if function is None:
            return f"the {library} tokenizer built at {where}"
        owner = context.kinds.class_of(function)
        named = f"{owner.name.value}.{function.name.value}" if owner is not None else function.name.value
        return f"the {library} tokenizer built in `{named}` ({where})"

    def library(self, expr: cst.BaseExpression, depth: int = 0) -> str | None:
        """The module of the library that built the known tokenizer `expr` (`transformers`,
        `tiktoken`), the same for every value it may hold; None when not known."""
        if depth > 4 or not self.is_known(expr):
            return None
        found = set()
        for context, value in self._origins(expr):
            if isinstance(value, (cst.Name, cst.Attribute)):
                found.add(tokenizers(context).library(value, depth + 1))
            else:
                found.add(tokenizers(context)._library_of(value))
        return found.pop() if len(found) == 1 else None

    def _library_of(self, builder: cst.Call) -> str:
        """The library of a known tokenizer's builder call (one of TOKENIZER_LIBRARIES)."""
        return min({name.split(".")[0] for name in self.context.names.of(builder.func)} & TOKENIZER_LIBRARIES.keys())

    def _origins(self, expr: cst.BaseExpression) -> list[tuple[FileContext, cst.BaseExpression]] | None:
        """The values `expr` may hold, each with the file it is written in."""
        if isinstance(expr, cst.Name):
            values = [value for value, path in self.context.loaders.bound_values(expr) if not path]
            return [(self.context, value) for value in values] or None
        if isinstance(expr, cst.Attribute):
            return self.context.kinds.attribute_origins(expr)
        return None

    def _builds(self, value: cst.BaseExpression, depth: int = 0) -> bool:
        if isinstance(value, (cst.Name, cst.Attribute)):
            return self.is_known(value, depth + 1)
        if not isinstance(value, cst.Call):
            return False
        for name in self.context.names.of(value.func):
            if name in TOKENIZER_BUILDERS:
                return True
            head, _, last = name.rpartition(".")
            if (
                name.startswith("transformers.")
                and last == "from_pretrained"
                and TOKENIZER_CLASS_WORD in head.rsplit(".", 1)[-1]
            ):
                return True
        return False


def _formats_text(expr: cst.BaseExpression) -> bool:
    """Is `expr` a string formatted from values: `f"..."`, `"..." % x`, `"...".format(x)`?"""
    if isinstance(expr, cst.FormattedString):
        return True
    if isinstance(expr, cst.BinaryOperation):
        return isinstance(expr.operator, cst.Modulo) and isinstance(expr.left, cst.SimpleString)
    return (
        isinstance(expr, cst.Call) and method_name(expr) == "format" and isinstance(expr.func.value, cst.SimpleString)
    )


def _literal_keys(subscript: cst.Subscript) -> bool:
    """Is every key of `subscript` a literal (`cfg["data"]`, `rows[0]`)?"""
    return all(
        isinstance(element.slice, cst.Index) and isinstance(element.slice.value, (cst.SimpleString, cst.Integer))
        for element in subscript.slice
    )


def _inner_parts(expr: cst.BaseExpression) -> list[cst.BaseExpression]:
    """What text `expr` is made of when it is an item or attribute of a value, a
    comprehension's element or an operation on two values."""
    if isinstance(expr, (cst.Subscript, cst.Attribute)):
        return [expr.value]
    if isinstance(expr, (cst.ListComp, cst.GeneratorExp, cst.SetComp)):
        return [expr.elt]
    if isinstance(expr, cst.BinaryOperation):
        return [expr.left, expr.right]
    return []


def _element_parts(expr: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The values a literal list, tuple, set or dict holds, or an f-string formats."""
    if isinstance(expr, (cst.List, cst.Tuple, cst.Set)):
        return [e.value for e in expr.elements if isinstance(e, cst.Element)]
    if isinstance(expr, cst.Dict):
        return [e.value for e in expr.elements if isinstance(e, cst.DictElement)]
    if isinstance(expr, cst.FormattedString):
        return [p.expression for p in expr.parts if isinstance(p, cst.FormattedStringExpression)]
    return []


def _bound_from(statement: cst.CSTNode | None) -> cst.BaseExpression | None:
    """What a binding statement binds its target from: a loop's iterable, an assignment's value."""
    if isinstance(statement, (cst.For, cst.CompFor)):
        return statement.iter
    if isinstance(statement, (cst.Assign, cst.AnnAssign)):
        return statement.value
    return None


def _read_only(context: FileContext, node: cst.Attribute) -> bool:
    """Does this use of a tokenizer `node` (`self.tokenizer`) only read it?"""
    parent = context.parents.get(node)
    if isinstance(parent, cst.Call) and parent.func is node:
        return True  # `self.tokenizer(text)`
    if isinstance(parent, cst.Attribute) and parent.value is node:  # `self.tokenizer.<name>`
        used = context.parents.get(parent)
        if isinstance(used, cst.Call) and used.func is parent:
            return parent.attr.value in TOKENIZER_READERS
        return not isinstance(used, (cst.AssignTarget, cst.AugAssign, cst.Del))
    if isinstance(parent, cst.Arg):
        call = context.parents.get(parent)
        return isinstance(call, cst.Call) and bool(context.names.of(call.func) & (ATTRIBUTE_READERS | PURE_BUILTINS))
    return False


def corpus_of(text: cst.BaseExpression) -> cst.Name | None:
    """`docs` of `docs[i]`: one index, a name, of a list named."""
    if (
        isinstance(text, cst.Subscript)
        and isinstance(text.value, cst.Name)
        and len(text.slice) == 1
        and isinstance(text.slice[0].slice, cst.Index)
        and isinstance(text.slice[0].slice.value, cst.Name)
    ):
        return text.value
    return None


def reads_only(expr: cst.BaseExpression, var: str) -> bool:
    """Is `expr` the name `var`, or `docs[var]`?"""
    if isinstance(expr, cst.Name):
        return expr.value == var
    return corpus_of(expr) is not None and expr.slice[0].slice.value.value == var


def call_parts(call: cst.Call) -> list[cst.BaseExpression]:
    """What `call` evaluates besides the callee's name: its receiver and its arguments."""
    receiver = [call.func.value] if isinstance(call.func, cst.Attribute) else []
    return [*receiver, *(a.value for a in call.args)]
