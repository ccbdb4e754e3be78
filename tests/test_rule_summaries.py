"""Rule summaries, as `perfmod rules` and the docs index show them: whole
sentences, never cut (the first paragraph of a rule's docs may stop at an
example in mid-sentence)."""

from codemod.docs import summary


def test_every_summary_of_the_real_catalogue_ends_a_sentence():
    from codemod import rules

    for rule in rules.ALL_RULES:
        text = summary(rule)
        assert text.endswith((".", ".)", ".`")), (rule.CODE, text)
        assert "\n" not in text and text == " ".join(text.split())


def test_the_summary_continues_past_an_example_that_interrupts_a_sentence():
    from codemod.rule import Rule

    class Example(Rule):
        """## What it does
        Finds a loop over the samples of a batch,

            for i in range(n):
                step(x[i])

        and replaces it with one call. Then more text.

        ## Why is this bad?
        """

    class Colon(Rule):
        """## What it does
        Wraps the forward pass in autocast:

        ```python
        with autocast():
            ...
        ```
        """

    assert summary(Example) == "Finds a loop over the samples of a batch, and replaces it with one call."
    assert summary(Colon) == "Wraps the forward pass in autocast."
