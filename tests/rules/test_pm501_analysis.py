"""PM501's analysis: which registrations are per call, which handles it can follow
to their removal, which it registers once in `__init__`, and why it reports the others
without a fix."""

import textwrap

import pytest

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level
from codemod.rules.per_call_hook_registration import PerCallHookRegistration

HEADER = "import contextlib\nimport torch\nmodel = torch.nn.Linear(2, 2)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"


FIXED, PER_CALL, ESCAPES = "fixed", "per call", "escapes"


def findings(body: str) -> list[tuple[int, str]]:
    """(line in `body`, what became of it) of each PM501 finding: FIXED; PER_CALL, reported
    as registered and removed on every call; ESCAPES, reported as a handle it cannot follow."""
    source = HEADER + textwrap.dedent(body)
    settings = Settings(select=("PM501",), level=Level.UNSAFE)
    result = process_source(source.encode(), "t.py", settings, [PerCallHookRegistration])
    assert result.error is None, result.error
    offset = HEADER.count("\n")
    return [(f.line - offset, _kind(f)) for f in result.findings]


def _kind(finding) -> str:
    if finding.fixable:
        return FIXED
    if "registered and removed on every call, but" in finding.message:
        return PER_CALL
    assert "stored or used other than by" in finding.message, finding.message
    return ESCAPES


TRAIN = """\
for x in [torch.randn(1, 2)]:
{body}    model(x).sum().backward()
    opt.step()
"""


def in_loop(body: str) -> str:
    return TRAIN.format(body=textwrap.indent(textwrap.dedent(body), "    "))


@pytest.mark.parametrize(
    "body",
    [
        "h = model.register_forward_hook(print)\nh.remove()\n",
        "with model.register_forward_pre_hook(print):\n    model(x)\n",
        "hs = [model.register_forward_hook(print)]\nhs.append(model.register_forward_hook(print))\n"
        "for h in hs:\n    h.remove()\nhs.clear()\n",
        "hs = []\nhs += [model.register_forward_hook(print) for _ in range(2)]\nfor h in hs:\n    h.remove()\n",
        "h = model.register_forward_hook(print, with_kwargs=True)\ntry:\n    model(x)\nfinally:\n    h.remove()\n",
        "h = model.register_forward_hook(hook=print)\nh.remove()\n",
        "hs = {}\nhs['a'] = model.register_forward_hook(print)\nfor h in hs.values():\n    h.remove()\n",
        "hs = dict()\nhs[0] = model.register_forward_hook(print)\nfor k, h in hs.items():\n    h.remove()\n",
        "hs = {}\nh = model.register_forward_hook(print)\nhs['a'] = h\nhs['a'].remove()\n",
        "hs = []\nh = model.register_forward_hook(print)\nhs.append(h)\nwhile hs:\n    hs.pop().remove()\n",
        "hs = []\nhs.append(model.register_forward_pre_hook(print))\n[h.remove() for h in hs]\n",
        "hs = []\nhs.append(model.register_forward_hook(print))\nfor h in reversed(hs):\n    h.remove()\n",
        "hs: list = []\nh = model.register_forward_hook(print)\nhs.append(h)\nfor h in hs:\n    h.remove()\n",
        "hs: dict = {}\nhs['a'] = model.register_forward_hook(print)\nfor h in hs.values():\n    h.remove()\n",
        "h = model.register_forward_hook(print, always_call=True)\nh.remove()\n",
        "h = model.register_forward_hook(print, prepend=True)\nh.remove()\n",
        "kw = {}\nh = model.register_forward_hook(print, **kw)\nh.remove()\n",
    ],
)
def test_followed_handles_are_reported_as_registered_per_call(body):
    """In a training loop: followed to their removal, reported with that reason."""
    found = findings(in_loop(body))
    assert found and all(kind == PER_CALL for _, kind in found)


@pytest.mark.parametrize(
    "body,why",
    [
        ("h = model.register_forward_hook(print)\nprint(h.id)\nh.remove()\n", "the handle is read"),
        ("hs = {}\nhs['a'] = model.register_forward_hook(print)\nfor h in hs.values():\n    print(h)\n", "a dict read"),
        ("hs = {}\nhs['a'] = model.register_forward_hook(print)\nreturn_later = hs\n", "a dict aliased"),
        ("hs = [model.register_forward_hook(print)]\nkeep = hs\nfor h in hs:\n    h.remove()\n", "the list is aliased"),
    ],
)
def test_handles_it_cannot_follow_are_reported_as_such(body, why):
    found = findings(in_loop(body))
    assert found and all(kind == ESCAPES for _, kind in found), why


