"""training/checkpoint/state.py: trainer_state.json is one versioned record, written through the checkpoint
writer and read back field for field; another version, none, or a missing or unknown field is one line."""
import json
import os
import re

import pytest

from common import rundir
from common.errors import UserError
from training.checkpoint import files as ck
from training.checkpoint.state import VERSION, TrainerState, read_trainer_state


def _state():
    return TrainerState(step=7, epoch=1, batch=3, best_top1=0.5, best_step=4, skipped=1, recent_skips=[6],
                        train_time_s=1.25, images=224, last_eval={"top1": 0.5}, schedule_offset=-1,
                        epoch_note="from step 4: processes 1 -> 2", config={"run.global_batch": 32, "optim.lr": 0.1},
                        world_size=2, updates_in_epoch=3, updates_per_epoch=8,
                        epoch_partial={"loss_sum": 6.5, "updates": 3}, loss_finite=False)


def _saved(tmp_path, state):
    root = str(tmp_path / rundir.CHECKPOINTS)
    tmp = ck.begin_save(root, state.step)
    ck.write_main_files(tmp, model_state={}, ema_state=None, optimizer_state=None, scheduler_state=None,
                        scaler_state=None, trainer_state=state)
    return ck.commit_save(root, state.step)


def test_round_trip_through_the_checkpoint_writer(tmp_path):
    state = _state()
    path = _saved(tmp_path, state)
    assert ck.validation_error(path) is None
    back = read_trainer_state(path)
    assert back == state and back.version == VERSION
    assert back.global_batch == 32 and back.partial_epoch() == [6.5, 3.0]
    assert set(back.counters()) < set(back.to_dict()) and "config" not in back.counters()
    with pytest.raises(TypeError):  # the writer takes the typed record only
        ck.write_main_files(str(tmp_path), model_state={}, ema_state=None, optimizer_state=None,
                            scheduler_state=None, scaler_state=None, trainer_state={"step": 1})


@pytest.mark.parametrize("change, message", [
    (lambda d: d.update(version=VERSION + 1),
     f"is format version {VERSION + 1}; this train.py reads version {VERSION}"),
    (lambda d: d.pop("version"), "has no format version (written by an older train.py)"),
    (lambda d: d.pop("updates_in_epoch"), "missing updates_in_epoch"),
    (lambda d: d.update(global_batch=32), "unknown global_batch"),
])
def test_another_format_is_refused_in_one_line(tmp_path, change, message):
    path = _saved(tmp_path, _state())
    record = _state().to_dict()
    change(record)
    with open(os.path.join(path, rundir.TRAINER_STATE), "w") as f:
        json.dump(record, f)
    with pytest.raises(UserError, match=re.escape(message)) as err:
        read_trainer_state(path)
    assert "\n" not in str(err.value) and path in str(err.value)


def test_eval_of_a_checkpoint_of_another_version_is_one_line(tmp_path, one_line_error):
    path = _saved(tmp_path, _state())
    with open(os.path.join(path, rundir.TRAINER_STATE), "w") as f:
        json.dump(dict(_state().to_dict(), version=99), f)
    assert "is format version 99" in one_line_error("eval", ["--checkpoint", path])
