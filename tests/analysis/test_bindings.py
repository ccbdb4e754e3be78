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


@pytest.mark.parametrize(
    "code, reads",
    [
        # every read either binding reaches, each once (libcst links the last one to both)
        ("h = reg()\nif c:\n    h = reg()\nh.remove()\nprobe(h)\n", ["h", "h"]),
        ("for h in hs:\n    h.remove()\nprobe(h)\n", ["h", "h"]),
        ("with s() as h:\n    pass\nprobe(h)\n", ["h"]),
        ("def f(h):\n    probe(h)\n", None),  # a parameter: bound by each caller
        ("import h\nprobe(h)\n", None),
    ],
)
def test_the_reads_of_a_variable_bound_by_plain_names_only(code, reads):
    bindings, module, probe = probed(code)
    found = bindings.reads(probe)
    assert (None if found is None else code_of(module, found)) == reads
    if reads is not None:
        assert [a.node.value for a in bindings.name_bindings(probe)] == ["h"] * len(bindings.name_bindings(probe))


def test_a_variable_is_the_same_for_each_use_and_another_in_another_function():
    code = "def f():\n    h = reg()\n    h.remove()\n\ndef g():\n    h = reg()\n    probe(h)\n"
    bindings, module, probe = probed(code)
    f, g = [d for d in module.body if isinstance(d, cst.FunctionDef)]
    in_f = [n for n in m.findall(f, m.Name("h"))]
    in_g = [n for n in m.findall(g, m.Name("h"))]
    assert bindings.variable(in_f[0]) == bindings.variable(in_f[1]) != bindings.variable(probe)
    assert {bindings.variable(n) for n in in_g} == {bindings.variable(probe)}
