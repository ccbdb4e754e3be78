"""PM501: the rewritten fixture scripts train exactly as the originals do.

Each script is run as written and as PM501 rewrites it, in this process on one CPU
thread; the losses of every step, the trained parameters and the gradients of the
last step must be equal bit for bit (`torch.equal`). A run with the runtime's hooks
switched off shows that the comparison would notice hooks that do nothing.
"""

import contextlib
import io
import re
from pathlib import Path

import pytest
import torch

import runtime.hooks
from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level
from codemod.rules.per_call_hooks import PerCallHookRegistration
from tests.rules.scripts import one_thread

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "rules" / "PM501"
# script -> the global that holds its trained model
MODELS = {"seed_lm": "model", "context_manager": "model", "try_finally_loop": "net"}


def rewritten(source: str) -> str:
    settings = Settings(select=("PM501",), level=Level.UNSAFE)
    result = process_source(source.encode(), "<fixture>", settings, [PerCallHookRegistration])
    assert result.error is None, result.error
    assert result.findings and all(f.applied for f in result.findings), result.findings
    return result.new_source.decode()


def run(source: str, model_name: str):
    """Losses printed per step, and the trained model's parameters and gradients."""
    out = io.StringIO()
    namespace = {"__name__": "__main__"}
    with one_thread(), contextlib.redirect_stdout(out):
        exec(compile(source, "<fixture>", "exec"), namespace)
    model = namespace[model_name]
    losses = [float(v) for v in re.findall(r"loss (\S+)", out.getvalue())]
    params = {name: p.detach().clone() for name, p in model.named_parameters()}
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return losses, params, grads, model


def assert_equal_runs(got, want):
    got_losses, got_params, got_grads, _ = got
    want_losses, want_params, want_grads, _ = want
    assert len(want_losses) >= 5 and got_losses == want_losses
    assert got_params.keys() == want_params.keys() and got_grads.keys() == want_grads.keys() and want_grads
    for name in want_params:
        assert torch.equal(got_params[name], want_params[name]), name
    for name in want_grads:
        assert torch.equal(got_grads[name], want_grads[name]), name


@pytest.mark.parametrize("case", list(MODELS))
def test_rewritten_script_trains_bit_identically(case):
    source = (FIXTURES / f"{case}.in.py").read_text()
    new_source = rewritten(source)
    assert "register_forward_hook" not in new_source.replace("register_forward_hook(add_half)", "")
    want = run(source, MODELS[case])
    got = run(new_source, MODELS[case])
    assert_equal_runs(got, want)
    # The rewritten script did go through the dispatchers, registered once per module.
    hooked = [module for module in got[3].modules() if module in runtime.hooks._DISPATCHERS]
    assert hooked
    for module in hooked:
        dispatchers = runtime.hooks._DISPATCHERS[module]
        assert all(not d.entries for d in dispatchers.values())  # every per-call hook was removed
        torch_hooks = list(module._forward_hooks.values()) + list(module._forward_pre_hooks.values())
        assert sum(hook in dispatchers.values() for hook in torch_hooks) == len(dispatchers)


class _Dropped:
    def remove(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        pass


@pytest.mark.parametrize("case", ["seed_lm", "try_finally_loop"])
def test_the_comparison_notices_hooks_that_do_nothing(case, monkeypatch):
    """The tests above could fail: with the hooks dropped, the losses differ."""
    source = (FIXTURES / f"{case}.in.py").read_text()
    monkeypatch.setattr(runtime.hooks, "per_call_forward_hook", lambda module, hook, **kwargs: _Dropped())
    monkeypatch.setattr(runtime.hooks, "per_call_forward_pre_hook", lambda module, hook, **kwargs: _Dropped())
    got_losses = run(rewritten(source), MODELS[case])[0]
    want_losses = run(source, MODELS[case])[0]
    assert got_losses != want_losses


def test_negative_fixtures_are_left_alone_or_reported_without_fix():
    settings = Settings(select=("PM501",), level=Level.UNSAFE)
    one_shot = process_source((FIXTURES / "one_shot.in.py").read_bytes(), "one_shot.py", settings)
    assert one_shot.findings == [] and not one_shot.changed
    escaping = process_source((FIXTURES / "escaping_handle.in.py").read_bytes(), "escaping_handle.py", settings)
    assert [(f.line, f.fixable) for f in escaping.findings] == [(13, False), (32, False)]
    assert not escaping.changed
