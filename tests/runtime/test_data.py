import collections
import os
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from runtime import data
from runtime.data import DevicePrefetcher, PadCollate, PretokenizedDataset, default_num_workers

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
Pair = collections.namedtuple("Pair", "x y")


def assert_same(a, b, device=None):
    """Equal types and structure; tensors equal bit for bit (meta ones: in shape), with
    equal dtypes, on `device` (default: b's device)."""
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and a.device == (device or b.device)
        assert a.is_meta or torch.equal(a.cpu(), b.cpu())
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for key in a:
            assert_same(a[key], b[key], device)
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y, device)
    else:
        assert a == b


def batches(pin=False):
    """Batches of every shape a loader yields: tuples, lists, dicts, namedtuples, nested,
    with non-tensor leaves and several dtypes."""
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(4):
        x = torch.randn(3, 5, generator=g)
        ids = torch.randint(0, 100, (3, 7), generator=g)
        mask = torch.rand(3, 7, generator=g) > 0.5
        half = x.half()
        if pin:
            x, ids, mask, half = (t.pin_memory() for t in (x, ids, mask, half))
        out += [
            (x, ids),
            [x, ids, f"name{i}"],
            {"input_ids": ids, "mask": mask, "meta": {"step": i, "half": half}},
            Pair(x, [ids, (mask, None)]),
            collections.OrderedDict(x=x, extra=(ids, 3.5)),
            collections.defaultdict(list, x=x),
        ]
    return out


def as_moved(batch):
    """What moving a batch's tensors gives: a defaultdict cannot be rebuilt from a dict."""
    return dict(batch) if isinstance(batch, collections.defaultdict) else batch


def test_cpu_prefetcher_yields_the_loaders_batches_every_epoch():
    loader = DataLoader(TensorDataset(torch.randn(10, 3), torch.arange(10)), batch_size=4)
    prefetcher = DevicePrefetcher(loader, "cpu")
    assert len(prefetcher) == len(loader) == 3
    for _ in range(2):
        got = list(prefetcher)
        assert len(got) == 3
        for a, b in zip(got, loader):
            assert_same(a, b)
    assert [xb.shape[0] for xb, _ in prefetcher] == [4, 4, 2]  # the loop keeps its shape


def test_cpu_prefetcher_hands_out_the_loaders_own_batches():
    loader = batches()
    got = list(DevicePrefetcher(loader, torch.device("cpu")))
    assert len(got) == len(loader) and all(a is b for a, b in zip(got, loader))


def test_other_devices_get_every_tensor_moved_and_everything_else_kept():
    """meta stands for a non-CUDA accelerator: it runs without hardware."""
    loader = batches()
    got = list(DevicePrefetcher(loader, "meta"))
    assert len(got) == len(loader)
    for a, b in zip(got, loader):
        assert_same(a, as_moved(b), torch.device("meta"))


def test_prefetcher_without_len_iterates_and_has_no_len():
    prefetcher = DevicePrefetcher((torch.full((2,), float(i)) for i in range(3)), "cpu")
    with pytest.raises(TypeError):
        len(prefetcher)
    assert [b.tolist() for b in prefetcher] == [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]


def test_map_tensors_applies_fn_to_every_tensor_and_keeps_the_rest():
    x, ids = torch.randn(2, 3), torch.arange(4)
    batch = {"a": Pair(x, [ids, ("s", 1)]), "b": collections.OrderedDict(c=(ids, None))}
    expected = {"a": Pair(x.double(), [ids.double(), ("s", 1)]), "b": collections.OrderedDict(c=(ids.double(), None))}
    assert_same(data._map_tensors(torch.Tensor.double, batch), expected)


@pytest.fixture
def cores(monkeypatch):
    """Pretend this process may run on n cores."""
    monkeypatch.delenv(data.NUM_WORKERS_ENV, raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)

    def set_cores(n):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(n)), raising=False)
        monkeypatch.setattr(os, "cpu_count", lambda: 10 * n)  # more than we may use

    return set_cores


@pytest.mark.parametrize("n, expected", [(1, 0), (2, 1), (5, 4), (9, 8), (64, 8)])
def test_num_workers_follows_affinity_leaves_a_core_and_is_capped(cores, n, expected):
    cores(n)
    assert default_num_workers() == expected


def test_num_workers_cap_is_an_argument(cores):
    cores(64)
    assert default_num_workers(cap=3) == 3
    assert default_num_workers(cap=100) == 63


def test_num_workers_shares_cores_among_local_ranks(cores, monkeypatch):
    cores(32)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert default_num_workers() == 3  # 4 cores per rank, one for the rank itself
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "64")
    assert default_num_workers() == 0


def test_num_workers_without_affinity_uses_cpu_count(cores, monkeypatch):
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    assert default_num_workers() == 3
    monkeypatch.setattr(os, "cpu_count", lambda: None)  # undeterminable: as one core
    assert default_num_workers() == 0


