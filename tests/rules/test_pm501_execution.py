"""PM501: the rewritten fixture script trains exactly as the original does, and its
model compiles without a graph break.

The script is run as written and as PM501 rewrites it, in this process on one CPU
thread; the losses of every step, the trained parameters and the gradients of the
last step must be equal bit for bit (`torch.equal`). A run with the hooks left out
shows that the comparison would notice hooks that do nothing.
"""

import contextlib
import io
import re
from pathlib import Path

import pytest
import torch

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level
from codemod.rules.per_call_hook_registration import PerCallHookRegistration
from tests.rules.scripts import one_thread

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "rules" / "PM501"
# script -> the global that holds its trained model
MODELS = {"register_once": "model"}


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
    assert ".remove()" not in new_source and "runtime" not in new_source
    want = run(source, MODELS[case])
    got = run(new_source, MODELS[case])
    assert_equal_runs(got, want)
    # registered once: the hooks stay on the trained model's blocks
    assert [len(block._forward_hooks) for block in got[3].blocks] == [1, 1]
    assert [len(block._forward_hooks) for block in want[3].blocks] == [0, 0]


def test_the_comparison_notices_hooks_that_do_nothing():
    """The test above could fail: with the hooks left out, the losses differ."""
    source = (FIXTURES / "register_once.in.py").read_text()
    without = rewritten(source).replace("block.register_forward_hook(keep)", "pass")
    assert run(without, "model")[0] != run(source, "model")[0]


def test_the_rewritten_model_compiles_without_a_graph_break():
    """torch._dynamo.explain of one forward: the original breaks the graph where it
    creates a RemovableHandle in its loop over the blocks; the rewrite does not."""
    counts = {}
    for name, source in [("original", (FIXTURES / "register_once.in.py").read_text())]:
        for version, text in [(name, source), ("rewritten", rewritten(source))]:
            namespace = {"__name__": "fixture"}
            exec(compile(text, "<fixture>", "exec"), namespace)
            torch.manual_seed(0)
            model = namespace["HookedLM"]()
            torch._dynamo.reset()
            with one_thread():
                explained = torch._dynamo.explain(model)(torch.randint(0, 32, (2, 8)))
            counts[version] = (explained.graph_count, explained.graph_break_count)
    torch._dynamo.reset()
    assert counts["original"][1] > 0, counts
    assert counts["rewritten"] == (1, 0), counts


def test_negative_fixtures_are_left_alone_or_reported_without_fix():
    settings = Settings(select=("PM501",), level=Level.UNSAFE)
    one_shot = process_source((FIXTURES / "one_shot.in.py").read_bytes(), "one_shot.py", settings)
    assert one_shot.findings == [] and not one_shot.changed
    escaping = process_source((FIXTURES / "escaping_handle.in.py").read_bytes(), "escaping_handle.py", settings)
    assert [(f.line, f.fixable) for f in escaping.findings] == [(13, False), (32, False)]
    assert not escaping.changed
    for case in ["seed_lm", "context_manager", "try_finally_loop"]:  # per-call values, or not in forward
        result = process_source((FIXTURES / f"{case}.in.py").read_bytes(), f"{case}.py", settings)
        assert result.findings and not any(f.fixable for f in result.findings) and not result.changed, case


def test_handles_collected_by_a_comprehension_are_registered_once_and_train_bit_identically():
    source = (FIXTURES / "register_once.in.py").read_text()
    loop = (
        "        handles = []\n"
        "        for i, block in enumerate(self.blocks):\n"
        "            def keep(module, args, output, i=i):\n"
        "                self.captured[i] = output.detach().norm()\n"
        "            handles.append(block.register_forward_hook(keep))\n"
    )
    comprehension = (
        "        handles = [\n"
        "            block.register_forward_hook(lambda m, a, o, i=i: self.captured.update({i: o.detach().norm()}))\n"
        "            for i, block in enumerate(self.blocks)\n"
        "        ]\n"
    )
    assert loop in source
    source = source.replace(loop, comprehension)
    new_source = rewritten(source)
    assert ".remove()" not in new_source and "for i, block in enumerate(self.blocks):\n" in new_source
    want, got = run(source, "model"), run(new_source, "model")
    assert_equal_runs(got, want)
    assert [len(block._forward_hooks) for block in got[3].blocks] == [1, 1]
