"""The quick start's numbers in README.md and docs/quickstart.md are what the current code computes from
the recorded quick start (scripts/readme_numbers.py: the report rebuilt from docs/quickstart_record by
compare_heads' --report-only path): a number typed by hand, or code whose numbers changed, fails here."""
import json
import os
import shutil

import pytest

from common.cli import run_cli
from common.errors import UserError
from comparison.report import readme_numbers as rn
from project_files import ROOT, tracked_files

RECORD = os.path.join(ROOT, rn.RECORD_DIR)


@pytest.fixture(scope="module")
def blocks():
    """The blocks the current code makes of the committed record (one report rebuild: a few seconds)."""
    return rn.generate(RECORD)


def record_files():
    """The record's files, relative to it: recorded.json and each planned run's RUN_FILES."""
    return [rn.RECORD_INFO] + [os.path.join(name, f) for name in rn.run_names() for f in rn.RUN_FILES]


def copy_files(src, dst, files):
    for rel in files:
        os.makedirs(os.path.dirname(os.path.join(dst, rel)), exist_ok=True)
        shutil.copyfile(os.path.join(src, rel), os.path.join(dst, rel))


def errors_of(capsys):
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]


def exit_code(argv):
    with pytest.raises(SystemExit) as exited:
        run_cli(rn.main, argv)
    return exited.value.code


def test_the_record_is_committed_small_and_only_what_the_report_reads():
    """Every clone can check the pages: the record is tracked, and holds no weights."""
    tracked = {p for p in tracked_files() if p.startswith(rn.RECORD_DIR + "/")}
    assert tracked == {f"{rn.RECORD_DIR}/{rel}" for rel in record_files()}
    assert sum(os.path.getsize(os.path.join(ROOT, p)) for p in tracked) < 1_000_000
    with open(os.path.join(RECORD, rn.RECORD_INFO)) as f:
        info = json.load(f)
    assert info["cpu"] and info["torch"] and info["python"]  # the pages say where the numbers come from


def test_the_record_is_of_the_comparison_make_quickstart_runs():
    with open(os.path.join(ROOT, "Makefile")) as f:
        assert " ".join(rn.COMPARE_ARGS) in f.read()


def test_the_pages_hold_what_the_code_computes_from_the_record(blocks):
    assert rn.first_difference(ROOT, blocks) is None


@pytest.mark.parametrize("page, name", [(page, name) for page, names in rn.PAGES.items() for name in names])
def test_a_number_edited_by_hand_is_caught_and_rewritten(blocks, tmp_path, monkeypatch, capsys, page, name):
    """One digit of a block changed on a copy of the pages: --check names that block in one line (exit 1),
    and the rewrite gives the page back as it was."""
    copy_files(ROOT, tmp_path, rn.PAGES)
    path = tmp_path / page
    original = path.read_text(encoding="utf-8")
    lines = original.split("\n")
    begin, end = rn._block_span(lines, page, name)
    at = max(i for i in range(begin + 1, end) if any(c.isdigit() for c in lines[i]))  # its last line with a number
    digit = max(i for i, c in enumerate(lines[at]) if c.isdigit())
    lines[at] = lines[at][:digit] + str((int(lines[at][digit]) + 1) % 10) + lines[at][digit + 1:]
    path.write_text("\n".join(lines), encoding="utf-8")
    # the command line, without a second rebuild
    monkeypatch.setattr(rn, "generate", lambda record_dir, spec=rn.QUICKSTART: blocks)

    assert exit_code(["--of", "quickstart", "--check", "--pages", str(tmp_path)]) == 1
    errors = errors_of(capsys)
    assert len(errors) == 1 and f"{page}: block {rn.MARKER}:{name} " in errors[0] and f"line {at + 1}:" in errors[0]
    assert exit_code(["--of", "quickstart", "--pages", str(tmp_path)]) == 0
    assert path.read_text(encoding="utf-8") == original
    assert exit_code(["--of", "quickstart", "--check", "--pages", str(tmp_path)]) == 0


