"""Module hooks without registering them with torch on every call.

Two tools, for two ways of writing it:

- `per_call_forward_hook(module, fn)` / `per_call_forward_pre_hook(module, fn)` take the
  place of `module.register_forward_hook(fn)` in code that registers hooks and removes
  them on every call (what PM501 rewrites): the code keeps its shape and its results,
  torch sees one hook per module, registered once. See the section below.
- `PersistentHooks`, for code written by hand: hooks registered once, switched on per
  call with `with hooks.active(state=...)`:

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

import weakref
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


# -- per-call hooks on a dispatcher registered once ---------------------------------------
#
# What PM501 rewrites to. The per-call code keeps its shape (register, run, remove in
# `finally`); only `module.register_forward_hook(fn)` becomes
# `per_call_forward_hook(module, fn)`. Each module gets one dispatcher hook from torch,
# registered the first time, and every call then only appends its hook to the
# dispatcher's list and removes it again. The dispatcher runs the listed hooks in order,
# passing each torch's arguments and using what it returns as torch would, so a model
# runs the same hooks, in the same order, with the same arguments and replacements:
#
# - hook order: torch runs a module's hooks in registration order, and a hook registered
#   per call comes after every hook already there. Before adding to its list, the
#   dispatcher checks that it is still the module's last hook. If another hook was
#   registered after it, it moves itself to the end when its list is empty; when it is
#   not, the new hook is registered with torch directly (as the original code did), so
#   that it runs after the other one.
# - with an empty list the dispatcher returns None at once: no effect on the output.
# - removal is the caller's `handle.remove()`, in the same place as before (a `finally`
#   still runs it after an exception); nested and re-entrant registrations append and
#   remove their own entries, as torch's dict does.
#
# One difference is left: torch takes the list of hooks to run when it starts running a
# module's hooks, the dispatcher when it is reached, so a hook that registers or removes
# per-call hooks of the module whose hooks are running at that moment changes what runs
# in this pass. Objects that are not nn.Modules, and TorchScript modules, get torch's
# own registration.

_DISPATCHERS: "weakref.WeakKeyDictionary[torch.nn.Module, dict[str, _Dispatcher]]" = weakref.WeakKeyDictionary()


class PerCallHandle:
    """Returned for a per-call hook: `.remove()` takes it off the dispatcher's list
    (again: nothing), and `with handle:` removes it on exit, as torch's RemovableHandle."""

    __slots__ = ("dispatcher", "hook", "with_kwargs")

    def __init__(self, dispatcher: "_Dispatcher", hook: Callable, with_kwargs: bool):
        self.dispatcher, self.hook, self.with_kwargs = dispatcher, hook, with_kwargs

    def remove(self) -> None:
        try:
            self.dispatcher.entries.remove(self)  # by identity: handles do not define __eq__
        except ValueError:
            pass  # removed already

    def __enter__(self) -> "PerCallHandle":
        return self

    def __exit__(self, *exc_info) -> None:
        self.remove()


class _Dispatcher:
    """The one torch hook of a module (registered with_kwargs=True) that runs its per-call hooks.
    A class, not a closure, so that a module holding it still pickles."""

    __slots__ = ("entries", "handle")

    def __init__(self):
        self.entries: list[PerCallHandle] = []
        self.handle: torch.utils.hooks.RemovableHandle | None = None


class _ForwardDispatcher(_Dispatcher):
    __slots__ = ()

    def __call__(self, module, args, kwargs, output):
        if not self.entries:
            return None
        replaced = False
        for entry in tuple(self.entries):  # a snapshot, as torch iterates a copy of its dict
            result = entry.hook(module, args, kwargs, output) if entry.with_kwargs else entry.hook(module, args, output)
            if result is not None:
                output, replaced = result, True
        return output if replaced else None


class _ForwardPreDispatcher(_Dispatcher):
    __slots__ = ()

    def __call__(self, module, args, kwargs):
        if not self.entries:
            return None
        changed = False
        for entry in tuple(self.entries):
            if entry.with_kwargs:
                result = entry.hook(module, args, kwargs)
                if result is not None:
                    if not (isinstance(result, tuple) and len(result) == 2):
                        raise RuntimeError(
                            f"forward pre-hook must return None or a tuple of (new_args, new_kwargs), but got {result}."
                        )
                    args, kwargs = result
                    changed = True
            else:
                result = entry.hook(module, args)
                if result is not None:
                    args = result if isinstance(result, tuple) else (result,)
                    changed = True
        return (args, kwargs) if changed else None


def per_call_forward_hook(module, hook: Callable, *, with_kwargs: bool = False):
    """`module.register_forward_hook(hook, with_kwargs=...)` for a hook removed again
    within the call: same effect, without registering with torch each time."""
    return _add(module, hook, with_kwargs, "forward")


def per_call_forward_pre_hook(module, hook: Callable, *, with_kwargs: bool = False):
    """`module.register_forward_pre_hook(hook, with_kwargs=...)` for a hook removed
    again within the call."""
    return _add(module, hook, with_kwargs, "forward_pre")


def _add(module, hook: Callable, with_kwargs: bool, kind: str):
    register_name = f"register_{kind}_hook"
    if not isinstance(module, torch.nn.Module) or isinstance(module, torch.jit.ScriptModule):
        return getattr(module, register_name)(hook, with_kwargs=with_kwargs)
    dispatchers = _DISPATCHERS.get(module)
    if dispatchers is None:
        dispatchers = _DISPATCHERS[module] = {}
    dispatcher = dispatchers.get(kind)
    torch_hooks = module._forward_hooks if kind == "forward" else module._forward_pre_hooks
    if dispatcher is None:
        dispatcher = dispatchers[kind] = _ForwardDispatcher() if kind == "forward" else _ForwardPreDispatcher()
        dispatcher.handle = getattr(module, register_name)(dispatcher, with_kwargs=True)
    elif next(reversed(torch_hooks), None) != dispatcher.handle.id:
        # A hook registered after the dispatcher (or a removed dispatcher): per-call
        # hooks must run after it.
        if dispatcher.entries:
            return getattr(module, register_name)(hook, with_kwargs=with_kwargs)
        dispatcher.handle.remove()
        dispatcher.handle = getattr(module, register_name)(dispatcher, with_kwargs=True)
    handle = PerCallHandle(dispatcher, hook, with_kwargs)
    dispatcher.entries.append(handle)
    return handle
