"""The command-line options a file declares with argparse: for each destination
(`args.lr`), the `add_argument` call that declares it, its `default=` and its
`choices=`. Analyses read a setting through here (the value a script runs with
as written is its option's default; the values it may run with are its choices,
or anything where it has none).

A destination declared twice (two parsers, or a flag and a `dest=` of the same
name) is left unknown: which one a run parses cannot be told from the file.

Public API (reached as `context.command_line`):
- `option(dest)`: the `Option` stored in `args.<dest>`.
- `option_at(expr)`: the `Option` that `args.<dest>` reads, where `args` is bound only to
  the namespace of options (`parses`).
- `parses(expr)`: is `expr` the namespace of options: `parser.parse_args()`,
  `parser.parse_known_args()[0]`, or a call of a function of this file every
  `return` of which hands back one (`def get_args(): ...; return p.parse_args()`,
  directly or through a name bound to it in that function).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import libcst as cst

from codemod.analysis.bindings import returned_values
from codemod.analysis.names import kwarg, method_name, sole_definition

if TYPE_CHECKING:
    from codemod.context import FileContext

PARSE_METHODS = ("parse_args", "parse_known_args")


class Option(NamedTuple):
    call: cst.Call  # the add_argument call
    default: cst.BaseExpression | None  # its `default=`; None where it has none
    choices: tuple[cst.BaseExpression, ...] | None  # the literal `choices=`; None where any value goes
    converter: cst.BaseExpression | None = None  # its `type=` (`int`); None where it has none
    single: bool = False  # stores one value: no `nargs=`, no `action=` other than "store"
    required: bool = False  # `required=True`: a run that leaves it out stops


class CommandLine:
    def __init__(self, context: FileContext) -> None:
        self._context = context
        self._parsing: dict[int, bool] = {}
        declared: dict[str, list[cst.Call]] = {}
        for call in context.index.find(cst.Call):
            if method_name(call) == "add_argument" and call.args:
                dest = _destination(call)
                if dest is not None:
                    declared.setdefault(dest, []).append(call)
        self._options = {dest: _option(calls[0]) for dest, calls in declared.items() if len(calls) == 1}

    def option(self, dest: str) -> Option | None:
        """The option stored in `args.<dest>`, when one `add_argument` of this file declares it."""
        return self._options.get(dest)

    def option_at(self, expr: cst.BaseExpression) -> Option | None:
        """The option `expr` (`args.bs`) reads: `args` is bound only to the namespace of
        options, and one `add_argument` of this file declares `bs`."""
        if not isinstance(expr, cst.Attribute) or not isinstance(expr.value, cst.Name):
            return None
        sources = self._context.kinds.value_sources(expr.value)
        if not sources or not all(self.parses(source) for source in sources):
            return None
        return self.option(expr.attr.value)

    def parses(self, expr: cst.BaseExpression | None) -> bool:
        """Is `expr` the namespace of options: a parse call, or a call of a function of
        this file that returns one (`args = get_args()`)?"""
        if expr is None:
            return False
        if is_parse_call(expr):
            return True
        if not isinstance(expr, cst.Call) or expr.args:
            return False
        function = sole_definition(self._context.scopes, expr.func, cst.FunctionDef)
        return function is not None and self._returns_namespace(function)

    def _returns_namespace(self, function: cst.FunctionDef) -> bool:
        """Does every `return` of `function` hand back the namespace of options?"""
        key = id(function)
        if key not in self._parsing:
            self._parsing[key] = False  # a function that calls itself returns nothing known
            values = returned_values(function)
            self._parsing[key] = bool(values) and all(self._namespace_in(v) for v in values)
        return self._parsing[key]

    def _namespace_in(self, value: cst.BaseExpression) -> bool:
        """`value`, returned by a function, is a parse call, or a name bound only to one
        (`args = p.parse_args(); return args`)."""
        if not isinstance(value, cst.Name):
            return self.parses(value)
        bound = self._context.bindings.values(value)
        return bool(bound) and all(self.parses(v) for v in bound)


def is_parse_call(expr: cst.BaseExpression) -> bool:
    """`parser.parse_args()`, `parser.parse_known_args()[0]`: the namespace of options."""
    if isinstance(expr, cst.Subscript) and isinstance(expr.value, cst.Call):
        return method_name(expr.value) == "parse_known_args"
    return isinstance(expr, cst.Call) and method_name(expr) in PARSE_METHODS


def _destination(call: cst.Call) -> str | None:
    """argparse's dest: `dest=`, else the first long flag (`--max-lr` -> `max_lr`), else the
    first short flag, else the positional name."""
    stored = kwarg(call, "dest")
    if stored is not None:
        value = stored.value.evaluated_value if isinstance(stored.value, cst.SimpleString) else None
        return value if isinstance(value, str) else None
    flags = [
        a.value.evaluated_value
        for a in call.args
        if a.keyword is None and isinstance(a.value, cst.SimpleString) and isinstance(a.value.evaluated_value, str)
    ]
    if not flags:
        return None
    chosen = next((f for f in flags if f.startswith("--")), flags[0])
    return chosen.lstrip("-").replace("-", "_") or None


def _option(call: cst.Call) -> Option:
    default = kwarg(call, "default")
    choices = kwarg(call, "choices")
    literal = (
        choices is not None
        and isinstance(choices.value, (cst.List, cst.Tuple, cst.Set))
        and all(isinstance(e, cst.Element) for e in choices.value.elements)
    )
    converter, action, required = kwarg(call, "type"), kwarg(call, "action"), kwarg(call, "required")
    stores = action is None or (isinstance(action.value, cst.SimpleString) and action.value.evaluated_value == "store")
    return Option(
        call,
        default.value if default is not None else None,
        tuple(e.value for e in choices.value.elements) if literal else None,
        converter.value if converter is not None else None,
        stores and kwarg(call, "nargs") is None,
        required is not None and isinstance(required.value, cst.Name) and required.value.value == "True",
    )
