"""The project's Markdown pages as the tests read them: one named file (README.md, or a page of
docs/), whole or one section of it, its shell commands and its Python blocks in order; never a walk
of the tree (the pages are those git tracks)."""
import os
import re
import shlex
from typing import NamedTuple

from project_files import tracked_files

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADING = re.compile(r"(#{1,6}) ")


def docs_text(page, section=None):
    """The text of `page` ("README.md", or "predict.md" for docs/predict.md), or, with `section`, of
    its section whose heading starts with `section`: from that heading to the next heading of the
    same or a higher level (a `#` line inside a code block is not a heading)."""
    path = os.path.join(ROOT, page if page == "README.md" or "/" in page else os.path.join("docs", page))
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if section is None:
        return text
    lines, level, out, fenced = text.splitlines(keepends=True), None, [], False
    for line in lines:
        if line.startswith("```"):
            fenced = not fenced
        heading = None if fenced else HEADING.match(line)
        if level is None:
            if heading and line[heading.end():].startswith(section):
                level = len(heading.group(1))
                out.append(line)
            continue
        if heading and len(heading.group(1)) <= level:
            break
        out.append(line)
    if level is None:
        raise AssertionError(f"{path} has no section headed {section!r}")
    return "".join(out)


FENCED_BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
# a table cell that is one command, e.g. README.md's "Using it": | to | `python train.py ...` | more |
TABLE_COMMAND = re.compile(r"(?<=\| )`((?:python|accelerate launch|make) [^`]*)`(?= \|)")
SHELL_VARIABLE = re.compile(r"\$\{?([A-Za-z_]\w*)\}?")
ASSIGNMENT = re.compile(r"[A-Za-z_]\w*=")
LOOP = re.compile(r"for (\w+) in ([^;]*); do\b")


def command_lines(page, section=None):
    """The shell lines a reader of `page` (or of its `section`) pastes, in the page's order: the lines
    of its ```bash blocks (continuations joined) and the commands standing alone in a table cell."""
    text, out = docs_text(page, section), []
    spans = [(m.start(), m.group(2).replace("\\\n", " ").splitlines()) for m in FENCED_BLOCK.finditer(text)
             if m.group(1) in ("bash", "sh", "shell")]
    fenced = [(m.start(), m.end()) for m in FENCED_BLOCK.finditer(text)]
    spans += [(m.start(), [m.group(1)]) for m in TABLE_COMMAND.finditer(text)
              if not any(a <= m.start() < b for a, b in fenced)]
    for _, lines in sorted(spans):
        out += [line for line in lines if line.strip() and not line.lstrip().startswith("#")]
    return out


PYTHON_TAGS = ("python", "py")


def pages():
    """The pages the tests read: README.md and the tracked docs/*.md, as git lists them."""
    return ["README.md"] + [p for p in tracked_files() if re.fullmatch(r"docs/[^/]+\.md", p)]


def python_blocks(page):
    """[(line, code)]: the ```python blocks of `page`, in the page's order; `line` is the page's line
    number (from 1) of the block's opening fence, so its code starts on line + 1."""
    text = docs_text(page)
    return [(text.count("\n", 0, m.start()) + 1, m.group(2)) for m in FENCED_BLOCK.finditer(text)
            if m.group(1) in PYTHON_TAGS]


def prose(page):
    """The text of `page` a reader is told things in: without its code blocks and command cells."""
    return TABLE_COMMAND.sub("", FENCED_BLOCK.sub("", docs_text(page)))


def shell_commands(lines):
    """[(line, argv)]: each command of `lines` as the shell runs it, in order: NAME=value lines set
    variables that later lines expand ($NAME, "$NAME", ${NAME}; word splitting as bash's), a `for`
    loop's body runs once with the variable at its first value, comments, `done`, `wait`, redirections
    and a trailing `&` are dropped. Enough for the docs' blocks, not a shell."""
    variables, out = {}, []
    for line in lines:
        expanded = SHELL_VARIABLE.sub(lambda m: variables.get(m.group(1), m.group(0)), line)
        loop = LOOP.match(expanded.strip())
        if loop:
            variables[loop.group(1)] = loop.group(2).split()[0]
            continue
        argv = shlex.split(expanded, comments=True)
        if argv and all(ASSIGNMENT.match(a) for a in argv):
            variables.update(a.split("=", 1) for a in argv)
            continue
        words, skip = [], False
        for word in argv:
            if skip:
                skip = False
            elif word in (">", ">>", "<"):
                skip = True
            elif word not in ("&", "2>&1") and not word.startswith(("2>", ">")):
                words.append(word)
        if words and words not in (["done"], ["wait"]):
            out.append((line.strip(), words))
    return out


# ---- how the prose reads: its sentences and their lengths (tests/test_docs_prose.py) ---------------------
# The prose is the pages' paragraphs: headings, tables, list items (with their continuation lines), code
# blocks and HTML comments (the generated blocks' markers) are left out ("details go into lists and
# tables"). An inline code span counts as one word, whatever it holds; a link counts as its text.
FENCE = re.compile(r"\s*(```|~~~)")
LIST_ITEM = re.compile(r"\s*(?:[-+*]|\d{1,9}[.)])(?:\s|$)")
HTML_COMMENT = re.compile(r"<!--.*?-->", re.S)
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
IMAGE = re.compile(r"!\[[^\]]*\]\([^)]*\)")
LINK = re.compile(r"\[([^\]]*)\](?:\([^)]*\)|\[[^\]]*\])")
CODE_MARK = "\0"  # a code span while the sentences are split: \0<its index>\0, one word
LINK_JOIN = "\1"  # between a link's words while the sentences are split
# a word ending in one of these never ends a sentence (compared in lower case); "etc." does before a capital
ABBREVIATIONS = frozenset({"e.g.", "i.e.", "vs.", "al.", "cf.", "approx.", "ca.", "resp.", "fig.", "eq.", "no.",
                           "p.", "pp.", "dr.", "mr.", "ms.", "st."})
