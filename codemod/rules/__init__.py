"""The rule catalogue, discovered: every module of this package that defines a
`Rule` subclass with a CODE contributes it. Add a rule by adding a module."""

from __future__ import annotations

import importlib
import pkgutil

from codemod.rule import Rule


def discover() -> list[type[Rule]]:
    """Every rule of this package's modules, by code (afresh: the lists below are the
    registry, which tests may pin)."""
    found: dict[str, type[Rule]] = {}
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, Rule)
                and value.__module__ == module.__name__
                and "CODE" in value.__dict__
            ):
                if value.CODE in found:
                    raise ImportError(f"rule code {value.CODE} is defined twice: {found[value.CODE]} and {value}")
                found[value.CODE] = value
    return sorted(found.values(), key=lambda rule: rule.CODE)


ALL_RULES: list[type[Rule]] = discover()
RULES_BY_CODE: dict[str, type[Rule]] = {rule.CODE: rule for rule in ALL_RULES}
