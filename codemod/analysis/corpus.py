"""The texts of a fixed corpus that a training step tokenizes again on every step, and
whether tokenizing the whole corpus once, before the loop, gives each step the same ids.

- `pretokenizable(call, loop)`: a Pretokenize plan when `call` is the element of
  `[tok.encode(t, n) for t in texts]` with `texts = [docs[i] for i in idx]` bound in
  the step (or of `[tok.encode(docs[i], n) for i in idx]`), `docs` a list held in
  memory that the loop only reads, `tok.encode` pure (`purity`, or a known tokenizer
  not changed in the loop) and its other arguments invariant (`variance`), and the ids
  handed to `torch.tensor`, which copies them. The plan names the outermost loop the
  corpus may be tokenized in front of, and the step's indices when every text gives as
  many ids (one tensor holds them all); where each item of a collection the step loops
  over brings its own tokenizer (`for ctx in contexts:`, `item_loop`), one table per
  item, keyed by the item's identity. The reason (a string) when a precondition
  fails; None when `call` is not of that shape.
- `rewrite(call, plan, name, variable)`: what pretokenizing by a plan writes: the value
  of `<name> = ...` in front of the loop, the node of the step that gave the ids, and
  what replaces it (the ids the step picks from `name`).
- `text_table(call, loop)`: a TextTable plan when `call` tokenizes in a loop of the step
  over its texts (`for user_text in batch_user_texts:` rendering a chat prompt, then
  tokenizing it): what the loop's statements make of each text up to its last tokenizer
  call, made before the loop for every text of the corpus (the step's statements that
  make the loop's list replayed over the corpus), keyed by the text and per item; the
  reason when that table could differ from what a step computes; `table_rewrite(plan,
  name)`: the code in front of the loop, and the step's look-up.
- `padded_table(call, loop)`: a PaddedTable plan when `call`, a Hugging Face tokenizer's,
  pads the step's texts of a corpus together to the longest of the step (the picked texts,
  by name or picked in the call, or a list made from them text by text, `[f"{t}{suffix}" for t in batch_texts]`): each
  text tokenized once, unpadded, in a table keyed by the text (per item), and the step's
  rows padded by the tokenizer's own `pad`, which pads as the call does; the reason when
  the options, the fields read, the tokenizer or the texts do not allow it;
  `padded_rewrite(plan, name)`: the table in front of the loop, and the step's `pad` call.
- `not_pretokenized(call, loop)`: for a known tokenizer's call on texts of a corpus that
  is not of the shapes above, what keeps tokenizing the corpus once from being proven:
  the reason a loop of the step over its texts cannot be tabulated, the step's texts
  tokenized together in one call (padded to the longest of the step), texts that pass
  on their way through a function of another module that is not pure (`purity`).
- `tokenizes_step_text(call, loop)`: does `call` tokenize text the step makes (what the
  model generated, a prompt formatted from the step's values), never a corpus's: there
  is nothing to tokenize ahead.
- `picked_texts(texts, comp, loop)`: (docs, i, idx) when the name `texts` holds
  `[docs[i] for i in idx]`, bound once in the step; the reason, or None.
- `encoder_impurity(call, region)`: why `call` may give other ids for the same text
  before the loop than in it, or None.
- `corpus_changed(corpus, region)`: why the list `corpus` may hold other texts on some
  iteration of `region`, or None when the loop only reads it.

Built once per file (FileContext.shared).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, NamedTuple

import libcst as cst
from libcst.metadata import BuiltinAssignment

from codemod.analysis.bindings import argument_for
from codemod.analysis.lengths import Lengths
from codemod.analysis.names import kwarg, names_read
from codemod.analysis.project import project_of
from codemod.analysis.tokenizers import RANDOM_PICKS, call_parts, corpus_of, reads_only, tokenizers
from codemod.analysis.torch_facts import (
    RETURN_TENSORS,
    TOKENIZER_IDS,
    TOKENIZER_NO_PADDING,
    TOKENIZER_PAD_FIELDS,
    TOKENIZER_PAD_LIBRARIES,
    TOKENIZER_PAD_LONGEST,
    TOKENIZER_PAD_OPTIONS,
    TOKENIZER_PADDING,
    TOKENIZER_PER_TEXT_OPTIONS,
)
from codemod.analysis.variance import variance

if TYPE_CHECKING:
    from codemod.context import FileContext

KEY = "corpus"


def corpus(context: FileContext) -> Corpus:
    return context.shared(KEY, Corpus)


@dataclass
class Pretokenize:
    comp: cst.ListComp  # the per-step `[tok.encode(t, n) for t in texts]`
    corpus: cst.Name  # the list of texts the step picks from
    region: cst.CSTNode  # the loop the pretokenized corpus goes in front of
    position: str  # the variable of the indices' comprehension (`i`)
    indices: cst.BaseExpression | None  # `idx` of `[docs[i] for i in idx]` (texts bound in the loop)
    new_elt: cst.Subscript | None  # `_[i]` for the element `tok.encode(docs[i], n)`
    factory: cst.Call  # `torch.tensor(<comp>, ...)`
    stacked: cst.BaseExpression | None  # the step's indices, when the ids go in one tensor
    # `for ctx in contexts:` of the step, when the call reads its item (`ctx.tok.encode(t)`):
    # one table of ids per item, keyed by the item's identity
    items: cst.For | None = None


@dataclass
class TextTable:
    """What a loop of the step computes from each of its texts, tokenized once before the
    loop: `for user_text in batch_user_texts:` renders each text with a chat template
    and tokenizes it (`toks = tok(rendered, ...)`); the table holds that value for every
    text of the corpus, keyed by the text (and, per item, by the item of `for ctx in
    contexts:` that brings the tokenizer)."""

    statement: cst.SimpleStatementLine  # `toks = tok(rendered, ...)`: its value goes in the table
    target: cst.Name  # `toks`
    text_loop: cst.For  # `for user_text in batch_user_texts:`
    before: list[cst.BaseStatement]  # the statements of its body that make the tokenizer's text
    replayed: list[cst.BaseStatement]  # the step's statements from its picked texts to the loop's list
    renamed: dict[str, str]  # the names those bind -> the names bound over the whole corpus
    texts: cst.Name  # the loop's list (`batch_user_texts`)
    nesting: list[cst.CSTNode]  # `for ctx in contexts:` and the `if`s of the step around the loop, outermost first
    items: cst.For | None
    corpus: cst.Name
    region: cst.CSTNode


class _PaddedBatch(NamedTuple):
    """The texts a padding tokenizer's call of the step tokenizes: `element` of each text
    `variable` of `texts` (the call's own list where `texts` is None), the list comprehension
    and its line that make them where they are made text by text, and how the step picks
    them (`Corpus._picked_chain`)."""

    receiver: cst.BaseExpression
    given: cst.BaseExpression
    element: cst.BaseExpression
    variable: cst.Name
    texts: cst.BaseExpression | None
    comp: cst.ListComp | None
    texts_line: cst.SimpleStatementLine | None
    chain: tuple


@dataclass
class PaddedTable:
    """The step's texts of a corpus handed to a Hugging Face tokenizer together and padded to
    the longest of the step (`tok([f"{t}{suffix}" for t in batch], padding=True)`): each text
    of the corpus tokenized once, unpadded, into a table keyed by the text (per item of `for
    ctx in contexts:`), and the step's rows padded by the tokenizer's own `pad`, which pads
    as its batched call does (its padding side and pad id)."""

    call: cst.Call
    receiver: cst.BaseExpression  # the tokenizer
    element: cst.BaseExpression  # `f"{t}{suffix}"`: what is tokenized of each text `variable`
    variable: cst.Name  # `t`
    texts: cst.Name | None  # `batch`: the step's texts, picked from the corpus
    picked: cst.ListComp | None  # `[docs[i] for i in idx]`: the texts picked in the call itself
    texts_line: cst.SimpleStatementLine | None  # `with_suffix = [...]`, when the call reads it by name
    before: list[cst.SimpleStatementLine]  # `suffix = ...`: the step's values the texts are made with
    per_text: list[cst.Arg]  # the keywords that tokenize each text
    padding: list[cst.Arg]  # the keywords `pad` takes
    replayed: list[cst.BaseStatement]
    renamed: dict[str, str]
    nesting: list[cst.CSTNode]
    items: cst.For | None
    corpus: cst.Name
    region: cst.CSTNode


class Corpus:
    def __init__(self, context: FileContext) -> None:
        self.context = context
        self._scopes = context.scopes
        self._bindings = context.bindings
        self._index = context.index
        self._tokenizers = tokenizers(context)
        self._variance = variance(context)

    def pretokenizable(self, call: cst.Call, loop: cst.CSTNode) -> Pretokenize | str | None:
        """How to tokenize once, before the loop, every text of the corpus that `call`
        tokenizes a few of per step: `call` is the element of `[tok.encode(t, n) for t in
        texts]`, with `texts = [docs[i] for i in idx]` bound in the loop (or of
        `[tok.encode(docs[i], n) for i in idx]`), `docs` a list in memory that the loop
        does not change, `tok.encode` pure and its other arguments the same every step, and
        the ids handed to `torch.tensor`, which copies them. None when `call` is not of that
        shape; the reason when a precondition fails."""
        encoded = self._encoded_per_text(call)
        if encoded is None:
            return None
        comp, text = encoded
        source = self._texts_source(text, comp, loop)
        if source is None or isinstance(source, str):
            return source
        corpus, position, indices, new_elt = source
        if not self.context.kinds.in_memory_list(corpus):
            return f"perfmod cannot tell that `{corpus.value}` is a list held in memory"
        factory = self._copying_factory(comp)
        if factory is None:
            return "the ids stay a list the step could change, and pretokenized they would be shared by every step"
        others = [part for part in call_parts(call) if part is not text]
        items = self.item_loop(call, loop)
        region = self._widest_region(
            loop,
            partial(self.encoder_impurity, call),
            partial(self._arguments_vary, others, items),
            partial(self._texts_changed, corpus, items),
        )
        if isinstance(region, str):
            return region
        picks = indices if indices is not None else comp.for_in.iter
        stacked = self._equal_rows(call, text, factory, picks, region)
        return Pretokenize(comp, corpus, region, position, indices, new_elt, factory, picks if stacked else None, items)

    def _encoded_per_text(self, call: cst.Call) -> tuple[cst.ListComp, cst.BaseExpression] | None:
        """(comp, text) when `call` is the element of `comp`, one `for` over a name, and given
        the comprehension's text (`t` or `docs[i]`) in one argument, the variable nowhere else."""
        comp = self.context.parents.get(call)
        if not (isinstance(comp, cst.ListComp) and comp.elt is call and _one_for(comp)):
            return None
        var = comp.for_in.target.value
        texts = [a for a in call.args if reads_only(a.value, var)]
        if len(texts) != 1 or texts[0].star:
            return None
        text = texts[0].value
        if any(var in {n.value for n in names_read(part)} for part in call_parts(call) if part is not text):
            return None
        return comp, text

    def _texts_source(self, text: cst.BaseExpression, comp: cst.ListComp, loop: cst.CSTNode):
        """(corpus, position, indices, new_elt) of the texts `comp` tokenizes: picked by a
        list bound in the step (`[tok.encode(t, n) for t in texts]`, `texts = [docs[i] for i
        in idx]`), or picked in `comp` itself (`[tok.encode(docs[i], n) for i in idx]`: its
        element then reads the table by the index); the reason, or None."""
        if isinstance(text, cst.Name):
            picked = self.picked_texts(comp.for_in.iter, comp, loop)
            if picked is None or isinstance(picked, str):
                return picked
            corpus, position, indices = picked
            return corpus, position, indices, None
        corpus = corpus_of(text)
        if corpus is None:
            return None
        var = comp.for_in.target.value
        return corpus, var, None, cst.Subscript(cst.Name("_"), [cst.SubscriptElement(cst.Index(cst.Name(var)))])

    def _copying_factory(self, comp: cst.ListComp) -> cst.Call | None:
        """`torch.tensor(comp, ...)`, `torch.as_tensor(comp, ...)`: the call that copies the ids."""
        holder = self.context.parents.get(comp)
        factory = self.context.parents.get(holder) if isinstance(holder, cst.Arg) else None
        if (
            isinstance(factory, cst.Call)
            and factory.args
            and factory.args[0] is holder
            and self.context.names.is_(factory.func, "torch.tensor", "torch.as_tensor")
        ):
            return factory
        return None

    def _arguments_vary(self, others: list[cst.BaseExpression], items: cst.For | None, region: cst.CSTNode):
        """Why the encoder's arguments other than the text may differ from step to step in
        `region`; the item of `for ctx in contexts:` is bound, for the table, in front of it."""
        hoisted = {items.target.value: region} if items is not None else {}
        return self._variance.of_all(others, region, hoisted)

    def _texts_changed(self, corpus: cst.Name, items: cst.For | None, region: cst.CSTNode):
        """Why the corpus, or the collection of the step's `for ctx in contexts:`, may hold
        other items on some iteration of `region`; None when neither does."""
        reason = self.corpus_changed(corpus, region)
        return reason or (self._collection_changed(items, region) if items is not None else None)

    def _widest_region(self, loop: cst.CSTNode, *problems) -> cst.CSTNode | str:
        """The outermost loop, from `loop` outwards, that neither it nor a loop inside it has
        one of the `problems` (each asked of a loop: a reason, or None): the table is built in
        front of it. The reason when `loop` itself has one."""
        region = None
        for candidate in [loop, *self._index.enclosing_loops(loop)]:
            reason = None
            for problem in problems:
                reason = reason or problem(candidate)
            if reason is not None:
                break
            region = candidate
        if region is not None:
            return region
        return reason[1] if isinstance(reason, tuple) else reason

    def item_loop(self, call: cst.Call, loop: cst.CSTNode) -> cst.For | None:
        """The loop of the step `loop` over the items of a collection the step does not
        change (`for ctx in model_contexts:`), innermost first, whose item `call` reads
        (`ctx.wrapper.tokenizer(text)`, `ctx.tok.encode(t, ctx.max_len)`): tokenized once,
        the corpus takes one table of ids per item."""
        read = {n.value for part in call_parts(call) for n in names_read(part)}
        for inner in self._index.enclosing_loops(call):
            if inner is loop or not self.context.inside(inner, loop):
                break
            if (
                isinstance(inner, cst.For)
                and isinstance(inner.target, cst.Name)
                and inner.target.value in read
                and isinstance(inner.iter, cst.Name)
                and self._collection_changed(inner, loop) is None
            ):
                return inner
        return None

    def _collection_changed(self, items: cst.For, region: cst.CSTNode) -> str | None:
        """Why the collection `items` iterates may hold other items on some iteration of
        `region` (re-bound, changed in place), or why its items cannot key a table (the name
        `id` is not the builtin); None when the table built in front of `region` has an
        entry for each item the step iterates."""
        collection = items.iter
        problem = self._variance.of(collection, region)
        if problem is not None:
            return problem[1] if isinstance(problem, tuple) else problem
        if self._variance.changed_in_place(collection.value, region):
            return f"`{collection.value}` is changed in place in the loop"
        scope = self._scopes.get(region)
        if scope is None or not all(isinstance(found, BuiltinAssignment) for found in scope["id"]):
            return "the name `id`, which would key the table by item, is not the builtin here"
        return None

    def _equal_rows(
        self, call: cst.Call, text: cst.BaseExpression, factory: cst.Call, picks: cst.BaseExpression, region
    ) -> bool:
        """May the ids go in one tensor, indexed by the step's `picks`: `factory` is
        `torch.tensor(ids, ...)`, `call` a function of the file whose lists have the length
        one of its arguments gives (the same on every call: padded and truncated to it), and
        `picks` a list (a tuple would index a tensor's dimensions)?"""
        if not self.context.names.is_(factory.func, "torch.tensor") or any(a.keyword is None for a in factory.args[1:]):
            return False
        if self._variance.of_all([a.value for a in factory.args[1:]], region) is not None:
            return False
        callee = self.context.kinds.local_callee(call)
        if callee is None or not self.context.kinds.in_memory_list(picks, tuples=False):
            return False
        param = self.context.shared("lengths", Lengths).returned_length(callee)
        offset = self.context.kinds.receiver_offset(call, callee)
        length = argument_for(call, callee, param, offset) if param is not None else None
        return length is not None and length is not text

    def picked_texts(self, texts: cst.BaseExpression, comp: cst.ListComp, loop: cst.CSTNode):
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
        corpus = corpus_of(value.elt)
        indices = picks.iter
        if corpus is None or not reads_only(value.elt, picks.target.value):
            return f"the texts are made in the step (`{_short(self.context, value.elt)}`), not taken as they are from a list"
        if not isinstance(indices, cst.Name):
            return f"the indices `{_short(self.context, indices)}` are not a name the step keeps"
        for name in sorted(self._variance.aliases(texts, loop) | {indices.value}):
            if self._variance.changed_in_place(name, loop):
                return f"`{name}` is changed in place in the step"
        start, end = self.context.positions[value].end, self.context.positions[comp].start
        for assignment in self.context.kinds.bindings_in(loop, indices.value):
            at = self.context.positions[assignment.node].start
            if (start.line, start.column) <= (at.line, at.column) <= (end.line, end.column):
                return f"`{indices.value}` is bound again between the texts and their tokenization"
        return corpus, picks.target.value, indices

    def encoder_impurity(self, call: cst.Call, region: cst.CSTNode) -> str | None:
        """Why `call` may not give the same ids for the same text before the loop as in it
        (its callee not known pure, its tokenizer changed in the loop), or None."""
        spelled = self.context.source(call.func)
        if self.context.purity.pure_callee(call):
            return None
        if self.context.kinds.local_callee(call) is not None:
            return (
                f"`{spelled}` is not known to be pure (it changes state, draws random numbers or calls "
                "what perfmod cannot follow): the ids of a text may differ from call to call"
            )
        known, receiver = self._tokenizers.tokenizer_call(call)
        if not known:
            return f"perfmod cannot prove `{spelled}` is pure"
        return self._tokenizers.changed_in(receiver, region)

    def corpus_changed(self, corpus: cst.Name, region: cst.CSTNode) -> str | None:
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
            problem = self._variance.of_name(node, region)
            if problem is not None:
                return problem
            for use in self._variance.names_in(region, name):
                parent = self.context.parents.get(use)
                if (isinstance(parent, cst.Subscript) and parent.value is use) or (
                    isinstance(parent, (cst.For, cst.CompFor)) and parent.iter is use
                ):
                    continue  # `docs[i]`, `for d in docs`: read
                call = self.context.parents.get(parent) if isinstance(parent, cst.Arg) else None
                if isinstance(call, cst.Call) and (
                    self.context.purity.pure_call(call) or self.context.names.is_(call.func, *RANDOM_PICKS)
                ):
                    continue
                if isinstance(parent, cst.AssignTarget) or (isinstance(parent, cst.Assign) and parent.value is use):
                    continue  # `b = docs`: checked as an alias
                return f"`{name}` is used in the loop other than read (`{_short(self.context, parent)}`)"
        return None

    def rewrite(
        self, call: cst.Call, plan: Pretokenize, name: str, variable: str
    ) -> tuple[cst.BaseExpression, cst.CSTNode, cst.BaseExpression]:
        """What pretokenizing by `plan` writes: the value of `<name> = ...` in front of the
        loop (every text of the corpus tokenized, in `torch.tensor(...)` when the rows have
        one length), the node of the step that gives the ids, and what replaces it (the ids
        the step picks from `name`). `variable` names a text of the corpus when the step
        picked its texts inside the comprehension (`tok.encode(docs[i], n)`)."""
        if plan.new_elt is None:  # the texts' comprehension, over every text of the corpus
            encoded = plan.comp.with_changes(for_in=plan.comp.for_in.with_changes(iter=plan.corpus))
        else:  # `tok.encode(docs[i], n)` becomes `tok.encode(text, n)` over the corpus
            text = next(a.value for a in call.args if not isinstance(a.value, cst.Name) and corpus_of(a.value))
            elt = call.deep_replace(text, cst.Name(variable))
            encoded = cst.ListComp(elt, cst.CompFor(target=cst.Name(variable), iter=plan.corpus))
        table: cst.BaseExpression = cst.Name(name)
        if plan.items is not None:  # `docs_ids[id(ctx)]`: the table of the step's item
            key = cst.Call(cst.Name("id"), [cst.Arg(plan.items.target)])
            table = cst.Subscript(table, [cst.SubscriptElement(cst.Index(key))])
        if plan.stacked is not None:  # one tensor of the corpus's ids, its rows picked per step
            first = plan.factory.args[0].with_changes(value=encoded)
            value = plan.factory.with_changes(args=[first, *plan.factory.args[1:]])
            picked = cst.Subscript(table, [cst.SubscriptElement(cst.Index(plan.stacked))])
            return self._per_item(value, plan), plan.factory, picked
        if plan.new_elt is None:  # `[docs_ids[i] for i in idx]`
            row = cst.Subscript(table, [cst.SubscriptElement(cst.Index(cst.Name(plan.position)))])
            per_step = cst.ListComp(row, cst.CompFor(target=cst.Name(plan.position), iter=plan.indices))
            return self._per_item(encoded, plan), plan.comp, per_step
        # `[docs_ids[i] for i in <as written>]`
        return self._per_item(encoded, plan), call, plan.new_elt.with_changes(value=table)

    @staticmethod
    def _per_item(value: cst.BaseExpression, plan: Pretokenize) -> cst.BaseExpression:
        """`value`, or `{id(ctx): value for ctx in contexts}` when each item of the step's
        collection brings its own tokenizer."""
        if plan.items is None:
            return value
        key = cst.Call(cst.Name("id"), [cst.Arg(plan.items.target)])
        return cst.DictComp(key, value, cst.CompFor(target=plan.items.target, iter=plan.items.iter))

    def text_table(self, call: cst.Call, loop: cst.CSTNode) -> TextTable | str | None:
        """How to compute once, before the loop, what a loop of the step over its texts
        computes from each text and tokenizes (`for user_text in batch_user_texts:`,
        rendering a chat prompt, then `toks = tok(rendered, ...)`): `call` tokenizes in the
        statements of that loop's body up to the last statement that tokenizes, each a plain
        assignment (or an `if` of them) of values the same on every step but for the text and
        the item of `for ctx in contexts:`, each name bound before it is read, their names
        read nowhere else in the function (the result's only after it, in the step), the
        tokenizer's result changed in place nowhere; the loop's list made from texts the step
        picks from a list in memory, text by text (`[split(raw)[0] for raw in batch_texts]`,
        or the picked texts themselves, under `if`s the same on every step); the loop inside
        the step under `for ctx in contexts:` and `if`s the same on every step only. The
        reason when a precondition fails; None when `call` is in no such loop."""
        text_loop = self._text_loop(call, loop)
        if text_loop is None:
            return None
        if not isinstance(text_loop.target, cst.Name) or not isinstance(text_loop.iter, cst.Name) or text_loop.orelse:
            return f"the loop `for {_short(self.context, text_loop.target)} in ...` is not over one name"
        statements = self._table_statements(text_loop, call)
        if statements is None or isinstance(statements, str):
            return statements
        before, statement, target = statements
        bound = self._bound_by(before, target)
        if isinstance(bound, str):
            return bound
        table_part = (*before, statement)
        problem = self._table_names_problem(table_part, bound, target, loop)
        if problem is not None:
            return problem
        shown = f"`for {_short(self.context, text_loop.target)} in ...`"
        nesting = self._nesting(text_loop, shown, call, loop)
        if isinstance(nesting, str):
            return nesting
        items = next((node for node in nesting if isinstance(node, cst.For)), None)
        chain = self._picked_chain(text_loop.iter, loop)
        if isinstance(chain, str):
            return chain
        replayed, renamed, corpus, chain_assigns, picks = chain
        problem = self._picked_changed(text_loop.iter, text_loop, renamed, picks, loop)
        if problem is not None:
            return problem
        if not self.context.kinds.in_memory_list(corpus):
            return f"perfmod cannot tell that `{corpus.value}` is a list held in memory"
        region = self._widest_region(
            loop,
            partial(
                self._table_varies,
                table_part,
                nesting,
                replayed,
                text_loop=text_loop,
                bound=bound,
                chain_assigns=chain_assigns,
            ),
            partial(self._texts_changed, corpus, items),
        )
        if isinstance(region, str):
            return region
        return TextTable(
            statement, target, text_loop, before, replayed, renamed, text_loop.iter, nesting, items, corpus, region
        )

    def _table_statements(self, text_loop: cst.For, call: cst.Call):
        """(before, statement, target): the statements of the text loop's body up to the last
        that tokenizes, `target = ...`, among which `call` is; the reason when that last is
        not a plain assignment; None when `call` is after it."""
        body = list(text_loop.body.body) if isinstance(text_loop.body, cst.IndentedBlock) else []
        tokenizing = [line for line in body if self._tokenizes_in(line)]
        statement = tokenizing[-1] if tokenizing else None
        target = _assigned_name(statement)
        if target is None:
            return "the last tokenizer call of the loop's body is not a plain assignment to a name"
        before = body[: body.index(statement)]
        if not any(self.context.inside(call, line) for line in (*before, statement)):
            return None
        return before, statement, target

    def _table_names_problem(
        self, table_part: tuple[cst.CSTNode, ...], bound: set[str], target: cst.Name, loop: cst.CSTNode
    ) -> str | None:
        """Why the names the table's statements bind cannot live in the table: bound or read
        elsewhere in the function (the result's only after them, in the step), read before
        they are bound, or the result shared by a name changed in place in the step."""
        function = self._index.first_enclosing(loop, cst.FunctionDef) or self.context.module
        for name in sorted(bound):
            for node in self._variance.names_in(function, name):
                if any(self.context.inside(node, line) for line in table_part):
                    continue
                where = f"line {self.context.line(node)}"
                if self._is_binding(node):
                    return f"`{name}`, bound in the statements that make the ids, is bound elsewhere too ({where})"
                if name != target.value or not self.context.inside(node, loop):
                    return f"`{name}`, bound in the statements that make the ids, is read after them ({where})"
        carried = _read_before_bound(table_part, bound)
        if carried is not None:
            return f"`{carried}` may keep its value from the text before"
        for alias in sorted(self._variance.aliases(target, loop)):
            if self._variance.changed_in_place(alias, loop):
                return f"`{alias}` shares what the tokenizer gives and is changed in place in the step"
        return None

    def _picked_changed(self, texts: cst.Name, user: cst.CSTNode, renamed, picks, loop: cst.CSTNode) -> str | None:
        """Why the step's texts may not be the ones picked: a list of them changed in place
        before `user`, which tokenizes the list `texts`, is done with it (the lists are made
        anew every step: only a change in that span counts)."""
        lines = list(loop.body.body) if isinstance(loop.body, cst.IndentedBlock) else []
        first, last = (self._top(node, loop) for node in (min(picks, key=self._index.order), user))
        span = lines[lines.index(first) : lines.index(last) + 1] if first in lines and last in lines else [loop]
        for name in sorted(self._variance.aliases(texts, loop) | set(renamed)):
            if any(self._variance.changed_in_place(name, line) for line in span):
                return f"`{name}` is changed in place in the step: it may hold a text the table does not"
        return None

    def _bound_by(self, before: list[cst.CSTNode], target: cst.Name) -> set[str] | str:
        """The names the table's statements bind (`target` and those of the lines `before`
        it); the reason when one of those lines is not a plain assignment."""
        bound = {target.value}
        for line in before:
            names = _plain_bindings(line)
            if names is None:
                return f"`{_short(self.context, line)}` is not a plain assignment"
            bound |= names
        return bound

    def _text_loop(self, call: cst.Call, loop: cst.CSTNode) -> cst.For | None:
        """The innermost `for` statement of the step `loop` around `call` that iterates the
        step's texts of a corpus."""
        return next(
            (
                inner
                for inner in self._index.enclosing_loops(call)
                if isinstance(inner, cst.For)
                and inner is not loop
                and self.context.inside(inner, loop)
                and self._tokenizers.from_corpus(inner.iter, loop)
            ),
            None,
        )

    def _tokenizes_in(self, line: cst.CSTNode) -> bool:
        return any(self._tokenizers.tokenizer_call(inner)[0] for inner in self._index.find(cst.Call, within=line))

    def _is_binding(self, name: cst.Name) -> bool:
        parent = self.context.parents.get(name)
        return isinstance(parent, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign, cst.For, cst.CompFor)) or (
            isinstance(parent, cst.NamedExpr) and parent.target is name
        )

    def _nesting(self, inner: cst.CSTNode, shown: str, call: cst.Call, loop: cst.CSTNode) -> list[cst.CSTNode] | str:
        """The `for ctx in contexts:` whose item `call` reads, the `if`s (their bodies) and the
        `else`s of `if`s between the step `loop` and the statement `inner` (`shown` in a
        message), outermost first; the reason when something else is."""
        found: list[cst.CSTNode] = []
        node = self.context.parents.get(inner)
        while node is not None and node is not loop.body:
            if isinstance(node, cst.Else):
                branch = self.context.parents.get(node)
                if not isinstance(branch, cst.If) or isinstance(self.context.parents.get(branch), cst.If):
                    return f"{shown} is in the `else` of an `elif` or of a loop"
                found.append(node)
                node = branch
            elif isinstance(node, cst.If):
                if node.orelse is not None and self.context.inside(inner, node.orelse):
                    return f"{shown} is in an `elif`"
                found.append(node)
            elif isinstance(node, cst.For):
                if node is not self.item_loop(call, loop):
                    return f"{shown} is inside another loop of the step"
                found.append(node)
            elif not isinstance(node, (cst.IndentedBlock, cst.SimpleStatementSuite)):
                return f"{shown} is inside a `{type(node).__name__}`"
            node = self.context.parents.get(node)
        return found[::-1]

    def _guard_test(self, node: cst.CSTNode) -> cst.BaseExpression | None:
        """The test of an `if` of a nesting, or of the `if` whose `else` it is; None for a loop."""
        if isinstance(node, cst.Else):
            return self.context.parents.get(node).test
        return node.test if isinstance(node, cst.If) else None

    def _nested(self, block: list[cst.BaseStatement], nesting: list[cst.CSTNode]) -> list[cst.BaseStatement]:
        """`block` inside the loops and `if`s of `nesting` (an `else` as `if not (test):`)."""
        for node in reversed(nesting):
            if isinstance(node, cst.For):
                block = [cst.For(target=node.target, iter=node.iter, body=cst.IndentedBlock(block))]
                continue
            test = self._guard_test(node)
            if isinstance(node, cst.Else):
                if not isinstance(test, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)):
                    test = test.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
                test = cst.UnaryOperation(cst.Not(), test)
            block = [cst.If(test=test, body=cst.IndentedBlock(block))]
        return block

    def _picked_chain(self, texts: cst.Name, loop: cst.CSTNode):
        """(the statements of the step that make `texts` from the texts it picks, the names
        they bind -> the names to bind over the corpus, the corpus, their assignments by id,
        the picks' assignments) when `texts` is made text by text (`[f(raw) for raw in
        batch]`, or the list itself) from `batch = [docs[i] for i in ...]`; else the reason."""
        todo, seen = [texts], set()
        assigns: dict[int, cst.Assign] = {}
        picked: set[str] = set()
        picks: list[cst.Assign] = []
        corpus: cst.Name | None = None
        while todo:
            name = todo.pop()
            for binding in self.context.kinds.reaching(name):
                if id(binding.node) in seen:
                    continue
                seen.add(id(binding.node))
                statement = self._bindings.statement(binding.node)
                value = self._bindings.assigned_value(binding)
                if not self.context.inside(binding.node, loop) or not isinstance(statement, cst.Assign):
                    return f"`{name.value}` is not made in the step from the texts it picks"
                if isinstance(value, cst.Name):
                    todo.append(value)
                elif isinstance(value, cst.ListComp) and _one_for(value):
                    source = corpus_of(value.elt)
                    if source is not None and reads_only(value.elt, value.for_in.target.value):
                        if corpus is not None and corpus.value != source.value:
                            return "the step picks its texts from more than one list"
                        corpus = source
                        picked.add(binding.name)
                        picks.append(statement)
                        continue
                    if not isinstance(value.for_in.iter, cst.Name):
                        return f"`{_short(self.context, value)}` is not made from a list of the step's texts"
                    todo.append(value.for_in.iter)
                else:
                    return f"`{binding.name}` is not made text by text from the texts the step picks"
                assigns[id(statement)] = statement
        if corpus is None:
            return f"`{texts.value}` is not made from texts the step picks from a list"
        tops: dict[int, cst.BaseStatement] = {}
        for assign in assigns.values():
            top = self._top(assign, loop)
            if not all(id(leaf) in assigns for leaf in self._assignments_in(top)):
                return f"`{_short(self.context, top)}` does more than make the step's texts"
            tops[id(top)] = top
        replayed = sorted(tops.values(), key=self._index.order)
        renamed = {name: f"{name}_all" for name in {a.targets[0].target.value for a in assigns.values()}}
        renamed.update({name: corpus.value for name in picked})
        return replayed, renamed, corpus, assigns, picks

    def _top(self, node: cst.CSTNode, loop: cst.CSTNode) -> cst.CSTNode:
        """The statement of the body of `loop` that holds `node`."""
        while self.context.parents.get(node) not in (loop.body, None):
            node = self.context.parents.get(node)
        return node

    def _assignments_in(self, top: cst.BaseStatement) -> list[cst.CSTNode]:
        """The statements of `top` (a line, or an `if` of lines), or [top] when it holds other statements."""
        if isinstance(top, cst.SimpleStatementLine):
            return list(top.body)
        if isinstance(top, cst.If):
            blocks = [top.body]
            orelse = top.orelse
            while orelse is not None:
                blocks.append(orelse.body)
                orelse = orelse.orelse if isinstance(orelse, cst.If) else None
            found = []
            for block in blocks:
                for line in block.body:
                    if not isinstance(line, cst.SimpleStatementLine):
                        return [top]
                    found.extend(line.body)
            return found
        return [top]

    def _table_varies(self, table_part, nesting, replayed, region, text_loop, bound, chain_assigns):
        """Why the table's values would not be the ones a step gets on some iteration of
        `region`: a value of the loop's statements that differs for reasons other than the text
        and the item, a test of an `if` around it or among the statements that make the
        step's texts, or their values; None when they are the same on every step."""
        exprs: list[cst.BaseExpression] = []
        for line in table_part:
            exprs += [node.test for node in self._index.find(cst.If, within=line)]
            exprs += [assign.value for assign in self._index.find(cst.Assign, within=line)]
        return self._picks_vary(exprs, {text_loop.target.value, *bound}, nesting, replayed, chain_assigns, region)

    def _picks_vary(self, exprs, names, nesting, replayed, chain_assigns, region):
        """Why `exprs` (given the text, the item and `names` bound in front of `region`), the
        tests of `nesting`, or the statements that make the step's texts from those it picks
        may differ on some iteration of `region`; None when they are the same on every step."""
        names = set(names) | {node.target.value for node in nesting if isinstance(node, cst.For)}
        tests = [self._guard_test(node) for node in nesting if not isinstance(node, cst.For)]
        reason = self._variance.of_all([*tests, *exprs], region, dict.fromkeys(names, region))
        if reason is not None:
            return reason
        for top in replayed:
            tests = [node.test for node in self._index.find(cst.If, within=top)]
            reason = self._variance.of_all(tests, region)
            if reason is not None:
                return reason
        for assign in chain_assigns.values():
            value = assign.value
            if isinstance(value, cst.ListComp):
                reason = self._variance.of(value.elt, region, {value.for_in.target.value: region})
                if reason is not None:
                    return reason
        return None

    def table_rewrite(self, plan: TextTable, name: str) -> tuple[list[cst.BaseStatement], cst.BaseExpression]:
        """What tabulating by `plan` writes in front of its region: the step's statements that
        make its texts, replayed over the corpus, and the table (`name = {}` filled by the
        loop's statements over every text, per item); and the look-up that replaces the
        tokenizer's value in the step (`name[id(ctx)][user_text]`)."""
        replayed = [_renamed(top.deep_clone(), plan.renamed) for top in plan.replayed]
        text = plan.text_loop.target
        table: cst.BaseExpression = cst.Name(name)
        if plan.items is not None:
            key = cst.Call(cst.Name("id"), [cst.Arg(plan.items.target)])
            table = cst.Subscript(table, [cst.SubscriptElement(cst.Index(key))])
        entry = cst.Subscript(table, [cst.SubscriptElement(cst.Index(text))])
        store = cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(entry)], plan.target)])
        body = [line.deep_clone() for line in plan.before] + [plan.statement.deep_clone(), store]
        texts = cst.Name(plan.renamed.get(plan.texts.value, plan.texts.value))
        block: list[cst.BaseStatement] = [cst.For(target=text, iter=texts, body=cst.IndentedBlock(body))]
        if plan.items is not None:
            block.insert(0, cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(table)], cst.Dict([]))]))
        start = cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name(name))], cst.Dict([]))])
        return [*replayed, start, *self._nested(block, plan.nesting)], entry

    def padded_table(self, call: cst.Call, loop: cst.CSTNode) -> PaddedTable | str | None:
        """How to tokenize once, before the loop, the texts of a corpus that `call`, a
        tokenizer's call of the step, tokenizes together and pads to the longest of the step
        (`tok(with_suffix, padding=True, return_tensors="pt")`, `with_suffix = [f"{t}{suffix}"
        for t in batch_texts]`): a Hugging Face tokenizer's, whose `pad` pads rows of texts
        tokenized one by one as the call pads them; keywords that tokenize each text as it is
        tokenized alone or that `pad` takes; tensors returned (lists would share the table's
        rows); of the result only fields `pad` gives read; the texts made, text by text, from
        texts the step picks (`text_table`'s conditions), with values the same on every step but
        for the item of `for ctx in contexts:` and names bound for them alone. None when `call`
        does not pad a list of the step's texts; the reason when a precondition fails."""
        batch = self._padded_batch(call, loop)
        if batch is None:
            return None
        problem = self._padded_batch_problem(call, loop, batch)
        if problem is not None:
            return problem
        receiver, element, variable, texts = batch.receiver, batch.element, batch.variable, batch.texts
        comp, texts_line, chain, given = batch.comp, batch.texts_line, batch.chain, batch.given
        line = self._index.first_enclosing(call, cst.SimpleStatementLine)
        before = self._made_with(element, variable, [comp, texts_line], line, loop)
        if isinstance(before, str):
            return before
        nesting = self._nesting(line, f"`{_short(self.context, call)}`", call, loop)
        if isinstance(nesting, str):
            return nesting
        items = next((node for node in nesting if isinstance(node, cst.For)), None)
        replayed, renamed, corpus, chain_assigns, picks = chain
        problem = self._picked_changed(texts, line, renamed, picks, loop) if picks else None
        if problem is not None:
            return problem
        if not self.context.kinds.in_memory_list(corpus):
            return f"perfmod cannot tell that `{corpus.value}` is a list held in memory"
        per_text = [arg for arg in call.args if arg.keyword and arg.keyword.value in TOKENIZER_PER_TEXT_OPTIONS]
        pads = [arg for arg in call.args if arg.keyword and arg.keyword.value in TOKENIZER_PAD_OPTIONS]
        exprs = [element, *(arg.value for arg in call.args[1:])]
        exprs += [statement.body[0].value for statement in before]
        bound = {variable.value, *(_assigned_name(statement).value for statement in before)}
        region = self._widest_region(
            loop,
            partial(self.encoder_impurity, call),
            partial(self._picks_vary, exprs, bound, nesting, replayed, chain_assigns),
            partial(self._variance.replaced, receiver, ahead=items),
            partial(self._texts_changed, corpus, items),
        )
        if isinstance(region, str):
            return region
        return PaddedTable(
            call,
            receiver,
            element,
            variable,
            texts,
            given if texts is None else None,
            texts_line,
            before,
            per_text,
            pads,
            replayed,
            renamed,
            nesting,
            items,
            corpus,
            region,
        )

    def _padded_batch(self, call: cst.Call, loop: cst.CSTNode) -> _PaddedBatch | None:
        """The list of the step's texts that `call`, a tokenizer's call padding to the longest,
        tokenizes: picked in the call, picked by the step, or made text by text from texts the
        step picks; None when it is none of these."""
        padding = kwarg(call, TOKENIZER_PADDING)
        positional = [arg for arg in call.args if arg.keyword is None]
        _, receiver = self._tokenizers.tokenizer_call(call)
        if padding is None or self.context.source(padding.value) not in TOKENIZER_PAD_LONGEST:
            return None
        if receiver is not call.func or len(positional) != 1 or positional[0].star:
            return None
        given = positional[0].value
        picked = self._picked_chain(given, loop) if isinstance(given, cst.Name) else None
        inline = (
            isinstance(given, cst.ListComp) and _one_for(given) and reads_only(given.elt, given.for_in.target.value)
        )
        taken = {n.value for part in call_parts(call) for n in names_read(part)}
        variable = cst.Name(next(n for n in ("text", "text_", "text__") if n not in taken))
        if inline and corpus_of(given.elt) is not None:
            # the texts picked in the call (`tok([docs[i] for i in idx], ...)`), each tokenized as it is
            chain = ([], {}, corpus_of(given.elt), {}, [])
            return _PaddedBatch(receiver, given, variable, variable, None, None, None, chain)
        if isinstance(picked, tuple) and not picked[0]:
            # the texts the step picks themselves (`batch = [docs[i] for i in idx]`), each tokenized as it is
            return _PaddedBatch(receiver, given, variable, variable, given, None, None, picked)
        found = self._texts_comp(given, loop)
        if found is None:
            return None
        comp, texts_line = found
        if not _one_for(comp) or not self._tokenizers.from_corpus(comp.for_in.iter, loop):
            return None
        chain = self._picked_chain(comp.for_in.iter, loop)
        if isinstance(chain, str):
            return None  # texts the step does not pick from a list: no table of them to make
        return _PaddedBatch(receiver, given, comp.elt, comp.for_in.target, comp.for_in.iter, comp, texts_line, chain)

    def _padded_batch_problem(self, call: cst.Call, loop: cst.CSTNode, batch: _PaddedBatch) -> str | None:
        """Why the padded `batch` cannot be padded again from rows tokenized one by one: not a
        Hugging Face tokenizer, the list used elsewhere, keywords `pad` does not take."""
        if self._tokenizers.library(batch.receiver) not in TOKENIZER_PAD_LIBRARIES:
            return (
                f"`{self.context.source(batch.receiver)}` is not known to be a Hugging Face tokenizer, whose `pad` pads "
                "texts tokenized one by one as its call pads them together"
            )
        if batch.comp is not None and batch.texts_line is None and isinstance(batch.given, cst.Name):
            return f"`{batch.given.value}`, the list of texts, is used elsewhere too"
        return self._padding_problem(call, loop)

    def _texts_comp(self, texts: cst.BaseExpression, loop: cst.CSTNode):
        """(comp, line): the comprehension of the texts a call tokenizes together, given as
        written (line None) or by a name the step binds to it once, on its own `line`, and
        reads nowhere else; (comp, None) for a name read elsewhere too; None otherwise."""
        if isinstance(texts, cst.ListComp):
            return texts, None
        if not isinstance(texts, cst.Name):
            return None
        reaching = self.context.kinds.reaching(texts)
        if len(reaching) != 1 or not self.context.inside(reaching[0].node, loop):
            return None
        comp = self._bindings.assigned_value(reaching[0])
        line = self.context.parents.get(self._bindings.statement(reaching[0].node))
        if not isinstance(comp, cst.ListComp) or _assigned_name(line) is None:
            return None
        function = self._index.first_enclosing(loop, cst.FunctionDef) or self.context.module
        uses = [node for node in self._variance.names_in(function, texts.value) if not self.context.inside(node, line)]
        return comp, (line if uses == [texts] else None)

    def _padding_problem(self, call: cst.Call, loop: cst.CSTNode) -> str | None:
        """Why `pad` of the rows of each text tokenized alone may not give what `call` gives:
        a keyword perfmod does not know to act text by text, lists returned, a field of the
        result that `pad` does not give read, or the result used whole."""
        for arg in call.args[1:]:
            if arg.star or arg.keyword is None:
                return f"`{_short(self.context, arg)}` is not a keyword perfmod knows"
            if arg.keyword.value not in TOKENIZER_PER_TEXT_OPTIONS | TOKENIZER_PAD_OPTIONS:
                return f"perfmod does not know that `{arg.keyword.value}=` tokenizes each text as it is tokenized alone"
        if kwarg(call, RETURN_TENSORS) is None:
            return "the ids are lists, and `pad` hands back rows that need no padding as they are: the table's own"
        function = self._index.first_enclosing(loop, cst.FunctionDef) or self.context.module
        parent = self.context.parents.get(call)
        uses = [call]
        if (
            isinstance(parent, cst.Assign)
            and len(parent.targets) == 1
            and isinstance(parent.targets[0].target, cst.Name)
        ):
            uses = [
                node
                for node in self._variance.names_in(function, parent.targets[0].target.value)
                if not self._is_binding(node)
                and any(self._bindings.statement(b.node) is parent for b in self.context.kinds.reaching(node))
            ]
        for use in uses:
            field = _field(self.context.parents.get(use), use)
            if field is None:
                return f"the tokenizer's result is used whole (line {self.context.line(use)}), not only its ids"
            if field not in TOKENIZER_PAD_FIELDS:
                return f"`{field}` of the tokenizer's result is read (line {self.context.line(use)}), which `pad` does not give"
        return None

    def _made_with(self, element, variable: cst.Name, makers, line, loop: cst.CSTNode):
        """The lines of the step, in the block of `line` and before it, that bind the names
        `element` makes each text `variable` with (`suffix = ...` for `f"{t}{suffix}"`), in
        order, each a plain assignment bound once in the step and read only there or in
        `makers` (the comprehension of the texts and its line); the reason otherwise."""
        block = self.context.parents.get(line)
        found: dict[int, cst.SimpleStatementLine] = {}
        todo = [n for n in names_read(element) if n.value != variable.value]
        while todo:
            name = todo.pop()
            inside = [b for b in self.context.kinds.reaching(name) if self.context.inside(b.node, loop)]
            if not inside or isinstance(self._bindings.statement(inside[0].node), cst.For):
                continue  # bound before the step, or the item of `for ctx in contexts:`: `variance`'s to judge
            statement = self.context.parents.get(self._bindings.statement(inside[0].node))
            if (
                len(inside) != 1
                or _assigned_name(statement) is None
                or self.context.parents.get(statement) is not block
                or self._index.order(statement) > self._index.order(line)
            ):
                return f"`{name.value}`, which the texts are made with, is not bound once by a line of their block"
            if id(statement) not in found:
                found[id(statement)] = statement
                todo += names_read(statement.body[0].value)
        kept = [*found.values(), *(maker for maker in makers if maker is not None)]
        function = self._index.first_enclosing(loop, cst.FunctionDef) or self.context.module
        for statement in found.values():
            bound = _assigned_name(statement).value
            for node in self._variance.names_in(function, bound):
                if not any(self.context.inside(node, part) for part in kept):
                    return f"`{bound}`, which the texts are made with, is used elsewhere too (line {self.context.line(node)})"
        return sorted(found.values(), key=self._index.order)

    def padded_rewrite(self, plan: PaddedTable, name: str) -> tuple[list[cst.BaseStatement], cst.Call]:
        """What tabulating by `plan` writes in front of its region: the step's statements that
        make its texts, replayed over the corpus, and the table of each text's unpadded ids
        (`name = {text: tok(<text>, padding=False, ...)["input_ids"] for text in docs}`, per
        item); and the call that pads the step's rows instead of tokenizing its texts."""
        text = plan.variable
        table: cst.BaseExpression = cst.Name(name)
        if plan.items is not None:
            table = cst.Subscript(
                table, [cst.SubscriptElement(cst.Index(cst.Call(cst.Name("id"), [cst.Arg(plan.items.target)])))]
            )
        unpadded = plan.call.with_changes(args=[cst.Arg(plan.element), *_keywords([*plan.per_text, _UNPADDED])])
        ids_key = cst.SimpleString(f'"{TOKENIZER_IDS}"')
        ids = cst.Subscript(unpadded, [cst.SubscriptElement(cst.Index(ids_key))])
        if plan.picked is not None:  # `[docs_ids_by_text[docs[i]] for i in idx]`
            texts = plan.corpus
            rows = plan.picked.with_changes(
                elt=cst.Subscript(table, [cst.SubscriptElement(cst.Index(plan.picked.elt))])
            )
        else:  # `[docs_ids_by_text[text] for text in batch]`
            texts = cst.Name(plan.renamed.get(plan.texts.value, plan.texts.value))
            row = cst.Subscript(table, [cst.SubscriptElement(cst.Index(text))])
            rows = cst.ListComp(row, cst.CompFor(target=text, iter=plan.texts))
        every_text = cst.DictComp(text, ids, cst.CompFor(target=text, iter=texts))
        fill = cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(table)], every_text)])
        block = [*(line.deep_clone() for line in plan.before), fill]
        replayed = [_renamed(top.deep_clone(), plan.renamed) for top in plan.replayed]
        # an empty table first where the table is filled per item or under an `if`
        start = [cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name(name))], cst.Dict([]))])]
        padded = cst.Call(
            cst.Attribute(plan.receiver, cst.Name("pad")),
            [
                cst.Arg(cst.Dict([cst.DictElement(ids_key, rows)])),
                *_keywords(plan.padding),
            ],
        )
        return [*replayed, *(start if plan.nesting else []), *self._nested(block, plan.nesting)], padded

    def not_pretokenized(self, call: cst.Call, loop: cst.CSTNode) -> list[str]:
        """What keeps the texts of a corpus that `call`, a known tokenizer's call of the step
        loop `loop`, tokenizes from being tokenized once before it: why the loop of the step
        over its texts that `call` is in cannot be tabulated (`text_table`), the step's texts
        handed to the tokenizer together and padded, and the functions of other modules the
        texts pass through (`split_user_and_anchor(raw)`) that are not pure."""
        found: list[str] = []
        text_loop = self._text_loop(call, loop)
        table = self.text_table(call, loop) if text_loop is not None else None
        if isinstance(table, str):
            found.append(
                f"the step tokenizes its texts one at a time in the statements of `for "
                f"{_short(self.context, text_loop.target)} in {_short(self.context, text_loop.iter)}:`, "
                f"which perfmod cannot tabulate ahead: {table}"
            )
        batch = next((a.value for a in call.args if self._step_texts(a.value, loop)), None)
        if batch is not None:
            padding = kwarg(call, TOKENIZER_PADDING)
            spelled = self.context.source(padding.value) if padding is not None else "False"
            table = self.padded_table(call, loop) if spelled in TOKENIZER_PAD_LONGEST else None
            if spelled in TOKENIZER_NO_PADDING:
                how = ", where the corpus is tokenized one text per call"
            elif isinstance(table, str):
                how = f", padded to the longest of the step (`padding={spelled}`): {table}"
            else:
                longest = " to the longest of the step" if spelled in TOKENIZER_PAD_LONGEST else ""
                how = (
                    f", padded{longest} (`padding={spelled}`): tokenized once, one by one, they would have to be padded "
                    "again on every step by the tokenizer's `pad`, which perfmod writes only for a list of the step's "
                    "texts, or one made from them text by text, padded to the longest"
                )
            found.append(f"the step's texts go to the tokenizer together (`{_short(self.context, batch)}`){how}")
        project = project_of(self.context)
        for made in self._text_calls([a.value for a in call.args], loop):
            function = project.function(made.func)
            if function is not None and not self.context.purity.pure_callee(made):
                found.append(
                    f"the texts pass through `{self.context.source(made.func)}` "
                    f"({project.shown(function)}), a function of another module that is not known to be pure "
                    "(it changes state, draws random numbers or calls what perfmod cannot follow)"
                )
        return found

    def _step_texts(self, expr: cst.BaseExpression, loop: cst.CSTNode) -> bool:
        """Is `expr` a list of the step's texts of a corpus (a comprehension over them, or a
        name the step binds to one), not one text?"""
        if isinstance(expr, cst.Name):
            reaching = self.context.kinds.reaching(expr)
            if len(reaching) != 1 or not self.context.inside(reaching[0].node, loop):
                return False
            expr = self._bindings.assigned_value(reaching[0])
        return isinstance(expr, (cst.ListComp, cst.GeneratorExp)) and self._tokenizers.from_corpus(expr, loop)

    def _text_calls(self, exprs: list[cst.BaseExpression], loop: cst.CSTNode) -> list[cst.Call]:
        """The calls of the step that the values of `exprs` are computed by, followed through
        the names of the step that reach them (assigned, or iterated by a `for`)."""
        calls: dict[int, cst.Call] = {}
        todo, seen = list(exprs), set()
        while todo and len(seen) < 40:
            expr = todo.pop()
            if id(expr) in seen:
                continue
            seen.add(id(expr))
            for made in self._index.find(cst.Call, within=expr):
                calls.setdefault(id(made), made)
            for name in names_read(expr):
                for binding in self.context.kinds.reaching(name):
                    if not self.context.inside(binding.node, loop):
                        continue
                    value = self._bindings.assigned_value(binding)
                    statement = self._bindings.statement(binding.node)
                    if value is None and isinstance(statement, (cst.For, cst.CompFor)):
                        value = statement.iter
                    if value is not None:
                        todo.append(value)
        return sorted(calls.values(), key=self._index.order)

    def tokenizes_step_text(self, call: cst.Call, loop: cst.CSTNode) -> bool:
        """Does `call` tokenize text the step makes or sets, and none a corpus holds?"""
        args = [arg.value for arg in call.args]
        return (
            self._variance.of_all(args, loop) is not None
            and not any(self._tokenizers.from_corpus(arg, loop) for arg in args)
            and any(self._tokenizers.made_in_step(arg, loop) or self._set_in_step(arg, loop) for arg in args)
        )

    def _set_in_step(self, expr: cst.BaseExpression, loop: cst.CSTNode) -> bool:
        """Is `expr` an attribute or item the step assigns or changes in place
        (`setattr(cfg.data, "prompt", p)`, `cfg["data"].update(suffix=s)`): a setting the
        training changes as it goes, not a text to tokenize once?"""
        variance = self._variance
        if isinstance(expr, cst.Attribute):
            return variance.attribute_assigned(expr, loop) or variance.changed_through(expr, loop)
        return isinstance(expr, cst.Subscript) and variance.changed_through(expr.value, loop)


