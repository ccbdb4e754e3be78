"""PM501's analysis: which registrations are per call, which handles it can follow
to their removal, and which forms it reports without a fix."""

import textwrap

import pytest

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level
from codemod.rules.per_call_hooks import PerCallHookRegistration

HEADER = "import contextlib\nimport torch\nmodel = torch.nn.Linear(2, 2)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"


def findings(body: str) -> list[tuple[int, bool]]:
    """(line in `body`, fixable) of each PM501 finding."""
    source = HEADER + textwrap.dedent(body)
    settings = Settings(select=("PM501",), level=Level.UNSAFE)
    result = process_source(source.encode(), "t.py", settings, [PerCallHookRegistration])
    assert result.error is None, result.error
    offset = HEADER.count("\n")
    return [(f.line - offset, f.fixable) for f in result.findings]


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
    ],
)
def test_followed_handles_are_fixed(body):
    found = findings(in_loop(body))
    assert found and all(fixable for _, fixable in found)


@pytest.mark.parametrize(
    "body,why",
    [
        ("h = model.register_forward_hook(print, always_call=True)\nh.remove()\n", "always_call"),
        ("h = model.register_forward_hook(print, prepend=True)\nh.remove()\n", "prepend"),
        ("kw = {}\nh = model.register_forward_hook(print, **kw)\nh.remove()\n", "**kwargs"),
        ("h = model.register_forward_hook(print)\nprint(h.id)\nh.remove()\n", "the handle is read"),
        ("hs = {}\nhs['a'] = model.register_forward_hook(print)\nfor h in hs.values():\n    print(h)\n", "a dict read"),
        ("hs = {}\nhs['a'] = model.register_forward_hook(print)\nreturn_later = hs\n", "a dict aliased"),
        ("hs = [model.register_forward_hook(print)]\nkeep = hs\nfor h in hs:\n    h.remove()\n", "the list is aliased"),
    ],
)
def test_handles_it_cannot_follow_or_arguments_it_cannot_keep_are_reported(body, why):
    found = findings(in_loop(body))
    assert found and not any(fixable for _, fixable in found), why


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
    """) == [(3, True), (9, True), (16, False)]


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


def test_suppression_and_a_name_already_taken():
    assert findings(in_loop("h = model.register_forward_hook(print)  # perfmod: ignore[PM501]\nh.remove()\n")) == []
    taken = "def per_call_forward_hook(*args):\n    pass\n" + in_loop(
        "h = model.register_forward_hook(print)\nh.remove()\n"
    )
    assert findings(taken) == [(4, False)]


def test_hooks_entered_into_an_exit_stack_are_removed_by_its_with():
    assert findings(
        in_loop("""\
        with contextlib.ExitStack() as stack:
            stack.enter_context(model.register_forward_hook(print))
            model(x)
    """)
    ) == [(3, True)]
    assert findings(
        in_loop("""\
        with contextlib.ExitStack() as stack:
            stack.enter_context(model.register_forward_hook(print))
            later = stack.pop_all()
    """)
    ) == [(3, False)]  # the hooks outlive the with: reported
