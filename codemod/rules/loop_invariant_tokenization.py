from __future__ import annotations

from dataclasses import replace
from functools import partial

import libcst as cst

from codemod.analysis.call_writes import call_writes
from codemod.analysis.corpus import PaddedTable, Pretokenize, TextTable, corpus
from codemod.analysis.loop_edits import in_front_of, moved_line
from codemod.analysis.names import kwarg
from codemod.analysis.periodic import periodic
from codemod.analysis.tokenizers import tokenizers
from codemod.analysis.values import Kind
from codemod.analysis.variance import Hoist, Hoists, variance
from codemod.edits import InsertBefore, Move, Remove, Replace
from codemod.rule import Invalid, Level, Rule, Valid
from codemod.suppression import suppressed_on

PREAMBLE = """\
import torch
from transformers import AutoTokenizer
tokenizer = AutoTokenizer.from_pretrained("gpt2")
model = torch.nn.Embedding(1000, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
PROMPT = "Answer with one number."
"""
STEP = "    loss = model(ids).sum()\n    loss.backward()\n    opt.step()\n    opt.zero_grad()\n"
OWN_TOKENIZER = """\
import torch
class WordTokenizer:
    def __init__(self, docs):
        self.vocab = {w: i for i, w in enumerate(sorted({w for d in docs for w in d.split()}))}
    def encode(self, text):
        return [self.vocab.get(w, 0) for w in text.split()]
tokenizer = WordTokenizer(["a b c"])
model = torch.nn.Embedding(1000, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
"""

CORPUS = """\
import random
import torch
class WordTokenizer:
    def __init__(self, docs):
        self.vocab = {w: i + 1 for i, w in enumerate(sorted({w for d in docs for w in d.split()}))}
    def encode(self, text, n):
        ids = [self.vocab.get(w, 0) for w in text.split()][:n]
        return ids + [0] * (n - len(ids))
docs = ["a b c", "b c d", "c d e", "d e f"]
tok = WordTokenizer(docs)
model = torch.nn.Embedding(16, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
"""
PICK = "    idx = random.sample(range(len(docs)), 2)\n    texts = [docs[i] for i in idx]\n"
ENCODE = "    ids = torch.tensor([tok.encode(t, 4) for t in texts])\n"
UNSAFE = {"level": Level.UNSAFE}
CHAT_CORPUS = "docs = ['a b', 'c d', 'e f', 'g h']\n"
CHAT_STEP = (
    "    rows = []\n    for text in batch:\n"
    "        messages = [{'role': 'user', 'content': text}]\n"
    "        prompt = tokenizer.apply_chat_template(messages, tokenize=False)\n"
    "        toks = tokenizer(prompt, return_tensors='pt')\n"
    "        rows.append(toks['input_ids'][0])\n    ids = torch.cat(rows)\n"
)
PADDED = (
    "for step in range(3):\n    batch = [docs[i] for i in torch.randperm(4)[:2].tolist()]\n"
    "    ids = tokenizer(batch, return_tensors='pt', {padding})['input_ids']\n"
)


