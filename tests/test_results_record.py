"""docs/results.md's table and verdicts are what the current code computes from the recorded Fashion-MNIST
comparison (docs/fashion_mnist_record: every head on cached features, 5 seeds), through the same generator
as the quick start's numbers (scripts/readme_numbers.py --of fashion_mnist); its own file, so that its one
report rebuild of 45 runs (the longest test) runs beside the quick start's tests."""
import os

import pytest

from common.cli import run_cli
from common.errors import UserError
from comparison.report import readme_numbers as rn
from project_files import ROOT, tracked_files
from test_readme_numbers import copy_files

FASHION_RECORD = os.path.join(ROOT, rn.FASHION.dir)


def fashion_record_files():
    """recorded.json, the feature folder's description and each planned run's RUN_FILES."""
    names = rn.run_names(rn.FASHION, FASHION_RECORD)
    return ([rn.RECORD_INFO] + [os.path.join(rn.FEATURES, f) for f in rn.FEATURE_FILES]
            + [os.path.join(name, f) for name in names for f in rn.RUN_FILES])


def test_the_fashion_record_is_committed_small_and_holds_no_features_or_weights():
    tracked = {p for p in tracked_files() if p.startswith(rn.FASHION.dir + "/")}
    assert tracked == {f"{rn.FASHION.dir}/{rel}" for rel in fashion_record_files()}
    assert len(tracked) > 9 * 5 * len(rn.RUN_FILES)  # every head, every seed
    assert sum(os.path.getsize(os.path.join(ROOT, p)) for p in tracked) < 20_000_000  # 45 runs x 0.4 MB, 4.3 MB packed


def test_results_md_holds_what_the_code_computes_from_the_fashion_record():
    """docs/results.md's table and verdicts are the report the current code makes of the recorded runs."""
    blocks = rn.generate(FASHION_RECORD, rn.FASHION)
    assert rn.first_difference(ROOT, blocks, rn.FASHION) is None
    table = blocks[("docs/results.md", "table")]
    assert all(head in table[table.index("") + 1] for head in rn.FASHION_HEADS)  # one column per head


def test_the_fashion_records_are_of_the_commands_the_docs_and_make_fashion_run():
    """One source for the probes' settings: the Makefile's FASHION_PROBE is the record's; docs/results.md
    shows each recorded comparison's command."""
    with open(os.path.join(ROOT, "Makefile")) as f:
        makefile = f.read()
    assert f"FASHION_PROBE ?= {' '.join(rn.FASHION_PROBE)}\n" in makefile
    with open(os.path.join(ROOT, "docs", "results.md"), encoding="utf-8") as f:
        page = " ".join(f.read().replace("\\\n", " ").split())
    for spec in (rn.FASHION, rn.FASHION_E2E):
        assert "python scripts/compare_heads.py " + " ".join(spec.compare_args) in page, spec.name


def test_the_end_to_end_record_is_small_and_makes_its_blocks_without_the_data(tmp_path, monkeypatch):
    """docs/results.md's end-to-end table and verdicts are what the current code computes from the three
    recorded runs (each head's seed-0 training of the recipe: small result files, no weights); the rebuild
    reads no Fashion-MNIST file (the installed package hidden: CI machines need not have it)."""
    record = os.path.join(ROOT, rn.FASHION_E2E.dir)
    names = rn.run_names(rn.FASHION_E2E, record)
    assert names == [f"{head}-s0" for head in rn.FASHION_E2E_HEADS]
    tracked = {p for p in tracked_files() if p.startswith(rn.FASHION_E2E.dir + "/")}
    assert tracked == {f"{rn.FASHION_E2E.dir}/{rel}" for rel in
                       [rn.RECORD_INFO] + [f"{name}/{f}" for name in names for f in rn.RUN_FILES]}
    assert sum(os.path.getsize(os.path.join(ROOT, p)) for p in tracked) < 2_000_000
    monkeypatch.setattr("data.idx.SYSTEM_ROOT", str(tmp_path / "no-datasets"))
    blocks = rn.generate(record, rn.FASHION_E2E)
    assert rn.first_difference(ROOT, blocks, rn.FASHION_E2E) is None


def test_a_fashion_record_without_its_feature_description_is_one_line(tmp_path):
    files = fashion_record_files()
    copy_files(FASHION_RECORD, tmp_path, [f for f in files if not f.startswith(rn.FEATURES + os.sep)])
    with pytest.raises(UserError, match=r"has no feature_folder/features.json: the record is incomplete; "
                                        r"record it again \(--of fashion_mnist"):
        rn.generate(str(tmp_path), rn.FASHION)


def test_recording_without_the_feature_folder_or_with_a_stray_record_dir_is_refused(tmp_path, monkeypatch, capsys):
    """--of fashion_mnist --record needs the comparison's feature folder (its features.json is recorded);
    --record-dir without --of would not say which record it is. Each is refused, nothing written."""
    monkeypatch.setattr(rn, "ROOT", str(tmp_path / "checkout"))  # a checkout without features/fashion_mnist_e30
    (tmp_path / "runs").mkdir()
    with pytest.raises(UserError, match=r"no .*features/fashion_mnist_e30/features\.json: the fashion_mnist "
                                        r"comparison's runs were trained on the features there"):
        rn.record(str(tmp_path / "runs"), str(tmp_path / "record"), False, rn.FASHION)
    with pytest.raises(SystemExit) as exited:
        run_cli(rn.main, ["--record-dir", str(tmp_path / "record")])
    assert exited.value.code == 2 and "--record-dir goes with --of NAME" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["runs"]
