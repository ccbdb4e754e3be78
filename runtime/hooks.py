"""Module hooks without registering them with torch on every call.

`PersistentHooks`, for code written by hand: hooks registered once, switched on per
call with `with hooks.active(state=...)`, which hands them the call's values:

    # before: every call registers and removes hooks
    handles = [m.register_forward_hook(partial(hook, mask=masks[name])) for name, m in targets.items()]
    try:
        out = model(x)
    finally:
        for h in handles:
            h.remove()

    # after: registered once, per-call values passed as state
    hooks = PersistentHooks()
    for name, m in targets.items():
        hooks.forward(m, partial(hook, name=name))    # hook(module, args, output, state, *, name)
    ...
    with hooks.active(state=masks):
        out = model(x)
"""

from collections.abc import Callable, Iterable

import torch


class PersistentHooks:
    """Forward and forward-pre hooks registered once, inert except inside `active()`.

    A hook is called with torch's arguments plus the state given to `active()`:

        forward:                    fn(module, args, output, state)
        forward, with_kwargs=True:  fn(module, args, kwargs, output, state)
        forward_pre:                fn(module, args, state)
        forward_pre, with_kwargs:   fn(module, args, kwargs, state)

    and what it returns is used as torch uses a hook's return value (a replacement
    output, args, or (args, kwargs)). Outside `active()`, or for a module that active()
    leaves out, a hook returns None after one set lookup; torch still runs its hook
    dispatch for the module, which is what the module's forward costs with any hook.

    Registering the same (module, kind, fn) again does nothing; a fresh
    functools.partial each time needs `key=` to be recognized. Hooks run in torch's
    registration order: a hook added to the module later by other code runs after these,
    where a hook registered per call would have run last.

    Full backward hooks are not offered: once registered, torch wraps the inputs and
    outputs of every forward of the module in an autograd function for them, even when
    they would do nothing (several times the forward of a small Linear on CPU), and they
    fire during backward, usually after the `with active()` block has ended.
    Not thread-safe: threads running hooked modules at once share the state.
    """

    def __init__(self):
        self.state = None
        self._handles: dict[tuple, torch.utils.hooks.RemovableHandle] = {}
        self._hooked: frozenset[torch.nn.Module] = frozenset()
        self._live: frozenset[torch.nn.Module] = frozenset()  # modules whose hooks run now

    def forward(self, module: torch.nn.Module, fn: Callable, *, with_kwargs=False, key=None) -> None:
        self._register(module.register_forward_hook, module, fn, key, with_kwargs)

    def forward_pre(self, module: torch.nn.Module, fn: Callable, *, with_kwargs=False, key=None) -> None:
        self._register(module.register_forward_pre_hook, module, fn, key, with_kwargs)

    def _register(self, register: Callable, module: torch.nn.Module, fn: Callable, key, with_kwargs):
        handle_key = (module, register.__name__, with_kwargs, fn if key is None else key)
        if handle_key in self._handles:
            return
        self._handles[handle_key] = register(_Hook(self, fn), with_kwargs=with_kwargs)
        self._hooked |= {module}

    def active(self, state=None, modules: Iterable[torch.nn.Module] | None = None) -> "_Active":
        """`with hooks.active(state, modules):` runs the hooks of `modules` (default: every
        hooked module) with `state` inside the block.

        Nested blocks restore the outer modules and state on exit, exceptions included.
        """
        live = self._hooked if modules is None else frozenset(modules)
        if not live <= self._hooked:
            raise ValueError("active(modules=...) names modules that have no hooks here")
        return _Active(self, live, state)

    def remove(self) -> None:
        """Unregister every hook from its module."""
        for handle in self._handles.values():
            handle.remove()
        self._handles.clear()
        self._hooked = self._live = frozenset()


class _Hook:
    """What torch holds: calls fn only while its module is live. A class, not a closure,
    so that a hooked model still pickles (torch.save(model)) when fn does."""

    __slots__ = ("hooks", "fn")

    def __init__(self, hooks: PersistentHooks, fn: Callable):
        self.hooks, self.fn = hooks, fn

    def __call__(self, module, *args):
        if module not in self.hooks._live:
            return None
        return self.fn(module, *args, self.hooks.state)


class _Active:
    """The context manager of PersistentHooks.active: a class, as a @contextmanager
    generator costs about 2 us more per call, which is what the class is there to save."""

    __slots__ = ("hooks", "live", "state", "outer")

    def __init__(self, hooks: PersistentHooks, live: frozenset, state):
        self.hooks, self.live, self.state = hooks, live, state

    def __enter__(self) -> PersistentHooks:
        self.outer = self.hooks._live, self.hooks.state
        self.hooks._live, self.hooks.state = self.live, self.state
        return self.hooks

    def __exit__(self, *exc_info) -> None:
        self.hooks._live, self.hooks.state = self.outer
