"""What tokenizes, which tokenizer calls are pure, what a loop's iterations share, and
which texts a step takes from a fixed corpus: the answers of `tokenizers`, `variance`
and `corpus` on small programs."""

import textwrap

import libcst as cst

from codemod.analysis.corpus import Pretokenize, corpus
from codemod.analysis.tokenizers import tokenizers
from codemod.analysis.variance import variance
from codemod.context import FileContext

WORDS = """
import random
import torch

class WordTokenizer:
    def __init__(self, lines):
        self.vocab = {}
        for line in lines:
            for w in line.split():
                self.vocab.setdefault(w, len(self.vocab) + 1)
{encode}

lines = ["the cat sat", "a dog ran", "the dog sat down", "a cat ran off"]
wt = WordTokenizer(lines)
net = torch.nn.Embedding(32, 4)
sgd = torch.optim.SGD(net.parameters(), lr=0.01)
for it in range(5):
{body}
    out = net(x).mean()
    out.backward()
    sgd.step()
    sgd.zero_grad()
"""
READS_VOCAB = (
    "    def encode(self, s, width):\n"
    "        got = [self.vocab.get(w, 0) for w in s.split()][:width]\n"
    "        return got + [0] * (width - len(got))\n"
)
WRITES_CACHE = (
    "    def encode(self, s, width):\n"
    "        self.cache = s\n"
    "        got = [self.vocab.get(w, 0) for w in s.split()][:width]\n"
    "        return got + [0] * (width - len(got))\n"
)


def program(encode: str, body: str) -> FileContext:
    body = textwrap.indent(textwrap.dedent(body), "    ")
    return FileContext.of_source(WORDS.replace("{encode}", encode).replace("{body}", body))


def call_spelled(context: FileContext, spelled: str) -> cst.Call:
    return next(c for c in context.index.find(cst.Call) if context.source(c.func) == spelled)


def loop_of(context: FileContext) -> cst.For:
    return next(f for f in context.index.find(cst.For) if context.source(f.target) == "it")


def test_an_own_tokenizer_reading_a_vocab_set_in_init_is_pure_and_its_fixed_call_invariant():
    context = program(READS_VOCAB, "x = torch.tensor([wt.encode('the cat', 3)])")
    call = call_spelled(context, "wt.encode")
    assert tokenizers(context).tokenizes(call)
    assert tokenizers(context).tokenizer_call(call) == (False, call.func.value)  # not a library's tokenizer
    assert context.purity.is_pure(context.kinds.local_callee(call))
    assert variance(context).of(call, loop_of(context)) is None


def test_an_own_tokenizer_writing_a_cache_on_self_is_not_pure_and_its_call_not_invariant():
    context = program(WRITES_CACHE, "x = torch.tensor([wt.encode('the cat', 3)])")
    call = call_spelled(context, "wt.encode")
    assert not context.purity.is_pure(context.kinds.local_callee(call))
    assert variance(context).of(call, loop_of(context)) is not None


HF = """
import torch
from transformers import AutoTokenizer

tok = AutoTokenizer.from_pretrained("some/model")
net = torch.nn.Embedding(50000, 4)
for it in range(3):
{body}
"""


def hf(body: str) -> FileContext:
    return FileContext.of_source(HF.replace("{body}", textwrap.indent(textwrap.dedent(body), "    ")))


def test_a_chat_template_of_constant_messages_is_invariant():
    context = hf(
        """
        chat = [{"role": "user", "content": "Name a colour."}]
        prompt = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        """
    )
    call, loop = call_spelled(context, "tok.apply_chat_template"), loop_of(context)
    known, receiver = tokenizers(context).tokenizer_call(call)
    assert known and context.source(receiver) == "tok"
    chat = next(a for a in context.index.find(cst.Assign) if context.source(a.targets[0].target) == "chat")
    assert variance(context).of(chat.value, loop) is None
    # `chat` is bound in the loop: invariant once its own line is moved in front of the loop
    assert variance(context).of(call, loop) == "`chat` is re-bound in the loop"
    assert variance(context).of(call, loop, {"chat": loop}) is None
    context = hf('ids = tok.apply_chat_template([{"role": "user", "content": "Hi."}], return_tensors="pt")')
    assert variance(context).of(call_spelled(context, "tok.apply_chat_template"), loop_of(context)) is None


