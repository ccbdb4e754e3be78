"""Profiler for `perfmod profile`: runs inside the training script's process.

`perfmod profile` (and `perfmod verify --profile`) run the copy that `perfmod
verify` instruments (runtime/trace.py) with two more settings:
PERFMOD_PROFILE_OUT (where this module writes its attribution, JSON) and
PERFMOD_PROFILE_FILES (the script's own files, relative to the run's folder,
separated by os.pathsep). PERFMOD_PROFILE_TRACE, when set, keeps the Chrome
trace of the profiled steps there (for Perfetto or chrome://tracing).

The tracer starts `torch.profiler.profile` at `install()`, with CPU activities
(and CUDA where torch has it), `with_stack=True` (the Python tracer: every
Python call with the line that made it), and a schedule that waits out the
warm-up steps and records the timed ones: steps W+1..N, the window `perfmod
verify` times. `stepped()` advances it; after step N the events are attributed
here, in the script's process, and written before the tracer stops the script.

Attribution, on the thread that runs the training loop:
- Every moment of the window belongs to the innermost event open then (its
  self time). Its user stack is the chain of lines in the script's own files
  that called down to it (outermost first): a Python call made from a line of
  those files adds that line. Time spent in a function of the script between
  its calls (the interpreter running its own lines) goes to the line of the
  next call it makes (the one it was evaluating), or the previous one after the
  last call.
- Backward: the autograd engine runs each gradient function, on the CPU, in
  the thread that called backward(); its time also carries the user stack of
  the forward operator that recorded it (matched by the operator's sequence
  number), so the backward of a loop counts on the loop's lines.
- Category of each moment: "data" inside a DataLoader's `__next__` (making
  the batch in the main process when the loader has no workers; blocked until
  a worker's batch arrives when it has them); "handoff" inside the `__next__` of
  a loader with worker processes, except that wait: the main process's side of
  the workers, sending each its next indices and receiving each batch that is
  ready (torch.multiprocessing rebuilding its tensors from the worker's shared
  memory: with the default file_descriptor strategy, a connection to the
  worker per tensor that passes its file descriptor over), time that workers
  cost rather than hide; "sync" inside a host-device synchronisation (`.item()`,
  `aten::_local_scalar_dense`, cudaStreamSynchronize, cudaDeviceSynchronize,
  cudaEventSynchronize, a blocking cudaMemcpy); "ops" inside any other torch
  operator (compute on the CPU, dispatch and launches on CUDA); "python"
  otherwise. Moments no event covers are "untraced".
- On CUDA: each kernel (and memcpy, memset) is attributed to the user stack of
  the main thread at the moment it was launched (kernels launched by the
  autograd thread to the backward() call that waits for them); the GPU's idle
  time is the window less the union of those intervals.

Output (PERFMOD_PROFILE_OUT), schema 1:

    {"schema": 1, "steps": int (profiled), "window_ns": int, "device": "cpu"|"cuda",
     "entries": [{"stack": [[file, line], ...], "category": str, "ns": int}],
     "kernels": [{"stack": [[file, line], ...], "ns": int}],
     "counts": [{"stack": [[file, line], ...], "calls": int, "ops": int}],
     "gpu_idle_ns": int|null, "error": str|null}

`counts` holds, per user stack, the calls made from its last line and the torch
operators dispatched under it (outermost ones), over the window.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import os
import sys
import time

import torch

OUT_VAR, FILES_VAR, TRACE_VAR = "PERFMOD_PROFILE_OUT", "PERFMOD_PROFILE_FILES", "PERFMOD_PROFILE_TRACE"
SCHEMA = 1
SYNC_NAMES = frozenset(
    {
        "aten::item",
        "aten::_local_scalar_dense",
        "aten::is_nonzero",
        "cudaStreamSynchronize",
        "cudaDeviceSynchronize",
        "cudaEventSynchronize",
        "cudaMemcpy",
    }
)
DATA_ANNOTATION = "enumerate(DataLoader)"
LOADER_FILE = "torch/utils/data/dataloader.py"
# Functions that only the iterator of a loader with worker processes has
# (_MultiProcessingDataLoaderIter): its _next_data takes a ready batch (_get_data)
# and sends the next indices to a worker (_process_data).
WORKER_FUNCTIONS = frozenset({"_get_data", "_process_data"})
WAIT_FUNCTION = "_try_get_data"  # the multi-worker iterator's blocking get of the next ready batch
SHARED_TENSOR_FILE = "torch/multiprocessing/reductions.py"  # rebuild_storage_fd, rebuild_tensor, ...
LOADING = frozenset({"data", "handoff"})
BACKWARD_PREFIX = "autograd::engine::evaluate_function"


def enabled() -> bool:
    return bool(os.environ.get(OUT_VAR))


class Profiler:
    """A torch profiler that records steps warmup+1..steps, advanced by `step()`."""

    def __init__(self, out: str, steps: int, warmup: int) -> None:
        from torch.profiler import ProfilerActivity, profile, schedule

        self.out = out
        self.files = [f for f in os.environ.get(FILES_VAR, "").split(os.pathsep) if f]
        self.trace = os.environ.get(TRACE_VAR) or None
        self.steps = steps - warmup
        self.start_ns: int | None = None
        self.end_ns: int | None = None
        self.written = False
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self.cuda = len(activities) > 1
        self.profiler = profile(
            activities=activities,
            schedule=schedule(wait=warmup - 1, warmup=1, active=self.steps, repeat=1),
            with_stack=True,
            on_trace_ready=self._ready,
        )
        with _inductor_unprobed():
            self.profiler.start()

    def step(self) -> None:
        """After each optimizer step; the last one attributes and writes."""
        if self.start_ns is not None and self.end_ns is None and self._last():
            self.end_ns = time.time_ns()
        with _inductor_unprobed():
            self.profiler.step()
        if self.start_ns is None and self._recording():
            self.start_ns = time.time_ns()

    def _recording(self) -> bool:
        from torch.profiler import ProfilerAction

        return self.profiler.current_action in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)

    def _last(self) -> bool:
        from torch.profiler import ProfilerAction

        return self.profiler.current_action is ProfilerAction.RECORD_AND_SAVE

    def stop(self) -> None:
        """The script ended before the last step: nothing complete to attribute."""
        if not self.written:
            self._write({"schema": SCHEMA, "error": "the script ended before the profiled steps were done"})

    def _ready(self, prof) -> None:
        try:
            result = attribute(prof, self.files, self.start_ns, self.end_ns or time.time_ns(), self.cuda)
        except Exception as error:  # the profile is an extra: a surprise in torch's events must not fail the run
            result = {"schema": SCHEMA, "error": f"attribution failed: {type(error).__name__}: {error}"}
        result["steps"] = self.steps
        if self.trace:
            try:
                prof.export_chrome_trace(self.trace)
            except Exception as error:  # noqa: BLE001 - reported, not raised
                result["trace_error"] = str(error)
        self._write(result)

    def _write(self, result: dict) -> None:
        self.written = True
        temporary = self.out + ".part"
        with open(temporary, "w") as handle:
            json.dump(result, handle)
        os.replace(temporary, self.out)


@contextlib.contextmanager
def _inductor_unprobed():
    """Keep torch.profiler from importing inductor into the script's process.

    Each profiling cycle asks `hasattr(torch, "_inductor")` (for CUDA graphs of
    compiled code), and torch answers by importing it: some 800 modules whose
    objects every later `gc.collect()` walks, so each collection of the script
    would take twice as long under the profile as without it. Where inductor is
    not loaded yet, nothing was compiled: the answer is no.
    """
    lazy = vars(torch).get("__getattr__")  # torch's lazy submodules
    if lazy is None or "torch._inductor" in sys.modules:
        yield
        return

    def without_inductor(name: str):
        if name == "_inductor":
            raise AttributeError(name)
        return lazy(name)

    torch.__getattr__ = without_inductor
    try:
        yield
    finally:
        torch.__getattr__ = lazy


class _UserFiles:
    """Whether a file name that the Python tracer reports is one of the script's
    files (it reports them relative to the entry of sys.path that holds them)."""

    def __init__(self, files: list[str]) -> None:
        cwd = os.getcwd()
        self.paths = {os.path.normpath(os.path.join(cwd, f)): f for f in files}
        self.cache: dict[str, str | None] = {}

    def name(self, file_name: str) -> str | None:
        found = self.cache.get(file_name, "")
        if found != "":
            return found
        path = os.path.normpath(file_name if os.path.isabs(file_name) else os.path.join(os.getcwd(), file_name))
        found = self.paths.get(path)
        self.cache[file_name] = found
        return found


def attribute(prof, files: list[str], start_ns: int | None, end_ns: int, cuda: bool) -> dict:
    from torch._C._profiler import _EventType

    user = _UserFiles(files)
    roots = prof.profiler.kineto_results.experimental_event_tree()
    main = _main_roots(roots, user, _EventType)
    if start_ns is None:
        start_ns = min((r.start_time_ns for r in main), default=end_ns)
    entries: dict[tuple, int] = {}
    counts: dict[tuple, list[int]] = {}  # user stack -> [calls made from its last line, operators]
    timeline: list[tuple[int, int, tuple]] = []  # (start, end, stack) of each self-time piece
    forward: dict[int, tuple] = {}  # sequence number -> user stack of the forward operator

    def add(stack: tuple, category: str, start: int, end: int) -> None:
        start, end = max(start, start_ns), min(end, end_ns)
        if end <= start:
            return
        entries[(stack, category)] = entries.get((stack, category), 0) + end - start
        timeline.append((start, end, stack))

    def count(stack: tuple, key: int) -> None:
        if stack and start_ns <= node_start <= end_ns:
            counts.setdefault(stack, [0, 0])[key] += 1

    # Iterative walk: Python stacks under torch can be deep. Each node is clipped to its
    # parent's interval and after its previous sibling's end, so no moment counts twice.
    pending = [(root, (), "python", False, start_ns, end_ns) for root in sorted(main, key=lambda e: -e.start_time_ns)]
    covered: list[tuple[int, int]] = []
    while pending:
        node, stack, category, in_op, low, high = pending.pop()
        tag = node.tag
        node_start = max(node.start_time_ns, low)
        node_end = min(node.start_time_ns + node.duration_time_ns, high)
        if node_end <= node_start:
            continue
        if not stack and category == "python":
            covered.append((node_start, node_end))
        child_stack, category, own, counted = _enter(node, stack, category, in_op, user, forward, _EventType)
        in_op = in_op or tag == _EventType.TorchOp
        for counted_stack, key in counted:
            count(counted_stack, key)
        children = sorted(node.children, key=lambda e: e.start_time_ns)
        # Self time: the gaps between children. In a function of the script, a gap goes
        # to the line of the next call (the line being evaluated), the last one to the
        # line of the previous call; an operator run without a Python call (`a * b`,
        # `x[i]`) to the line of the previous call (or the next, before the first).
        lines = [_caller_line(child, user, _EventType) for child in children] if own is not None else []
        following: list = [None] * len(lines)
        upcoming = None
        for index in range(len(lines) - 1, -1, -1):
            upcoming = lines[index] or upcoming
            following[index] = upcoming
        cursor, last_line, bounded = node_start, None, []
        for index, child in enumerate(children):
            child_start = max(child.start_time_ns, cursor)
            child_end = min(child.start_time_ns + child.duration_time_ns, node_end)
            gap_stack = inner_stack = child_stack
            if own is not None:
                line = lines[index] or last_line or following[index]
                if line is not None:
                    gap_stack = child_stack + (line,)
                    if lines[index] is None:
                        inner_stack = gap_stack  # a Python call adds its own line when walked
                last_line = lines[index] or last_line
            if child.tag == _EventType.TorchOp and _name(child).startswith(BACKWARD_PREFIX) and category not in LOADING:
                # The autograd engine between two gradient functions prepares the next one.
                gap_stack = child_stack + forward.get(child.extra_fields.sequence_number, ())
            add(gap_stack, category, cursor, min(child_start, node_end))
            if child_end > child_start:
                bounded.append((child, inner_stack, child_start, child_end))
                cursor = child_end
        tail = child_stack + (last_line,) if own is not None and last_line is not None else child_stack
        add(tail, category, cursor, node_end)
        for child, inner_stack, child_start, child_end in reversed(bounded):  # in time order: forward first
            pending.append((child, inner_stack, category, in_op, child_start, child_end))
    covered.sort()
    traced = _union(covered, start_ns, end_ns)
    window = end_ns - start_ns
    if window - traced > 0:
        entries[((), "untraced")] = window - traced
    result = {
        "schema": SCHEMA,
        "window_ns": window,
        "device": "cuda" if cuda and torch.cuda.is_initialized() else "cpu",
        "entries": [
            {"stack": [list(s) for s in stack], "category": category, "ns": ns}
            for (stack, category), ns in sorted(entries.items(), key=lambda item: -item[1])
        ],
        "counts": [{"stack": [list(s) for s in stack], "calls": c, "ops": o} for stack, (c, o) in counts.items()],
        "kernels": [],
        "gpu_idle_ns": None,
        "error": None,
    }
    if result["device"] == "cuda":
        result["kernels"], result["gpu_idle_ns"] = _kernels(prof, timeline, start_ns, end_ns)
    return result


def _enter(node, stack: tuple, category: str, in_op: bool, user, forward: dict, events):
    """What a node of the event tree is: the user stack its children run under, its
    category, the script file it is a call into (or None), and the (stack, 0 for a call
    made from the script's line, 1 for an operator) to count."""
    tag, name = node.tag, _name(node)
    child_stack, own, counted = stack, None, []
    if tag in (events.PyCall, events.PyCCall):
        caller = node.extra_fields.caller
        caller_file = user.name(_file(caller))
        if caller_file is not None:
            child_stack = stack + ((caller_file, caller.line_number),)
            counted.append((child_stack, 0))
        if tag == events.PyCall:
            callsite = node.extra_fields.callsite
            own = user.name(_file(callsite))
            if _file(callsite).endswith(LOADER_FILE):
                if callsite.function_name == "__next__" and category not in LOADING:
                    category = "handoff" if _from_workers(node, events) else "data"
                elif callsite.function_name == WAIT_FUNCTION and category == "handoff":
                    category = "data"  # blocked until a worker's batch arrives
            elif category == "data" and _file(callsite).endswith(SHARED_TENSOR_FILE):
                category = "handoff"  # a worker's batch, arrived: its tensors received
    elif tag == events.TorchOp:
        if name.startswith(DATA_ANNOTATION) and category not in LOADING:
            category = "data"
        elif category not in LOADING:
            sequence = node.extra_fields.sequence_number
            if name.startswith(BACKWARD_PREFIX):
                child_stack = stack + forward.get(sequence, ())
            elif sequence >= 0 and not in_op:
                forward.setdefault(sequence, stack)
            if not in_op:
                counted.append((stack, 1))
            if name in SYNC_NAMES:
                category = "sync"
            elif category == "python":
                category = "ops"
    elif name in SYNC_NAMES and category not in LOADING:
        category = "sync"
    return child_stack, category, own, counted


def _from_workers(next_call, events) -> bool:
    """Whether a DataLoader `__next__` call is that of a loader with worker processes:
    its `_next_data` takes their batches and sends them indices (WORKER_FUNCTIONS)."""
    return any(
        child.tag == events.PyCall
        and child.extra_fields.callsite.function_name == "_next_data"
        and any(
            grandchild.tag == events.PyCall and grandchild.extra_fields.callsite.function_name in WORKER_FUNCTIONS
            for grandchild in child.children
        )
        for child in next_call.children
    )


def _name(node) -> str:
    try:
        return node.name
    except UnicodeDecodeError:  # a C function's repr that torch cut inside a character
        return ""


def _file(frame) -> str:
    try:
        return frame.file_name
    except UnicodeDecodeError:
        return ""


def _caller_line(node, user: _UserFiles, types) -> tuple | None:
    if node.tag in (types.PyCall, types.PyCCall):
        caller = node.extra_fields.caller
        name = user.name(_file(caller))
        if name is not None:
            return (name, caller.line_number)
    return None


def _main_roots(roots, user: _UserFiles, types) -> list:
    """The roots of the thread that runs the script's code: the one whose Python
    calls come from its files (the most time among them, if several do)."""
    by_thread: dict[int, list] = {}
    for root in roots:
        by_thread.setdefault(root.start_tid, []).append(root)
    best, best_time = [], -1
    for group in by_thread.values():
        has_user = any(
            node.tag in (types.PyCall, types.PyCCall) and user.name(_file(node.extra_fields.caller))
            for node in _shallow(group)
        )
        total = sum(r.duration_time_ns for r in group)
        if has_user and total > best_time:
            best, best_time = group, total
    return best


def _shallow(group, depth: int = 40):
    pending = [(node, 0) for node in group]
    while pending:
        node, level = pending.pop()
        yield node
        if level < depth:
            pending += [(child, level + 1) for child in node.children]


def _union(intervals: list[tuple[int, int]], start: int, end: int) -> int:
    total, cursor = 0, start
    for a, b in sorted(intervals):
        a, b = max(a, cursor), min(b, end)
        if b > a:
            total += b - a
            cursor = b
    return total


def _kernels(prof, timeline: list, start_ns: int, end_ns: int) -> tuple[list, int]:
    """Device time by the user stack that launched it, and the GPU's idle time."""
    from torch._C._autograd import DeviceType

    timeline.sort()
    starts = [t[0] for t in timeline]
    events = prof.profiler.kineto_results.events()
    launches = {e.correlation_id(): e.start_ns() for e in events if e.device_type() == DeviceType.CPU}
    by_stack: dict[tuple, int] = {}
    busy = []
    for event in events:
        if event.device_type() != DeviceType.CUDA:
            continue
        a, b = max(event.start_ns(), start_ns), min(event.end_ns(), end_ns)
        if b <= a:
            continue
        busy.append((a, b))
        launched = launches.get(event.linked_correlation_id(), a)
        index = bisect.bisect_right(starts, launched) - 1
        stack = timeline[index][2] if index >= 0 and timeline[index][1] >= launched else ()
        by_stack[stack] = by_stack.get(stack, 0) + b - a
    idle = (end_ns - start_ns) - _union(busy, start_ns, end_ns)
    kernels = [{"stack": [list(s) for s in stack], "ns": ns} for stack, ns in by_stack.items()]
    return kernels, idle
