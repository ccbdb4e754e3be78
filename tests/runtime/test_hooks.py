import copy
import functools
import pickle
import time

import pytest
import torch

from runtime.hooks import PersistentHooks


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)

    def forward(self, x, scale=1.0):
        return torch.tanh(self.lin(x)) * scale


class Net(torch.nn.Module):
    """Blocks called with a keyword argument, so that with_kwargs hooks have one to see."""

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(3))
        self.head = torch.nn.Linear(6, 2)

    def forward(self, x):
        for block in self.blocks:
            x = block(x, scale=0.5)
        return self.head(x)


# The hooks as the per-call code writes them: per-call values bound with functools.partial.


def mask_output(module, args, output, mask):  # replaces the output
    return output * mask


def rescale_kwargs(module, args, kwargs, factor):  # forward-pre with kwargs: replaces kwargs
    return args, {**kwargs, "scale": kwargs["scale"] * factor}


def add_scale(module, args, kwargs, output):  # forward with kwargs: reads them
    return output + kwargs["scale"]


def record(module, args, output, store, name):  # returns None: output unchanged
    store[name] = output


def shift_input(module, args, shift):  # forward-pre: replaces args
    return (args[0] + shift,)


def run_with_per_call_hooks(model, x, call, store):
    """The "before": every call registers its hooks on the modules it hooks, then removes them."""
    handles = [model.head.register_forward_pre_hook(functools.partial(shift_input, shift=call["shift"]))]
    for i in call["blocks"]:
        block = model.blocks[i]
        handles += [
            block.register_forward_hook(functools.partial(mask_output, mask=call["masks"][i])),
            block.register_forward_pre_hook(functools.partial(rescale_kwargs, factor=call["factor"]), with_kwargs=True),
            block.register_forward_hook(add_scale, with_kwargs=True),
            block.lin.register_forward_hook(functools.partial(record, store=store, name=i)),
        ]
    try:
        return model(x)
    finally:
        for handle in handles:
            handle.remove()


def persistent_hooks(model, store):
    """The "after": the same hooks registered once, reading per-call values from the state."""
    hooks = PersistentHooks()
    hooks.forward_pre(model.head, lambda module, args, state: shift_input(module, args, state["shift"]))
    for i, block in enumerate(model.blocks):
        hooks.forward(block, functools.partial(mask_output_from_state, name=i))
        hooks.forward_pre(block, rescale_kwargs_from_state, with_kwargs=True)
        hooks.forward(
            block, lambda m, args, kwargs, output, state: add_scale(m, args, kwargs, output), with_kwargs=True
        )
        hooks.forward(block.lin, functools.partial(record_from_state, store=store, name=i))
    return hooks


def mask_output_from_state(module, args, output, state, *, name):
    return mask_output(module, args, output, state["masks"][name])


def rescale_kwargs_from_state(module, args, kwargs, state):
    return rescale_kwargs(module, args, kwargs, state["factor"])


def record_from_state(module, args, output, state, *, store, name):
    return record(module, args, output, store, name)


def run_with_persistent_hooks(model, hooks, x, call):
    modules = [model.head] + [m for i in call["blocks"] for m in (model.blocks[i], model.blocks[i].lin)]
    with hooks.active(state=call, modules=modules):
        return model(x)


def calls(n=6):
    """Per-call values, including which blocks are hooked: all, some, none."""
    g = torch.Generator().manual_seed(1)
    subsets = [[0, 1, 2], [1], [], [0, 2], [2, 0], [0, 1, 2]]
    return [
        {
            "x": torch.randn(4, 6, generator=g),
            "blocks": subsets[k % len(subsets)],
            "masks": [(torch.rand(4, 6, generator=g) > 0.3).float() for _ in range(3)],
            "factor": 1.0 + k / 4,
            "shift": torch.randn(6, generator=g),
        }
        for k in range(n)
    ]


def models():
    torch.manual_seed(0)
    before = Net()
    return before, copy.deepcopy(before), copy.deepcopy(before)  # before, after, never hooked