SOFT_ABBREVIATIONS = frozenset({"etc."})
SENTENCE_END = re.compile(r"(?<!\.)[.!?][)\]\"'”’*_]*$")  # not an ellipsis ("epochs=...")
SENTENCE_START = re.compile(rf"[\"'“‘(\[*_]*[A-Z0-9{CODE_MARK}]")
INITIAL = re.compile(r"[(\[*_]*[A-Z]\.$")  # "A. Martins": an initial, not a sentence end


def prose_paragraphs(text):
    """The paragraphs of a Markdown text that are prose, each joined into one line: without its headings,
    tables, list items (and the lines that continue them), code blocks, indented blocks and HTML comments;
    a quote's '>' is dropped."""
    out, current, kind, fenced = [], [], None, False

    def close():
        if kind == "prose" and current:
            out.append(" ".join(current))
        current.clear()

    for line in HTML_COMMENT.sub("", text).splitlines():
        if FENCE.match(line):
            fenced = not fenced
            close()
            kind = None
            continue
        if fenced:
            continue
        if not line.strip() or HEADING.match(line):
            close()
            kind = None
            continue
        if line.lstrip().startswith("|"):
            new = "table"
        elif LIST_ITEM.match(line):
            new = "list"
        elif kind in (None, "table"):
            new = "indented" if line[0].isspace() else "prose"  # after a blank line, indented: a list's, or code
        else:
            new = kind  # a line continuing its paragraph or list item
        if new != kind or new != "prose":
            close()
        kind = new
        if kind == "prose":
            current.append(line.strip().removeprefix(">").strip())
    close()
    return out


def split_sentences(paragraph):
    """The sentences of one prose paragraph, as lists of words (whitespace-separated; a code span is one
    word, a link its text, inside which no sentence ends). A sentence ends at a word ending in . ! or ?
    (closing quotes, brackets and emphasis after it allowed; not an ellipsis), unless that word is an
    abbreviation (ABBREVIATIONS; "etc." only before a capital, a digit or a code span) or an initial:
    "e.g. Sparsemax", "Campos et al. 2025", 0.5, config.yaml, torch 2.4.1 and URLs do not split;
    "eval.py writes it. compare_heads.py reads it" does (a sentence may open with a lower-case name).
    The paragraph's end ends a sentence."""
    spans = []

    def code(match):
        spans.append(match.group(0))
        return f"{CODE_MARK}{len(spans) - 1}{CODE_MARK}"

    def link(match):  # its words, joined so that no sentence ends inside it
        return LINK_JOIN.join(match.group(1).split())

    text = LINK.sub(link, IMAGE.sub(" ", CODE_SPAN.sub(code, paragraph)))
    words = [(w, i == len(ws) - 1) for token in text.split() for ws in [token.split(LINK_JOIN)]
             for i, w in enumerate(ws) if any(c.isalnum() for c in w)]  # not a lone dash, ± or *
    sentences, current = [], []
    for (word, may_end), following in zip(words, [w for w, _ in words[1:]] + [None]):
        current.append(word)
        bare = word.lstrip("(\"'“‘*_").rstrip(")]\"'”’*_").lower()
        if following is not None and may_end and SENTENCE_END.search(word) and bare not in ABBREVIATIONS \
                and not INITIAL.match(word) and (bare not in SOFT_ABBREVIATIONS or SENTENCE_START.match(following)):
            sentences.append(current)
            current = []
    if current:
        sentences.append(current)
    restore = re.compile(rf"{CODE_MARK}(\d+){CODE_MARK}")
    return [[restore.sub(lambda m: spans[int(m.group(1))], w) for w in s] for s in sentences]


OPENING_WORDS = 8  # how much of a sentence the table and the test's message quote


class ProseStats(NamedTuple):
    """How a page's prose reads: its words, its sentences, their mean length in words, and its longest
    sentence (its words, its opening words)."""
    page: str
    words: int
    sentences: int
    mean: float
    longest: int
    opening: str


def measure_prose(text, page=""):
    """ProseStats of a Markdown text (prose_paragraphs, split_sentences)."""
    sentences = [s for p in prose_paragraphs(text) for s in split_sentences(p)]
    words = sum(map(len, sentences))
    longest = max(sentences, key=len, default=[])
    opening = " ".join(longest[:OPENING_WORDS]) + (" ..." if len(longest) > OPENING_WORDS else "")
    return ProseStats(page, words, len(sentences), words / len(sentences) if sentences else 0.0, len(longest),
                      opening)


def prose_stats(page):
    """ProseStats of one page (as pages() names it)."""
    return measure_prose(docs_text(page), page)


def prose_table(stats):
    """The ProseStats as an aligned text table, one page a line."""
    rows = [("page", "words", "sentences", "mean", "longest", "the longest opens with")]
    rows += [(s.page, str(s.words), str(s.sentences), f"{s.mean:.1f}", str(s.longest), s.opening) for s in stats]
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    return "\n".join("  ".join([r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:5], widths[1:])] + [r[5]])
                     for r in rows)


def print_prose_table():
    """Print how every page's prose reads (python tests/markdown_docs.py --prose-table)."""
    print(prose_table([prose_stats(page) for page in pages()]))


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["--prose-table"]:
        sys.exit("usage: python tests/markdown_docs.py --prose-table  (how every page's prose reads)")
    print_prose_table()