def test_a_page_without_its_markers_is_one_line(tmp_path, capsys):
    copy_files(ROOT, tmp_path, rn.PAGES)
    page = next(iter(rn.PAGES))
    text = (tmp_path / page).read_text(encoding="utf-8")
    (tmp_path / page).write_text(text.replace(rn.end_line(rn.PAGES[page][0]), ""), encoding="utf-8")
    assert exit_code(["--of", "quickstart", "--check", "--pages", str(tmp_path)]) == 2
    errors = errors_of(capsys)
    assert len(errors) == 1 and f"should hold block {rn.MARKER}:{rn.PAGES[page][0]} once" in errors[0]


def test_record_refuses_incomplete_runs_and_another_record_in_one_line(tmp_path, capsys):
    """--record: a run lacking a file, or a record of other runs without --overwrite, is one line and
    leaves the record and the pages as they were."""
    runs, record, pages = tmp_path / "runs", tmp_path / "record", tmp_path / "pages"
    run_files = record_files()[1:]
    copy_files(RECORD, runs, run_files)
    copy_files(RECORD, record, record_files())
    copy_files(ROOT, pages, rn.PAGES)
    argv = ["--record", str(runs), "--record-dir", str(record), "--pages", str(pages)]
    before = {rel: (record / rel).read_bytes() for rel in record_files()}

    missing = runs / run_files[-1]
    missing.unlink()
    assert exit_code(argv) == 2
    errors = errors_of(capsys)
    assert len(errors) == 1 and f"has no {os.path.basename(run_files[-1])}" in errors[0]
    shutil.copyfile(os.path.join(RECORD, run_files[-1]), missing)

    with open(runs / run_files[0], "a") as f:
        f.write("\n")
    assert exit_code(argv) == 2
    errors = errors_of(capsys)
    assert len(errors) == 1 and f"holds another record ({run_files[0]} differs from" in errors[0]

    assert exit_code(["--record", str(tmp_path / "nothing")] + argv[2:]) == 2
    assert "no such folder" in errors_of(capsys)[0]
    assert {rel: (record / rel).read_bytes() for rel in record_files()} == before
    assert sorted(os.listdir(tmp_path)) == ["pages", "record", "runs"]  # no staging folder left behind
    for page in rn.PAGES:
        with open(os.path.join(ROOT, page), encoding="utf-8") as f:
            assert (pages / page).read_text(encoding="utf-8") == f.read()


def test_a_record_that_cannot_be_written_is_one_line_and_exit_74(tmp_path, capsys):
    """--record into a folder that cannot be made (its parent is a file: as a read-only or full disk, an
    OSError of the writes) is the project's write error: one line naming the record, exit 74."""
    from common.io import EXIT_WRITE_FAILED

    runs, blocker, pages = tmp_path / "runs", tmp_path / "blocker", tmp_path / "pages"
    copy_files(RECORD, runs, record_files()[1:])
    copy_files(ROOT, pages, rn.PAGES)
    blocker.write_text("a file where the record's folder would go")
    record = blocker / "record"
    assert exit_code(["--record", str(runs), "--record-dir", str(record), "--pages", str(pages)]) == EXIT_WRITE_FAILED
    errors = errors_of(capsys)
    assert len(errors) == 1 and errors[0].startswith(f"error: cannot write {record}")
    assert blocker.read_text() == "a file where the record's folder would go"
    assert sorted(os.listdir(tmp_path)) == ["blocker", "pages", "runs"]  # no staging folder left behind
    for page in rn.PAGES:
        with open(os.path.join(ROOT, page), encoding="utf-8") as f:
            assert (pages / page).read_text(encoding="utf-8") == f.read()


def test_a_record_of_other_settings_is_refused(tmp_path):
    """A record whose runs the quick-start config no longer resolves to (here: another learning rate) is
    refused as compare_heads refuses such runs, before any report is written."""
    copy_files(RECORD, tmp_path, record_files())
    request = tmp_path / rn.run_names()[0] / rn.RUN_FILES[0]
    assert request.name == "compare_request.json"
    doc = json.loads(request.read_text())
    doc["resolved"]["optim"]["lr"] *= 2
    request.write_text(json.dumps(doc))
    with pytest.raises(UserError, match=r"do not make the quickstart report.*other settings \(optim\.lr"):
        rn.generate(str(tmp_path))


def test_a_folder_without_a_record_is_one_line(tmp_path):
    with pytest.raises(UserError, match="holds no record"):
        rn.generate(str(tmp_path))