def test_forward_and_context_manager_functions_are_per_call():
    assert findings("""\
        class Net(torch.nn.Module):
            def forward(self, x):
                h = model.register_forward_hook(print)
                out = model(x)
                h.remove()
                return out
        @contextlib.contextmanager
        def probe(m):
            handle = m.register_forward_pre_hook(print)
            try:
                yield
            finally:
                handle.remove()
        @contextlib.contextmanager
        def leaking(m):
            handles = [m.register_forward_hook(print)]
            try:
                yield handles
            finally:
                for h in handles:
                    h.remove()
    """) == [(3, PER_CALL), (9, PER_CALL), (16, ESCAPES)]


CAPTURE = """\
@contextlib.contextmanager
def capture(module, store):
    handle = module.register_forward_hook(lambda m, a, out: store.append(out.detach()))
    try:
        yield store
    finally:
        handle.remove()
for step in range(30):
    model(torch.randn(1, 2)).sum().backward()
    opt.step()
    {guard}
        feats = []
        with torch.no_grad(), capture(model, feats):
            model(torch.randn(1, 2))
        h = model.register_forward_pre_hook(print)
        h.remove()
"""


@pytest.mark.parametrize(
    "guard,found",
    [
        ("if step >= 0:", [(3, PER_CALL), (15, PER_CALL)]),
        ("if step % 10 == 9:", []),  # blind11: an evaluation capture, every ten steps
        ("if (step + 1) % 10 == 0 and step > 0:", []),
    ],
)
def test_hooks_registered_only_every_few_steps_are_not_per_call(guard, found):
    assert findings(CAPTURE.format(guard=guard)) == found


def test_registrations_of_unknown_frequency_or_never_removed_are_left_alone():
    assert (
        findings("""\
        def attach(m):
            h = m.register_forward_hook(print)
            model(torch.randn(1, 2))
            h.remove()
        def make_hooks(m):
            return [m.register_forward_hook(print)]
        class Net(torch.nn.Module):
            def forward(self, x):
                helper = lambda: model.register_forward_hook(print)
                self.net.register_forward_hook(print)
                return x
        registry = {}
        for name, layer in model.named_children():
            registry[name] = layer.register_forward_hook(print)
    """)
        == []
    )


def test_suppression():
    assert findings(in_loop("h = model.register_forward_hook(print)  # perfmod: ignore[PM501]\nh.remove()\n")) == []


def test_hooks_entered_into_an_exit_stack_are_removed_by_its_with():
    assert findings(
        in_loop("""\
        with contextlib.ExitStack() as stack:
            stack.enter_context(model.register_forward_hook(print))
            model(x)
    """)
    ) == [(3, PER_CALL)]
    assert findings(
        in_loop("""\
        with contextlib.ExitStack() as stack:
            stack.enter_context(model.register_forward_hook(print))
            later = stack.pop_all()
    """)
    ) == [(3, ESCAPES)]  # the hooks outlive the with: reported


def reasons(body: str) -> list[str]:
    source = HEADER + textwrap.dedent(body)
    settings = Settings(select=("PM501",), level=Level.UNSAFE)
    result = process_source(source.encode(), "t.py", settings, [PerCallHookRegistration])
    assert result.error is None, result.error
    return [f.message if not f.fixable else FIXED for f in result.findings]


def test_a_context_manager_whose_handles_go_through_a_local_name_into_an_annotated_list():
    """goodfire-ai/spd's `_attach_forward_hooks`: `handle = m.register_forward_hook(...)`,
    `handles.append(handle)` into `handles: list[RemovableHandle] = []`, removed in
    `finally`: followed to the removal (not "stored or used other than by .remove()")."""
    found = reasons("""\
        class ComponentModel(torch.nn.Module):
            @contextlib.contextmanager
            def _attach_forward_hooks(self, hooks: dict):
                handles: list[torch.utils.hooks.RemovableHandle] = []
                for module_name, hook in hooks.items():
                    target_module = self.target_model.get_submodule(module_name)
                    handle = target_module.register_forward_hook(hook, with_kwargs=True)
                    handles.append(handle)
                try:
                    yield
                finally:
                    for handle in handles:
                        handle.remove()
    """)
    assert len(found) == 1 and "registered and removed on every call, but it is registered in the " in found[0]
    assert (
        "`@contextmanager` helper `_attach_forward_hooks`" in found[0] and "(`hooks`, given by the caller)" in found[0]
    )


FORWARD = """\
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(2, 2)])
        self.seen = {{}}

    def forward(self, x{params}):
{body}        try:
            for layer in self.layers:
                x = layer(x)
            return x
        finally:
            for h in handles:
                h.remove()
"""


def in_forward(body: str, params: str = "") -> str:
    return FORWARD.format(params=params, body=textwrap.indent(textwrap.dedent(body), "        "))


