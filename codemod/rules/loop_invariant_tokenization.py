from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from functools import partial

import libcst as cst
from libcst.metadata import Assignment

from codemod.analysis.bindings import argument_for
from codemod.analysis.kinds import SAME_PLACE_METHODS, Kind, Place
from codemod.analysis.lengths import Lengths
from codemod.analysis.names import kwarg, method_name, names_read, subscript_parts
from codemod.analysis.periodic import periodic
from codemod.analysis.scopes import PerBindings, reads_of
from codemod.analysis.tensor_layout import layouts
from codemod.analysis.torch_facts import (
    DETERMINISTIC_FACTORIES,
    MUTATING_METHODS,
    NOT_SAME_PLACE_METHODS,
    PURE_BUILTINS,
    RANDOM_FUNCTIONS,
    RANDOM_METHODS,
    SHARING_ATTRIBUTES,
    SHARING_CALLS,
)
from codemod.edits import InsertBefore, Move, Replace
from codemod.rule import Invalid, Level, Rule, Valid
from codemod.suppression import suppressed_on

# How a known tokenizer is built: qualified name of the call (a prefix and a suffix
# for the `transformers.<Class>.from_pretrained` family).
TOKENIZER_BUILDERS = {
    "tiktoken.get_encoding",
    "tiktoken.encoding_for_model",
    "tokenizers.Tokenizer.from_file",
    "tokenizers.Tokenizer.from_pretrained",
    "tokenizers.Tokenizer.from_str",
}
# Methods of those tokenizers that compute ids from their arguments and change nothing.
TOKENIZER_METHODS = {
    "encode",
    "encode_plus",
    "batch_encode_plus",
    "apply_chat_template",
    "tokenize",
    "convert_tokens_to_ids",
    "encode_ordinary",
    "encode_batch",
}
# Context managers whose block may give up a statement that does not depend on them: they
# change how ops are computed (precision, gradients), not what a factory or a tokenizer gives.
TRANSPARENT_BLOCKS = {
    "torch.no_grad",
    "torch.enable_grad",
    "torch.inference_mode",
    "torch.autocast",
    "torch.amp.autocast",
    "torch.cuda.amp.autocast",
    "torch.cpu.amp.autocast",
    "contextlib.nullcontext",
}
TOKENIZING_WORDS = ("tokeniz", "chat_template")
TENSOR_METHODS = SAME_PLACE_METHODS | {"to", "cuda", "cpu"}
LITERALS = (cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString)

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


@dataclass
class _Pretokenize:
    comp: cst.ListComp  # the per-step `[tok.encode(t, n) for t in texts]`
    corpus: cst.Name  # the list of texts the step picks from
    region: cst.CSTNode  # the loop the pretokenized corpus goes in front of
    position: str  # the variable of the indices' comprehension (`i`)
    indices: cst.BaseExpression | None  # `idx` of `[docs[i] for i in idx]` (texts bound in the loop)
    new_elt: cst.Subscript | None  # `_[i]` for the element `tok.encode(docs[i], n)`
    factory: cst.Call  # `torch.tensor(<comp>, ...)`
    stacked: cst.BaseExpression | None  # the step's indices, when the ids go in one tensor


