"""Which calls tokenize text, which tokenizers perfmod knows to be pure, and where the
texts a training step tokenizes come from.

- `tokenizes(call)`: does `call` tokenize text: a known tokenizer, a tokenizer's method
  (`encode`, `apply_chat_template`, ...) on something that is not a model and given no
  tensor, a callee
  named like a tokenizer, an instance of a `*Tokenizer` class, or a function of this
  file (not a model's method) that tokenizes?
- `tokenizer_call(call)`: (known, receiver): known when `call` is `tok(...)` or
  `tok.<pure method>(...)` on a tokenizer a known library built (Hugging Face,
  tiktoken: the tables in torch_facts), and so pure; receiver is `tok` for any call
  shaped like that.
- `is_known(expr)`: is `expr` a tokenizer a known library built (followed through
  names, parameters and `self` attributes)?
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
from codemod.analysis.tensor_layout import layouts
from codemod.analysis.torch_facts import (
    DETOKENIZER_METHODS,
    TOKENIZER_BUILDERS,
    TOKENIZER_CLASS_WORD,
    TOKENIZER_METHODS,
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
            if kinds.fact(receiver).kind is Kind.MODULE and not kinds.attribute_values(func):
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

    def from_corpus(self, expr: cst.BaseExpression, loop: cst.CSTNode, depth: int = 0) -> bool:
        """Does `expr` take its text from data kept outside the step (picked by the step's
        indices, `texts[i]`, or handed out by the loop, `for batch in loader`), rather than
        make it in the step (`tok.decode(model.generate(...))`)?"""
        if depth > 6:
            return False
        index = self._index
        if isinstance(expr, cst.Subscript):
            if isinstance(expr.value, cst.Name) and not self._bound_inside(expr.value, loop):
                return True  # `texts[i]`
            return self.from_corpus(expr.value, loop, depth + 1)
        if isinstance(expr, cst.Attribute):
            return self.from_corpus(expr.value, loop, depth + 1)
        if isinstance(expr, cst.Name):
            if layouts(self.context).is_number(expr):
                return False  # the step's counter, a size: no text of a corpus
            for assignment in self._scopes.get(expr)[expr.value] if self._scopes.get(expr) is not None else ():
                node = getattr(assignment, "node", None)
                if not isinstance(node, cst.CSTNode) or not index.inside(node, loop):
                    continue
                statement = self._bindings.statement(node)
                if statement is loop or (isinstance(statement, cst.For) and index.inside(loop, statement)):
                    return True  # the loop's own target: a batch of the loader or list it iterates
                if isinstance(statement, (cst.For, cst.CompFor)):
                    if self.from_corpus(statement.iter, loop, depth + 1):
                        return True
                elif isinstance(statement, (cst.Assign, cst.AnnAssign)) and statement.value is not None:
                    if self.from_corpus(statement.value, loop, depth + 1):
                        return True
            return False
        if isinstance(expr, cst.Call):
            if self.context.names.is_(expr.func, *RANDOM_PICKS):
                first = expr.args[0].value if expr.args else None
                return isinstance(first, cst.Name) and not self._bound_inside(first, loop)
            if self.context.kinds.fact(expr.func).kind is Kind.MODULE or method_name(expr) in DETOKENIZER_METHODS:
                return False
            parts = [a.value for a in expr.args]
            if isinstance(expr.func, cst.Attribute):
                parts.append(expr.func.value)
            return any(self.from_corpus(part, loop, depth + 1) for part in parts)
        if isinstance(expr, (cst.List, cst.Tuple, cst.Set)):
            return any(isinstance(e, cst.Element) and self.from_corpus(e.value, loop, depth + 1) for e in expr.elements)
        if isinstance(expr, cst.Dict):
            return any(
                isinstance(e, cst.DictElement) and self.from_corpus(e.value, loop, depth + 1) for e in expr.elements
            )
        if isinstance(expr, (cst.ListComp, cst.GeneratorExp, cst.SetComp)):
            return self.from_corpus(expr.elt, loop, depth + 1)
        if isinstance(expr, cst.BinaryOperation):
            return self.from_corpus(expr.left, loop, depth + 1) or self.from_corpus(expr.right, loop, depth + 1)
        if isinstance(expr, cst.FormattedString):
            return any(
                isinstance(p, cst.FormattedStringExpression) and self.from_corpus(p.expression, loop, depth + 1)
                for p in expr.parts
            )
        return False

    def made_in_step(self, expr: cst.BaseExpression, loop: cst.CSTNode, depth: int = 0) -> bool:
        """Is `expr` text the step makes: decoded or generated ids, a value computed by a
        call given a model, or a string formatted from the step's values?"""
        if depth > 6:
            return False
        kinds = self.context.kinds
        if isinstance(expr, cst.FormattedString) or (
            isinstance(expr, cst.BinaryOperation)
            and isinstance(expr.operator, cst.Modulo)
            and isinstance(expr.left, cst.SimpleString)
        ):
            return True  # f"Step {step}: ...", "%d" % step
        if (
            isinstance(expr, cst.Call)
            and method_name(expr) == "format"
            and isinstance(expr.func.value, cst.SimpleString)
        ):
            return True
        if isinstance(expr, cst.Call):
            if method_name(expr) in DETOKENIZER_METHODS or kinds.fact(expr.func).kind is Kind.MODULE:
                return True
            if any(kinds.fact(a.value).kind is Kind.MODULE for a in expr.args):
                return True
            parts = [a.value for a in expr.args] + ([expr.func.value] if isinstance(expr.func, cst.Attribute) else [])
            return any(self.made_in_step(part, loop, depth + 1) for part in parts)
        if isinstance(expr, (cst.Subscript, cst.Attribute)):
            return self.made_in_step(expr.value, loop, depth + 1)
        if isinstance(expr, (cst.ListComp, cst.GeneratorExp, cst.SetComp)):
            return self.made_in_step(expr.elt, loop, depth + 1)
        if isinstance(expr, cst.BinaryOperation):
            return self.made_in_step(expr.left, loop, depth + 1) or self.made_in_step(expr.right, loop, depth + 1)
        if isinstance(expr, cst.Name):
            scope = self._scopes.get(expr)
            for assignment in scope[expr.value] if scope is not None else ():
                node = getattr(assignment, "node", None)
                if not isinstance(node, cst.CSTNode) or not self._index.inside(node, loop):
                    continue
                statement = self._bindings.statement(node)
                if isinstance(statement, (cst.For, cst.CompFor)) and statement is not loop:
                    if self.made_in_step(statement.iter, loop, depth + 1):
                        return True
                elif isinstance(statement, (cst.Assign, cst.AnnAssign)) and statement.value is not None:
                    if self.made_in_step(statement.value, loop, depth + 1):
                        return True
        return False

    def _bound_inside(self, name: cst.Name, loop: cst.CSTNode) -> bool:
        scope = self._scopes.get(name)
        return scope is not None and any(
            isinstance(getattr(a, "node", None), cst.CSTNode) and self._index.inside(a.node, loop)
            for a in scope[name.value]
        )

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
        """Is `expr` a tokenizer a known library built (followed through names, parameters
        and `self` attributes)?"""
        if depth > 4:
            return False
        if isinstance(expr, cst.Name):
            values = [value for value, path in self.context.loaders.bound_values(expr) if not path] or None
        elif isinstance(expr, cst.Attribute):
            values = self.context.kinds.attribute_values(expr)
        else:
            return False
        return bool(values) and all(self._builds(v, depth) for v in values)

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