def grads(model):
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def assert_bit_identical(a: dict, b: dict):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_persistent_hooks_give_bit_identical_outputs_activations_and_gradients():
    before, after, _ = models()
    store_before, store_after = {}, {}
    hooks = persistent_hooks(after, store_after)
    for call in calls():
        for model in (before, after):
            model.zero_grad(set_to_none=True)
        out_before = run_with_per_call_hooks(before, call["x"], call, store_before)
        out_after = run_with_persistent_hooks(after, hooks, call["x"], call)
        assert torch.equal(out_before, out_after)
        assert store_before.keys() == store_after.keys() == set(call["blocks"])
        assert_bit_identical(store_before, store_after)
        out_before.square().sum().backward()
        out_after.square().sum().backward()
        assert_bit_identical(grads(before), grads(after))
        store_before.clear(), store_after.clear()


def test_hooks_are_inert_outside_active():
    _, after, plain = models()
    store = {}
    hooks = persistent_hooks(after, store)
    call = calls(1)[0]
    hooked = run_with_persistent_hooks(after, hooks, call["x"], call)
    assert not torch.equal(hooked, plain(call["x"]))  # the hooks did change the output
    store.clear()
    assert torch.equal(after(call["x"]), plain(call["x"]))
    assert store == {} and hooks.state is None


def test_active_leaves_out_modules_not_named_and_restores_on_exit_and_error():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 3))
    seen = []
    hooks = PersistentHooks()
    for layer in model:
        hooks.forward(layer, lambda m, args, output, state: seen.append((m, state)))
    x = torch.randn(2, 3)
    with hooks.active(state="outer"):
        with hooks.active(state="inner", modules=[model[1]]):
            model(x)
        assert seen == [(model[1], "inner")]
        model(x)
    assert seen[1:] == [(model[0], "outer"), (model[1], "outer")]
    with pytest.raises(RuntimeError, match="boom"):
        with hooks.active(state="failing"):
            raise RuntimeError("boom")
    model(x)
    assert len(seen) == 3 and hooks.state is None


def test_registering_again_is_a_no_op_and_key_names_a_partial():
    layer = torch.nn.Linear(3, 3)
    x = torch.randn(2, 3)
    hooks = PersistentHooks()

    def add(module, args, output, state, amount=1.0):
        return output + amount

    for _ in range(3):
        hooks.forward(layer, add)
        hooks.forward(layer, functools.partial(add, amount=10.0), key="add10")
    with hooks.active():
        assert torch.equal(layer(x), layer.forward(x) + 1 + 10)
    assert len(layer._forward_hooks) == 2


def test_active_rejects_modules_without_hooks():
    hooks = PersistentHooks()
    hooks.forward(torch.nn.Linear(2, 2), lambda *args: None)
    with pytest.raises(ValueError, match="no hooks"):
        hooks.active(modules=[torch.nn.Linear(2, 2)])


def test_remove_unregisters_everything():
    _, after, plain = models()
    hooks = persistent_hooks(after, {})
    hooks.remove()
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in after.modules())
    call = calls(1)[0]
    with hooks.active(state=call):
        assert torch.equal(after(call["x"]), plain(call["x"]))


def shift_by_state(module, args, state):
    return (args[0] + state,)


def test_a_hooked_model_still_pickles():
    """torch.save(model) pickles the module with its hooks: per-call code never left any."""
    model, _, plain = models()
    hooks = PersistentHooks()
    hooks.forward_pre(model.head, shift_by_state)
    loaded = pickle.loads(pickle.dumps(model))
    x = torch.randn(2, 6)
    assert torch.equal(loaded(x), plain(x))


def test_persistent_hooks_cost_less_per_call_than_registering_them():
    """A loose check of the point of the class: CPU timings are too noisy for more."""
    layers = torch.nn.Sequential(*(torch.nn.Identity() for _ in range(8)))
    x = torch.randn(2, 2)

    def noop(module, args, output, value):
        return None

    def per_call():
        handles = [m.register_forward_hook(functools.partial(noop, value=1)) for m in layers]
        layers(x)
        for handle in handles:
            handle.remove()

    hooks = PersistentHooks()
    for m in layers:
        hooks.forward(m, noop)

    def persistent():
        with hooks.active(state=1):
            layers(x)

    best = {per_call: float("inf"), persistent: float("inf")}
    for _ in range(7):  # interleaved, so that a burst of load on the machine hits both
        for fn in best:
            start = time.perf_counter()
            for _ in range(100):
                fn()
            best[fn] = min(best[fn], time.perf_counter() - start)
    assert best[persistent] < best[per_call]
