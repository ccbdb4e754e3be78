"""Bindings: the syntax behind a name, on small programs. Each case marks the
name under test with `probe(...)`."""

import libcst as cst
import libcst.matchers as m
import pytest

from codemod.analysis.bindings import Bindings, argument_for, returned_values
from codemod.analysis.loops import calls_in
from codemod.context import FileContext


def probed(code: str) -> tuple[Bindings, cst.Module, cst.BaseExpression]:
    context = FileContext.of_source(code)
    probes = [node.args[0].value for node in _calls(context.module) if getattr(node.func, "value", None) == "probe"]
    assert len(probes) == 1
    return context.bindings, context.module, probes[0]


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
    "code, once",
    [
        ("device = pick()\nmodel.to(device)\nopt = build()\n", True),
        ("device = pick()\nmodel.to(device)\nif c:\n    device = other()\nopt = build()\n", False),  # bound again
        ("def f(device):\n    model.to(device)\ndevice = pick()\nopt = build()\n", False),  # another function's
        ("def f(device):\n    model.to(device)\n    opt = build()\n", True),  # a parameter, read where it is bound
    ],
)
def test_a_name_bound_once_in_the_scope_of_another_node(code, once):
    context = FileContext.of_source(code)
    device = [c for c in _calls(context.module) if context.source(c.func) == "model.to"][0].args[0].value
    [build] = [c for c in _calls(context.module) if context.source(c.func) == "build"]
    assert context.bindings.bound_once_where(device, build) is once


def test_the_statements_a_block_runs_before_new_code_can_read_a_name():
    context = FileContext.of_source(
        'import torch\ndef main():\n    """Doc."""\n    x = 1\n    import torch\n    y = 2\ndef other():\n    x = 1\n'
    )
    main, other = (s for s in context.module.body if isinstance(s, cst.FunctionDef))
    assert context.bindings.prefix_binding(list(main.body.body), ["torch"]) == 3  # its own import
    assert context.bindings.prefix_binding(list(main.body.body), ["os"]) == 0
    assert context.bindings.prefix_binding(list(other.body.body), ["torch"]) == 0  # the module's import
    assert context.bindings.prefix_binding(list(context.module.body), ["torch"]) == 1


def test_the_values_assigned_to_an_attribute_spelled_alike():
    context = FileContext.of_source(
        "args = parse()\nargs.cuda = torch.cuda.is_available()\nif x:\n    args.cuda = False\n"
        "other.cuda = True\na = b.cuda = 1\nprobe(args.cuda)\n"
    )
    [probe] = [c for c in _calls(context.module) if getattr(c.func, "value", None) == "probe"]
    values = context.bindings.attribute_assignments(probe.args[0].value)
    assert code_of(context.module, values) == ["torch.cuda.is_available()", "False"]


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
