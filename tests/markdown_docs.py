"""The project's Markdown pages as the tests read them: one named file (README.md, or a page of
docs/), whole or one section of it, its shell commands and its Python blocks in order; never a walk
of the tree (the pages are those git tracks)."""
import os
import re
import shlex

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