def _assigned_name(line: cst.CSTNode | None) -> cst.Name | None:
    """`name` of a line that is `name = value` and nothing else."""
    if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
        return None
    assign = line.body[0]
    if isinstance(assign, cst.Assign) and len(assign.targets) == 1 and isinstance(assign.targets[0].target, cst.Name):
        return assign.targets[0].target
    return None


def _plain_bindings(line: cst.CSTNode) -> set[str] | None:
    """The names a line of `name = value` binds, or an `if` (no `else`) of such lines;
    None for any other statement."""
    if isinstance(line, cst.If) and line.orelse is None and isinstance(line.body, cst.IndentedBlock):
        found: set[str] = set()
        for inner in line.body.body:
            names = _plain_bindings(inner)
            if names is None:
                return None
            found |= names
        return found
    name = _assigned_name(line)
    return {name.value} if name is not None else None


def _read_before_bound(lines: tuple[cst.CSTNode, ...], bound: set[str]) -> str | None:
    """A name of `bound` that a line of `lines` may read before a line above binds it on
    every path (a name bound only under an `if`, or by the line that reads it, may hold
    what the previous text left); None when each is bound first by a plain assignment."""
    defined: set[str] = set()
    for line in lines:
        reads = {name.value for name in names_read(line)} & bound
        if isinstance(line, cst.If):
            if reads - defined:
                return min(reads - defined)
            continue
        name = _assigned_name(line)
        if reads - defined:
            return min(reads - defined)
        defined.add(name.value)
    return None


