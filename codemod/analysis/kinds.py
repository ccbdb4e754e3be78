"""`Kinds` (what an expression holds) is part of the one value analysis,
`codemod.analysis.values`; its names are importable from here too."""

from codemod.analysis.values import *  # noqa: F403