def test_a_chat_template_of_the_step_or_of_a_changed_tokenizer_varies():
    context = hf(
        """
        chat = [{"role": "user", "content": f"Count to {it}."}]
        prompt = tok.apply_chat_template(chat, tokenize=False)
        """
    )
    assert variance(context).of(call_spelled(context, "tok.apply_chat_template"), loop_of(context)) is not None
    context = hf(
        """
        tok.add_special_tokens({"pad_token": "<pad>"})
        prompt = tok.apply_chat_template([{"role": "user", "content": "Hi."}], tokenize=False)
        """
    )
    call = call_spelled(context, "tok.apply_chat_template")
    assert "may change the tokenizer" in tokenizers(context).changed_in(call.func.value, loop_of(context))
    assert variance(context).of(call, loop_of(context)) is not None


def test_texts_sampled_from_a_list_each_step_come_from_a_fixed_corpus():
    context = program(
        READS_VOCAB,
        """
        texts = [lines[i] for i in random.sample(range(len(lines)), 2)]
        x = torch.tensor([wt.encode(s, 4) for s in texts])
        """,
    )
    texts = next(n for n in context.index.find(cst.Name) if n.value == "texts")
    assert tokenizers(context).from_corpus(texts, loop_of(context))
    assert not tokenizers(context).made_in_step(texts, loop_of(context))


def test_texts_formatted_from_the_step_are_made_in_the_step():
    context = program(READS_VOCAB, "x = torch.tensor([wt.encode(f'step {it} ' + lines[0], 4)])")
    text = call_spelled(context, "wt.encode").args[0].value
    assert tokenizers(context).made_in_step(text, loop_of(context))


def test_a_corpus_picked_by_kept_indices_is_pretokenizable_into_one_tensor():
    context = program(
        READS_VOCAB,
        """
        picks = random.sample(range(len(lines)), 2)
        texts = [lines[i] for i in picks]
        x = torch.tensor([wt.encode(s, 4) for s in texts])
        """,
    )
    plan = corpus(context).pretokenizable(call_spelled(context, "wt.encode"), loop_of(context))
    assert isinstance(plan, Pretokenize)
    assert plan.corpus.value == "lines" and plan.region is loop_of(context)
    assert context.source(plan.stacked) == "picks"  # every text gives 4 ids: one tensor, rows picked


def test_a_corpus_the_loop_appends_to_or_an_impure_encode_is_not_pretokenizable():
    body = """
        picks = random.sample(range(len(lines)), 2)
        texts = [lines[i] for i in picks]
        x = torch.tensor([wt.encode(s, 4) for s in texts])
        """
    context = program(READS_VOCAB, body + "lines.append('new words')\n")
    reason = corpus(context).pretokenizable(call_spelled(context, "wt.encode"), loop_of(context))
    assert isinstance(reason, str) and "`lines`" in reason
    context = program(WRITES_CACHE, body)
    reason = corpus(context).pretokenizable(call_spelled(context, "wt.encode"), loop_of(context))
    assert isinstance(reason, str) and "not known to be pure" in reason


def test_aliases_and_changes_in_place_are_followed_through_views():
    context = program(
        READS_VOCAB,
        "x = torch.tensor([[1, 2]])\nrow = x[0]\nflat = row.view(-1)\nflat.add_(1)\n"
        "x = torch.zeros(2)\nother = x[0]\nrest = [x.clone()]",
    )
    loop = loop_of(context)
    first = next(n for n in context.index.find(cst.Name) if n.value == "x")
    # `other` is made from the `x` bound after it, not from this one; a clone is new
    assert variance(context).aliases(first, loop) == {"x", "row", "flat"}
    assert variance(context).changed_in_place("flat", loop)
    assert not variance(context).changed_in_place("lines", loop)
    assert variance(context).trained(next(n for n in context.index.find(cst.Name) if n.value == "net"))


def test_an_attribute_added_to_another_name_is_read_not_changed():
    context = program(READS_VOCAB, "total += wt.size\n")
    assert variance(context).in_place_change("wt", loop_of(context)) is None
    context = program(READS_VOCAB, "total += wt.size\nwt.count += 1\n")
    assert variance(context).in_place_change("wt", loop_of(context)) == "`wt` is changed in place in the loop"