# `padding=False`: each text of the corpus tokenized alone, unpadded.
_UNPADDED = cst.Arg(
    cst.Name("False"),
    keyword=cst.Name(TOKENIZER_PADDING),
    equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")),
)


def _keywords(args: list[cst.Arg]) -> list[cst.Arg]:
    """Keyword arguments as written, for a new call (their commas and line breaks placed anew)."""
    return [
        arg.with_changes(comma=cst.MaybeSentinel.DEFAULT, whitespace_after_arg=cst.SimpleWhitespace("")) for arg in args
    ]


def _field(parent: cst.CSTNode | None, use: cst.CSTNode) -> str | None:
    """The field `use[...]` or `use.<field>` reads of a tokenizer's result, or None."""
    if isinstance(parent, cst.Subscript) and parent.value is use and len(parent.slice) == 1:
        key = parent.slice[0].slice
        if isinstance(key, cst.Index) and isinstance(key.value, cst.SimpleString):
            return key.value.evaluated_value
    if isinstance(parent, cst.Attribute) and parent.value is use:
        return parent.attr.value
    return None


def _one_for(comp: cst.ListComp) -> bool:
    """`[f(x) for x in xs]`: one `for` over a name, no `if`."""
    loop = comp.for_in
    return loop.inner_for_in is None and not loop.ifs and not loop.asynchronous and isinstance(loop.target, cst.Name)


class _Rename(cst.CSTTransformer):
    """Names read or bound renamed (not attribute names, not keywords)."""

    def __init__(self, names: dict[str, str]) -> None:
        super().__init__()
        self.names = names

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.Name:
        return updated.with_changes(value=self.names.get(updated.value, updated.value))

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.Attribute:
        return updated.with_changes(attr=original.attr)

    def leave_Arg(self, original: cst.Arg, updated: cst.Arg) -> cst.Arg:
        return updated.with_changes(keyword=original.keyword)


def _renamed(node: cst.CSTNode, names: dict[str, str]) -> cst.CSTNode:
    return node.visit(_Rename(names))


def _short(context: FileContext, node: cst.CSTNode) -> str:
    code = " ".join(context.source(node).split())
    return code if len(code) <= 60 else code[:57] + "..."
