"""Calls that may run one of several methods: a trainer that calls each of its callbacks
(`for cb in self.callbacks: cb.on_step_end(self, step, loss)`), where the list holds
instances of several classes of the file. The step model reaches each class's method,
so that every rule sees what a callback does on every step; where the list's items are
not all known (appended elsewhere, built by code perfmod does not read), nothing is
claimed."""

from __future__ import annotations

import pytest

from codemod.context import FileContext
from tests.analysis.test_calls_into_own_objects import call_of, context

TRAINER = """\
import gc
import torch
import torch.nn as nn


class Callback:
    def on_step_end(self, trainer, step):
        pass

    def on_train_end(self, trainer):
        pass


class Checkpoint(Callback):
    def __init__(self, path):
        self.path = path

    def on_step_end(self, trainer, step):
        torch.save(trainer.model.state_dict(), self.path)


class Janitor(Callback):
    def on_step_end(self, trainer, step):
        gc.collect()


class Printer:
    def on_step_end(self, trainer, step):
        print(step)

    def on_train_end(self, trainer):
        print("done")


class Trainer:
    def __init__(self, model, callbacks):
        self.model = model
        self.opt = torch.optim.SGD(model.parameters(), lr=0.1)
        self.callbacks = callbacks

    def fit(self, steps):
        for step in range(steps):
            loss = self.model(torch.randn(4, 8)).square().mean()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            for cb in self.callbacks:
                cb.on_step_end(self, step)
        for cb in self.callbacks:
            cb.on_train_end(self)


def main():
    callbacks = [Checkpoint("last.pt"), Janitor(), Printer()]
    trainer = Trainer(nn.Linear(8, 1), callbacks)
    trainer.fit(5)
"""


def owners(ctx: FileContext, code: str) -> list[str]:
    """`Class.method` of each function the call may run."""
    found = []
    for function in ctx.loops.callees(call_of(ctx, code)):
        classdef = ctx.kinds.class_of(function)
        found.append(f"{classdef.name.value}.{function.name.value}")
    return sorted(found)


def test_a_call_on_each_callback_of_a_list_runs_the_method_of_each_class():
    ctx = context(TRAINER)
    assert owners(ctx, "cb.on_step_end(self, step)") == [
        "Checkpoint.on_step_end",
        "Janitor.on_step_end",
        "Printer.on_step_end",
    ]
    # a class that does not override the method runs its base's
    assert owners(ctx, "cb.on_train_end(self)") == ["Callback.on_train_end", "Printer.on_train_end"]


def test_what_a_callback_does_runs_on_every_step_of_the_loop_that_calls_it():
    ctx = context(TRAINER)
    loop = ctx.loops.step_loops[0]
    for code in ("torch.save(trainer.model.state_dict(), self.path)", "gc.collect()"):
        sites = ctx.loops.runs_in(call_of(ctx, code))
        assert [site.loop for site in sites] == [loop], code
        assert [ctx.source(call) for call in sites[0].calls] == ["cb.on_step_end(self, step)"]
    assert ctx.loops.runs_in(call_of(ctx, 'print("done")')) == ()
    reached = {function.name.value for function in ctx.loops.functions_reached(loop.body)}
    assert reached == {"on_step_end"}


@pytest.mark.parametrize(
    "change",
    [
        # the list grows elsewhere, with anything
        ("    trainer.fit(5)", "    trainer.callbacks.append(make_callback())\n    trainer.fit(5)"),
        ("    trainer.fit(5)", "    trainer.callbacks[0] = make_callback()\n    trainer.fit(5)"),
        # an item perfmod cannot tell
        ("Janitor(), Printer()]", "Janitor(), make_callback()]"),
        ("Janitor(), Printer()]", "Janitor(), *extra]"),
        # the list comes from code perfmod does not read
        ('    callbacks = [Checkpoint("last.pt"), Janitor(), Printer()]', "    callbacks = make_callbacks()"),
        # the trainer is also built with a list perfmod cannot tell
        ("    trainer.fit(5)", "    trainer.fit(5)\n    Trainer(nn.Linear(8, 1), make_callbacks()).fit(5)"),
        # the list is handed to code that may change it
        ("    trainer = Trainer(", "    register(callbacks)\n    trainer = Trainer("),
    ],
)
def test_a_list_whose_items_are_not_all_known_runs_no_method_perfmod_would_claim(change):
    old, new = change
    assert old in TRAINER
    ctx = context(TRAINER.replace(old, new))
    assert ctx.loops.callees(call_of(ctx, "cb.on_step_end(self, step)")) == ()
    assert ctx.loops.runs_in(call_of(ctx, "gc.collect()")) == ()


def test_a_list_filled_by_append_where_it_is_built_is_known():
    ctx = context(
        TRAINER.replace(
            '    callbacks = [Checkpoint("last.pt"), Janitor(), Printer()]',
            '    callbacks = [Checkpoint("last.pt")]\n    callbacks.append(Janitor())',
        )
    )
    assert owners(ctx, "cb.on_step_end(self, step)") == ["Checkpoint.on_step_end", "Janitor.on_step_end"]


def test_a_class_without_the_method_adds_no_callee():
    ctx = context(
        TRAINER.replace(
            "class Printer:\n    def on_step_end(self, trainer, step):\n        print(step)\n", "class Printer:\n"
        )
    )
    assert owners(ctx, "cb.on_step_end(self, step)") == ["Checkpoint.on_step_end", "Janitor.on_step_end"]


# -- how the callbacks get into the list --------------------------------------------------

KERAS_LIST = TRAINER.replace("self.callbacks = callbacks", "self.callbacks = list(callbacks or [])").replace(
    "def __init__(self, model, callbacks):", "def __init__(self, model, callbacks=None):"
)