def test_num_workers_env_override_wins_uncapped(cores, monkeypatch):
    cores(4)
    monkeypatch.setenv(data.NUM_WORKERS_ENV, "12")
    assert default_num_workers() == 12
    monkeypatch.setenv(data.NUM_WORKERS_ENV, "0")
    assert default_num_workers() == 0
    monkeypatch.setenv(data.NUM_WORKERS_ENV, "")  # empty: not set
    assert default_num_workers() == 3
    for bad in ["-1", "two", "2.5"]:
        monkeypatch.setenv(data.NUM_WORKERS_ENV, bad)
        with pytest.raises(ValueError, match=data.NUM_WORKERS_ENV):
            default_num_workers()


@pytest.mark.parametrize("method, expected", [("fork", 3), ("spawn", 0), ("forkserver", 0)])
def test_fork_only_gives_no_workers_unless_they_start_by_fork(cores, monkeypatch, method, expected):
    cores(4)
    monkeypatch.setattr(data.multiprocessing, "get_start_method", lambda allow_none=False: method)
    assert default_num_workers(fork_only=True) == expected
    monkeypatch.setenv(data.NUM_WORKERS_ENV, "2")  # a pinned count cannot make spawn work
    assert default_num_workers(fork_only=True) == (2 if method == "fork" else 0)
    assert default_num_workers() == 2


def test_fork_only_follows_the_platform_default_and_does_not_fix_it(cores, monkeypatch):
    import multiprocessing

    cores(4)
    monkeypatch.setattr(multiprocessing, "get_start_method", lambda allow_none=False: None)
    for defaults, expected in [(["fork", "spawn"], 3), (["spawn", "fork"], 0), (["forkserver", "fork"], 0)]:
        monkeypatch.setattr(multiprocessing, "get_all_start_methods", lambda defaults=defaults: defaults)
        assert default_num_workers(fork_only=True) == expected


