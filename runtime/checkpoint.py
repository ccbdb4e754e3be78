"""Checkpoints saved in the background, atomically, by rank 0 only.

    ckpt = AsyncCheckpointer()
    for step in ...:
        ...
        ckpt.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, path)
    ckpt.close()

save() copies the state to CPU and returns; a thread writes it while training goes on.
wait_for_writes() waits for the writes of every checkpointer of this process:
runtime.distributed's barrier() and cleanup() call it.
"""

import atexit
import contextlib
import copy
import os
import uuid
import weakref
from concurrent.futures import Future, ThreadPoolExecutor

import torch
import torch.distributed as dist


class AsyncCheckpointer:
    """Saves like torch.save(obj, path), but the write happens in a background thread.

    - save() snapshots obj before returning: every tensor in its dicts, lists and tuples
      is copied to CPU (other values are deep-copied), so training may go on changing
      the live tensors. Tensors that alias each other (tied weights) stay shared.
    - The file is written to a temporary name in the target folder, fsynced and renamed
      over `path`: a reader, or a crash, sees the old checkpoint or the new one, never half.
    - At most one write is in flight: save() first waits for the previous one.
    - A failed write leaves the previous file as it was; its error is raised by the next
      save() (which then saves nothing) or flush().
    - Under torch.distributed, ranks other than 0 do nothing: DDP ranks hold the same state.
      The rank is the process group's, or before one is joined torchrun's RANK variable;
      save() is no collective, so a rank that skips never leaves another waiting.
    - Pending writes are flushed by close(), on leaving a `with` block (exceptions too)
      and at interpreter exit.

    `path` is a file path, not a file object: PM405 rewrites
    `with open(p, "wb") as f: torch.save(obj, f)` to `ckpt.save(obj, p)`.
    Files load with plain torch.load(path), weights_only included when obj holds only
    tensors, containers and primitive values.
    """

    def __init__(self):
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-writer")
        self._pending: Future | None = None
        atexit.register(self.flush)
        _open.add(self)

    def save(self, obj, path: str | os.PathLike) -> None:
        if _rank() != 0:
            return
        self.flush()
        snapshot = _snapshot_to_cpu(obj)
        # Resolved now: a later os.chdir in the training script must not move the file.
        self._pending = self._writer.submit(_write_atomically, snapshot, os.path.abspath(path))

    def call(self, fn, /, *args, **kwargs) -> None:
        """Run `fn(*args, **kwargs)`, a function that only writes files (a project's own
        checkpoint helper), in the background thread, on a snapshot of its arguments taken
        as save() takes one; its result is dropped. Rank 0 only, one write in flight, errors
        raised by the next save(), call() or flush(), as for save()."""
        if _rank() != 0:
            return
        self.flush()
        args, kwargs = _snapshot_to_cpu((args, kwargs))
        self._pending = self._writer.submit(fn, *args, **kwargs)

    def flush(self) -> None:
        """Wait for the pending write; raise its error, if any."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self._writer.shutdown()
            atexit.unregister(self.flush)
            _open.discard(self)

    def __enter__(self) -> "AsyncCheckpointer":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


# The checkpointers not closed yet, for wait_for_writes(); weak, so an abandoned one can go.
_open: "weakref.WeakSet[AsyncCheckpointer]" = weakref.WeakSet()


def wait_for_writes() -> None:
    """Wait for the pending write of every open AsyncCheckpointer of this process (before a
    barrier, before destroy_process_group); raise the first write error after waiting for all."""
    errors = []
    for ckpt in list(_open):
        try:
            ckpt.flush()
        except BaseException as error:  # noqa: BLE001 - the others must still be waited for
            errors.append(error)
    if errors:
        raise errors[0]


def _rank() -> int:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK") or 0)  # torchrun's, before the script joins a process group


def _snapshot_to_cpu(obj):
    """A copy of obj whose tensors are detached CPU copies, complete on return."""
    copies: dict[tuple, torch.Tensor] = {}
    snapshot = _copy_tree(obj, copies)
    # One wait for all the non_blocking copies, on each GPU that had any.
    for device in {key[0] for key in copies if key[0].type == "cuda"}:
        torch.cuda.synchronize(device)
    return snapshot


def _copy_tree(obj, copies: dict):
    if isinstance(obj, torch.Tensor):
        return _copy_tensor(obj.detach(), copies)
    if isinstance(obj, dict):
        tree = copy.copy(obj)  # keeps the dict's type and attributes (a state_dict's _metadata)
        for key, value in obj.items():
            tree[key] = _copy_tree(value, copies)
        return tree
    if isinstance(obj, list):
        return [_copy_tree(value, copies) for value in obj]
    if isinstance(obj, tuple):
        items = [_copy_tree(value, copies) for value in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)  # namedtuple
    return copy.deepcopy(obj)


def _copy_tensor(tensor: torch.Tensor, copies: dict) -> torch.Tensor:
    # Equal storage, offset, shape and strides: one tensor under two names (tied weights).
    # Copied once, so torch.save stores it once and torch.load gives it back shared.
    key = (
        tensor.device,
        tensor.untyped_storage().data_ptr(),
        tensor.storage_offset(),
        tensor.shape,
        tensor.stride(),
        tensor.dtype,
    )
    if key not in copies:
        if tensor.is_cuda:
            # Pinned memory lets the copy run asynchronously; _snapshot_to_cpu waits once.
            pinned = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            copies[key] = pinned.copy_(tensor, non_blocking=True)
        else:
            copies[key] = tensor.to("cpu", copy=True)
    return copies[key]


def _write_atomically(snapshot, path: str) -> None:
    # A hidden name in the same folder (os.replace is atomic within a file system only),
    # opened with the umask's mode like torch.save's own files.
    folder, name = os.path.split(path)
    tmp = os.path.join(folder, f".{name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "xb") as f:
            torch.save(snapshot, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):  # open() itself may have failed
            os.unlink(tmp)
        raise
