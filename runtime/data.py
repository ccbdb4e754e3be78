"""Feeding the training loop: batches copied ahead on a side stream, worker counts, pretokenized text.

loader = DataLoader(dataset, batch_size=64, num_workers=default_num_workers(), pin_memory=True)
for xb, yb in DevicePrefetcher(loader, device):
    loss = model(xb, yb)          # xb, yb are on `device` already

data = PretokenizedDataset(texts, tokenizer)      # tokenized once, not every step
loader = DataLoader(data, batch_size=32, collate_fn=PadCollate(tokenizer.pad_token_id))
"""

import multiprocessing
import os
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch

from runtime.distributed import local_device

NUM_WORKERS_ENV = "PERFMOD_NUM_WORKERS"  # a worker count that wins over default_num_workers' choice


class DevicePrefetcher:
    """Iterates like `loader`, with every tensor of each batch already on `device`.

    On CUDA, the copy of batch k+1 is queued on a side stream (`.stream`) before batch k
    is handed out, so it runs while the GPU computes step k, even when the loop
    synchronizes every step (`loss.item()`); the GPU holds one batch more than the loop
    does. Batches may be tensors, tuples, lists, namedtuples and mappings, nested; other
    values (strings, ints, custom objects) pass through unchanged, so tensors inside
    custom objects are not moved.

    Stream safety, per batch: the copies are queued with non_blocking=True on the side
    stream and an event is recorded after them; when the batch is handed out, the stream
    that is current for the consumer waits for that event (only for this batch's copies,
    not for the next batch's), and each copied tensor is recorded on that stream
    (`record_stream`), so the caching allocator does not give its memory to a later
    copy on the side stream before the consumer's queued work has read it.

    The copy overlaps only from pinned host memory: from pageable memory the driver stages
    it synchronously. Pass `pin_memory=True` to the DataLoader, which pins in a background
    thread; the prefetcher warns once if the first batch holds unpinned CPU tensors, rather
    than pinning them itself, which would add a host copy to the main thread on every step.
    The loader must hand out fresh host memory per batch (DataLoader does): the copy of a
    batch is still in flight when the loader is asked for the next one.

    `device="cuda"` without an index is this process's GPU: under torchrun the GPU of its
    LOCAL_RANK, as runtime.distributed.setup() picks it, else the current one.

    On other devices it is plain iteration: the CPU gets the loader's batches as they are,
    other devices a blocking `.to(device)` of each tensor. `len()` is the loader's, and
    each `for` over the prefetcher is a new epoch of the loader.
    """

    def __init__(self, loader: Iterable, device: torch.device | str):
        self.loader = loader
        # "cuda" is this process's GPU, fixed now: under torchrun its LOCAL_RANK's (runtime.distributed).
        self.device = local_device(device)
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._pinning_checked = False

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        if self.device.type == "cuda":
            return self._cuda_batches()
        if self.device.type == "cpu":
            return iter(self.loader)
        return (_map_tensors(lambda t: t.to(self.device), batch) for batch in self.loader)

    def _cuda_batches(self):
        queued = None
        for batch in self.loader:
            copying = self._copy(batch)
            if queued is not None:
                yield _hand_out(*queued, self.device)
            queued = copying
        if queued is not None:
            yield _hand_out(*queued, self.device)

    def _copy(self, batch):
        """Queue the copy of batch on the side stream; return the copy, its tensors and an
        event recorded after them."""
        sources, copies = [], []

        def copy(t: torch.Tensor) -> torch.Tensor:
            sources.append(t)
            copies.append(t.to(self.device, non_blocking=True))
            return copies[-1]

        # The pinned sources may be freed before their copies finish: torch's pinned memory
        # allocator records the copies' stream and does not reuse the memory until then.
        with torch.cuda.stream(self.stream):
            batch = _map_tensors(copy, batch)
        if not self._pinning_checked:
            self._pinning_checked = True  # pinning is a loader-wide setting: one batch tells
            if any(t.is_cpu and not t.is_pinned() for t in sources):
                warnings.warn(
                    "DevicePrefetcher: batches are in pageable host memory, so their copies to "
                    "CUDA block the host and cannot overlap with compute; pass pin_memory=True "
                    "to the DataLoader",
                    stacklevel=3,
                )
        return batch, copies, self.stream.record_event()


def _hand_out(batch, copies: list[torch.Tensor], copied: torch.cuda.Event, device: torch.device):
    consumer = torch.cuda.current_stream(device)
    consumer.wait_event(copied)
    for t in copies:
        t.record_stream(consumer)
    return batch


