"""`.gitignore` files, read as git reads them (gitignore(5)), without git.

    ignored = Gitignore.for_walk(folder)          # the files of folder and its parents up to the repository root
    ignored = ignored.entering(subfolder)         # adds subfolder/.gitignore
    ignored.match(path, is_dir)                   # True: ignored

Patterns: `#` comments, `!` negation, a trailing `/` for folders only, a `/`
at the start or in the middle anchors the pattern to the file's folder,
`*`, `?`, `[...]`, `**` (leading, trailing, or between slashes). The last
matching pattern wins, and a deeper file's patterns come after its parents'.
`.git/info/exclude` of the repository is read too. A file inside an ignored
folder is never looked at again, as in git: the walk does not enter it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import NamedTuple


class Pattern(NamedTuple):
    base: str  # absolute folder of the file the pattern comes from, as a posix string
    regex: re.Pattern
    negated: bool
    folders_only: bool

    def match(self, path: str, is_dir: bool) -> bool:
        if self.folders_only and not is_dir:
            return False
        if not path.startswith(self.base + "/"):
            return False
        return self.regex.fullmatch(path[len(self.base) + 1 :]) is not None


def parse_line(line: str, base: str) -> Pattern | None:
    """One line of a .gitignore file in folder `base`; None for blanks and comments."""
    line = line.rstrip("\n").rstrip("\r")
    if not line or line.startswith("#"):
        return None
    line = _strip_trailing_spaces(line)
    negated = line.startswith("!")
    if negated:
        line = line[1:]
    elif line.startswith("\\!") or line.startswith("\\#"):
        line = line[1:]
    folders_only = line.endswith("/") and not line.endswith("\\/")
    line = line.rstrip("/") if folders_only else line
    if not line:
        return None
    anchored = "/" in line
    line = line.lstrip("/")
    body = _translate(line)
    regex = body if anchored else f"(?:.*/)?{body}"
    return Pattern(base, re.compile(regex, re.S), negated, folders_only)


def _strip_trailing_spaces(line: str) -> str:
    """Trailing spaces go unless escaped with a backslash."""
    stripped = line.rstrip(" ")
    if stripped.endswith("\\") and len(stripped) < len(line):
        return stripped[:-1] + " "
    return stripped


def _translate(pattern: str) -> str:
    """A gitignore glob (without its anchoring slash) as a regular expression."""
    out, i, n = [], 0, len(pattern)
    while i < n:
        if pattern.startswith("**/", i) and (i == 0 or pattern[i - 1] == "/"):
            out.append("(?:.*/)?")  # zero or more folders
            i += 3
        elif pattern.startswith("/**", i) and i + 3 == n:
            out.append("/.*")  # everything inside
            i += 3
        elif pattern.startswith("**", i) and i + 2 == n and (i == 0 or pattern[i - 1] == "/"):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[":
            end = pattern.find("]", i + 2 if pattern[i + 1 : i + 2] in ("!", "^") else i + 1)
            if end == -1:
                out.append(re.escape("["))
                i += 1
                continue
            body = pattern[i + 1 : end]
            if body[:1] in ("!", "^"):
                body = "^" + body[1:]
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = end + 1
        elif pattern[i] == "\\" and i + 1 < n:
            out.append(re.escape(pattern[i + 1]))
            i += 2
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return "".join(out)


def read_patterns(file: Path, base: Path) -> list[Pattern]:
    try:
        text = file.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    base_text = base.absolute().as_posix().rstrip("/")
    return [p for p in (parse_line(line, base_text) for line in text.splitlines()) if p is not None]


def repository_root(folder: Path) -> Path | None:
    """The nearest folder at or above `folder` with a `.git` (a folder, or a file for worktrees)."""
    folder = folder.absolute()
    for candidate in [folder, *folder.parents]:
        if (candidate / ".git").exists():
            return candidate
    return None


class Gitignore(NamedTuple):
    patterns: tuple[Pattern, ...] = ()

    @classmethod
    def for_walk(cls, folder: Path) -> Gitignore:
        """The patterns that apply in `folder`: the repository's info/exclude and
        every .gitignore from the repository root down to `folder` (outside a
        repository, `folder`'s own)."""
        folder = Path(os.path.abspath(folder))
        root = repository_root(folder)
        patterns: list[Pattern] = []
        if root is None:
            chain = [folder]
        else:
            git = root / ".git"
            if git.is_dir():
                patterns += read_patterns(git / "info" / "exclude", root)
            chain = [root, *reversed([p for p in folder.parents if root in p.parents])]
            chain += [folder] if folder != root else []
        for directory in chain:
            patterns += read_patterns(directory / ".gitignore", directory)
        return cls(tuple(patterns))

    def entering(self, folder: Path) -> Gitignore:
        """These patterns and those of `folder`/.gitignore, for the walk below it."""
        added = read_patterns(folder / ".gitignore", folder)
        return Gitignore(self.patterns + tuple(added)) if added else self

    def match(self, path: Path, is_dir: bool) -> bool:
        text = Path(os.path.abspath(path)).as_posix()
        for pattern in reversed(self.patterns):
            if pattern.match(text, is_dir):
                return not pattern.negated
        return False