@pytest.mark.parametrize(
    "body,params,why",
    [
        ("handles = []\nfor layer in self.layers:\n    handles.append(layer.register_forward_hook(print))\n", "", None),
        (
            "handles = []\nfor i, layer in enumerate(self.layers):\n"
            "    handles.append(layer.register_forward_hook(lambda m, a, o, i=i: self.seen.update({i: o})))\n",
            "",
            None,
        ),
        (
            "handles = []\nfor layer in self.layers:\n    handles.append(layer.register_forward_hook(lambda m, a, o: o * s))\n",
            ", s=1.0",
            "it depends on `s`, a value of the call",
        ),
        (
            "handles = []\nfor layer in self.layers:\n"
            "    handles.append(layer.register_forward_hook(lambda m, a, o: o + x.mean()))\n",
            "",
            "it depends on `x`, a value of the call",
        ),
        (
            "handles = []\nfor layer in self.layers:\n    print(layer)\n    handles.append(layer.register_forward_hook(print))\n",
            "",
            "`print(layer)` may have side effects",
        ),
        ("handles = [layer.register_forward_hook(print) for layer in self.layers]\n", "", None),
        (
            "handles = [layer.register_forward_hook(print) for layer in self.layers if layer.bias is not None]\n",
            "",
            "its handles are kept other than by `h = ...`, `handles.append(...)` or a list comprehension",
        ),
        (
            "x = self.layers[0](x)\nhandles = []\nhandles.append(self.layers[0].register_forward_hook(print))\n",
            "",
            "`forward` runs other code before registering it",  # that call of the layer runs without the hook
        ),
    ],
)
def test_forward_registers_once_in_init_only_the_same_hooks_on_every_call(body, params, why):
    found = reasons(in_forward(body, params))
    assert len(found) == 1
    if why is None:
        assert found == [FIXED]
    else:
        assert why in found[0], found[0]


def test_an_attribute_forward_reads_that_another_method_assigns_keeps_the_hooks_per_call():
    source = in_forward(
        "handles = []\nfor layer in self.layers:\n    handles.append(layer.register_forward_hook(print))\n"
    )
    source += "\n    def prune(self):\n        self.layers = self.layers[:1]\n"
    found = reasons(source)
    assert len(found) == 1 and "`self.layers` is assigned outside `__init__`" in found[0]


def test_registering_in_init_may_rebind_its_names_unless_a_function_there_reads_them_later():
    body = "handles = []\nfor layer in self.layers:\n    handles.append(layer.register_forward_hook(print))\n"
    reused = in_forward(body).replace(
        "        self.seen = {}\n", "        self.seen = {}\n        for layer in self.layers:\n            pass\n"
    )
    assert reasons(reused) == [FIXED]
    closure = in_forward(body).replace(
        "        self.seen = {}\n", "        self.seen = {}\n        self.last = lambda: layer\n"
    )
    found = reasons(closure)
    assert len(found) == 1 and "a name it binds is read by a function defined in `__init__`" in found[0]


def test_an_attribute_the_script_replaces_on_an_instance_keeps_the_hooks_per_call():
    """Fine-tuning swaps a layer after construction (`net.layers = ...`): hooks registered
    once in `__init__` would stay on the old layer."""
    body = "handles = []\nfor layer in self.layers:\n    handles.append(layer.register_forward_hook(print))\n"
    source = in_forward(body) + "\n\nnet = Net()\nnet.layers = torch.nn.ModuleList([torch.nn.Linear(2, 2)])\n"
    found = reasons(source)
    assert len(found) == 1 and "`self.layers` is assigned outside `__init__`" in found[0]
    assert reasons(in_forward(body) + "\n\nnet = Net()\n") == [FIXED]


@pytest.mark.parametrize(
    "copy_line,fixed",
    [
        ("teacher = copy.deepcopy(net)\n", False),
        ("snapshot = copy.copy(net)\n", False),
        ("best = copy.deepcopy(net.state_dict())\n", True),  # a copy of a returned dict, not of the model
        ("", True),
    ],
)
def test_a_hook_closing_over_self_stays_per_call_when_the_file_copies_the_model(copy_line, fixed):
    """A copy of the model shares the closures its `__init__` made: the copy's hook would
    write into the original's `seen` (an EMA teacher made with `copy.deepcopy`)."""
    closure = (
        "handles = []\nfor i, layer in enumerate(self.layers):\n"
        "    handles.append(layer.register_forward_hook(lambda m, a, o, i=i: self.seen.update({i: o})))\n"
    )
    source = "import copy\n" + in_forward(closure) + "\n\nnet = Net()\n" + copy_line
    found = reasons(source)
    if fixed:
        assert found == [FIXED]
    else:
        assert len(found) == 1 and "the file copies the model" in found[0], found
        assert "a hook made in `__init__` that reads `self`" in found[0]
    # a hook that does not read `self` is the same in the copy
    plain = "handles = []\nfor layer in self.layers:\n    handles.append(layer.register_forward_hook(print))\n"
    assert reasons("import copy\n" + in_forward(plain) + "\n\nnet = Net()\n" + copy_line) == [FIXED]