def _map_tensors(fn: Callable[[torch.Tensor], torch.Tensor], obj):
    """obj with fn applied to each tensor in it, through mappings, lists and tuples."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, Mapping):
        mapped = {key: _map_tensors(fn, value) for key, value in obj.items()}
        try:
            return type(obj)(mapped)  # OrderedDict, Hugging Face BatchEncoding...
        except TypeError:  # a mapping type that cannot be built from a dict (defaultdict)
            return mapped
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(_map_tensors(fn, value) for value in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map_tensors(fn, value) for value in obj)
    return obj


def default_num_workers(cap: int = 8, *, fork_only: bool = False) -> int:
    """DataLoader worker processes for this machine: one per usable core, one core left to
    the training process, at most `cap`; 0 (load in the main process) with a single core.

    Usable cores are those this process may run on (os.sched_getaffinity, which respects
    taskset, cgroups cpusets and Slurm bindings; os.cpu_count() where it is missing),
    shared among the local ranks under torchrun (LOCAL_WORLD_SIZE). The cap: every worker
    is a process holding its own copy of the dataset object (copy-on-write pages that
    Python's reference counting soon copies), and beyond a few workers the loader is rarely
    the bottleneck while memory and core contention grow. The environment variable
    PERFMOD_NUM_WORKERS, when set and not empty, is returned as is: users pin the count.

    `fork_only=True` gives 0 unless workers start by fork: for loaders whose workers could
    not start otherwise. Under spawn and forkserver (the default on macOS and Windows, and
    on Linux from Python 3.14) each worker receives the dataset and collate_fn by pickle
    (a lambda or a nested function cannot be) and re-imports the main script (one without
    an `if __name__ == "__main__":` guard starts its training again there, and fails).
    A DataLoader with its own `multiprocessing_context` is not seen here: pass the count
    yourself.
    """
    if fork_only and _start_method() != "fork":
        return 0
    if env := os.environ.get(NUM_WORKERS_ENV):  # set and not empty, as PERFMOD_AMP
        if not env.isdecimal():
            raise ValueError(f"{NUM_WORKERS_ENV}={env!r}: expected a non-negative integer")
        return int(env)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    per_rank = cores // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return max(0, min(cap, per_rank - 1))


def _start_method() -> str:
    """How DataLoader workers will start, without fixing the choice (get_start_method()
    without allow_none would, and a later set_start_method would then raise)."""
    return multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]


class PretokenizedDataset(torch.utils.data.Dataset):
    """The token ids of a fixed list of texts, tokenized once instead of in every step.

    `tokenize(text)` returns the ids of one text: a sequence of ints, a 1-D tensor, or a
    mapping with "input_ids" (a Hugging Face tokenizer called on one text; its
    truncation, special tokens etc. are whatever that call does). Item i is then
    `torch.tensor(ids_i, dtype=torch.long)`: the same ids the loop would have produced
    by tokenizing text i, as a new tensor each time (callers may change it in place, e.g.
    to mask labels, without changing later epochs). Batch them with PadCollate.

    The ids are kept as one flat tensor plus offsets, not as a list of tensors: DataLoader
    workers then share two objects copy-on-write instead of touching the reference counts
    of one Python object per text, which copies their memory page by page.
    """

    def __init__(self, texts: Iterable[str], tokenize: Callable):
        seqs = [_token_ids(tokenize(text)) for text in texts]
        self.offsets = torch.zeros(len(seqs) + 1, dtype=torch.long)
        torch.cumsum(torch.tensor([len(s) for s in seqs], dtype=torch.long), 0, out=self.offsets[1:])
        self.ids = torch.cat(seqs) if seqs else torch.empty(0, dtype=torch.long)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> torch.Tensor:
        if not 0 <= i < len(self):
            raise IndexError(f"index {i} out of range for {len(self)} texts")
        start, end = self.offsets[i : i + 2].tolist()
        return self.ids[start:end].clone()


def _token_ids(tokenized) -> torch.Tensor:
    ids = tokenized["input_ids"] if isinstance(tokenized, Mapping) else tokenized
    ids = torch.as_tensor(ids, dtype=torch.long)
    if ids.dim() != 1:
        raise ValueError(f"tokenize(text) must give a 1-D sequence of ids, not shape {tuple(ids.shape)}")
    return ids


@dataclass(frozen=True)
class PadCollate:
    """collate_fn that pads 1-D id tensors to the longest in the batch, like
    `tokenizer(texts, padding=True, return_tensors="pt")` or a hand-written pad loop:

    - "input_ids": int64 (batch, longest), each row the item's ids followed by `pad_id`
      (before them with padding_side="left", a Hugging Face tokenizer's padding_side);
    - "attention_mask": int64 of the same shape, 1 over the ids and 0 over the padding.

    Items may also be tuples whose first element is the ids and the rest per-sample
    values (labels, ...), as `StackDataset(PretokenizedDataset(texts, tok), labels)`
    gives them; the batch is then `(padded, *rest)`, the rest collated as DataLoader's
    default collate does (tensors and numbers stacked).

    Nothing else: no token_type_ids, no padding to a fixed length (truncation belongs to
    `tokenize` in PretokenizedDataset). A dataclass, not a closure, so that DataLoader
    workers can receive it under the spawn and forkserver start methods.
    """

    pad_id: int
    padding_side: str = "right"

    def __post_init__(self):
        if self.padding_side not in ("right", "left"):
            raise ValueError(f"padding_side={self.padding_side!r}: expected 'right' or 'left'")

    @classmethod
    def for_tokenizer(cls, tokenizer) -> "PadCollate":
        """Pad as `tokenizer(texts, padding=True)` does: its pad id and padding side."""
        if tokenizer.pad_token_id is None:
            raise ValueError("the tokenizer has no pad token (set tokenizer.pad_token, e.g. to its eos token)")
        return cls(tokenizer.pad_token_id, getattr(tokenizer, "padding_side", "right"))

    def __call__(self, items: Sequence) -> dict[str, torch.Tensor] | tuple:
        if items and isinstance(items[0], tuple):
            ids, *rest = zip(*items)
            return (self._pad(ids), *(torch.utils.data.default_collate(list(values)) for values in rest))
        return self._pad(items)

    def _pad(self, seqs: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        lengths = torch.tensor([len(s) for s in seqs], dtype=torch.long)
        longest = int(lengths.max())
        ids = torch.full((len(seqs), longest), self.pad_id, dtype=torch.long)
        positions = torch.arange(longest)
        if self.padding_side == "right":
            mask = positions < lengths[:, None]
        else:
            mask = positions >= longest - lengths[:, None]
        ids[mask] = torch.cat(list(seqs))  # row by row: each row's ids land in its mask's places
        return {"input_ids": ids, "attention_mask": mask.long()}