@pytest.mark.parametrize(
    "code",
    [
        KERAS_LIST,
        TRAINER.replace("self.callbacks = callbacks", "self.callbacks = tuple(callbacks)"),
        TRAINER.replace("self.callbacks = callbacks", "self.callbacks = [Printer()] + sorted(callbacks, key=id)"),
        TRAINER.replace(
            '    callbacks = [Checkpoint("last.pt"), Janitor(), Printer()]',
            '    janitor = Janitor()\n    callbacks = (Checkpoint("last.pt"), *[janitor, Printer()])',
        ),
        # registered one by one on the trainer's own list (Detectron-style hooks)
        TRAINER.replace("self.callbacks = callbacks", "self.callbacks = []\n        self.register(callbacks)").replace(
            "    def fit(self, steps):",
            "    def register(self, hooks):\n        for hook in hooks:\n            self.callbacks.append(hook)\n"
            "        self.callbacks.sort(key=id)\n\n    def fit(self, steps):",
        ),
    ],
    ids=["list-of-or", "tuple-copy", "concatenated", "starred-display", "appended-in-a-method"],
)
def test_a_list_copied_joined_or_filled_by_a_method_keeps_its_items(code):
    ctx = context(code)
    assert owners(ctx, "cb.on_step_end(self, step)") == [
        "Checkpoint.on_step_end",
        "Janitor.on_step_end",
        "Printer.on_step_end",
    ]


def test_a_list_an_attribute_holds_is_not_known_where_something_else_takes_items_out():
    code = TRAINER.replace(
        "self.callbacks = callbacks", "self.callbacks = []\n        self.callbacks.extend(callbacks)"
    )
    assert owners(context(code), "cb.on_step_end(self, step)") == [
        "Checkpoint.on_step_end",
        "Janitor.on_step_end",
        "Printer.on_step_end",
    ]
    popped = code.replace("    trainer.fit(5)", "    trainer.callbacks.pop()\n    trainer.fit(5)")
    assert owners(context(popped), "cb.on_step_end(self, step)") == []


# -- events fired by name -----------------------------------------------------------------

FIRED = TRAINER.replace(
    """            for cb in self.callbacks:
                cb.on_step_end(self, step)
        for cb in self.callbacks:
            cb.on_train_end(self)
""",
    """            self.fire("on_step_end", step)
        self.fire("on_train_end")

    def fire(self, event, *args):
        for cb in self.callbacks:
            hook = getattr(cb, event, None)
            if hook is not None:
                hook(self, *args)
""",
)


def test_an_event_fired_by_name_runs_that_method_of_each_callback_where_it_is_fired():
    ctx = context(FIRED)
    assert owners(ctx, 'self.fire("on_step_end", step)') == [
        "Checkpoint.on_step_end",
        "Janitor.on_step_end",
        "Printer.on_step_end",
        "Trainer.fire",
    ]
    loop = ctx.loops.step_loops[0]
    assert [site.loop for site in ctx.loops.runs_in(call_of(ctx, "gc.collect()"))] == [loop]
    assert ctx.loops.runs_in(call_of(ctx, 'print("done")')) == ()  # fired after the loop


def test_an_instance_called_by_name_runs_its_call_method_and_what_it_fires():
    code = FIRED.replace("    def fire(self, event, *args):", "    def __call__(self, event, *args):").replace(
        'self.fire("on_step_end", step)', 'self("on_step_end", step)'
    )
    ctx = context(code)
    assert "Janitor.on_step_end" in owners(ctx, 'self("on_step_end", step)')
    assert [site.loop for site in ctx.loops.runs_in(call_of(ctx, "gc.collect()"))] == [ctx.loops.step_loops[0]]


def test_an_event_whose_name_is_not_written_out_runs_nothing_perfmod_claims():
    code = FIRED.replace('self.fire("on_step_end", step)', "self.fire(EVENTS[0], step)")
    ctx = context(code)
    assert owners(ctx, "self.fire(EVENTS[0], step)") == ["Trainer.fire"]
    assert ctx.loops.runs_in(call_of(ctx, "gc.collect()")) == ()


def test_an_event_looked_up_only_under_a_test_of_the_firing_function_is_not_claimed_every_step():
    code = FIRED.replace(
        "        for cb in self.callbacks:\n            hook = getattr(cb, event, None)",
        "        for cb in self.callbacks:\n            if self.verbose:\n                hook = getattr(cb, event, None)",
    )
    assert "if self.verbose:" in code
    ctx = context(code)
    assert owners(ctx, 'self.fire("on_step_end", step)') == ["Trainer.fire"]
    assert ctx.loops.runs_in(call_of(ctx, "gc.collect()")) == ()


def test_a_list_stored_in_an_attribute_and_added_to_through_it_is_read_whole_through_the_attribute():
    added = (
        TRAINER.replace(
            "    trainer.fit(5)",
            "    trainer.add(Printer())\n    trainer.fit(5)\n    for cb in callbacks:\n        cb.on_step_end(trainer, 0)",
        )
        .replace(
            '    callbacks = [Checkpoint("last.pt"), Janitor(), Printer()]',
            '    callbacks = [Checkpoint("last.pt"), Janitor()]',
        )
        .replace(
            "    def fit(self, steps):",
            "    def add(self, callback):\n        self.callbacks.append(callback)\n\n    def fit(self, steps):",
        )
    )
    ctx = context(added)
    assert owners(ctx, "cb.on_step_end(self, step)") == [
        "Checkpoint.on_step_end",
        "Janitor.on_step_end",
        "Printer.on_step_end",
    ]
    # main's own name for the list does not show what the trainer added to it
    assert owners(ctx, "cb.on_step_end(trainer, 0)") == []
