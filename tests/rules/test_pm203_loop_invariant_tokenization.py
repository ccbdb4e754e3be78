"""PM203 on the spellings and edge cases its VALID/INVALID examples do not cover:
which tokenizers are known, what counts as changing a value in the loop, and
where hoisted statements land."""

import pytest

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rules.loop_invariant_tokenization import LoopInvariantTokenization

MODEL = "model = torch.nn.Embedding(1000, 8)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
STEP = "    loss = model(ids).sum()\n    loss.backward()\n    opt.step()\n"


def run(code: str):
    settings = Settings(select=("PM203",))
    result = process_source(code.encode(), "<test>", settings, [LoopInvariantTokenization])
    assert result.error is None, result.error
    again = process_source(result.new_source, "<test>", settings, [LoopInvariantTokenization])
    assert not again.pending and again.new_source == result.new_source  # idempotent
    new = result.new_source.decode()
    compile(new, "<new>", "exec")
    return result.findings, new


@pytest.mark.parametrize(
    "build",
    [
        "import tiktoken\ntok = tiktoken.get_encoding('gpt2')\n",
        "from tokenizers import Tokenizer\ntok = Tokenizer.from_file('tok.json')\n",
        "import transformers\ntok = transformers.GPT2TokenizerFast.from_pretrained('gpt2')\n",
    ],
)
def test_known_tokenizer_libraries(build):
    code = (
        "import torch\n"
        + build
        + MODEL
        + "for step in range(3):\n    ids = torch.tensor([tok.encode('fixed')])\n"
        + STEP
    )
    findings, new = run(code)
    assert findings and all(f.applied for f in findings)
    assert "ids = torch.tensor([tok.encode('fixed')])\nfor step in range(3):\n" in new


@pytest.mark.parametrize(
    "build,receiver",
    [
        ("from transformers import AutoTokenizer\ndef AutoTokenizer():\n    pass\ntok = AutoTokenizer()\n", "tok"),
        ("from transformers import AutoModel\ntok = AutoModel.from_pretrained('gpt2')\n", "tok"),
    ],
)
def test_lookalikes_are_not_known_tokenizers(build, receiver):
    code = (
        "import torch\n"
        + build
        + MODEL
        + "for step in range(3):\n    ids = torch.tensor([tok.encode('fixed')])\n"
        + STEP
    )
    findings, new = run(code)
    assert new == code
    assert len(findings) == 1 and f"cannot prove `{receiver}` is a known tokenizer" in findings[0].message


def test_a_tokenizer_passed_as_a_parameter_is_reported():
    code = (
        "import torch\n" + MODEL + "def train(tokenizer, prompt):\n    for step in range(3):\n"
        "        ids = tokenizer(prompt, return_tensors='pt')['input_ids']\n" + STEP.replace("    ", "        ")
    )
    findings, new = run(code)
    assert new == code and len(findings) == 1 and not findings[0].fixable


HEAD = (
    "import torch\nfrom transformers import AutoTokenizer\ntok = AutoTokenizer.from_pretrained('x')\nPROMPT = 'p'\n"
    + MODEL
)


@pytest.mark.parametrize(
    "between,reason",
    [
        ("    del ids\n", "`ids` is changed in place"),
        ("    ids.append(1)\n", "`ids` is changed in place"),
        ("    view = ids[0]\n    view.add_(1)\n", "`view`, computed from `ids`"),
        ("    torch.add(ids, 1, out=ids)\n", "`ids` is changed in place"),
    ],
)
def test_values_changed_in_the_loop_stay(between, reason):
    code = (
        HEAD
        + "for step in range(3):\n    ids = tok.encode(PROMPT)\n"
        + between
        + "    loss = model(torch.tensor([1])).sum()\n    loss.backward()\n    opt.step()\n"
    )
    findings, new = run(code)
    assert new == code
    assert len(findings) == 1 and reason in findings[0].message and not findings[0].fixable


def test_a_target_read_before_it_is_bound_in_the_loop_stays():
    code = (
        HEAD + "ids = None\nfor step in range(3):\n    if ids is not None:\n        print(ids)\n"
        "    ids = tok(PROMPT, return_tensors='pt')['input_ids']\n" + STEP
    )
    findings, new = run(code)
    assert new == code and "read in the loop before it is bound" in findings[0].message


def test_an_argument_changed_in_the_loop_keeps_the_call_in_the_loop():
    code = (
        HEAD
        + "parts = ['a']\nfor step in range(3):\n    parts.append('b')\n    ids = tok(' '.join(parts), return_tensors='pt')['input_ids']\n"
        + STEP
    )
    findings, new = run(code)
    assert new == code and len(findings) == 1 and "tokenizes inside the training loop" in findings[0].message


def test_hoisted_only_out_of_the_loops_it_is_invariant_in():
    code = (
        HEAD + "for epoch in range(2):\n    prompt = f'epoch {epoch}: ' + PROMPT\n    for step in range(3):\n"
        "        ids = tok(prompt, return_tensors='pt')['input_ids']\n" + STEP.replace("    ", "        ")
    )
    findings, new = run(code)
    assert findings[0].applied
    assert (
        "    prompt = f'epoch {epoch}: ' + PROMPT\n    ids = tok(prompt, return_tensors='pt')['input_ids']\n"
        "    for step in range(3):\n"
    ) in new


