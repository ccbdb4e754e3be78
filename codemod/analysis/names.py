"""Qualified names through imports: `DL`, `tud.DataLoader` and
`torch.utils.data.DataLoader` are one name; a local class named DataLoader is not."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from itertools import islice

import libcst as cst
from libcst.helpers import get_full_name_for_node
from libcst.metadata import (
    Assignment,
    BaseAssignment,
    GlobalScope,
    ImportAssignment,
    QualifiedName,
    QualifiedNameSource,
)

from codemod.analysis.node_types import type_test
from codemod.analysis.scopes import Ordered, PerBindings, Span

# The attribute `Names.may_name` writes for an attribute whose name is not a literal.
ANY_ATTRIBUTE = "*"
# Type tests asked of most nodes the rules look at (codemod.analysis.node_types says why).
_is_call, _is_attribute, _is_assignment = type_test(cst.Call), type_test(cst.Attribute), type_test(Assignment)
# Public re-exports that resolve to the same object as the path users spell.
CANONICAL = {
    "torch.optim.adam.Adam": "torch.optim.Adam",
    "torch.optim.adamw.AdamW": "torch.optim.AdamW",
    "torch.optim.sgd.SGD": "torch.optim.SGD",
    "torch.utils.data.dataloader.DataLoader": "torch.utils.data.DataLoader",
    "torch.utils.data.dataset.Dataset": "torch.utils.data.Dataset",
    "torch.utils.data.dataset.IterableDataset": "torch.utils.data.IterableDataset",
    "torch.utils.data.dataset.TensorDataset": "torch.utils.data.TensorDataset",
    "torch.nn.modules.module.Module": "torch.nn.Module",
    "torch.amp.autocast_mode.autocast": "torch.amp.autocast",
    "torch.cuda.amp.grad_scaler.GradScaler": "torch.cuda.amp.GradScaler",
}


def is_none(node: cst.BaseExpression) -> bool:
    """The literal `None`."""
    return isinstance(node, cst.Name) and node.value == "None"


def _one_per_import(bindings: Collection[BaseAssignment]) -> list[BaseAssignment]:
    """`bindings` with one import of each spelling: libcst names a dotted name read through
    an import from the import statement's module and names alone, so a script that says
    `import torch` two hundred times gives each `torch.x` the same names two hundred times."""
    kept, seen = [], set()
    for binding in bindings:
        if isinstance(binding, ImportAssignment):
            names = binding.node.names
            spelled = (
                "*"
                if isinstance(names, cst.ImportStar)
                else tuple((get_full_name_for_node(alias.name), alias.evaluated_alias) for alias in names)
            )
            key = (type(binding.node), binding.get_module_name_for_import(), spelled)
            if key in seen:
                continue
            seen.add(key)
        kept.append(binding)
    return kept


class Names:
    """Qualified-name look-ups for one file.

    The answers are libcst's `Scope.get_qualified_names_for(node)`, computed from
    tables: libcst goes through every binding the name may refer to on each
    call, and in a long file that imports `torch` many times (or reads `torch`
    thousands of times) most look-ups repeat the work of an earlier one."""

    def __init__(self, scopes, star_member: Callable[[str, str], str | None] | None = None) -> None:
        self._scopes = scopes
        # What `name` is in a module star-imported (`from .parts import *`), where that module
        # binds it by an import of its own (`import torch.nn as nn`): the project answers.
        self._star_member = star_member
        self._cache: dict[cst.CSTNode, frozenset] = {}
        self._canonical_names: dict[frozenset, tuple[str, ...]] = {}
        self._by_referent: dict[BaseAssignment, frozenset] = {}
        self._by_prefix: dict[int, tuple[Ordered, list[frozenset]]] = {}
        self._by_referents = PerBindings()
        self._imported = PerBindings()  # a name's bindings without an optional import's None fallback
        self._distinct = PerBindings()  # a name's bindings, one per spelling of an import
        self._by_dotted_name: dict[tuple[int, str], tuple[Collection[BaseAssignment], frozenset]] = {}
        self._binding_nodes: set[cst.CSTNode] | None = None
        self._none_targets: set[cst.CSTNode] | None = None
        self._star_modules: tuple[str, ...] | None = None  # the modules of `from m import *`

    def _qualified(self, node: cst.CSTNode):
        found = self._cache.get(node)
        if found is None:
            found = self._cache[node] = self._compute_qualified(node)
        return found

    def _compute_qualified(self, node: cst.CSTNode) -> frozenset:
        scope = self._scopes.get(node)
        if scope is None:
            return frozenset()
        accesses = scope._accesses_by_node.get(node)
        if accesses:  # a name read: what each binding it may read is called
            found: set = set()
            for access in accesses:
                found |= self._names_of(access.referents) or self._star_imported(access.node)
            return frozenset(found)
        if node in self._bindings():  # a name bound here: libcst answers for that binding alone
            return frozenset(scope.get_qualified_names_for(node))
        # (only a chain of names: libcst spells `torch.randn(3).T` "torch.randn.T" and
        # `(a + b).data` "None.data", names of values computed at run time)
        dotted = get_full_name_for_node(node) if is_dotted_name(node) else None
        if dotted is None:
            return frozenset()
        # libcst's look-up by spelling: the bindings of the longest prefix bound here.
        bindings: Collection[BaseAssignment] = ()
        prefix: str | None = dotted
        while prefix:
            if prefix in scope:
                bindings = scope[prefix]
                break
            prefix = prefix.rpartition(".")[0] or None
        if not bindings:  # `nn.Module` where `nn` comes from a `from .parts import *`
            head, _, rest = dotted.partition(".")
            return frozenset(
                QualifiedName(f"{star.name}.{rest}" if rest else star.name, star.source)
                for star in self._star_imported(cst.Name(head))
            )
        # libcst hands out the set of bindings of the scope that binds the name, so every
        # scope that sees the same bindings shares one answer (a module-level `torch`, or
        # `model.to` where `model` is bound hundreds of times).
        key = (id(bindings), dotted)
        found = self._by_dotted_name.get(key)
        if found is None:
            if prefix != dotted and len(bindings) > 1:
                # `try: import torch` / `except ImportError: torch = None`: an attribute of the
                # None fallback does not exist, so where `torch.save` is read and runs, the
                # import is the binding it reads.
                imported = self._imported.get(bindings, self._without_fallbacks)
            else:
                imported = bindings
            names: set = set()
            for binding in self._distinct.get(imported, _one_per_import):
                names |= binding.get_qualified_names_for(dotted)
            found = self._by_dotted_name[key] = (bindings, frozenset(names))  # the set is kept: its id stays unique
        return found[1]

    def _without_fallbacks(self, bindings: Collection[BaseAssignment]) -> Collection[BaseAssignment]:
        """`bindings` without the None fallbacks of an optional import, unless that leaves
        all of them or none."""
        fallbacks = self._none_fallbacks()
        imported = [b for b in bindings if not (isinstance(b, Assignment) and b.node in fallbacks)]
        return imported if imported and len(imported) < len(bindings) else bindings

    def _star_imported(self, node: cst.CSTNode) -> frozenset:
        """What a name that nothing in the file binds is called when the module imports
        with `from m import *`: `m.name`, for each such module (libcst leaves these reads
        unresolved)."""
        if not isinstance(node, cst.Name):
            return frozenset()
        if self._star_modules is None:
            self._star_modules = tuple(
                imported_from(statement)
                for statement, scope in self._scopes.items()
                if isinstance(statement, cst.ImportFrom)
                and isinstance(statement.names, cst.ImportStar)
                and isinstance(scope, GlobalScope)
            )
        resolve = self._star_member or (lambda module, name: None)
        return frozenset(
            QualifiedName(resolve(module, node.value) or member(module, node.value), QualifiedNameSource.IMPORT)
            for module in self._star_modules
        )

    def _names_of(self, referents: Collection[BaseAssignment]) -> frozenset:
        """The qualified names of a read's referents: a prefix of the bindings of its
        scope in order (built up once for all the reads of the name there), or a set of
        bindings shared by the reads."""
        if isinstance(referents, Span) and referents.start == 0:
            known = self._by_prefix.setdefault(id(referents.ordered), (referents.ordered, [frozenset()]))[1]
            for referent in islice(referents.ordered.items, len(known) - 1, referents.stop):
                known.append(known[-1] | self._referent_names(referent))
            return known[referents.stop]
        if not referents:
            return frozenset()
        return self._by_referents.get(referents, lambda found: frozenset().union(*map(self._referent_names, found)))

    def _referent_names(self, referent: BaseAssignment) -> frozenset:
        found = self._by_referent.get(referent)
        if found is None:
            found = self._by_referent[referent] = frozenset(referent.get_qualified_names_for(referent.name))
        return found

    def _none_fallbacks(self) -> set[cst.CSTNode]:
        """The names bound to `None` in an `except` handler (`X = None`), the fallback
        of an optional import."""
        if self._none_targets is None:
            found: set[cst.CSTNode] = set()
            is_handler = type_test(cst.ExceptHandler)  # (asked of every node of the file)
            for node in self._scopes:
                if is_handler(node):
                    lines = node.body.body if isinstance(node.body, cst.IndentedBlock) else [node.body]
                    for line in lines:
                        for statement in line.body if isinstance(line, cst.SimpleStatementLine) else ():
                            if (
                                isinstance(statement, cst.Assign)
                                and is_none(statement.value)
                                and all(isinstance(t.target, cst.Name) for t in statement.targets)
                            ):
                                found.update(t.target for t in statement.targets)
            self._none_targets = found
        return self._none_targets

    def _bindings(self) -> set[cst.CSTNode]:
        """The nodes libcst takes for a binding itself (`_is_assignment`): the bound
        name, def or class, and the names of import aliases."""
        if self._binding_nodes is None:
            found: set[cst.CSTNode] = set()
            for scope in {id(scope): scope for scope in self._scopes.values()}.values():
                for assignment in scope.assignments:
                    if not _is_assignment(assignment):
                        continue
                    found.add(assignment.node)
                    if isinstance(assignment.node, (cst.Import, cst.ImportFrom)) and not isinstance(
                        assignment.node.names, cst.ImportStar
                    ):
                        for alias in assignment.node.names:
                            found.add(alias.name)
                            if alias.asname is not None:
                                found.add(alias.asname.name)
            self._binding_nodes = found
        return self._binding_nodes

    def of(self, node: cst.CSTNode) -> set[str]:
        """Imported or builtin names the expression refers to. None when a name
        bound by an import is also bound in this file (`class DataLoader:` after
        `from torch.utils.data import DataLoader`): which one is live is unknown."""
        if _is_call(node):
            attribute = self._attribute_named(node)
            if attribute is not None:  # `getattr(torch.optim, "AdamW")` names what `torch.optim.AdamW` does
                return attribute
            node = node.func
            if isinstance(node, cst.Call):  # what a call returns is unknown, unless it is such a getattr
                return self._attribute_named(node) or set()
        return set(self._canonical(self._qualified(node)))

    def _canonical(self, qualified: frozenset) -> tuple[str, ...]:
        """The names of `of` for a set of qualified names, sorted; one answer per set (the
        sets are shared by every read of the same bindings)."""
        found = self._canonical_names.get(qualified)
        if found is None:
            if any(q.source is QualifiedNameSource.LOCAL for q in qualified):
                found = ()
            else:
                found = tuple(sorted({CANONICAL.get(q.name, q.name) for q in qualified}))
            self._canonical_names[qualified] = found
        return found

    def _attribute_named(self, call: cst.Call) -> set[str] | None:
        """The names of `torch.optim.AdamW` for `getattr(torch.optim, "AdamW")`; None
        for any other call."""
        args = call.args
        if len(args) != 2 or any(arg.keyword is not None or arg.star for arg in args):
            return None
        name = args[1].value
        if not isinstance(name, cst.SimpleString) or not self.is_(call.func, "builtins.getattr"):
            return None
        attribute = name.evaluated_value
        if not isinstance(attribute, str) or not attribute.isidentifier():
            return None
        return {CANONICAL.get(f"{owner}.{attribute}", f"{owner}.{attribute}") for owner in self.of(args[0].value)}

    def may_name(self, node: cst.CSTNode) -> set[str]:
        """The names `node` (an expression, or a call for the callee) may refer to: those of
        `of`, and for `getattr(nn, rnn_type)`, whose attribute is not a literal, the pattern
        `torch.nn.*` (any attribute of what `nn` names; see `torch_facts.autocast_float16`)."""
        found = set(self.of(node))
        for candidate in (node, node.func) if isinstance(node, cst.Call) else (node,):
            if (
                isinstance(candidate, cst.Call)
                and len(candidate.args) in (2, 3)
                and not any(arg.keyword is not None or arg.star for arg in candidate.args)
                and self._attribute_named(candidate) is None
                and self.is_(candidate.func, "builtins.getattr")
            ):
                found |= {f"{owner}.{ANY_ATTRIBUTE}" for owner in self.of(candidate.args[0].value)}
        return found

    def local(self, node: cst.CSTNode) -> set[str]:
        """Names defined in this file (classes, functions, variables) the expression refers to."""
        if isinstance(node, cst.Call):
            node = node.func
        return {q.name for q in self._qualified(node) if q.source is QualifiedNameSource.LOCAL}

    def is_(self, node: cst.CSTNode, *names: str) -> bool:
        if _is_call(node):
            return not self.of(node).isdisjoint(names)
        return any(name in names for name in self._canonical(self._qualified(node)))

    def startswith(self, node: cst.CSTNode, prefixes: Collection[str]) -> str | None:
        """The first qualified name of `node` that starts with one of `prefixes`."""
        if _is_call(node):
            names: Collection[str] = sorted(self.of(node))
        else:
            names = self._canonical(self._qualified(node))
        for name in names:
            if any(name == p or name.startswith(p + ".") for p in prefixes):
                return name
        return None


def kwarg(call: cst.Call, name: str) -> cst.Arg | None:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == name:
            return arg
    return None


def integer_value(expr: cst.BaseExpression | None) -> int | None:
    """The value of an integer literal in any spelling Python accepts (`3`, `-3`,
    `0x4`, `1_000`); None for anything else."""
    value = number_value(expr)
    return value if isinstance(value, int) else None


def number_value(expr: cst.BaseExpression | None) -> int | float | None:
    """The value of an integer or float literal, negated or not (`2`, `-0.5`,
    `0x4`, `1e-3`); None for anything else. Every literal number perfmod reads
    goes through here, so that no spelling reads differently in two places."""
    if isinstance(expr, (cst.Integer, cst.Float)):
        return expr.evaluated_value
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.expression, (cst.Integer, cst.Float)):
        if isinstance(expr.operator, cst.Minus):
            return -expr.expression.evaluated_value
        if isinstance(expr.operator, cst.Plus):
            return expr.expression.evaluated_value
    return None


def separated(items: Sequence) -> list:
    """New `items` (arguments, subscript elements) written `a, b, c`: a comma and a space
    after each but the last, no comma after the last."""
    items = list(items)
    spaced = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    return [item.with_changes(comma=spaced) for item in items[:-1]] + [
        item.with_changes(comma=cst.MaybeSentinel.DEFAULT) for item in items[-1:]
    ]


def integer_literal(value: int) -> cst.BaseExpression:
    """The code of an integer: `3`, `-3`."""
    literal = cst.Integer(str(abs(value)))
    return literal if value >= 0 else cst.UnaryOperation(cst.Minus(), literal)


# Expressions that bind tighter than any operator: safe as a receiver or an operand as they are.
_ATOMS = (
    cst.Name,
    cst.Attribute,
    cst.Call,
    cst.Subscript,
    cst.Integer,
    cst.Float,
    cst.SimpleString,
    cst.List,
    cst.Dict,
    cst.Set,
)


def atom(node: cst.BaseExpression) -> cst.BaseExpression:
    """`node` in parentheses unless it is an atom (or already parenthesized)."""
    if isinstance(node, _ATOMS) or node.lpar:
        return node
    return node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def code_of(node: cst.CSTNode) -> str:
    """The code libcst writes for `node`, a node of the file or one a rewrite builds."""
    return cst.Module([]).code_for_node(node)


# Expressions that bind no tighter than `and` and `not`: an operand of theirs in parentheses.
_LOOSE = (cst.BooleanOperation, cst.IfExp, cst.Lambda, cst.NamedExpr, cst.UnaryOperation)


def logic_operand(expr: cst.BaseExpression) -> cst.BaseExpression:
    """`expr` as an operand of `and` / `not`: in parentheses unless it binds tighter."""
    if isinstance(expr, _LOOSE) and not expr.lpar:
        return expr.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return expr


def conjunction(left: cst.BaseExpression, right: cst.BaseExpression) -> cst.BooleanOperation:
    """`left and right` (`a and b and c`: a conjunction on the left needs no parentheses)."""
    if not (isinstance(left, cst.BooleanOperation) and isinstance(left.operator, cst.And) and not left.lpar):
        left = logic_operand(left)
    return cst.BooleanOperation(left, cst.And(), logic_operand(right))


def negation(test: cst.BaseExpression) -> cst.BaseExpression:
    """`not test`, written as a reader would: `a == b` -> `a != b`, `not a` -> `a`."""
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1 and not test.lpar:
        target = test.comparisons[0]
        swap = {cst.Equal: cst.NotEqual, cst.NotEqual: cst.Equal}.get(type(target.operator))
        if swap is not None:
            operator = swap(
                whitespace_before=target.operator.whitespace_before, whitespace_after=target.operator.whitespace_after
            )
            return test.with_changes(comparisons=[target.with_changes(operator=operator)])
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return test.expression
    return cst.UnaryOperation(cst.Not(), logic_operand(test))


def is_self(expr: cst.BaseExpression | None) -> bool:
    """`self`, by the name every method of the file gives its instance."""
    return isinstance(expr, cst.Name) and expr.value == "self"


def is_dotted_name(node: cst.BaseExpression) -> bool:
    """`a.b.c` or `a`: a name the imports may resolve (not a method of a computed value)."""
    while isinstance(node, cst.Attribute):
        node = node.value
    return isinstance(node, cst.Name)


def plain_code(node: cst.CSTNode) -> str | None:
    """The code of a name or dotted name written without brackets or spaces (`model`,
    `self.opt`), as libcst generates it, read off the nodes without generating it; None
    for anything else."""
    if type(node) is cst.Name:
        return None if node.lpar else node.value
    if type(node) is not cst.Attribute or node.lpar or node.attr.lpar:
        return None
    dot = node.dot
    if not (
        type(dot.whitespace_before) is cst.SimpleWhitespace
        and type(dot.whitespace_after) is cst.SimpleWhitespace
        and not dot.whitespace_before.value
        and not dot.whitespace_after.value
    ):
        return None
    head = plain_code(node.value)
    return None if head is None else f"{head}.{node.attr.value}"


def positional(call: cst.Call, index: int) -> cst.Arg | None:
    """The `index`-th positional argument, or None (also when a *args hides positions)."""
    plain = []
    for arg in call.args:
        if arg.keyword is not None or arg.star == "**":
            continue
        if arg.star == "*":
            return None
        plain.append(arg)
    return plain[index] if index < len(plain) else None


def has_star_kwargs(call: cst.Call) -> bool:
    return any(arg.star == "**" for arg in call.args)


def method_name(call: cst.Call) -> str | None:
    """`attr` for a call `<receiver>.attr(...)`."""
    if _is_attribute(call.func):
        return call.func.attr.value
    return None


def with_kwarg(call: cst.Call, name: str, value: cst.BaseExpression) -> cst.Call:
    """`call` with `name=value` appended, keeping the layout of the argument list."""
    new_arg = cst.Arg(
        keyword=cst.Name(name),
        value=value,
        equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")),
    )
    return call.with_changes(args=appended(call.args, new_arg, call.whitespace_before_args))


def dict_entry(literal: cst.Dict, key: str) -> cst.BaseExpression | None:
    """The value of the string key `key` in a dict literal, or None."""
    for element in literal.elements:
        if (
            isinstance(element, cst.DictElement)
            and isinstance(element.key, cst.SimpleString)
            and element.key.evaluated_value == key
        ):
            return element.value
    return None


def with_entry(literal: cst.Dict, key: str, value: cst.BaseExpression) -> cst.Dict:
    """`literal` with `key: value` appended, in the quotes of its other keys and the
    layout of its entries (after a trailing comma, one entry a line, it goes on a line of
    its own)."""
    elements = literal.elements
    first = elements[0].key if elements and isinstance(elements[0], cst.DictElement) else None
    quote = "'" if isinstance(first, cst.SimpleString) and first.value.startswith("'") else '"'
    entry = cst.DictElement(key=cst.SimpleString(f"{quote}{key}{quote}"), value=value)
    closing = literal.rbrace.whitespace_before  # a dict's last line break is its closing brace's
    last = elements[-1] if elements else None
    template = (
        elements[-2].comma.whitespace_after
        if len(elements) >= 2 and elements[-2].comma
        else literal.lbrace.whitespace_after
    )
    if (
        isinstance(last, cst.DictElement)
        and isinstance(last.comma, cst.Comma)
        and isinstance(closing, cst.ParenthesizedWhitespace)
        and isinstance(template, cst.ParenthesizedWhitespace)
    ):  # one entry a line: the new one on a line of its own, as `appended` does for calls
        between = template.with_changes(first_line=closing.first_line, empty_lines=[])
        rows = [*elements[:-1], last.with_changes(comma=last.comma.with_changes(whitespace_after=between))]
        rows.append(entry.with_changes(comma=last.comma))
        rbrace = literal.rbrace.with_changes(
            whitespace_before=closing.with_changes(first_line=cst.TrailingWhitespace())
        )
        return literal.with_changes(elements=rows, rbrace=rbrace)
    return literal.with_changes(elements=appended(elements, entry, literal.lbrace.whitespace_after))


def string_quote_at(index, node: cst.CSTNode) -> str | None:
    """The quote a string literal written at `node` can use and still compile under
    Python 3.10 (the oldest perfmod supports): before Python 3.12 (PEP 701) the braces
    of an f-string cannot hold the f-string's own quote character. `"` unless an
    enclosing f-string uses it, else `'`; None inside f-strings that use both."""
    used = {string.start[-1] for string in index.enclosing(node, cst.FormattedString)}
    return next((quote for quote in ('"', "'") if quote not in used), None)


def subscript_parts(subscript: cst.Subscript) -> list[cst.BaseExpression]:
    """What `subscript` reads: the subscripted value, then each index and slice bound."""
    parts = [subscript.value]
    for element in subscript.slice:
        if isinstance(element.slice, cst.Index):
            parts.append(element.slice.value)
        else:
            parts.extend(p for p in (element.slice.lower, element.slice.upper, element.slice.step) if p is not None)
    return parts


def appended(items: Sequence, new, opening: cst.BaseParenthesizableWhitespace) -> list:
    """`items` (arguments, dict entries: nodes with a `comma`) with `new` added last,
    in their layout: `f(a)` -> `f(a, new)`; after a trailing comma (often one item
    a line), or where the items before the last stand one a line, `new` goes on a
    line of its own, spaced like the item before it, or like the bracket (`opening`,
    the whitespace after it) for a single item."""
    items = list(items)
    if not items:
        return [new]
    last = items[-1]
    if last.comma is cst.MaybeSentinel.DEFAULT or last.comma is None:
        # (a fix may have built the items before the last without a comma of their own)
        breaks = [item.comma.whitespace_after if isinstance(item.comma, cst.Comma) else None for item in items[:-1]]
        before = breaks[-1] if breaks else None
        if breaks and all(isinstance(b, cst.ParenthesizedWhitespace) for b in breaks):
            # one item a line, the last one closing the bracket (`shuffle=True)` under the
            # arguments it is aligned with): the new one on a line of its own, aligned too
            between = before.with_changes(first_line=cst.TrailingWhitespace(), empty_lines=[])
        else:
            between = cst.SimpleWhitespace(" ")
        items[-1] = last.with_changes(comma=cst.Comma(whitespace_after=between))
        if isinstance(last, cst.Arg) and isinstance(new, cst.Arg):
            # the line break before a closing `)` on its own line stays before it
            items[-1] = items[-1].with_changes(whitespace_after_arg=cst.SimpleWhitespace(""))
            new = new.with_changes(whitespace_after_arg=last.whitespace_after_arg)
        return [*items, new]
    after = last.comma.whitespace_after  # up to the closing bracket
    template = items[-2].comma.whitespace_after if len(items) >= 2 else opening
    if isinstance(after, cst.ParenthesizedWhitespace) and isinstance(template, cst.ParenthesizedWhitespace):
        # A line of its own, indented like the item before; the comment at the end of the
        # last item's line stays there, the comment lines above the item before are not
        # copied, and the lines before the closing bracket stay before it.
        between = template.with_changes(first_line=after.first_line, empty_lines=[])
        new = new.with_changes(
            comma=last.comma.with_changes(whitespace_after=after.with_changes(first_line=cst.TrailingWhitespace()))
        )
    else:
        new = new.with_changes(comma=last.comma)
        between = template if isinstance(after, cst.ParenthesizedWhitespace) else cst.SimpleWhitespace(" ")
    items[-1] = last.with_changes(comma=cst.Comma(whitespace_after=between))
    return [*items, new]


class _Reads(cst.CSTVisitor):
    """Names whose value is read: not assignment targets, attribute or keyword names."""

    def __init__(self) -> None:
        self.names: list[cst.Name] = []

    def visit_Name(self, node: cst.Name) -> None:
        self.names.append(node)

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        node.value.visit(self)
        return False

    def visit_Arg(self, node: cst.Arg) -> bool:
        node.value.visit(self)
        return False

    def visit_AssignTarget(self, node: cst.AssignTarget) -> bool:
        return False

    def visit_AsName(self, node: cst.AsName) -> bool:
        return False

    def visit_AnnAssign(self, node: cst.AnnAssign) -> bool:
        if node.value is not None:
            node.value.visit(self)
        return False

    def visit_AugAssign(self, node: cst.AugAssign) -> bool:
        node.value.visit(self)
        return False

    def visit_NamedExpr(self, node: cst.NamedExpr) -> bool:
        node.value.visit(self)
        return False

    def visit_For(self, node: cst.For) -> bool:
        for part in (node.iter, node.body, node.orelse):
            if part is not None:
                part.visit(self)
        return False

    def visit_CompFor(self, node: cst.CompFor) -> bool:
        for part in (node.iter, *node.ifs, node.inner_for_in):
            if part is not None:
                part.visit(self)
        return False


def imported_from(statement: cst.ImportFrom) -> str:
    """The module a `from ... import` reads, as written: `pkg.models`, `.resnet`, `.`."""
    module = cst.Module([]).code_for_node(statement.module) if statement.module is not None else ""
    return "." * len(statement.relative) + module


def member(module: str, name: str) -> str:
    """The dotted name of `name` in `module` (`.` + `x` is `.x`, not `..x`)."""
    return f"{module}{name}" if module.endswith(".") else f"{module}.{name}"


def fresh_name(base: str, taken: set[str]) -> str:
    """`base`, or `base_2`, `base_3`, ...: the first not in `taken` (which it joins), for a
    name a rewrite introduces."""
    candidate, number = base, 2
    while candidate in taken:
        candidate, number = f"{base}_{number}", number + 1
    taken.add(candidate)
    return candidate


def stored_targets(targets: list[cst.BaseExpression]) -> list[cst.BaseExpression]:
    """What assignment `targets` store to, through the tuples, lists and starred elements
    of `a.x, (b[i], *c) = ...`: names, attributes and subscripts."""
    found, pending = [], list(targets)
    while pending:
        target = pending.pop()
        if isinstance(target, (cst.Tuple, cst.List)):
            pending += [element.value for element in target.elements]
        elif isinstance(target, cst.StarredElement):
            pending.append(target.value)
        else:
            found.append(target)
    return found


def names_read(node: cst.CSTNode) -> list[cst.Name]:
    """Names whose value `node` reads (not targets, attribute or keyword names)."""
    reads = _Reads()
    node.visit(reads)
    return reads.names


def methods_of(classdef: cst.ClassDef) -> dict[str, cst.FunctionDef]:
    """The methods a class body defines, by name (of two definitions, the last: Python's)."""
    return {
        statement.name.value: statement for statement in classdef.body.body if isinstance(statement, cst.FunctionDef)
    }


def sole_definition(scopes, expr: cst.BaseExpression, kind: type) -> cst.CSTNode | None:
    """The `def` or `class` statement of this file (`kind`) that the Name `expr`
    refers to, when that statement is the name's only binding."""
    if not isinstance(expr, cst.Name):
        return None
    scope = scopes.get(expr)
    if scope is None:
        return None
    found = [a.node for a in scope[expr.value] if _is_assignment(a)]
    return found[0] if len(found) == 1 and isinstance(found[0], kind) else None


def is_main_guard(test: cst.BaseExpression) -> bool:
    """`__name__ == "__main__"` (either way round)."""
    if not (
        isinstance(test, cst.Comparison)
        and len(test.comparisons) == 1
        and isinstance(test.comparisons[0].operator, cst.Equal)
    ):
        return False
    sides = [test.left, test.comparisons[0].comparator]
    names = [s for s in sides if isinstance(s, cst.Name) and s.value == "__name__"]
    strings = [s for s in sides if isinstance(s, cst.SimpleString) and s.evaluated_value == "__main__"]
    return len(names) == 1 and len(strings) == 1


def compound_keyword(statement: cst.CSTNode) -> str:
    """The keyword that opens a compound statement (`if`, `try`, `with`, `for`, ...)."""
    keywords = {cst.If: "if", cst.Try: "try", cst.With: "with", cst.For: "for", cst.While: "while"}
    return keywords.get(type(statement), type(statement).__name__.lower())
