"""The project's Markdown pages as the tests read them: one named file (README.md, or a page of
docs/), whole or one section of it; never a walk of the tree."""
import os
import re

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