def test_hoists_move_a_chain_of_invariant_lines_out_of_both_loops_and_say_why_others_stay():
    context = FileContext.of_source(
        HF.replace("for it in range(3):\n{body}", "for epoch in range(2):\n    for it in range(3):\n{body}").replace(
            "{body}",
            textwrap.indent(
                "with torch.no_grad():\n"
                "    chat = [{'role': 'user', 'content': 'Hi.'}]\n"
                "text = tok.apply_chat_template(chat, tokenize=False)\n"
                "prompt = torch.tensor([tok.encode(text)])\n"
                "prompt = prompt.long()\n"
                "seen = tok(['x'], return_tensors='pt')['input_ids']\n"
                "seen[0, 0] = it\n"
                "width = 3\n",
                "        ",
            ),
        )
    )
    loop, outer = loop_of(context), next(f for f in context.index.find(cst.For) if context.source(f.target) == "epoch")
    plan = variance(context).hoists(loop, skip=lambda line: False)
    assert [(h.name, h.region is outer) for h in plan.moves] == [
        ("chat", True),
        ("text", True),
        ("prompt", True),
        ("prompt", True),
        ("width", True),
    ]
    # `width = 3` calls nothing and nothing moved reads it: not worth a move
    assert [h.name for h in variance(context).doing_work(plan)] == ["chat", "text", "prompt", "prompt"]
    seen = call_spelled(context, "tok")
    assert "changed in place" in plan.why_not(seen, context)
    assert plan.unproven == []


def test_an_unknown_tokenizer_with_fixed_arguments_is_unproven_not_invariant():
    context = FileContext.of_source(
        "import torch\nfrom mytok import load\ntk = load()\nfor it in range(3):\n"
        "    x = torch.tensor([tk.encode('the cat')])\n"
    )
    plan = variance(context).hoists(loop_of(context), skip=lambda line: False)
    assert plan.moves == []
    [(call, message)] = plan.unproven
    assert context.source(call) == "tk.encode('the cat')" and "cannot prove `tk` is a known tokenizer" in message


def test_the_pretokenized_corpus_code_picks_rows_of_one_tensor():
    context = program(
        READS_VOCAB,
        """
        picks = random.sample(range(len(lines)), 2)
        texts = [lines[i] for i in picks]
        x = torch.tensor([wt.encode(s, 4) for s in texts])
        """,
    )
    call = call_spelled(context, "wt.encode")
    plan = corpus(context).pretokenizable(call, loop_of(context))
    value, node, replacement = corpus(context).rewrite(call, plan, "lines_ids", "")
    code = cst.Module([]).code_for_node
    assert code(value) == "torch.tensor([wt.encode(s, 4) for s in lines])"
    assert node is plan.factory and code(replacement) == "lines_ids[picks]"


def test_text_generated_in_the_step_is_tokenized_as_the_steps_own_work():
    context = hf(
        """
        out = net(torch.tensor([[1, 2]])).argmax(-1)
        reply = tok.decode(out[0])
        ids = tok(reply, return_tensors="pt")["input_ids"]
        """
    )
    assert corpus(context).tokenizes_step_text(call_spelled(context, "tok"), loop_of(context))
    context = hf('ids = tok(["a b", "c d"][it % 2], return_tensors="pt")["input_ids"]')
    assert not corpus(context).tokenizes_step_text(call_spelled(context, "tok"), loop_of(context))


def test_a_copy_of_a_host_tensor_to_the_device_uploads_it():
    context = FileContext.of_source("import torch\nx = torch.ones(3)\ny = x.to('cuda')\nz = x.to(torch.float16)\n")
    assert context.kinds.copy_of(call_spelled(context, "x.to")).uploads_host_tensor
    dtype_only = [c for c in context.index.find(cst.Call) if context.source(c) == "x.to(torch.float16)"][0]
    assert not context.kinds.copy_of(dtype_only).uploads_host_tensor


def test_an_encode_of_a_tensor_is_a_models_not_a_tokenizers():
    context = FileContext.of_source(
        textwrap.dedent("""\
            import torch
            from diffusers.models import AutoencoderKL
            vae = AutoencoderKL.from_pretrained("stabilityai/sd-vae-ft-ema").to("cuda")
            tok = load_tokenizer()
            loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 3, 32, 32)), batch_size=8)
            for (x,) in loader:
                x = x.to("cuda")
                latents = vae.encode(x).latent_dist.sample()
                ids = tok.encode("a caption")
        """)
    )
    assert not tokenizers(context).tokenizes(call_spelled(context, "vae.encode"))
    assert tokenizers(context).tokenizes(call_spelled(context, "tok.encode"))


def test_the_calls_that_tokenize_in_a_loop_body():
    context = program(READS_VOCAB, "    x = torch.tensor([wt.encode(lines[it % 4], 4)])\n    print(len(lines))")
    loop = loop_of(context)
    assert [context.source(call) for call in tokenizers(context).calls_in(loop.body)] == ["wt.encode(lines[it % 4], 4)"]