def test_a_while_loop_in_a_trainer_method_with_self_tokenizer():
    code = (
        "import torch\nfrom transformers import AutoTokenizer\nclass Trainer:\n    def __init__(self):\n"
        "        self.tokenizer = AutoTokenizer.from_pretrained('x')\n"
        "        self.model = torch.nn.Embedding(1000, 8)\n"
        "        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)\n"
        "    def fit(self, steps):\n        step = 0\n        while step < steps:\n"
        "            ids = self.tokenizer('fixed', return_tensors='pt')['input_ids']\n"
        "            loss = self.model(ids).sum()\n            loss.backward()\n            self.opt.step()\n"
        "            step += 1\n"
    )
    findings, new = run(code)
    assert findings[0].applied
    assert (
        "        step = 0\n        ids = self.tokenizer('fixed', return_tensors='pt')['input_ids']\n"
        "        while step < steps:\n"
    ) in new


def test_suppressed_statement_stays_and_is_not_reported():
    code = (
        HEAD
        + "for step in range(3):\n    ids = tok(PROMPT, return_tensors='pt')['input_ids']  # perfmod: ignore[PM203]\n"
        + STEP
    )
    findings, new = run(code)
    assert new == code and not findings


def test_literals_alone_are_not_moved():
    code = HEAD + "for step in range(3):\n    scale = 2.0\n    names = ['a', 'b']\n    ids = torch.tensor([1])\n" + STEP
    findings, new = run(code)
    assert "    scale = 2.0\n    names = ['a', 'b']\n" in new and "ids = torch.tensor([1])\nfor step" in new


@pytest.mark.parametrize(
    "params",
    [
        "list(model.parameters())",
        "[p for p in model.parameters() if p.requires_grad]",
        "[p for p in model.parameters()] if model is not None else []",
    ],
)
@pytest.mark.parametrize("read", ["p.grad", 'getattr(p, "grad", None)'])
def test_a_function_of_the_trained_parameters_is_not_advised_out_of_the_loop(params, read):
    """Its arguments are the same objects every step, but their values and gradients are
    what the step changes: computing it once would be wrong, so there is no finding."""
    code = (
        "import torch\n"
        + MODEL
        + f"params = {params}\n\n\n"
        + "def grad_norm(ps):\n"
        + "    total = 0.0\n"
        + "    for p in ps:\n"
        + f"        g = {read}\n"
        + "        if g is not None:\n"
        + "            total += float(g.norm())\n"
        + "    return total\n\n\n"
        + "for step in range(3):\n    ids = torch.randint(0, 1000, (2, 2))\n"
        + STEP
        + "    print(grad_norm(params))\n"
    )
    findings, new = run(code)
    assert findings == [] and new == code


@pytest.mark.parametrize(
    "setting,change,text",
    [
        ("cfg = SimpleNamespace(prompt=PROMPT)\n", "setattr(cfg, 'prompt', PROMPT + '!' * step)", "cfg.prompt"),
        ("cfg = SimpleNamespace(prompt=PROMPT)\n", "cfg.prompt = PROMPT[: 5 + step]", "cfg.prompt"),
        ("cfg = {'data': {'prompt': PROMPT}}\n", "cfg['data'].update(prompt=PROMPT * step)", "cfg['data']['prompt']"),
    ],
)
def test_a_prompt_the_step_sets_is_the_steps_own_text_and_gets_no_advice(setting, change, text):
    """A setting the training changes as it goes is not a corpus to tokenize once."""
    code = (
        "from types import SimpleNamespace\n"
        + HEAD
        + setting
        + f"for step in range(3):\n    {change}\n    ids = tok({text}, return_tensors='pt')['input_ids']\n"
        + STEP
    )
    findings, new = run(code)
    assert new == code and not findings, [f.message for f in findings]


def test_texts_picked_from_a_list_by_the_step_are_still_a_corpus():
    code = (
        HEAD
        + "texts = ['a b', 'c d']\nfor step in range(3):\n    ids = tok(texts[step % 2], return_tensors='pt')['input_ids']\n"
        + STEP
    )
    findings, new = run(code)
    assert new == code and len(findings) == 1 and "if the texts come from a fixed corpus" in findings[0].message


@pytest.mark.parametrize(
    ("line", "moved"),
    [
        ("    mask = torch.tril(torch.ones(4, 4))\n", True),  # a computation of invariant operands
        ("    mask = torch.tril(torch.empty(4, 4))\n", False),  # uninitialized memory: not the same tensor
    ],
)
def test_torch_computations_move_where_their_operands_are_invariant_and_initialized(line, moved):
    code = HEAD + "for step in range(3):\n" + line + "    loss = (model(torch.tensor([1])) @ mask[:8, :1]).sum()\n"
    code += "    loss.backward()\n    opt.step()\n"
    findings, new = run(code)
    assert (new != code) is moved