@dataclass
class _Hoist:
    line: cst.SimpleStatementLine
    name: str
    region: cst.CSTNode  # the loop it moves in front of
    value: cst.BaseExpression  # what it computes once now


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
    `apply_chat_template`, ...; `torch.tensor`, `torch.arange` and other
    deterministic factories; tensor conversions such as `.to(device)`), no
    variable it reads is re-bound or changed in place inside the loop, and the
    value it produces is not changed in place there either (aliasing: the
    hoisted object is now shared by every step). A function, or a method of a
    tokenizer class of your own, is pure when it reads only its arguments and
    attributes that nothing changes after `__init__` (a vocabulary dict), and
    calls only pure code; one that keeps a counter on `self`, draws random
    numbers or calls what perfmod cannot follow is not, and its calls are
    reported without a fix. Statements that build only the arguments
    (`messages = [...]`) move with the call when they are invariant too.

    A corpus is pretokenized when every text a step tokenizes is an element
    of a list held in memory (`docs[i]`: a list the script builds, or one a
    function of the file returns) that the loop only reads, the encode call
    is pure and its other arguments are the same on every step, and the ids
    go straight into `torch.tensor(...)`, which copies them. Texts the step makes
    (formatted from the step's counter, generated by the model) are not
    pretokenized. Work that runs only every few steps, a sample prompt
    tokenized for logging under `if step % 100 == 0:`, `if step > 0 and
    step % every == 0:` or a helper such as `if divisible_by(step, every):`,
    is left alone: it does not run on every step.

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

    ## Fix safety
    Safe: the hoisted statements compute the same values, once, so the losses
    are the same bit for bit. The tokenizer runs once instead of every step,
    before the loop starts: a loop that never runs now tokenizes once, and a
    tokenizer that would raise now raises before the first step. perfmod does
    not look inside the functions the hoisted value is passed to: one that
    writes into its argument in place (rare for token ids; the model's own
    forward does not) would see the same object on every step.

    Pretokenizing a corpus is unsafe (applied at `--level unsafe`): each step
    gets the same ids bit for bit, as the encode is pure and the corpus does
    not change, but every text of the corpus is now tokenized, before the
    first step, not only those the steps draw. An encode that raises on a text
    the training never draws now raises; a run that draws fewer texts than the
    corpus holds (a few steps over a large corpus) spends more time
    tokenizing in all, before training, to spend none during it; and the ids
    are kept in memory next to the texts (8 bytes a token, in a tensor or
    as lists of ints: about the size of the texts). It is done only for a
    corpus that is a list in memory already, never for a dataset read
    lazily. Other per-batch
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
    ]

    def __init__(self, context) -> None:
        super().__init__(context)
        self._scopes = context.scopes
        self._bindings = context.bindings
        self._index = context.index
        self._reported: set[int] = set()  # calls already reported (by a hoist or as not provable)
        self._names_in: dict[int, dict[str, list[cst.Name]]] = {}  # region -> its Name nodes by spelling
        self._trained_by_bindings = PerBindings()
        self._taken: set[str] = set()  # names the fixes of this file bind

    # -- step loops: hoist -------------------------------------------------------------

    def visit_Module(self, node: cst.Module) -> None:
        for loop in self.context.loops.step_loops:
            self._hoist_from(loop)

    def _hoist_from(self, loop: cst.CSTNode) -> None:
        hoists: list[_Hoist] = []
        regions: dict[str, cst.CSTNode] = {}  # hoisted name -> loop it now sits in front of
        blocked: dict[int, str] = {}  # id(line) -> why its invariant value cannot move
        for line in self._step_lines(loop):
            statement = _single_assignment(line)
            if statement is None or suppressed_on(line, self.CODE):
                continue
            name = statement.targets[0].target.value
            region, obstacle = self._outermost_region(statement, line, loop, regions)
            if region is None:
                if isinstance(obstacle, tuple):
                    self._reported.add(id(obstacle[0]))
                    self.report(obstacle[0], obstacle[1])
                elif obstacle is not None:
                    blocked[id(line)] = obstacle
                continue
            regions[name] = region
            hoists.append(_Hoist(line, name, region, statement.value))
        hoists = _needed(hoists, self._index)
        if hoists:
            self._fix(hoists)
        for call in self._index.find(cst.Call, within=loop.body):
            if id(call) in self._reported or not self._tokenizes(call, 0) or self._in_hoisted(call, hoists):
                continue
            if periodic(self.context).guard(call, loop) is not None:
                continue  # every few steps (`if step % 100 == 0:`), not on every step
            self._reported.add(id(call))
            spelled = self.context.source(call.func)
            varies = self._variance(call, loop, {})
            pretokenized = self._pretokenize(call, loop) if varies is not None else None
            if isinstance(pretokenized, _Pretokenize):
                self._fix_corpus(call, pretokenized)
                continue
            if varies is not None:
                args_vary = self._all([arg.value for arg in call.args], loop, {}) is not None
                if (
                    args_vary
                    and not any(self._from_corpus(arg.value, loop, 0) for arg in call.args)
                    and any(self._made_in_step(arg.value, loop, 0) for arg in call.args)
                ):
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
                self.report(
                    call,
                    f"`{spelled}` tokenizes inside the training loop on every step ({varies}); if the texts come "
                    "from a fixed corpus, tokenize them once (runtime.data.PretokenizedDataset, batched "
                    "by PadCollate) or in the DataLoader's workers; not rewritten automatically, as that "
                    "changes how the loop gets its batches",
                )
                continue
            line = next((l for l in self._step_lines(loop) if self.context.inside(call, l)), None)
            reason = blocked.get(id(line), "it is part of a larger statement or a condition") if line else ""
            self.report(
                call,
                f"`{spelled}` gets the same arguments on every training step but is not moved out "
                f"of the loop: {reason}; compute it once before the loop if that is safe",
            )
        self._report_repeated_copies(loop, hoists, blocked)

    def _step_lines(self, loop: cst.CSTNode) -> list[cst.CSTNode]:
        """The statements of the loop body that run once per step, in order, the blocks of
        `with torch.no_grad():` / autocast opened (a statement may leave them)."""
        found = []

        def walk(lines):
            for line in lines:
                if (
                    isinstance(line, cst.With)
                    and isinstance(line.body, cst.IndentedBlock)
                    and all(
                        isinstance(item.item, cst.Call)
                        and (
                            self.context.names.of(item.item.func) & TRANSPARENT_BLOCKS
                            or method_name(item.item) == "autocast"
                        )
                        for item in line.items
                    )
                ):
                    walk(line.body.body)
                else:
                    found.append(line)

        walk(_lines(loop.body))
        return found

    def _tokenizes(self, call: cst.Call, depth: int) -> bool:
        """Does `call` tokenize text: a known tokenizer, a tokenizer's method (`encode`,
        `apply_chat_template`, ...) on something that is not a model, a callee named like a
        tokenizer (`tokenizer(...)`, `tokenize(...)`, an instance of a `*Tokenizer` class), or
        a function of this file (not a model's method) that tokenizes?"""
        func = call.func
        kinds = self.context.kinds
        if kinds.fact(func).kind is Kind.MODULE:
            return False  # `self.encoder(x)`: a model
        if isinstance(func, cst.Attribute):
            receiver = func.value
            if isinstance(receiver, (cst.SimpleString, cst.FormattedString, cst.ConcatenatedString)):
                return False  # `"text".encode()`: bytes
            if kinds.fact(receiver).kind is Kind.MODULE and not kinds.self_attribute_values(func):
                return False  # `vae.encode(x)`: a model's method (`self.tokenizer(...)` is an attribute's call)
        if self._is_tokenizer_call(call)[0]:
            return True
        spelled = (
            func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else ""
        )
        if isinstance(func, cst.Attribute) and spelled in TOKENIZER_METHODS:
            return True
        if any(word in spelled.lower() for word in TOKENIZING_WORDS):
            return True
        classdef = kinds.instance_class(func) if isinstance(func, cst.Name) else None
        if (
            classdef is not None
            and "tokeniz" in classdef.name.value.lower()
            and kinds.class_fact(classdef).kind is not Kind.MODULE
        ):
            return True
        callee = kinds.local_callee(call)
        if callee is None or depth >= 2 or kinds.class_of(callee) is not None:
            return False
        return any(self._tokenizes(inner, depth + 1) for inner in self._index.find(cst.Call, within=callee.body))

    def _from_corpus(self, expr: cst.BaseExpression, loop: cst.CSTNode, depth: int) -> bool:
        """Does `expr` take its text from data kept outside the step (picked by the step's
        indices, `texts[i]`, or handed out by the loop, `for batch in loader`), rather than
        make it in the step (`tok.decode(model.generate(...))`)?"""
        if depth > 6:
            return False
        index = self._index
        if isinstance(expr, cst.Subscript):
            if isinstance(expr.value, cst.Name) and not self._bound_inside(expr.value, loop):
                return True  # `texts[i]`
            return self._from_corpus(expr.value, loop, depth + 1)
        if isinstance(expr, cst.Attribute):
            return self._from_corpus(expr.value, loop, depth + 1)
        if isinstance(expr, cst.Name):
            if layouts(self.context).is_number(expr):
                return False  # the step's counter, a size: no text of a corpus
            for assignment in self._scopes.get(expr)[expr.value] if self._scopes.get(expr) is not None else ():
                node = getattr(assignment, "node", None)
                if not isinstance(node, cst.CSTNode) or not index.inside(node, loop):
                    continue
                statement = self._bindings.statement(node)
                if statement is loop or (isinstance(statement, cst.For) and index.inside(loop, statement)):
                    return True  # the loop's own target: a batch of the loader or list it iterates
                if isinstance(statement, (cst.For, cst.CompFor)):
                    if self._from_corpus(statement.iter, loop, depth + 1):
                        return True
                elif isinstance(statement, (cst.Assign, cst.AnnAssign)) and statement.value is not None:
                    if self._from_corpus(statement.value, loop, depth + 1):
                        return True
            return False
        if isinstance(expr, cst.Call):
            if self.context.names.is_(expr.func, "random.sample", "random.choice", "random.choices"):
                first = expr.args[0].value if expr.args else None
                return isinstance(first, cst.Name) and not self._bound_inside(first, loop)
            if self.context.kinds.fact(expr.func).kind is Kind.MODULE or method_name(expr) in (
                "decode",
                "batch_decode",
                "generate",
            ):
                return False
            parts = [a.value for a in expr.args]
            if isinstance(expr.func, cst.Attribute):
                parts.append(expr.func.value)
            return any(self._from_corpus(part, loop, depth + 1) for part in parts)
        if isinstance(expr, (cst.List, cst.Tuple, cst.Set)):
            return any(
                isinstance(e, cst.Element) and self._from_corpus(e.value, loop, depth + 1) for e in expr.elements
            )
        if isinstance(expr, cst.Dict):
            return any(
                isinstance(e, cst.DictElement) and self._from_corpus(e.value, loop, depth + 1) for e in expr.elements
            )
        if isinstance(expr, (cst.ListComp, cst.GeneratorExp, cst.SetComp)):
            return self._from_corpus(expr.elt, loop, depth + 1)
        if isinstance(expr, cst.BinaryOperation):
            return self._from_corpus(expr.left, loop, depth + 1) or self._from_corpus(expr.right, loop, depth + 1)
        if isinstance(expr, cst.FormattedString):
            return any(
                isinstance(p, cst.FormattedStringExpression) and self._from_corpus(p.expression, loop, depth + 1)
                for p in expr.parts
            )
        return False

    def _made_in_step(self, expr: cst.BaseExpression, loop: cst.CSTNode, depth: int) -> bool:
        """Is `expr` text the step makes: decoded or generated ids, a value computed by a
        call given a model, or a string formatted from the step's values?"""
        if depth > 6:
            return False
        kinds = self.context.kinds
        if isinstance(expr, cst.FormattedString) or (
            isinstance(expr, cst.BinaryOperation)
            and isinstance(expr.operator, cst.Modulo)
            and isinstance(expr.left, cst.SimpleString)
        ):
            return True  # f"Step {step}: ...", "%d" % step
        if (
            isinstance(expr, cst.Call)
            and method_name(expr) == "format"
            and isinstance(expr.func.value, cst.SimpleString)
        ):
            return True
        if isinstance(expr, cst.Call):
            if method_name(expr) in ("decode", "batch_decode", "generate") or kinds.fact(expr.func).kind is Kind.MODULE:
                return True
            if any(kinds.fact(a.value).kind is Kind.MODULE for a in expr.args):
                return True
            parts = [a.value for a in expr.args] + ([expr.func.value] if isinstance(expr.func, cst.Attribute) else [])
            return any(self._made_in_step(part, loop, depth + 1) for part in parts)
        if isinstance(expr, (cst.Subscript, cst.Attribute)):
            return self._made_in_step(expr.value, loop, depth + 1)
        if isinstance(expr, (cst.ListComp, cst.GeneratorExp, cst.SetComp)):
            return self._made_in_step(expr.elt, loop, depth + 1)
        if isinstance(expr, cst.BinaryOperation):
            return self._made_in_step(expr.left, loop, depth + 1) or self._made_in_step(expr.right, loop, depth + 1)
        if isinstance(expr, cst.Name):
            scope = self._scopes.get(expr)
            for assignment in scope[expr.value] if scope is not None else ():
                node = getattr(assignment, "node", None)
                if not isinstance(node, cst.CSTNode) or not self._index.inside(node, loop):
                    continue
                statement = self._bindings.statement(node)
                if isinstance(statement, (cst.For, cst.CompFor)) and statement is not loop:
                    if self._made_in_step(statement.iter, loop, depth + 1):
                        return True
                elif isinstance(statement, (cst.Assign, cst.AnnAssign)) and statement.value is not None:
                    if self._made_in_step(statement.value, loop, depth + 1):
                        return True
        return False

    def _bound_inside(self, name: cst.Name, loop: cst.CSTNode) -> bool:
        scope = self._scopes.get(name)
        return scope is not None and any(
            isinstance(getattr(a, "node", None), cst.CSTNode) and self._index.inside(a.node, loop)
            for a in scope[name.value]
        )

    def _report_repeated_copies(self, loop: cst.CSTNode, hoists: list[_Hoist], blocked: dict[int, str]) -> None:
        """Copies of the same host tensor to the device, made again on every step, that could
        not be moved out with their statement: reported."""
        kinds = self.context.kinds
        for call in self._index.find(cst.Call, within=loop.body):
            if id(call) in self._reported or method_name(call) not in ("to", "cuda") or self._in_hoisted(call, hoists):
                continue
            if periodic(self.context).guard(call, loop) is not None:
                continue
            copy = kinds.copy_of(call)
            if (
                copy is None
                or not copy.moves_device
                or copy.receiver.kind is not Kind.TENSOR
                or copy.receiver.place is not Place.HOST
            ):
                continue
            if self._variance(call.func.value, loop, {}) is not None:
                continue
            self._reported.add(id(call))
            line = next((l for l in self._step_lines(loop) if self.context.inside(call, l)), None)
            reason = blocked.get(id(line), "it is part of a larger statement or a condition") if line else ""
            self.report(
                call,
                f"`{self._short(call)}` copies the same host tensor to the device on every training step; "
                f"not moved out of the loop ({reason}); copy it once before the loop",
            )

    def _in_hoisted(self, node: cst.CSTNode, hoists: list[_Hoist]) -> bool:
        return any(self.context.inside(node, hoist.line) for hoist in hoists)

    def _outermost_region(
        self, statement: cst.Assign, line: cst.CSTNode, loop: cst.CSTNode, regions: dict[str, cst.CSTNode]
    ):
        """The outermost loop (the step loop or one around it, same function) out of which
        `statement` can move; else (None, (node, message)) when a report is due, or (None, None)."""
        name = statement.targets[0].target.value
        best, obstacle = None, None
        for region in [loop, *self._enclosing_loops(loop)]:
            problem = self._variance(statement.value, region, regions)
            if problem is not None:
                if best is None and isinstance(problem, tuple):
                    obstacle = problem
                break
            problem = self._target_problem(name, statement, line, region, regions)
            if problem is not None:
                if best is None:
                    obstacle = problem
                break
            best = region
        if best is None:
            return None, obstacle
        return best, None

    # -- invariance ------------------------------------------------------------------------

    def _variance(self, expr: cst.BaseExpression, region: cst.CSTNode, regions: dict[str, cst.CSTNode]):
        """None when `expr` gives the same value on every iteration of `region`; else a
        reason: a string, or (call, message) when only an unproven callee stands in the way."""
        if isinstance(expr, LITERALS) or (isinstance(expr, cst.Name) and expr.value in ("True", "False", "None")):
            return None
        if isinstance(expr, cst.ConcatenatedString):
            return self._variance(expr.left, region, regions) or self._variance(expr.right, region, regions)
        if isinstance(expr, cst.FormattedString):
            return self._all(
                [p.expression for p in expr.parts if isinstance(p, cst.FormattedStringExpression)], region, regions
            )
        if isinstance(expr, cst.Name):
            return self._name_variance(expr, region, regions)
        if isinstance(expr, cst.Attribute):
            if self.context.names.of(expr):
                return None  # `torch.long`: a module attribute
            if self.context.kinds.fact(expr.value).kind is Kind.MODULE:
                return f"`{self.context.source(expr.value)}` is a model: its parameters change every step"
            if isinstance(expr.value, cst.Name) and self._attributes_assigned(expr.value.value, region):
                return f"`{self.context.source(expr.value)}` has attributes assigned in the loop"
            return self._variance(expr.value, region, regions)
        if isinstance(expr, cst.Subscript):
            return self._all(subscript_parts(expr), region, regions)
        if isinstance(expr, (cst.List, cst.Tuple, cst.Set)):
            return self._all([e.value for e in expr.elements], region, regions)
        if isinstance(expr, cst.Dict):
            parts = []
            for element in expr.elements:
                if not isinstance(element, cst.DictElement):
                    return "a dict built with **"
                parts += [element.key, element.value]
            return self._all(parts, region, regions)
        if isinstance(expr, cst.BinaryOperation):
            return self._all([expr.left, expr.right], region, regions)
        if isinstance(expr, cst.UnaryOperation):
            return self._variance(expr.expression, region, regions)
        if isinstance(expr, cst.Call):
            return self._call_variance(expr, region, regions)
        if isinstance(expr, (cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp)):
            own = {
                n.value
                for f in self._index.find(cst.CompFor, within=expr)
                for n in self._index.find(cst.Name, within=f.target)
            }
            varying = self._all([n for n in names_read(expr) if n.value not in own], region, regions)
            return varying or "a comprehension (its calls are not followed)"
        return f"`{self.context.source(expr)}` is not an expression perfmod follows"

    def _all(self, exprs, region, regions):
        for expr in exprs:
            problem = self._variance(expr, region, regions)
            if problem is not None:
                return problem
        return None

    def _call_variance(self, call: cst.Call, region, regions):
        args = [a.value for a in call.args]
        if any(a.star for a in call.args):
            return "a call with *args or **kwargs"
        names = self.context.names.of(call.func)
        if names & DETERMINISTIC_FACTORIES and kwarg(call, "requires_grad") is not None:
            return "a tensor that requires grad collects gradients: made once, they would pile up across steps"
        if names & DETERMINISTIC_FACTORIES or names & PURE_BUILTINS:
            return self._all(args, region, regions)
        known, receiver = self._is_tokenizer_call(call)
        if known:
            return self._tokenizer_changed(receiver, region) or self._all([receiver, *args], region, regions)
        callee = self.context.kinds.local_callee(call)
        if callee is not None and self.context.purity.is_pure(callee):
            # a pure function or method of this file: invariant where its receiver and arguments are
            receiver = call.func.value if isinstance(call.func, cst.Attribute) else call.func
            return self._all([receiver, *args], region, regions)
        method = method_name(call)
        if (
            method is not None
            and (
                method in TENSOR_METHODS
                or (
                    not method.endswith("_")
                    and method not in RANDOM_METHODS
                    and method not in NOT_SAME_PLACE_METHODS
                    and not method.startswith("_")
                )
            )
            and self._makes_tensor(call.func.value)
        ):
            return self._all([call.func.value, *args], region, regions)
        if receiver is not None and self._all([*args], region, regions) is None:
            # a tokenizer-shaped call with invariant arguments on a receiver perfmod cannot vouch for
            return (
                call,
                f"`{self.context.source(call.func)}` gets the same arguments on every training step, but perfmod "
                f"cannot prove `{self.context.source(receiver)}` is a known tokenizer (and so pure); if it is, "
                "move the call before the loop",
            )
        callee = self.context.kinds.local_callee(call)
        if (
            callee is not None
            and isinstance(call.func, cst.Name)
            and self._all([*args], region, regions) is None
            and not self._draws_or_trains(callee, args)
        ):
            # a function of this file given the same arguments every step
            return (
                call,
                f"`{self.context.source(call.func)}(...)` gets the same arguments on every training step, but "
                f"perfmod cannot prove `{call.func.value}` is pure (no side effects, no randomness); if it is, "
                "compute it once before the loop",
            )
        return f"`{self.context.source(call.func)}` is not known to be pure"

    def _tokenizer_changed(self, receiver: cst.BaseExpression, region: cst.CSTNode) -> str | None:
        """Why a known tokenizer `receiver` may change in `region` (a method other than a
        tokenizing one is called on it there), or None."""
        for other in self._index.find(cst.Call, within=region):
            if not (isinstance(other.func, cst.Attribute) and other.func.value.deep_equals(receiver)):
                continue
            if method_name(other) not in TOKENIZER_METHODS:
                return f"`{self.context.source(other.func)}` may change the tokenizer in the loop"
        return None

    # -- the texts of a fixed corpus: pretokenized ------------------------------------------

    def _pretokenize(self, call: cst.Call, loop: cst.CSTNode) -> _Pretokenize | str | None:
        """How to tokenize once, before the loop, every text of the corpus that `call`
        tokenizes a few of per step: `call` is the element of `[tok.encode(t, n) for t in
        texts]`, with `texts = [docs[i] for i in idx]` bound in the loop (or of
        `[tok.encode(docs[i], n) for i in idx]`), `docs` a list in memory that the loop
        does not change, `tok.encode` pure and its other arguments the same every step, and
        the ids handed to `torch.tensor`, which copies them. None when `call` is not of that
        shape; the reason when a precondition fails."""
        comp = self.context.parents.get(call)
        if not (isinstance(comp, cst.ListComp) and comp.elt is call):
            return None
        loop_in = comp.for_in
        if (
            loop_in.inner_for_in is not None
            or loop_in.ifs
            or loop_in.asynchronous
            or not isinstance(loop_in.target, cst.Name)
        ):
            return None
        var = loop_in.target.value
        texts = [a for a in call.args if _reads_only(a.value, var)]
        if (
            len(texts) != 1
            or texts[0].star
            or any(
                var in {n.value for n in names_read(part)} for part in _call_parts(call) if part is not texts[0].value
            )
        ):
            return None
        text = texts[0].value
        if isinstance(text, cst.Name):  # `[tok.encode(t, n) for t in texts]`
            picked = self._picked_texts(loop_in.iter, comp, loop)
            if picked is None or isinstance(picked, str):
                return picked
            corpus, position, indices = picked
            new_elt = None
        else:  # `[tok.encode(docs[i], n) for i in idx]`
            corpus = _corpus_of(text)
            if corpus is None:
                return None
            position, indices = var, None
            new_elt = cst.Subscript(cst.Name("_"), [cst.SubscriptElement(cst.Index(cst.Name(var)))])
        if not self.context.kinds.in_memory_list(corpus):
            return f"perfmod cannot tell that `{corpus.value}` is a list held in memory"
        holder = self.context.parents.get(comp)
        factory = self.context.parents.get(holder) if isinstance(holder, cst.Arg) else None
        if not (
            isinstance(factory, cst.Call)
            and factory.args
            and factory.args[0] is holder
            and self.context.names.is_(factory.func, "torch.tensor", "torch.as_tensor")
        ):
            return "the ids stay a list the step could change, and pretokenized they would be shared by every step"
        others = [part for part in _call_parts(call) if part is not text]
        region, reason = None, None
        for candidate in [loop, *self._enclosing_loops(loop)]:
            reason = self._impure_encoder(call, candidate) or self._all(others, candidate, {})
            reason = reason or self._corpus_changed(corpus, candidate)
            if reason is not None:
                break
            region = candidate
        if region is None:
            return reason[1] if isinstance(reason, tuple) else reason
        picks = indices if indices is not None else loop_in.iter
        stacked = self._equal_rows(call, text, factory, picks, region)
        return _Pretokenize(comp, corpus, region, position, indices, new_elt, factory, picks if stacked else None)

    def _equal_rows(
        self, call: cst.Call, text: cst.BaseExpression, factory: cst.Call, picks: cst.BaseExpression, region
    ) -> bool:
        """May the ids go in one tensor, indexed by the step's `picks`: `factory` is
        `torch.tensor(ids, ...)`, `call` a function of the file whose lists have the length
        one of its arguments gives (the same on every call: padded and truncated to it), and
        `picks` a list (a tuple would index a tensor's dimensions)?"""
        if not self.context.names.is_(factory.func, "torch.tensor") or any(a.keyword is None for a in factory.args[1:]):
            return False
        if self._all([a.value for a in factory.args[1:]], region, {}) is not None:
            return False
        callee = self.context.kinds.local_callee(call)
        if callee is None or not self.context.kinds.in_memory_list(picks, tuples=False):
            return False
        param = self.context.shared("lengths", Lengths).returned_length(callee)
        offset = 1 if self.context.kinds.class_of(callee) is not None and isinstance(call.func, cst.Attribute) else 0
        length = argument_for(call, callee, param, offset) if param is not None else None
        return length is not None and length is not text

    def _picked_texts(self, texts: cst.BaseExpression, comp: cst.ListComp, loop: cst.CSTNode):
        """(docs, i, idx) when `texts` holds `[docs[i] for i in idx]`, bound once in the
        loop, `idx` a name not bound again between there and `comp`, neither changed in
        place in the loop; the reason when `texts` is a list built in the loop otherwise;
        None when it is not one."""
        if not isinstance(texts, cst.Name):
            return None
        reaching = self.context.kinds.reaching(texts)
        if len(reaching) != 1 or not self.context.inside(reaching[0].node, loop):
            return None
        value = self._bindings.assigned_value(reaching[0])
        if not isinstance(value, cst.ListComp):
            return None
        picks = value.for_in
        if picks.inner_for_in is not None or picks.ifs or picks.asynchronous or not isinstance(picks.target, cst.Name):
            return None
        corpus = _corpus_of(value.elt)
        indices = picks.iter
        if corpus is None or not _reads_only(value.elt, picks.target.value):
            return f"the texts are made in the step (`{self._short(value.elt)}`), not taken as they are from a list"
        if not isinstance(indices, cst.Name):
            return f"the indices `{self._short(indices)}` are not a name the step keeps"
        for name in sorted(self._aliases(texts.value, loop) | {indices.value}):
            if self._mutated_in(name, loop):
                return f"`{name}` is changed in place in the step"
        start, end = self.context.positions[value].end, self.context.positions[comp].start
        scope = self._scopes.get(indices)
        for assignment in scope[indices.value] if scope is not None else ():
            node = getattr(assignment, "node", None)
            if isinstance(node, cst.CSTNode) and self.context.inside(node, loop):
                at = self.context.positions[node].start
                if (start.line, start.column) <= (at.line, at.column) <= (end.line, end.column):
                    return f"`{indices.value}` is bound again between the texts and their tokenization"
        return corpus, picks.target.value, indices

    def _impure_encoder(self, call: cst.Call, region: cst.CSTNode) -> str | None:
        """Why `call` may not give the same ids for the same text before the loop as in it
        (its callee not known pure, its tokenizer changed in the loop), or None."""
        spelled = self.context.source(call.func)
        callee = self.context.kinds.local_callee(call)
        if callee is not None:
            if self.context.purity.is_pure(callee):
                return None
            return (
                f"`{spelled}` is not known to be pure (it changes state, draws random numbers or calls "
                "what perfmod cannot follow): the ids of a text may differ from call to call"
            )
        known, receiver = self._is_tokenizer_call(call)
        if not known:
            return f"perfmod cannot prove `{spelled}` is pure"
        return self._tokenizer_changed(receiver, region)

    def _corpus_changed(self, corpus: cst.Name, region: cst.CSTNode) -> str | None:
        """Why the list `corpus` may hold other texts on some iteration of `region`: re-bound
        or changed in place there, itself or a name sharing it, or handed to a call that
        may change it; None when the loop only reads it (`docs[i]`, `len(docs)`)."""
        function = self._index.first_enclosing(region, (cst.FunctionDef,)) or self.context.module
        names = {corpus.value: corpus}  # the corpus and the names bound to the same list (`pool = docs`)
        changed = True
        while changed:
            changed = False
            for assign in self._index.find(cst.Assign, within=function):
                if isinstance(assign.value, cst.Name) and assign.value.value in names:
                    for target in assign.targets:
                        if isinstance(target.target, cst.Name) and target.target.value not in names:
                            names[target.target.value] = target.target
                            changed = True
        for name, node in sorted(names.items()):
            problem = self._name_variance(node, region, {})
            if problem is not None:
                return problem
            for use in self._names(region, name):
                parent = self.context.parents.get(use)
                if (isinstance(parent, cst.Subscript) and parent.value is use) or (
                    isinstance(parent, (cst.For, cst.CompFor)) and parent.iter is use
                ):
                    continue  # `docs[i]`, `for d in docs`: read
                call = self.context.parents.get(parent) if isinstance(parent, cst.Arg) else None
                if isinstance(call, cst.Call) and (
                    self.context.purity.pure_call(call)
                    or self.context.names.is_(call.func, "random.sample", "random.choice", "random.choices")
                ):
                    continue
                if isinstance(parent, cst.AssignTarget) or (isinstance(parent, cst.Assign) and parent.value is use):
                    continue  # `b = docs`: checked as an alias
                return f"`{name}` is used in the loop other than read (`{self._short(parent)}`)"
        return None

    def _fix_corpus(self, call: cst.Call, plan: _Pretokenize) -> None:
        """`<corpus>_ids = [tok.encode(t, n) for t in docs]` in front of the loop (in
        `torch.tensor(...)` when the rows have one length), and the step's ids picked from it."""
        name = self._fresh_name(f"{plan.corpus.value}_ids")
        if plan.new_elt is None:  # the texts' comprehension, over every text of the corpus
            encoded = plan.comp.with_changes(for_in=plan.comp.for_in.with_changes(iter=plan.corpus))
        else:  # `tok.encode(docs[i], n)` becomes `tok.encode(text, n)` over the corpus
            text = next(a.value for a in call.args if not isinstance(a.value, cst.Name) and _corpus_of(a.value))
            variable = self._fresh_name("text", within=call)
            elt = call.deep_replace(text, cst.Name(variable))
            encoded = cst.ListComp(elt, cst.CompFor(target=cst.Name(variable), iter=plan.corpus))
        if plan.stacked is not None:  # one tensor of the corpus's ids, its rows picked per step
            first = plan.factory.args[0].with_changes(value=encoded)
            value = plan.factory.with_changes(args=[first, *plan.factory.args[1:]])
            edit = Replace(plan.factory, cst.Subscript(cst.Name(name), [cst.SubscriptElement(cst.Index(plan.stacked))]))
        elif plan.new_elt is None:  # `[docs_ids[i] for i in idx]`
            value = encoded
            per_step = cst.parse_expression(f"[{name}[{plan.position}] for {plan.position} in _]")
            edit = Replace(plan.comp, per_step.with_changes(for_in=per_step.for_in.with_changes(iter=plan.indices)))
        else:  # `[docs_ids[i] for i in <as written>]`
            value = encoded
            edit = Replace(call, plan.new_elt.with_changes(value=cst.Name(name)))
        line = cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name(name))], value)])
        self._report_corpus(call, plan, name, [InsertBefore(plan.region, (line,)), edit])

    def _report_corpus(self, call: cst.Call, plan: _Pretokenize, name: str, edits: list) -> None:
        self.report(
            call,
            f"`{self.context.source(call.func)}` tokenizes texts of `{plan.corpus.value}`, a list that does "
            f"not change, again on every training step; every text is tokenized once before the loop "
            f"(`{name}`) and the step picks its ids",
            edits=edits,
            level=Level.UNSAFE,
        )

    def _fresh_name(self, wanted: str, within: cst.CSTNode | None = None) -> str:
        """`wanted`, or `wanted_2`, ...: a name spelled nowhere in the file (or in `within`)."""
        where = within if within is not None else self.context.module
        candidate, n = wanted, 1
        while self._names(where, candidate) or (within is None and candidate in self._taken):
            n += 1
            candidate = f"{wanted}_{n}"
        if within is None:
            self._taken.add(candidate)
        return candidate

    def _draws_or_trains(self, function: cst.FunctionDef, args: list[cst.BaseExpression]) -> bool:
        """Does `function` draw random numbers (a new batch each call), or is it handed a
        model, an optimizer or a model's parameters (whose values and gradients the steps
        change)?"""
        kinds = self.context.kinds
        if any(kinds.fact(arg).kind in (Kind.MODULE, Kind.OPTIMIZER) for arg in args):
            return True
        if any(self.context.training.parameter_models(arg) for arg in args):
            return True
        for call in self._index.find(cst.Call, within=function.body):
            for name in self.context.names.of(call.func):
                if name.startswith(("random.", "numpy.random.")) or name in RANDOM_FUNCTIONS or "Generator" in name:
                    return True
            if kinds.fact(call.func).kind is Kind.MODULE:
                return True
        return False

    def _makes_tensor(self, expr: cst.BaseExpression) -> bool:
        """Is `expr` a tensor (or a tokenizer's BatchEncoding), so `.to(device)`, `.long()` ... are conversions?"""
        if self.context.kinds.fact(expr).kind is Kind.TENSOR:
            return True
        while isinstance(expr, cst.Subscript):
            expr = expr.value
        if self.context.kinds.fact(expr).kind is Kind.TENSOR:
            return True
        if isinstance(expr, cst.Call):
            names = self.context.names.of(expr.func)
            return (
                bool(names & DETERMINISTIC_FACTORIES)
                or self._is_tokenizer_call(expr)[0]
                or (method_name(expr) in TENSOR_METHODS and self._makes_tensor(expr.func.value))
            )
        return False

    def _name_variance(self, name: cst.Name, region, regions):
        if name.value in regions:
            hoisted_at = regions[name.value]
            return (
                None
                if self.context.inside(region, hoisted_at)
                else f"`{name.value}` is hoisted only out of an inner loop"
            )
        scope = self._scopes.get(name)
        if scope is None:
            return f"`{name.value}` is not resolved"
        for assignment in scope[name.value]:
            if (
                isinstance(assignment, Assignment)
                and isinstance(assignment.node, cst.CSTNode)
                and self.context.inside(assignment.node, region)
            ):
                return f"`{name.value}` is re-bound in the loop"
        if self._mutated_in(name.value, region):
            return f"`{name.value}` is changed in place in the loop"
        if self._trained(name):
            return f"`{name.value}` is trained: the optimizer changes it in place every step"
        return None

    def _trained(self, name: cst.Name) -> bool:
        """Does `name` hold a model, a parameter, or a tensor that requires grad, which the
        optimizer changes in place (or autograd would see used in two steps)?"""
        if self.context.kinds.fact(name).kind is Kind.MODULE:
            return True
        scope = self._scopes.get(name)
        return scope is not None and self._trained_bindings(scope[name.value])

    def _trained_bindings(self, assignments) -> bool:
        """`_trained` for what the bindings (a scope's set of them for one name) hold."""
        return self._trained_by_bindings.get(assignments, self._compute_trained_bindings)

    def _compute_trained_bindings(self, assignments) -> bool:
        kinds = self.context.kinds
        for assignment in assignments:
            node = getattr(assignment, "node", None)
            if isinstance(node, cst.CSTNode):
                statement = self._bindings.statement(node)
                value = getattr(statement, "value", None)
                if isinstance(value, cst.Call) and (
                    self.context.names.is_(value.func, "torch.nn.Parameter", "torch.nn.parameter.Parameter")
                    or kwarg(value, "requires_grad") is not None
                ):
                    return True
        for access in reads_of(assignments):
            parent = self.context.parents.get(access.node)
            if isinstance(parent, cst.Attribute) and parent.attr.value == "requires_grad_":
                return True
            for ancestor in self._index.ancestors(access.node):
                if isinstance(ancestor, cst.Call) and kinds.fact(ancestor).kind is Kind.OPTIMIZER:
                    params = kwarg(ancestor, "params") or (ancestor.args[0] if ancestor.args else None)
                    if params is not None and self._index.inside(access.node, params):
                        return True  # `torch.optim.Adam([x], ...)`
                if isinstance(ancestor, (cst.BaseStatement, cst.Lambda)):
                    break
        return False

    def _target_problem(self, name: str, statement: cst.Assign, line: cst.CSTNode, region: cst.CSTNode, regions: dict):
        """Can `name = value` run once before `region`: bound nowhere else in it (or only by
        a chain hoisted with it, `s = f(...)` then `s = s.to(device)`), read in it only after
        those statements, and its value never changed in place there?"""
        scope = self._scopes.get(statement)
        others = [
            a
            for a in scope.assignments[name]
            if a.node is not statement.targets[0].target
            and isinstance(a.node, cst.CSTNode)
            and self.context.inside(a.node, region)
        ]
        chain = [statement]
        if others:
            chain = self._rebinding_chain(name, statement, region, regions)
            if chain is None:
                return f"`{name}` is bound more than once in the loop"
        last = self._bindings.statement(chain[-1]) if len(chain) > 1 else line
        end = self.context.positions[self.context.parents.get(last) if isinstance(last, cst.Assign) else last].end
        for access in scope.accesses[name]:
            start = self.context.positions[access.node].start
            if any(self.context.inside(access.node, member.value) for member in chain[1:]):
                continue  # the chain's next statement reading the one before
            if self.context.inside(access.node, region) and (start.line, start.column) < (end.line, end.column):
                return f"`{name}` is read in the loop before it is bound"
        for alias in sorted(self._aliases(name, region)):
            if self._mutated_in(alias, region):
                if alias == name:
                    return f"`{name}` is changed in place in the loop, and hoisted it would carry the change to the next step"
                return f"`{alias}`, computed from `{name}` (possibly a view of it), is changed in place in the loop"
        return None

    def _rebinding_chain(
        self, name: str, statement: cst.Assign, region: cst.CSTNode, regions: dict
    ) -> list[cst.Assign] | None:
        """The statements binding `name` in `region`, in order, when they are one chain an
        expert moves out together: `name = value` alone on lines of one block, each after
        the first computed from invariants and the one before (`s = s.to(device)`); the
        first is `statement`, or was moved out already. None otherwise."""
        scope = self._scopes.get(statement)
        members = []
        for assignment in scope.assignments[name]:
            node = assignment.node
            if not (isinstance(node, cst.CSTNode) and self.context.inside(node, region)):
                continue
            target, assign = self.context.parents.get(node), None
            if isinstance(target, cst.AssignTarget):
                assign = self.context.parents.get(target)
            line = self.context.parents.get(assign) if isinstance(assign, cst.Assign) else None
            if line is None or _single_assignment(line) is not assign:
                return None
            members.append((self.context.positions[line].start.line, line, assign))
        members.sort(key=lambda member: member[0])
        if len({id(self.context.parents.get(line)) for _, line, _ in members}) != 1:
            return None  # not one block: a branch may skip one of them
        chain = [assign for _, _, assign in members]
        if chain[0] is not statement and name not in regions:
            return None
        hoisted = {**regions, name: region}
        if any(self._variance(assign.value, region, hoisted) is not None for assign in chain[1:]):
            return None
        return chain

    def _aliases(self, name: str, region: cst.CSTNode) -> set[str]:
        """`name` and the names bound in `region` to values that may share its object or
        storage (`b = a`, `b = a[0]`, `b = a.view(-1)`, `b = a.to(device)`, `b = [a]`),
        transitively; a result that is a new object (`a.clone()`, `a + 1`, `model(a)`,
        `a.item()`) is not one."""
        found, changed = {name}, True
        pairs = []
        for assign in self._index.find(cst.Assign, within=region):
            for target in assign.targets:
                pairs.extend(_assigned_pairs(target.target, assign.value))
        while changed:
            changed = False
            for target, value in pairs:
                if target not in found and _shares(value, found):
                    found.add(target)
                    changed = True
        return found

    def _mutated_in(self, name: str, region: cst.CSTNode) -> bool:
        """Is the object `name` holds changed in place in `region`: `x.add_(1)`, `x.append(y)`,
        `x[0] = y`, `x.attr = y`, `x += y`, `del x[0]`, `f(out=x)`, also through `x[...]` and views?"""
        for use in self._names(region, name):
            node, parent = use, self.context.parents.get(use)
            while True:  # climb through the expressions that still share the object's memory
                if isinstance(parent, cst.Subscript) and parent.value is node:
                    node, parent = parent, self.context.parents.get(parent)
                elif isinstance(parent, cst.Attribute) and parent.value is node:
                    attribute, call = parent, self.context.parents.get(parent)
                    method = attribute.attr.value
                    if isinstance(call, cst.Call) and call.func is attribute:
                        if method in MUTATING_METHODS or (method.endswith("_") and not method.startswith("_")):
                            return True
                        if method in SAME_PLACE_METHODS:  # views and no-op conversions
                            node, parent = call, self.context.parents.get(call)
                            continue
                        break
                    if isinstance(self.context.parents.get(attribute), (cst.AssignTarget, cst.AugAssign)):
                        return True  # `x.attr = y`
                    break
                else:
                    break
            if isinstance(parent, cst.AssignTarget) and node is not use:
                return True  # `x[0] = y`
            if isinstance(parent, cst.AugAssign) and parent.target is node:
                return True
            if isinstance(parent, cst.Del) or (
                isinstance(parent, cst.Arg) and parent.keyword is not None and parent.keyword.value == "out"
            ):
                return True
        return False

    def _attributes_assigned(self, name: str, region: cst.CSTNode) -> bool:
        return any(
            isinstance(t.target, cst.Attribute)
            and isinstance(t.target.value, cst.Name)
            and t.target.value.value == name
            for t in self._index.find(cst.AssignTarget, within=region)
        )

    def _names(self, region: cst.CSTNode, name: str) -> list[cst.Name]:
        """The Name nodes spelled `name` in `region` (one table per region)."""
        table = self._names_in.get(id(region))
        if table is None:
            table = self._names_in[id(region)] = defaultdict(list)
            for node in self._index.find(cst.Name, within=region):
                table[node.value].append(node)
        return table.get(name, [])

    # -- what a tokenizer is -------------------------------------------------------------------

    def _is_tokenizer_call(self, call: cst.Call) -> tuple[bool, cst.BaseExpression | None]:
        """(known, receiver): known when `call` is `tok(...)` or `tok.<pure method>(...)` on a
        tokenizer built by a known library; receiver is `tok` for any call shaped like
        that (a method named like a tokenizer's, or a call of a name with "token" in it)."""
        if isinstance(call.func, cst.Attribute) and call.func.attr.value in TOKENIZER_METHODS:
            return self._is_known_tokenizer(call.func.value), call.func.value
        if isinstance(call.func, (cst.Name, cst.Attribute)):
            if self._is_known_tokenizer(call.func):
                return True, call.func
            if "token" in self.context.source(call.func).lower().rsplit(".", 1)[-1]:
                return False, call.func
        return False, None

    def _is_known_tokenizer(self, expr: cst.BaseExpression, depth: int = 0) -> bool:
        """Is `expr` a tokenizer a known library built (followed through names, parameters
        and `self` attributes)?"""
        if depth > 4:
            return False
        if isinstance(expr, cst.Name):
            values = [value for value, path in self.context.loaders.bound_values(expr) if not path] or None
        elif isinstance(expr, cst.Attribute):
            values = self.context.kinds.self_attribute_values(expr)
        else:
            return False
        return bool(values) and all(self._builds_tokenizer(v, depth) for v in values)

    def _builds_tokenizer(self, value: cst.BaseExpression, depth: int = 0) -> bool:
        if isinstance(value, (cst.Name, cst.Attribute)):
            return self._is_known_tokenizer(value, depth + 1)
        if not isinstance(value, cst.Call):
            return False
        for name in self.context.names.of(value.func):
            if name in TOKENIZER_BUILDERS:
                return True
            head, _, last = name.rpartition(".")
            if (
                name.startswith("transformers.")
                and last == "from_pretrained"
                and "Tokenizer" in head.rsplit(".", 1)[-1]
            ):
                return True
        return False

    # -- tokenizers in forward: reported ----------------------------------------------------

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if node.name.value != "forward":
            return
        classdef = self.context.parents.get(self.context.parents.get(node))
        if not isinstance(classdef, cst.ClassDef) or self.context.kinds.class_fact(classdef).kind is not Kind.MODULE:
            return
        for call in self._index.find(cst.Call, within=node.body):
            if id(call) not in self._reported and self._tokenizes(call, 0):
                self._reported.add(id(call))
                self.report(
                    call,
                    f"`{self.context.source(call.func)}` tokenizes inside the model's forward, on the host, on "
                    "every step; tokenize the texts once before training (runtime.data."
                    "PretokenizedDataset) or in the DataLoader's workers and pass ids to the model",
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
        for call in self._index.find(cst.Call, within=function.body):
            if id(call) not in self._reported and self._tokenizes(call, 0):
                self._reported.add(id(call))
                self.report(
                    call,
                    f"`{self.context.source(call.func)}` tokenizes in the DataLoader's collate function, again "
                    "for every batch of every epoch (in the workers when there are any); if the texts are "
                    "fixed, tokenize them once (runtime.data.PretokenizedDataset) and pad with PadCollate",
                )

    # -- the fix -------------------------------------------------------------------------------

    def _fix(self, hoists: list[_Hoist]) -> None:
        """Each hoisted line leaves the loop and goes, in order, in front of the outermost
        loop it is invariant in (a line a later one reads goes first: fixes apply in order)."""
        first_of_region: set[int] = set()
        for hoist in hoists:
            if id(hoist.region) in first_of_region:
                shape = _moved
            else:
                first_of_region.add(id(hoist.region))
                shape = partial(_in_front, hoist.region)
            self.report(
                hoist.line,
                f"`{hoist.name} = {self._short(hoist.value)}` gives the same value on every training "
                "step; computed once before the loop",
                edits=[Move(hoist.line, hoist.region, shape)],
            )

    # -- helpers -----------------------------------------------------------------------------

    def _enclosing_loops(self, loop: cst.CSTNode) -> list[cst.CSTNode]:
        found = []
        for current in self._index.ancestors(loop):
            if isinstance(current, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                break
            if isinstance(current, (cst.For, cst.While)):
                found.append(current)
        return found

    def _short(self, node: cst.CSTNode) -> str:
        code = " ".join(self.context.source(node).split())
        return code if len(code) <= 60 else code[:57] + "..."


def _corpus_of(text: cst.BaseExpression) -> cst.Name | None:
    """`docs` of `docs[i]`: one index, a name, of a list named."""
    if (
        isinstance(text, cst.Subscript)
        and isinstance(text.value, cst.Name)
        and len(text.slice) == 1
        and isinstance(text.slice[0].slice, cst.Index)
        and isinstance(text.slice[0].slice.value, cst.Name)
    ):
        return text.value
    return None


def _reads_only(expr: cst.BaseExpression, var: str) -> bool:
    """Is `expr` the name `var`, or `docs[var]`?"""
    if isinstance(expr, cst.Name):
        return expr.value == var
    return _corpus_of(expr) is not None and expr.slice[0].slice.value.value == var


def _call_parts(call: cst.Call) -> list[cst.BaseExpression]:
    """What `call` evaluates besides the callee's name: its receiver and its arguments."""
    receiver = [call.func.value] if isinstance(call.func, cst.Attribute) else []
    return [*receiver, *(a.value for a in call.args)]


def _lines(block: cst.BaseSuite) -> list[cst.CSTNode]:
    return list(block.body) if isinstance(block, cst.IndentedBlock) else []


def _in_front(loop: cst.CSTNode, line: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
    """`line` as it goes first in front of `loop`: the blank lines above the loop go above
    it (the comments above the loop stay with it), the line keeps its own comments."""
    leading = list(loop.leading_lines)
    first_comment = next((k for k, above in enumerate(leading) if above.comment is not None), len(leading))
    moved = _moved(line)
    return moved.with_changes(leading_lines=[*leading[:first_comment], *moved.leading_lines])


# Methods and attributes whose result may be the receiver itself or a view of its storage.


def _shares(value: cst.BaseExpression, names: set[str]) -> bool:
    """May `value` be (a part or view of) the object one of `names` holds?"""
    while True:
        if isinstance(value, cst.Subscript):
            value = value.value
        elif isinstance(value, cst.Attribute) and value.attr.value in SHARING_ATTRIBUTES:
            value = value.value
        elif (
            isinstance(value, cst.Call)
            and isinstance(value.func, cst.Attribute)
            and value.func.attr.value in SHARING_CALLS
        ):
            value = value.func.value
        else:
            break
    if isinstance(value, cst.Name):
        return value.value in names
    if isinstance(value, cst.IfExp):
        return _shares(value.body, names) or _shares(value.orelse, names)
    if isinstance(value, (cst.List, cst.Tuple, cst.Set)):
        return any(isinstance(e, (cst.Element, cst.StarredElement)) and _shares(e.value, names) for e in value.elements)
    if isinstance(value, cst.Dict):
        return any(isinstance(e, cst.DictElement) and _shares(e.value, names) for e in value.elements)
    if isinstance(value, (cst.ListComp, cst.GeneratorExp, cst.SetComp)):
        return _shares(value.elt, names) or _shares(value.for_in.iter, names)
    if isinstance(value, cst.DictComp):
        return _shares(value.value, names) or _shares(value.for_in.iter, names)
    return False


def _assigned_pairs(target: cst.BaseExpression, value: cst.BaseExpression) -> list[tuple[str, cst.BaseExpression]]:
    """(name, the value it gets) for `target = value`; pairwise through a tuple of both,
    every name with the whole value otherwise."""
    if isinstance(target, cst.Name):
        return [(target.value, value)]
    if isinstance(target, (cst.Tuple, cst.List)):
        if (
            isinstance(value, (cst.Tuple, cst.List))
            and len(value.elements) == len(target.elements)
            and not any(isinstance(e, cst.StarredElement) for e in (*value.elements, *target.elements))
        ):
            return [pair for t, v in zip(target.elements, value.elements) for pair in _assigned_pairs(t.value, v.value)]
        return [pair for t in target.elements for pair in _assigned_pairs(t.value, value)]
    return []


def _moved(line: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
    """`line` without the blank lines above it: its comments go along."""
    return line.with_changes(leading_lines=[l for l in line.leading_lines if l.comment is not None])


def _needed(hoists: list[_Hoist], index) -> list[_Hoist]:
    """The hoists worth making: those that call something (a tokenizer, a tensor factory, a
    conversion), and the plain literals (`messages = [...]`) that such a hoist reads."""
    kept: list[_Hoist] = []
    read: set[str] = set()
    for hoist in reversed(hoists):
        if index.find(cst.Call, within=hoist.value) or hoist.name in read:
            kept.append(hoist)
            read |= {n.value for n in names_read(hoist.value)}
    return kept[::-1]


def _single_assignment(line: cst.CSTNode) -> cst.Assign | None:
    """`name = value` alone on its line."""
    if not (isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1):
        return None
    statement = line.body[0]
    if (
        isinstance(statement, cst.Assign)
        and len(statement.targets) == 1
        and isinstance(statement.targets[0].target, cst.Name)
    ):
        return statement
    return None