class LoopInvariantTokenization(Rule):
    """
    ## What it does
    Finds work in a training loop whose result is the same on every step, a
    fixed prompt or chat template tokenized again, `torch.tensor` of a
    constant, and moves it in front of the loop, out of every loop around it
    for which it is invariant too. Texts of a fixed corpus tokenized again on
    every step (`[tok.encode(t, n) for t in texts]` over `texts = [docs[i] for
    i in idx]`) are tokenized once before the loop, and each step picks its
    ids (at `--level unsafe`). Other per-batch tokenization, and
    tokenizing inside a model's `forward` or a DataLoader's `collate_fn`, are
    reported without a fix.

    ## Why is this bad?
    Tokenizing is host work: Python (or Rust behind a Python call) that runs
    while the GPU waits for the next step's kernels, and `torch.tensor(...)`
    of the ids is one more host allocation and, with `.to(device)`, one more
    blocking copy per step. What it costs depends on the tokenizer and on how
    long the GPU's step is; measured on the CPU (torch 2.13, a pure-Python word-level
    tokenizer, batch 64, a 100-token scaffold, `benchmarks/bench_tokenize.py`)
    the host time to build one batch falls from 2.1 ms to 1.8 ms when the
    scaffold is tokenized once, and to 0.7 ms (none on the training process
    with DataLoader workers) when the questions are pretokenized too. For 8
    sampled documents of about 350 words, truncated to 129 ids by a
    pure-Python word tokenizer, a step's batch takes about 1.3 ms to tokenize
    and 0.03 ms to pick from the pretokenized corpus, which took 63 ms to
    build for 400 documents. Work that gives the same result every step can
    run once.

    A call is moved only when perfmod can prove its result invariant: the
    callee is known to be pure (a tokenizer built by
    `transformers.<Class>.from_pretrained`, `tiktoken.get_encoding` or
    `tokenizers.Tokenizer.from_file`, and its `__call__`, `encode`,
    `apply_chat_template`, ..., also when it is an attribute of an object of
    a class of your project, `ctx.wrapper.tokenizer` built in the wrapper's
    `__init__` in another module, whose other methods only read it;
    `torch.tensor`, `torch.arange` and other
    deterministic factories; tensor conversions such as `.to(device)`), no
    variable it reads is re-bound or changed in place inside the loop, and the
    value it produces is not changed in place there either (aliasing: the
    hoisted object is now shared by every step). A field of a config record
    (a dataclass of your file with no property, no attribute hooks and no
    method that assigns) counts as changed only where the loop may assign
    that field, on any object, or replace or hand on a record it is read
    through: the loop may change the record's other fields. A function, or a method of a
    tokenizer class of your own, is pure when it reads only its arguments and
    attributes that nothing changes after `__init__` (a vocabulary dict), and
    calls only pure code; one that keeps a counter on `self`, draws random
    numbers or calls what perfmod cannot follow is not, and its calls are
    reported without a fix. A function of another module of your project is
    pure by the same rules, read in its own module. Statements that build
    only the arguments (`messages = [...]`) move with the call when they are
    invariant too. A value that is only a view made in constant time
    (`torch.from_numpy(array)`, `x.unsqueeze(1)`, `x.t()`) is left in the
    loop: making it once saves nothing worth a line.

    A corpus is pretokenized when every text a step tokenizes is an element
    of a list held in memory (`docs[i]`: a list the script builds, or one a
    function of the file returns) that the loop only reads, the encode call
    is pure and its other arguments are the same on every step, and the ids
    go straight into `torch.tensor(...)`, which copies them. Where the step
    loops over model contexts that each bring their own tokenizer (`for ctx in
    contexts:`, a list the loop does not change), the corpus is tokenized once
    for each context, in a table keyed by the context (`docs_ids[id(ctx)]`).
    Texts of the corpus that a loop of the step tokenizes one at a time (`for
    user_text in batch_user_texts:` rendering a chat template, then
    tokenizing) are tabulated: what the loop's statements make of each text
    up to the last tokenizer call is made once before the loop for every text
    of the corpus, in a table keyed by the text (per context, as above), and
    the step looks it up. The loop's list must be made from the texts the step
    picks text by text (`[split_user_and_anchor(raw, anchor)[0] for raw in
    batch_texts]`, with a pure function, under `if`s the same on every step),
    the statements plain assignments of values the same on every step but for
    the text and the context, their names read nowhere else, and the
    tokenizer's result never changed in place. Texts of the corpus that a
    Hugging Face tokenizer pads together, to the longest of the step
    (`tokenizer(batch_texts, padding=True, return_tensors="pt")`, the texts
    picked in the call, `[docs[i] for i in idx]`, or a list made from them
    text by text, `[f"{text}{suffix}" for text in batch_texts]`), are
    tokenized once each, unpadded, in a table keyed by the
    text, and the step pads its rows with the tokenizer's own `pad`, which
    uses the tokenizer's padding side and pad id as its batched call does. This
    needs a tokenizer of transformers (a class of your own may pad otherwise),
    options that act on each text alone (`add_special_tokens`, `truncation`,
    `max_length`) or that `pad` takes (`pad_to_multiple_of`,
    `return_tensors`, ...), tensors returned, and of the result only
    `input_ids` and `attention_mask` read (`pad` gives no `token_type_ids`).
    Texts the step makes (formatted from the step's counter, generated by the
    model) are not pretokenized: the report says why, and where the tokenizer is
    built. Work that runs only
    every few steps, a sample prompt tokenized for logging under `if step %
    100 == 0:`, `if step > 0 and step % every == 0:` or a helper such as `if
    divisible_by(step, every):`, is left alone: it does not run on every step.

    ## Example
    ```python
    for batch in loader:
        prompt = tokenizer.apply_chat_template(messages, tokenize=False)
        prompt_ids = tokenizer(prompt, return_tensors="pt")["input_ids"].to(device)
        loss = model(prompt_ids, batch)
        ...
    ```
    Use instead:
    ```python
    prompt = tokenizer.apply_chat_template(messages, tokenize=False)
    prompt_ids = tokenizer(prompt, return_tensors="pt")["input_ids"].to(device)
    for batch in loader:
        loss = model(prompt_ids, batch)
        ...
    ```

    Tokenizing texts of a corpus on every step:
    ```python
    for step in range(steps):
        idx = random.sample(range(len(docs)), batch_size)
        texts = [docs[i] for i in idx]
        ids = torch.tensor([tok.encode(t, seq + 1) for t in texts])
        ...
    ```
    Use instead:
    ```python
    docs_ids = torch.tensor([tok.encode(t, seq + 1) for t in docs])
    for step in range(steps):
        idx = random.sample(range(len(docs)), batch_size)
        ids = docs_ids[idx]
        ...
    ```
    One tensor holds the corpus's ids when perfmod can prove that every text
    gives as many ids (`encode` truncates and pads to the length it is given:
    `ids[:n]`, then `ids + [pad] * (n - len(ids))`) and the step's indices are
    a list; otherwise the ids are kept as lists, `docs_ids = [tok.encode(t,
    seq + 1) for t in docs]`, and the step makes its tensor from the rows it
    picks, `torch.tensor([docs_ids[i] for i in idx])`, as before.

    Model contexts that each bring their own tokenizer:
    ```python
    for step in range(steps):
        idx = random.sample(range(len(docs)), batch_size)
        texts = [docs[i] for i in idx]
        for ctx in contexts:
            ids = torch.tensor([ctx.tok.encode(t, ctx.seq) for t in texts])
            ...
    ```
    Use instead:
    ```python
    docs_ids = {id(ctx): torch.tensor([ctx.tok.encode(t, ctx.seq) for t in docs]) for ctx in contexts}
    for step in range(steps):
        idx = random.sample(range(len(docs)), batch_size)
        for ctx in contexts:
            ids = docs_ids[id(ctx)][idx]
            ...
    ```
    The table is keyed by each context's identity: the list of contexts must
    not change in the loop.

    A chat prompt rendered and tokenized for each text:
    ```python
    for step in range(steps):
        batch_texts = [texts[i] for i in perm[step * bs:(step + 1) * bs].tolist()]
        for ctx in model_contexts:
            for user_text in batch_texts:
                messages = [{"role": "user", "content": user_text}]
                rendered = ctx.tokenizer.apply_chat_template(messages, tokenize=False)
                toks = ctx.tokenizer(rendered, return_tensors="pt")
                ids_list.append(toks["input_ids"][0].to(device))
            ...
    ```
    Use instead:
    ```python
    toks_by_text = {}
    for ctx in model_contexts:
        toks_by_text[id(ctx)] = {}
        for user_text in texts:
            messages = [{"role": "user", "content": user_text}]
            rendered = ctx.tokenizer.apply_chat_template(messages, tokenize=False)
            toks = ctx.tokenizer(rendered, return_tensors="pt")
            toks_by_text[id(ctx)][user_text] = toks
    for step in range(steps):
        batch_texts = [texts[i] for i in perm[step * bs:(step + 1) * bs].tolist()]
        for ctx in model_contexts:
            for user_text in batch_texts:
                toks = toks_by_text[id(ctx)][user_text]
                ids_list.append(toks["input_ids"][0].to(device))
            ...
    ```

    A batch of texts padded together:
    ```python
    for step in range(steps):
        batch = [docs[i] for i in torch.randperm(len(docs))[:bs].tolist()]
        ids = tokenizer(batch, return_tensors="pt", padding=True)["input_ids"]
        ...
    ```
    Use instead:
    ```python
    docs_ids_by_text = {text: tokenizer(text, padding=False)["input_ids"] for text in docs}
    for step in range(steps):
        batch = [docs[i] for i in torch.randperm(len(docs))[:bs].tolist()]
        ids = tokenizer.pad(
            {"input_ids": [docs_ids_by_text[text] for text in batch]}, return_tensors="pt", padding=True
        )["input_ids"]
        ...
    ```

    ## Fix safety
    Safe: the hoisted statements compute the same values, once, so the losses
    are the same bit for bit. The tokenizer runs once instead of every step,
    before the loop starts: a loop that never runs now tokenizes once, and a
    tokenizer that would raise now raises before the first step. A value the
    loop hands to a call stays in the loop unless perfmod knows the call
    leaves its arguments alone (Python's builtins that only read, torch's
    functions that are not in-place, a model of a library): `random.shuffle(order)`
    or `np.copyto(buf.numpy(), a)` may change it. The functions of the file and
    the `forward` of a model whose class the file defines are read: one that
    changes its argument in place (`mem.add_(1)`) keeps the value in the loop.

    Pretokenizing a corpus is unsafe (applied at `--level unsafe`): each step
    gets the same ids bit for bit, as the encode is pure and the corpus does
    not change, but every text of the corpus is now tokenized, before the
    first step, not only those the steps draw. An encode that raises on a text
    the training never draws now raises; a run that draws fewer texts than the
    corpus holds (a few steps over a large corpus) spends more time
    tokenizing in all, before training, to spend none during it; a table
    keyed by the text needs texts that are strings (any other hashable value
    works; one that is not raises before the first step); and the ids
    are kept in memory next to the texts (8 bytes a token, in a tensor or
    as lists of ints: about the size of the texts). It is done only for a
    corpus that is a list in memory already, never for a dataset read
    lazily. Rows padded by `pad` are the batched call's ids and attention mask
    (transformers pads both the same way, with the padding side the tokenizer
    has when the step runs). Other per-batch
    tokenization is reported with the bigger change it calls for (pretokenize
    once with `runtime.data.PretokenizedDataset` and batch with `PadCollate`,
    or tokenize in the DataLoader's workers), which changes the loop's
    structure and is left to you.
    """

    CODE = "PM203"
    NAME = "loop-invariant-tokenization"
    LEVEL = Level.SAFE
    # a known tokenizer's module or class (`tiktoken`, `AutoTokenizer`), or torch for its factories
    REQUIRES = ("token", "Token", "torch")
    MESSAGE = "the same value is computed on every training step; compute it once before the loop"
    GAIN = "host time per batch 2.1 -> 1.8 ms with a 100-token scaffold tokenized once (bench_tokenize, CPU)"

    VALID = [
        Valid(
            PREAMBLE + "ids = tokenizer(PROMPT, return_tensors='pt')['input_ids']\nfor step in range(3):\n" + STEP,
            "already before the loop",
        ),
        Valid(PREAMBLE + "for step in range(3):\n    print(tokenizer(PROMPT))\n", "not a training loop"),
        Valid(
            PREAMBLE + "for step in range(3):\n    prompt = f'Step {step}: answer with one number.'\n"
            "    ids = tokenizer(prompt, return_tensors='pt')['input_ids']\n" + STEP,
            "a prompt formatted from the step's counter: nothing to tokenize ahead",
        ),
        Valid(
            PREAMBLE + "for step in range(3):\n    ids = torch.randint(0, 1000, (1, 4))\n" + STEP,
            "random: not invariant",
        ),
        Valid(
            PREAMBLE + "for step in range(3):\n    ids = torch.randint(0, 1000, (4, 1)).T\n" + STEP,
            "an attribute of a random tensor is random too",
        ),
        Valid(
            PREAMBLE + "for step in range(3):\n    w = torch.ones(8, requires_grad=True)\n"
            "    loss = (model(torch.tensor([1])) * w).sum()\n    loss.backward()\n    opt.step()\n",
            "a leaf that collects gradients is new every step",
        ),
        Valid(
            PREAMBLE + "lengths = []\nfor step in range(3):\n    ids = torch.tensor([[1, 2, step]])\n"
            "    lengths.append(len(ids))\n" + STEP,
            "reads the loop variable",
        ),
        Valid(
            PREAMBLE + "def divisible_by(num, den):\n    return (num % den) == 0\n"
            "ids = torch.tensor([[1, 2, 3]])\nfor step in range(300):\n" + STEP + "    if divisible_by(step, 100):\n"
            "        sample = tokenizer(PROMPT, return_tensors='pt')['input_ids']\n        print(model(sample).sum())\n",
            "tokenized every 100 steps, under a helper that tests the counter: not every step",
        ),
        Valid(
            PREAMBLE
            + "ids = torch.tensor([[1, 2, 3]])\nfor i in range(300):\n"
            + STEP
            + "    if i != 0 and i % 100 == 0:\n"
            "        start = torch.ones((1, 1)).long().cuda()\n"
            "        sample = tokenizer(PROMPT, return_tensors='pt')['input_ids']\n        print(start, sample)\n",
            "copied and tokenized every 100 steps but the first: not every step",
        ),
        Valid(
            PREAMBLE + "import numpy as np\nrows = np.ones((15, 1), dtype=np.int64)\nfor step in range(3):\n"
            "    ids = torch.from_numpy(rows).squeeze(1)\n" + STEP,
            "a view of an array, made in constant time: once instead of every step saves nothing",
        ),
    ]
    INVALID = [
        Invalid(
            OWN_TOKENIZER + "for step in range(3):\n    ids = torch.tensor([tokenizer.encode('a b')])\n"
            "    ids = ids.long()\n" + STEP,
            OWN_TOKENIZER
            + "ids = torch.tensor([tokenizer.encode('a b')])\nids = ids.long()\nfor step in range(3):\n"
            + STEP,
            "a name bound twice, the second from the first: the two lines move together",
        ),
        Invalid(
            OWN_TOKENIZER + "for step in range(3):\n    ids = torch.tensor([tokenizer.encode('a b')])\n"
            "    print(ids)\n    ids = ids.long()\n" + STEP,
            None,
            "read between the two bindings: reported",
        ),
        Invalid(
            OWN_TOKENIZER + "for step in range(3):\n    ids = torch.tensor([tokenizer.encode('a b')])\n" + STEP,
            OWN_TOKENIZER + "ids = torch.tensor([tokenizer.encode('a b')])\nfor step in range(3):\n" + STEP,
            "a tokenizer class of the script's own whose methods are pure",
        ),
        Invalid(
            OWN_TOKENIZER
            + "for step in range(3):\n    ids = torch.tensor([tokenizer.encode('a b')])\n"
            + "    tokenizer.vocab['d'] = 3\n"
            + STEP,
            None,
            "its vocabulary changes in the loop: not pure, reported",
        ),
        Invalid(
            PREAMBLE + "for step in range(3):\n    ids = tokenizer(PROMPT, return_tensors='pt')['input_ids']\n" + STEP,
            PREAMBLE + "ids = tokenizer(PROMPT, return_tensors='pt')['input_ids']\nfor step in range(3):\n" + STEP,
            "a fixed prompt",
        ),
        Invalid(
            PREAMBLE + "device = 'cpu'\nfor epoch in range(2):\n    for step in range(3):\n"
            "        messages = [{'role': 'system', 'content': PROMPT}]\n"
            "        text = tokenizer.apply_chat_template(messages, tokenize=False)\n"
            "        ids = torch.tensor([tokenizer.encode(text)], dtype=torch.long).to(device)\n"
            + STEP.replace("    ", "        "),
            PREAMBLE + "device = 'cpu'\nmessages = [{'role': 'system', 'content': PROMPT}]\n"
            "text = tokenizer.apply_chat_template(messages, tokenize=False)\n"
            "ids = torch.tensor([tokenizer.encode(text)], dtype=torch.long).to(device)\n"
            "for epoch in range(2):\n    for step in range(3):\n" + STEP.replace("    ", "        "),
            "a chat template, its arguments and the tensor, out of both loops",
        ),
        Invalid(
            PREAMBLE + "for step in range(3):\n    ids = tokenizer(PROMPT, return_tensors='pt')['input_ids']\n"
            "    ids[0, 0] = step\n" + STEP,
            None,
            "written in place: hoisting would share it across steps",
        ),
        Invalid(
            PREAMBLE + "for step in range(3):\n    tokenizer.add_tokens(['<x>'])\n"
            "    ids = tokenizer(PROMPT, return_tensors='pt')['input_ids']\n" + STEP,
            None,
            "the tokenizer may change in the loop: tokenizes every step, reported",
        ),
        Invalid(
            PREAMBLE + "import numpy as np\nrows = np.ones((15, 1), dtype=np.int64)\nfor step in range(3):\n"
            "    view = torch.from_numpy(rows)\n    ids = view.to('cpu', dtype=torch.float32).long()\n" + STEP,
            PREAMBLE + "import numpy as np\nrows = np.ones((15, 1), dtype=np.int64)\nview = torch.from_numpy(rows)\n"
            "ids = view.to('cpu', dtype=torch.float32).long()\nfor step in range(3):\n" + STEP,
            "a view of an array moves with the conversion made of it, which copies",
        ),
        Invalid(
            PREAMBLE + "for step in range(3):\n    ids = torch.tensor([[1, 2, 3]])\n" + STEP,
            PREAMBLE + "ids = torch.tensor([[1, 2, 3]])\nfor step in range(3):\n" + STEP,
            "torch.tensor of a constant",
        ),
        Invalid(
            PREAMBLE.replace(
                'tokenizer = AutoTokenizer.from_pretrained("gpt2")',
                "from mytok import MyTokenizer\ntokenizer = MyTokenizer()",
            )
            + "for step in range(3):\n    ids = torch.tensor([tokenizer.encode(PROMPT)])\n"
            + STEP,
            None,
            "a tokenizer class perfmod does not know: not known pure",
        ),
        Invalid(
            PREAMBLE + "texts = ['a b', 'c d e', 'f']\nfor step in range(3):\n    batch = texts[step:step + 2]\n"
            "    ids = tokenizer(batch, padding=True, return_tensors='pt')['input_ids']\n" + STEP,
            None,
            "per-batch tokenization of a fixed corpus: pretokenize (reported)",
        ),
        Invalid(
            PREAMBLE + "from torch.utils.data import DataLoader\ntexts = ['a b', 'c d e', 'f']\n"
            "def collate(batch):\n    return tokenizer(batch, padding=True, return_tensors='pt')\n"
            "loader = DataLoader(texts, batch_size=2, collate_fn=collate)\n",
            None,
            "a tokenizer in the collate function runs every batch",
        ),
        Invalid(
            PREAMBLE + "class Model(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            "        self.tokenizer = AutoTokenizer.from_pretrained('gpt2')\n"
            "    def forward(self, texts):\n        return self.tokenizer(texts, return_tensors='pt')['input_ids']\n",
            None,
            "a tokenizer in forward runs every step",
        ),
        Invalid(
            CORPUS + "for step in range(3):\n" + PICK + ENCODE + STEP,
            CORPUS + "docs_ids = torch.tensor([tok.encode(t, 4) for t in docs])\nfor step in range(3):\n"
            "    idx = random.sample(range(len(docs)), 2)\n    ids = docs_ids[idx]\n" + STEP,
            "texts sampled from a list each step, a pure encode of the script's own that pads and truncates "
            "to its length: the corpus tokenized once into one tensor, its rows picked per step",
            config=UNSAFE,
        ),
        Invalid(
            CORPUS.replace("        return ids + [0] * (n - len(ids))\n", "        return ids\n")
            + "for step in range(3):\n"
            + PICK
            + ENCODE
            + STEP,
            CORPUS.replace("        return ids + [0] * (n - len(ids))\n", "        return ids\n")
            + "docs_ids = [tok.encode(t, 4) for t in docs]\nfor step in range(3):\n"
            "    idx = random.sample(range(len(docs)), 2)\n    ids = torch.tensor([docs_ids[i] for i in idx])\n" + STEP,
            "ids of lengths perfmod cannot prove equal: kept as lists, a tensor made per step as before",
            config=UNSAFE,
        ),
        Invalid(
            CORPUS + "for epoch in range(2):\n    for start in range(0, 4, 2):\n"
            "        ids = torch.tensor([tok.encode(docs[i], 4) for i in range(start, start + 2)])\n"
            + STEP.replace("    ", "        "),
            CORPUS + "docs_ids = [tok.encode(text, 4) for text in docs]\nfor epoch in range(2):\n"
            "    for start in range(0, 4, 2):\n"
            "        ids = torch.tensor([docs_ids[i] for i in range(start, start + 2)])\n"
            + STEP.replace("    ", "        "),
            "texts picked by index in the comprehension: pretokenized out of both loops",
            config=UNSAFE,
        ),
        Invalid(
            CORPUS + "for step in range(3):\n    idx = random.sample(range(len(docs)), 2)\n"
            "    ids = torch.tensor([tok.encode(docs[i], 4) for i in idx], dtype=torch.long)\n" + STEP,
            CORPUS + "docs_ids = torch.tensor([tok.encode(text, 4) for text in docs], dtype=torch.long)\n"
            "for step in range(3):\n    idx = random.sample(range(len(docs)), 2)\n    ids = docs_ids[idx]\n" + STEP,
            "texts picked by index, ids of one length, the tensor's dtype kept",
            config=UNSAFE,
        ),
        Invalid(
            CORPUS + "for step in range(3):\n    idx = random.sample(range(len(docs)), 2)\n"
            "    texts = [f'step {step}: ' + docs[i] for i in idx]\n" + ENCODE + STEP,
            None,
            "texts that change each step (formatted from the step's counter): nothing to pretokenize",
            config=UNSAFE,
        ),
        Invalid(
            CORPUS.replace(
                "        ids = [self", "        self.calls = getattr(self, 'calls', 0) + 1\n        ids = [self"
            )
            + "for step in range(3):\n"
            + PICK
            + ENCODE
            + STEP,
            None,
            "an encode that keeps a counter on its object is not pure: reported",
            config=UNSAFE,
        ),
        Invalid(
            CORPUS.replace("for w in text.split()]", "for w in text.split() if random.random() > 0.1]")
            + "for step in range(3):\n"
            + PICK
            + ENCODE
            + STEP,
            None,
            "an encode that drops words at random gives other ids each call: reported",
            config=UNSAFE,
        ),
        Invalid(
            CORPUS + "for step in range(3):\n" + PICK + ENCODE + "    docs.append(' '.join(texts))\n" + STEP,
            None,
            "a corpus appended to inside the loop: reported",
            config=UNSAFE,
        ),
        Invalid(
            CORPUS.replace('docs = ["a b c", "b c d", "c d e", "d e f"]', "docs = load_texts()")
            + "for step in range(3):\n"
            + PICK
            + ENCODE
            + STEP,
            None,
            "a corpus perfmod cannot tell is a list in memory: reported",
            config=UNSAFE,
        ),
        Invalid(
            CORPUS + "for step in range(3):\n" + PICK + "    rows = [tok.encode(t, 4) for t in texts]\n"
            "    rows[0][0] = 1\n    ids = torch.tensor(rows)\n" + STEP,
            None,
            "ids kept as a list the step changes: pretokenized they would be shared across steps",
            config=UNSAFE,
        ),
        Invalid(
            PREAMBLE
            + CHAT_CORPUS
            + "for step in range(3):\n    batch = [docs[i] for i in torch.randperm(4)[:2].tolist()]\n"
            + CHAT_STEP
            + STEP,
            PREAMBLE
            + CHAT_CORPUS
            + "toks_by_text = {}\nfor text in docs:\n    messages = [{'role': 'user', 'content': text}]\n"
            "    prompt = tokenizer.apply_chat_template(messages, tokenize=False)\n"
            "    toks = tokenizer(prompt, return_tensors='pt')\n    toks_by_text[text] = toks\n"
            "for step in range(3):\n    batch = [docs[i] for i in torch.randperm(4)[:2].tolist()]\n"
            "    rows = []\n    for text in batch:\n        toks = toks_by_text[text]\n"
            "        rows.append(toks['input_ids'][0])\n    ids = torch.cat(rows)\n" + STEP,
            "a chat prompt rendered and tokenized for each text of a corpus: tabulated by text before the loop",
            config=UNSAFE,
        ),
        Invalid(
            PREAMBLE
            + CHAT_CORPUS
            + "for step in range(3):\n    batch = [docs[i] for i in torch.randperm(4)[:2].tolist()]\n"
            + CHAT_STEP.replace("tokenize=False)\n", "tokenize=False)\n        prompt += f' {step}'\n")
            + STEP,
            None,
            "a prompt that takes the step's counter: nothing to tabulate, reported",
            config=UNSAFE,
        ),
        Invalid(
            PREAMBLE + CHAT_CORPUS + PADDED.format(padding="padding=True") + STEP,
            PREAMBLE
            + CHAT_CORPUS
            + 'docs_ids_by_text = {text: tokenizer(text, padding=False)["input_ids"] for text in docs}\n'
            "for step in range(3):\n    batch = [docs[i] for i in torch.randperm(4)[:2].tolist()]\n"
            '    ids = tokenizer.pad(\n        {"input_ids": [docs_ids_by_text[text] for text in batch]},\n'
            "        return_tensors='pt',\n        padding=True,\n    )['input_ids']\n" + STEP,
            "texts of a corpus padded together by a Hugging Face tokenizer: each tokenized once, the rows padded by `pad`",
            config=UNSAFE,
        ),
        Invalid(
            PREAMBLE + CHAT_CORPUS + PADDED.format(padding="padding=True, return_token_type_ids=True") + STEP,
            None,
            "an option perfmod does not know to act on each text alone: reported",
            config=UNSAFE,
        ),
    ]

    def __init__(self, context) -> None:
        super().__init__(context)
        self._bindings = context.bindings
        self._index = context.index
        self._reported: set[int] = set()  # calls already reported (by a hoist or as not provable)
        self._replaced: list[cst.CSTNode] = []  # lines a fix removes or rewrites: their calls are reported with it
        self._taken: set[str] = set()  # names the fixes of this file bind

    # -- step loops: hoist -------------------------------------------------------------

    def visit_Module(self, node: cst.Module) -> None:
        for loop in self.context.loops.step_loops:
            self._hoist_from(loop)

    def _hoist_from(self, loop: cst.CSTNode) -> None:
        plan = variance(self.context).hoists(loop, skip=lambda line: suppressed_on(line, self.CODE))
        for call, message in plan.unproven:
            self._reported.add(id(call))
            self.report(call, message)
        hoists = variance(self.context).doing_work(plan)
        if hoists:
            self._fix(hoists)
        for call in tokenizers(self.context).calls_in(loop.body):
            if self._was_reported(call) or self._in_hoisted(call, hoists):
                continue
            if periodic(self.context).guard(call, loop) is not None:
                continue  # every few steps (`if step % 100 == 0:`), not on every step
            self._reported.add(id(call))
            spelled = self.context.source(call.func)
            varies = variance(self.context).of(call, loop)
            pretokenized = corpus(self.context).pretokenizable(call, loop) if varies is not None else None
            if isinstance(pretokenized, Pretokenize):
                self._fix_corpus(call, pretokenized)
                continue
            table = corpus(self.context).text_table(call, loop) if varies is not None else None
            if isinstance(table, TextTable):
                self._fix_text_table(call, table)
                continue
            padded = corpus(self.context).padded_table(call, loop) if varies is not None else None
            if isinstance(padded, PaddedTable):
                self._fix_padded_table(call, padded)
                continue
            if varies is not None:
                if corpus(self.context).tokenizes_step_text(call, loop):
                    # Text the step makes (what the model generated, a prompt formatted from the
                    # step's values): nothing to tokenize ahead; tokenizing it is the step's work.
                    continue
                if pretokenized is not None:
                    self.report(
                        call,
                        f"`{spelled}` tokenizes texts inside the training loop on every step; not "
                        f"pretokenized before the loop, as {pretokenized}",
                    )
                    continue
                if self._report_known_tokenizer(call, loop):
                    continue
                if isinstance(padded, str):
                    self.report(
                        call,
                        f"`{spelled}` tokenizes texts of a corpus again on every training step, together, padded to "
                        f"the longest of the step; not pretokenized before the loop, as {padded}",
                    )
                    continue
                changed = call_writes(self.context).changes(call)
                if changed is not None:  # ids that depend on what was encoded before: none to compute ahead
                    self.report(
                        call,
                        f"`{spelled}` tokenizes inside the training loop on every step, and each call may change "
                        f"{changed}: tokenizing the texts once ahead of the loop would change it otherwise (and "
                        "ids that depend on it); left as written",
                    )
                    continue
                self.report(
                    call,
                    f"`{spelled}` tokenizes inside the training loop on every step ({varies}); if the texts come "
                    "from a fixed corpus, tokenize them once (runtime.data.PretokenizedDataset, batched "
                    "by PadCollate) or in the DataLoader's workers; not rewritten automatically, as that "
                    "changes how the loop gets its batches",
                )
                continue
            reason = plan.why_not(call, self.context)
            self.report(
                call,
                f"`{spelled}` gets the same arguments on every training step but is not moved out "
                f"of the loop: {reason}; compute it once before the loop if that is safe",
            )
        self._report_repeated_copies(loop, hoists, plan)

    def _report_repeated_copies(self, loop: cst.CSTNode, hoists: list[Hoist], plan: Hoists) -> None:
        """Copies of the same host tensor to the device, made again on every step, that could
        not be moved out with their statement: reported."""
        for call in self.context.kinds.host_uploads(loop.body):
            if self._was_reported(call) or self._in_hoisted(call, hoists):
                continue
            if periodic(self.context).guard(call, loop) is not None:
                continue
            if variance(self.context).of(call.func.value, loop) is not None:
                continue
            self._reported.add(id(call))
            reason = plan.why_not(call, self.context)
            self.report(
                call,
                f"`{self._short(call)}` copies the same host tensor to the device on every training step; "
                f"not moved out of the loop ({reason}); copy it once before the loop",
            )

    def _was_reported(self, call: cst.Call) -> bool:
        return id(call) in self._reported or any(self.context.inside(call, line) for line in self._replaced)

    def _in_hoisted(self, node: cst.CSTNode, hoists: list[Hoist]) -> bool:
        return any(self.context.inside(node, hoist.line) for hoist in hoists)

    # -- the texts of a fixed corpus: pretokenized ------------------------------------------

    def _fix_corpus(self, call: cst.Call, plan: Pretokenize) -> None:
        """`<corpus>_ids = [tok.encode(t, n) for t in docs]` in front of the loop (in
        `torch.tensor(...)` when the rows have one length), and the step's ids picked from it."""
        name = self._fresh_name(f"{plan.corpus.value}_ids")
        variable = self._fresh_name("text", within=call) if plan.new_elt is not None else ""
        value, node, replacement = corpus(self.context).rewrite(call, plan, name, variable)
        line = cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name(name))], value)])
        self.report(
            call,
            f"`{self.context.source(call.func)}` tokenizes texts of `{plan.corpus.value}`, a list that does "
            f"not change, again on every training step; every text is tokenized once before the loop "
            f"(`{name}`){_per_item(plan)} and the step picks its ids",
            edits=[InsertBefore(plan.region, (line,)), Replace(node, replacement)],
            level=Level.UNSAFE,
        )

    def _fix_text_table(self, call: cst.Call, plan: TextTable) -> None:
        """The statements of the step's loop over its texts that make the ids, run once
        before the loop over every text of the corpus into a table (per item of the
        contexts), and the step's value looked up by its text."""
        self._replaced.extend((*plan.before, plan.statement))
        renamed = {old: new if new == plan.corpus.value else self._fresh_name(new) for old, new in plan.renamed.items()}
        plan = replace(plan, renamed=renamed)
        name = self._fresh_name(f"{plan.target.value}_by_text")
        lines, entry = corpus(self.context).table_rewrite(plan, name)
        self.report(
            call,
            f"`{self.context.source(call.func)}` tokenizes texts of `{plan.corpus.value}`, a list that does not "
            f"change, again on every training step, one at a time in `for {plan.text_loop.target.value} in "
            f"{plan.texts.value}:`; what its statements make of each text up to `{plan.target.value} = ...` is made "
            f"once before the loop for every text of the corpus (`{name}`){_per_item(plan)} and the step looks it up by "
            "its text",
            edits=[
                InsertBefore(plan.region, tuple(lines)),
                *(Remove(line) for line in plan.before),
                Replace(plan.statement.body[0].value, entry),
            ],
            level=Level.UNSAFE,
        )

    def _fix_padded_table(self, call: cst.Call, plan: PaddedTable) -> None:
        """Each text of the corpus tokenized once, unpadded, before the loop, into a table (per
        item of the contexts), and the step's rows padded by the tokenizer's `pad`."""
        self._replaced.extend(line for line in (*plan.before, plan.texts_line) if line is not None)
        renamed = {old: new if new == plan.corpus.value else self._fresh_name(new) for old, new in plan.renamed.items()}
        plan = replace(plan, renamed=renamed)
        name = self._fresh_name(f"{plan.corpus.value}_ids_by_text")
        lines, padded = corpus(self.context).padded_rewrite(plan, name)
        removed = [*plan.before, *([plan.texts_line] if plan.texts_line is not None else [])]
        self.report(
            call,
            f"`{self.context.source(call.func)}` tokenizes texts of `{plan.corpus.value}`, a list that does not "
            f"change, again on every training step, padded to the longest of the step; each text of the corpus "
            f"is tokenized once before the loop, unpadded (`{name}`){_per_item(plan)} and the step pads its rows "
            f"with the tokenizer's own `pad`, which pads them as the call did",
            edits=[InsertBefore(plan.region, tuple(lines)), *(Remove(line) for line in removed), Replace(call, padded)],
            level=Level.UNSAFE,
        )

    def _report_known_tokenizer(self, call: cst.Call, loop: cst.CSTNode) -> bool:
        """Texts kept outside the step, tokenized by a tokenizer known to be pure, in a shape
        the corpus fix does not take: reported with where the tokenizer is built and what
        keeps the corpus from being tokenized once."""
        found = tokenizers(self.context)
        _, receiver = found.tokenizer_call(call)
        origin = found.origin(receiver) if receiver is not None else None
        if origin is None or not any(found.from_corpus(arg.value, loop) for arg in call.args):
            return False
        reasons = corpus(self.context).not_pretokenized(call, loop)
        if not reasons:
            return False
        self.report(
            call,
            f"`{self.context.source(call.func)}` tokenizes texts kept outside the step again on every training "
            f"step; `{self.context.source(receiver)}` is {origin}, which gives the same ids for the same "
            f"text, but the texts are not tokenized once before the loop: {'; '.join(reasons)}. Tokenizing them "
            "once by hand (runtime.data.PretokenizedDataset, batched by PadCollate) takes the step's tokenizer work "
            "away",
        )
        return True

    def _fresh_name(self, wanted: str, within: cst.CSTNode | None = None) -> str:
        """`wanted`, or `wanted_2`, ...: a name spelled nowhere in the file (or in `within`)."""
        where = within if within is not None else self.context.module
        candidate, n = wanted, 1
        while variance(self.context).names_in(where, candidate) or (within is None and candidate in self._taken):
            n += 1
            candidate = f"{wanted}_{n}"
        if within is None:
            self._taken.add(candidate)
        return candidate

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if node.name.value != "forward":
            return
        classdef = self.context.kinds.class_of(node)
        if classdef is None or self.context.kinds.class_fact(classdef).kind is not Kind.MODULE:
            return
        self._report_tokenizing(
            node.body,
            "tokenizes inside the model's forward, on the host, on every step; tokenize the texts once before "
            "training (runtime.data.PretokenizedDataset) or in the DataLoader's workers and pass ids to the model",
        )

    def visit_Call(self, node: cst.Call) -> None:
        """A tokenizer in a DataLoader's collate function runs on every batch too."""
        collate = kwarg(node, "collate_fn")
        if collate is None or not self.context.names.is_(node.func, "torch.utils.data.DataLoader"):
            return
        function = (
            collate.value if isinstance(collate.value, cst.Lambda) else self._bindings.local_function(collate.value)
        )
        if function is None:
            return
        self._report_tokenizing(
            function.body,
            "tokenizes in the DataLoader's collate function, again for every batch of every epoch (in the "
            "workers when there are any); if the texts are fixed, tokenize them once "
            "(runtime.data.PretokenizedDataset) and pad with PadCollate",
        )

    def _report_tokenizing(self, body: cst.CSTNode, what: str) -> None:
        for call in tokenizers(self.context).calls_in(body):
            if not self._was_reported(call):
                self._reported.add(id(call))
                self.report(call, f"`{self.context.source(call.func)}` {what}")

    # -- the fix -------------------------------------------------------------------------------

    def _fix(self, hoists: list[Hoist]) -> None:
        """Each hoisted line leaves the loop and goes, in order, in front of the outermost
        loop it is invariant in (a line a later one reads goes first: fixes apply in order)."""
        first_of_region: set[int] = set()
        for hoist in hoists:
            if id(hoist.region) in first_of_region:
                shape = moved_line
            else:
                first_of_region.add(id(hoist.region))
                shape = partial(in_front_of, hoist.region)
            self.report(
                hoist.line,
                f"`{hoist.name} = {self._short(hoist.value)}` gives the same value on every training "
                "step; computed once before the loop",
                edits=[Move(hoist.line, hoist.region, shape)],
            )

    # -- helpers -----------------------------------------------------------------------------

    def _short(self, node: cst.CSTNode) -> str:
        code = " ".join(self.context.source(node).split())
        return code if len(code) <= 60 else code[:57] + "..."


def _per_item(plan: Pretokenize | TextTable | PaddedTable) -> str:
    """How the message says the table is made once for each context of the step."""
    if plan.items is None:
        return ""
    return f", once for each item of `{plan.items.iter.value}` (each brings its own tokenizer),"