def test_start_method_stays_unset_for_the_script():
    """Asking how workers start must leave the script free to choose (set_start_method raises
    once the context is fixed); checked in a fresh interpreter, where nothing chose yet."""
    import subprocess
    import sys

    code = (
        "import multiprocessing, runtime.data as d; d._start_method(); "
        "assert multiprocessing.get_start_method(allow_none=True) is None; "
        "multiprocessing.set_start_method('spawn')"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    subprocess.run(
        [sys.executable, "-c", code], check=True, cwd=root, timeout=120, env={**os.environ, "PYTHONPATH": root}
    )


TEXTS = [
    "the cat sat",
    "",
    "a much longer sentence with many words in it",
    "on the mat",
    "x",
    "tokens tokens tokens",
    "the end",
    "héllo wörld",
    "one two three four five",
]
PAD = 0


def toy_tokenize(text):
    """A stand-in for a real tokenizer: BOS, one id per word, EOS."""
    return [1] + [sum(map(ord, word)) % 997 + 3 for word in text.split()] + [2]


def hf_style_tokenize(text):
    ids = toy_tokenize(text)
    return {"input_ids": ids, "attention_mask": [1] * len(ids)}


def tokenize_in_the_loop(texts, padding_side="right"):
    """The per-batch code that PretokenizedDataset + PadCollate replace."""
    seqs = [toy_tokenize(t) for t in texts]
    longest = max(len(s) for s in seqs)
    pads = [[PAD] * (longest - len(s)) for s in seqs]
    ones = [[1] * len(s) for s in seqs]
    zeros = [[0] * len(p) for p in pads]
    if padding_side == "right":
        return {
            "input_ids": torch.tensor([s + p for s, p in zip(seqs, pads)]),
            "attention_mask": torch.tensor([o + z for o, z in zip(ones, zeros)]),
        }
    return {
        "input_ids": torch.tensor([p + s for s, p in zip(seqs, pads)]),
        "attention_mask": torch.tensor([z + o for o, z in zip(ones, zeros)]),
    }


def tensor_tokenize(text):
    return torch.tensor(toy_tokenize(text))


@pytest.mark.parametrize("tokenize", [toy_tokenize, hf_style_tokenize, tensor_tokenize])
def test_pretokenized_items_are_the_tokenizers_ids(tokenize):
    dataset = PretokenizedDataset(TEXTS, tokenize)
    assert len(dataset) == len(TEXTS)
    for i, text in enumerate(TEXTS):
        assert_same(dataset[i], torch.tensor(toy_tokenize(text)))
    assert dataset.ids.numel() == sum(len(toy_tokenize(t)) for t in TEXTS)  # one flat tensor
    with pytest.raises(IndexError):
        dataset[len(TEXTS)]
    with pytest.raises(IndexError):
        dataset[-1]


def test_pretokenized_items_are_copies():
    dataset = PretokenizedDataset(TEXTS, toy_tokenize)
    dataset[0][:] = -100  # e.g. masking labels in place
    assert_same(dataset[0], torch.tensor(toy_tokenize(TEXTS[0])))


def test_pretokenized_rejects_batched_output():
    with pytest.raises(ValueError, match="1-D"):
        PretokenizedDataset(["a b"], lambda t: [toy_tokenize(t)])
    assert len(PretokenizedDataset([], toy_tokenize)) == 0


@pytest.mark.parametrize("padding_side", ["right", "left"])
@pytest.mark.parametrize("batch_size", [1, 2, 4])
def test_pretokenized_batches_equal_tokenizing_in_the_loop(padding_side, batch_size):
    dataset = PretokenizedDataset(TEXTS, toy_tokenize)
    loader = DataLoader(dataset, batch_size=batch_size, collate_fn=PadCollate(PAD, padding_side))
    expected = [tokenize_in_the_loop(TEXTS[i : i + batch_size], padding_side) for i in range(0, len(TEXTS), batch_size)]
    for epoch in range(2):
        got = list(loader)
        assert len(got) == len(expected)
        for a, b in zip(got, expected):
            assert_same(a, b)


def test_pretokenized_batches_from_two_workers_are_identical_and_in_order():
    dataset = PretokenizedDataset(TEXTS * 3, toy_tokenize)
    loader = DataLoader(
        dataset, batch_size=4, shuffle=False, num_workers=2, collate_fn=PadCollate(PAD), timeout=60
    )  # a stuck worker fails, not hangs
    expected = [tokenize_in_the_loop((TEXTS * 3)[i : i + 4]) for i in range(0, 3 * len(TEXTS), 4)]
    got = list(loader)
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        assert_same(a, b)


def test_pad_collate_rejects_unknown_side():
    with pytest.raises(ValueError, match="padding_side"):
        PadCollate(0, "center")


def test_exported_from_runtime():
    import runtime

    assert (runtime.DevicePrefetcher, runtime.default_num_workers, runtime.PretokenizedDataset, runtime.PadCollate) == (
        DevicePrefetcher,
        default_num_workers,
        PretokenizedDataset,
        PadCollate,
    )


# --- CUDA: run where a GPU is present -------------------------------------------------

SLEEP_CYCLES = 200_000_000  # torch.cuda._sleep: ~0.1 s of GPU clock cycles


@pytest.mark.gpu
@needs_cuda
def test_cuda_batches_equal_plain_copies_on_any_consumer_stream():
    loader = batches(pin=True)
    expected = [data._map_tensors(lambda t: t.to("cuda"), b) for b in loader]
    prefetcher = DevicePrefetcher(loader, "cuda")
    assert len(prefetcher) == len(loader)
    with torch.cuda.stream(torch.cuda.Stream()):
        for epoch in range(2):
            got = [data._map_tensors(torch.clone, b) for b in prefetcher]  # on the consumer stream
            torch.cuda.synchronize()
            assert len(got) == len(expected)
            for a, b in zip(got, expected):
                assert_same(a, as_moved(b))


@pytest.mark.gpu
@needs_cuda
def test_cuda_consumer_waits_for_each_batchs_copy():
    """The side stream is held back before every copy; a consumer that did not wait for
    the copy would read the batch's memory before the copy lands."""
    host = [torch.full((1 << 20,), i + 1.0).pin_memory() for i in range(5)]

    def slow_copies():
        for batch in host:
            with torch.cuda.stream(prefetcher.stream):
                torch.cuda._sleep(SLEEP_CYCLES)  # queued just before this batch's copy
            yield batch

    prefetcher = DevicePrefetcher(slow_copies(), "cuda")
    got = [xb.clone() for xb in prefetcher]
    torch.cuda.synchronize()
    for a, b in zip(got, host, strict=True):
        assert torch.equal(a.cpu(), b)


@pytest.mark.gpu
@needs_cuda
def test_cuda_batch_memory_is_not_reused_while_the_consumer_still_reads_it():
    """The consumer's stream is held back before it reads each batch, and the batch is
    dropped at once; without record_stream the next copy would reuse its memory and
    overwrite it before the read."""
    host = [torch.full((1 << 20,), i + 1.0).pin_memory() for i in range(6)]
    got, batches_on_gpu = [], iter(DevicePrefetcher(host, "cuda"))
    for _ in host:
        xb = next(batches_on_gpu)
        torch.cuda._sleep(SLEEP_CYCLES)
        got.append(xb * 1)  # queued after the sleep
        del xb
    torch.cuda.synchronize()
    for a, b in zip(got, host, strict=True):
        assert torch.equal(a.cpu(), b)


@pytest.mark.gpu
@needs_cuda
def test_cuda_prefetcher_warns_once_about_pageable_batches():
    def pinning_warnings(batches):
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            prefetcher = DevicePrefetcher(batches, "cuda")
            got = [list(prefetcher) for epoch in range(2)]
        assert all(torch.equal(a.cpu(), b) for epoch in got for a, b in zip(epoch, batches, strict=True))
        return [w for w in record if "pin_memory=True" in str(w.message)]

    pageable = [torch.randn(4, 4) for _ in range(3)]
    assert len(pinning_warnings(pageable)) == 1
    assert pinning_warnings([t.pin_memory() for t in pageable]) == []
