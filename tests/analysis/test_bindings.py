"""Bindings: the syntax behind a name, on small programs. Each case marks the
name under test with `probe(...)`."""

import libcst as cst
import libcst.matchers as m
import pytest
from libcst.metadata import MetadataWrapper, ParentNodeProvider, ScopeProvider

from codemod.analysis.bindings import Bindings, argument_for, returned_values
from codemod.analysis.loops import calls_in


def probed(code: str) -> tuple[Bindings, cst.Module, cst.BaseExpression]:
    wrapper = MetadataWrapper(cst.parse_module(code))
    bindings = Bindings(wrapper.resolve(ScopeProvider), wrapper.resolve(ParentNodeProvider))
    probes = [node.args[0].value for node in _calls(wrapper.module) if getattr(node.func, "value", None) == "probe"]
    assert len(probes) == 1
    return bindings, wrapper.module, probes[0]


def _calls(module: cst.Module) -> list[cst.Call]:
    return m.findall(module, m.Call())


def code_of(module: cst.Module, nodes) -> list[str]:
    return [module.code_for_node(node) for node in nodes]


@pytest.mark.parametrize(
    "code, values",
    [
        ("x = 1\nif c:\n    x = f()\nprobe(x)\n", ["1", "f()"]),
        ("x: int = 2\nprobe(x)\n", ["2"]),
        ("a, x = g()\nprobe(x)\n", None),  # unpacked: not a plain value
        ("import x\nprobe(x)\n", None),
        ("for x in range(3):\n    probe(x)\n", None),
        ("def f(x):\n    probe(x)\n", None),
    ],
)
def test_values_are_plain_assignments_only(code, values):
    bindings, module, name = probed(code)
    found = bindings.values(name)
    assert (code_of(module, found) if found is not None else None) == values


def test_unpacked_gives_the_value_and_the_index():
    bindings, module, name = probed("a, x = g()\nprobe(x)\n")
    [assignment] = bindings.assignments(name)
    value, index = bindings.unpacked(assignment)
    assert (module.code_for_node(value), index) == ("g()", 1)
    bindings, _, name = probed("*a, x = g()\nprobe(x)\n")
    assert bindings.unpacked(bindings.assignments(name)[0]) is None


def test_helpers_functions_parameters_and_call_arguments():
    code = (
        "def make(ds, bs=1, *, shuffle=False):\n"
        "    def inner():\n"
        "        return hidden()\n"
        "    if bs:\n"
        "        return build(ds, bs)\n"
        "    return None\n"
        "def use(p):\n"
        "    probe(p)\n"
        "r = make(data, 4, shuffle=True)\n"
    )
    bindings, module, name = probed(code)
    function, param = bindings.param_of(name)
    assert function.name.value == "use" and param.name.value == "p"
    call = [c for c in _calls(module) if getattr(c.func, "value", None) == "make"][0]
    make = bindings.local_function(call.func)
    assert make is not None and code_of(module, returned_values(make)) == ["build(ds, bs)", "None"]
    ds, bs, shuffle = (make.params.params[0], make.params.params[1], make.params.kwonly_params[0])
    assert [module.code_for_node(argument_for(call, make, p)) for p in (ds, bs, shuffle)] == ["data", "4", "True"]
    starred = cst.parse_expression("make(*args)")
    assert argument_for(starred, make, ds) is None
    assert [module.code_for_node(c.func) for c in calls_in(make.body)] == ["build"]  # not those of inner()
