"""DALI train and eval loaders with the PIL loaders' sample order, labels, sharding and resume.

The batch list comes from data/samplers.py exactly as in data/loaders.py (same (seed, epoch)
permutation, rank r takes positions r, r+W, ..., repeated augmentation as timm's
RepeatAugSampler, same per-position aug seeds), so each rank's labels and order equal the PIL
path's. Host threads read the encoded bytes of upcoming batches and parse their header sizes;
the random parameters (data/dali_params.py) go with them into DALI via `fn.external_source`.
Nothing random lives in DALI, so:

- resume is exact: `start_batch=b` slices the batch list, and batch t of a resumed epoch has the
  same samples, labels and pixels as batch t of an uninterrupted one (random erasing included);
- augmentation does not depend on `num_workers` (DALI's thread count) or on the device.

Undecodable files behave as on the PIL path (data/imagefolder.py): the same one-line UserError,
or with `skip_corrupt` the next decodable sample in the dataset takes the slot, recorded with
`dataset.note_skipped`. Files whose header does not parse are caught on the host; a file that
fails inside DALI's decoder is identified by decoding the failed batch's files with PIL, marked
bad, and the epoch restarts at that batch (deterministic, so nothing is replayed differently).
"""
import collections
import concurrent.futures
import io

import numpy as np
import torch
from PIL import Image

from common.errors import UserError

from . import dali_params as P
from .loaders import epoch_train_batches
from .registry import dataset_names, dataset_spec
from .samplers import eval_batches
from .transforms import eval_transform, train_crop_mode

_PREFETCH_BATCHES = 3  # host read-ahead, in batches
INSTALL_HINT = ("NVIDIA DALI is not installed: pip install -r requirements-dali.txt "
                "(or pip install nvidia-dali-cuda130), or set data.backend=pil")


def dali_available():
    try:
        import nvidia.dali  # noqa: F401  (optional: requirements-dali.txt)
    except ImportError:
        return False
    return True


def require_dali():
    """Raise the one-line UserError saying how to install DALI unless it imports."""
    if not dali_available():
        raise UserError(INSTALL_HINT)


def check_dali_config(cfg):
    """UserError (one line) for data settings the DALI path does not implement."""
    if not dataset_spec(cfg.dataset).dali:
        raise UserError(f"data.backend=dali supports data.dataset {' or '.join(dataset_names(dali=True))}, not "
                        f"'{cfg.dataset}' (the in-memory datasets use the device path: set data.backend=pil)")
    if train_crop_mode(cfg) != "rrc":
        raise UserError("data.backend=dali implements data.train_crop=rrc (DeiT) only; set data.train_crop=rrc "
                        "or data.backend=pil")
    if cfg.interpolation == "random":
        raise UserError("data.interpolation=random is not implemented with data.backend=dali; use bicubic or bilinear")
    if cfg.auto_augment:
        try:
            P.parse_rand_augment(cfg.auto_augment)
        except ValueError as e:
            raise UserError(f"data.auto_augment with data.backend=dali: {e}") from None
    elif cfg.color_jitter:
        raise UserError("data.color_jitter is not implemented with data.backend=dali; set data.color_jitter=0 "
                        "or data.backend=pil")
    require_dali()


def resolve_backend(cfg, device=None):
    """'pil' or 'dali' for cfg.backend pil | dali | auto (see `explain_backend`)."""
    return explain_backend(cfg, device)[0]


def explain_backend(cfg, device=None):
    """(backend, why): the backend data.backend=pil | dali | auto gives on this machine, and one
    phrase saying why, for the run's first log lines. auto takes DALI when it is installed, the
    dataset is a folder or shards, the training device is a CUDA GPU and every data option is one
    the DALI path implements; otherwise PIL, never an error."""
    if cfg.backend != "auto":
        return cfg.backend, f"data.backend={cfg.backend}"
    if not dataset_spec(cfg.dataset).dali:
        served = " and ".join(dataset_names(dali=True))
        return "pil", f"data.backend=auto: DALI serves {served} only, not '{cfg.dataset}'"
    on_cuda = torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda")
    if not on_cuda:
        return "pil", "data.backend=auto: no CUDA device (DALI decodes on the GPU)"
    if not dali_available():
        return "pil", "data.backend=auto: DALI is not installed (pip install -r requirements-dali.txt)"
    try:
        check_dali_config(cfg)
    except UserError as e:  # auto never fails over an option only the PIL path implements
        return "pil", f"data.backend=auto: {e}"
    return "dali", "data.backend=auto: DALI installed, CUDA device, folder/shards data"


def _bad_set(dataset):
    """Indices known to be undecodable, kept on the dataset object (reused across epochs)."""
    return dataset.__dict__.setdefault("_dali_bad", set())


def _read_bytes(dataset, i):
    if hasattr(dataset, "read_bytes"):
        return dataset.read_bytes(i)
    with open(dataset.samples[i][0], "rb") as f:
        return f.read()


def _strict_check(dataset, j):
    """Decode sample j with the PIL path's own code, skip_corrupt off: raises its exact UserError
    when PIL cannot decode it, returns normally when PIL can."""
    probe = dataset.subset([j])
    probe.skip_corrupt = False
    probe.load(0)


def _header_size(buf):
    """(w, h) from the JPEG/PNG header, else from PIL's lazy open (other formats DALI also decodes)."""
    size = P.image_size(buf)
    if size is None:
        try:
            with Image.open(io.BytesIO(buf)) as im:
                size = im.size
        except Exception:
            return None
    return size


def _resolve(dataset, i):
    """Sample i, or with skip_corrupt the next sample that reads and whose header parses
    -> (j, bytes, (w, h), skipped names)."""
    bad, n, skipped = _bad_set(dataset), len(dataset), []
    for k in range(n):
        j = (i + k) % n
        if j not in bad:
            try:
                buf = _read_bytes(dataset, j)
            except OSError:  # the PIL path counts an unreadable file as undecodable too
                buf = b""
            size = _header_size(buf)
            if size is not None:
                return j, buf, size, skipped
            bad.add(j)
        if not dataset.skip_corrupt:
            _strict_check(dataset, j)  # raises the PIL path's message
            raise UserError(f"cannot parse the image header of {dataset.samples[j][0]}; delete or replace it, "
                            "or set data.skip_corrupt=true to skip undecodable files")
        skipped.append(dataset.samples[j][0])
    raise UserError(f"no decodable image among the {n} files of this split")


class _HostBatch:
    """One batch's host side: what DALI gets (feed) and what the loader adds afterwards."""

    def __init__(self, t, resolved, seeds, labels):
        self.t = t
        self.indices = [r[0] for r in resolved]
        self.skipped = [name for r in resolved for name in r[3]]
        self.seeds = seeds
        self.labels = labels
        self.feed = None
        self.erase = None


class _DaliEpoch:
    """Runs DALI over tasks[start:], restarting at the failing batch after a decode failure."""

    def __init__(self, loader, tasks):
        self.loader, self.tasks = loader, tasks

    def __iter__(self):
        t = 0
        while t < len(self.tasks):
            restart = None
            for item in self._run(t):
                if isinstance(item, _Restart):
                    restart = item.t
                    break
                yield item
                t += 1
            if restart is None and t < len(self.tasks):
                raise RuntimeError("DALI pipeline ended before the epoch did")
            if restart is not None:
                t = restart

    def _run(self, t0):
        loader = self.loader
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=loader.io_threads, thread_name_prefix="dali-read")
        pending = collections.deque()  # host read futures, in batch order
        fed = collections.deque()  # _HostBatch records fed to DALI, not yet returned
        state = {"next_submit": t0, "error": None}

        def submit():
            t = state["next_submit"]
            if t < len(self.tasks):
                indices = self.tasks[t][0]
                chunks = [indices[c:c + 32] for c in range(0, len(indices), 32)]
                pending.append((t, [pool.submit(lambda ch=ch: [_resolve(loader.dataset, int(i)) for i in ch])
                                    for ch in chunks]))
                state["next_submit"] = t + 1

        def source():
            while len(pending) < _PREFETCH_BATCHES and state["next_submit"] < len(self.tasks):
                submit()
            if not pending or state["error"] is not None:
                raise StopIteration
            t, futures = pending.popleft()
            submit()
            try:
                resolved = [r for f in futures for r in f.result()]
                batch = loader.prepare(t, resolved, self.tasks[t][1])
            except UserError as e:  # raised to the caller once the batches before it are out
                state["error"] = e
                raise StopIteration from None
            fed.append(batch)
            return batch.feed

        pipe = loader.acquire_pipeline(source)
        closed = []

        def close(clean):
            if not closed:
                closed.append(True)
                for _, futures in pending:
                    for f in futures:
                        f.cancel()
                pool.shutdown(wait=True)
                loader.release_pipeline(pipe, clean)

        try:
            for t in range(t0, len(self.tasks)):
                try:
                    out = pipe.run()
                except StopIteration:
                    if state["error"] is not None:
                        raise state["error"] from None
                    return
                except RuntimeError as e:  # a decoder failure inside DALI
                    yield _Restart(loader.on_decode_failure(fed, e))
                    return
                batch = fed.popleft()
                if batch.skipped:
                    loader.note_skipped(batch.skipped)
                item = loader.finish(out, batch)  # copied out of DALI's buffers
                if t == len(self.tasks) - 1:
                    close(True)  # before the last yield: a consumer that stops here still frees it for reuse
                yield item
        finally:
            close(False)


class _Restart:
    def __init__(self, t):
        self.t = t


class _Trampoline:
    """The external source of a cached pipeline: calls whichever epoch's source is current."""

    def __init__(self):
        self.source = None

    def __call__(self):
        return self.source()


_PIPELINES = collections.OrderedDict()  # key -> (pipeline, trampoline); built pipelines reused across epochs
_MAX_CACHED = 4


class _DaliLoader:
    """Shared DALI plumbing for the train and eval loaders."""

    def acquire_pipeline(self, source):
        """A built pipeline for this loader's settings fed by `source` (building one takes ~1 s, so a
        pipeline that finished an epoch cleanly is reset and reused by the next loader)."""
        key = self.pipeline_key()
        entry = _PIPELINES.pop(key, None)
        if entry is None:
            trampoline = _Trampoline()
            entry = (self.build_pipeline(trampoline), trampoline)
        entry[1].source = source
        self._entry = (key, entry)
        return entry[0]

    def release_pipeline(self, pipe, clean):
        key, entry = self._entry
        entry[1].source = None
        if not clean:
            return  # batches may still be queued inside it: let it go
        pipe.reset()
        _PIPELINES[key] = entry
        while len(_PIPELINES) > _MAX_CACHED:
            _PIPELINES.popitem(last=False)

    def __init__(self, dataset, cfg, tasks, device):
        require_dali()
        check_dali_config(cfg)
        from . import dali_pipeline  # optional: NVIDIA DALI (requirements-dali.txt), found by require_dali

        self.dali = dali_pipeline  # the pipeline definitions (DALI's own imports at that module's top)
        self.dataset, self.cfg, self.tasks = dataset, cfg, tasks
        self.device = torch.device(device)
        gpu = self.device.type == "cuda"
        self.device_id = None
        if gpu:
            self.device_id = self.device.index if self.device.index is not None else torch.cuda.current_device()
        self.num_threads = max(1, int(cfg.num_workers))
        self.io_threads = min(2, self.num_threads)  # file reads + header parsing: ~25 us per image
        self.uses_memory_path = False
        self.backend = "dali"

    def note_skipped(self, names):
        if hasattr(self.dataset, "note_skipped"):
            self.dataset.note_skipped(names)

    def on_decode_failure(self, fed, error):
        """Find the files PIL cannot decode among the batches in flight; mark them bad (skip_corrupt)
        or raise the PIL path's error. Returns the batch index to restart from."""
        found = []
        for batch in fed:
            for j in sorted(set(batch.indices) - _bad_set(self.dataset)):
                try:
                    _strict_check(self.dataset, j)
                except UserError:
                    if not self.dataset.skip_corrupt:
                        raise
                    found.append(j)
            if found:
                break
        if not found:
            names = ", ".join(self.dataset.samples[j][0] for j in fed[0].indices[:3]) if fed else "?"
            first = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
            raise UserError(f"DALI failed on a batch that PIL decodes ({names}, ...): {first}; "
                            "set data.backend=pil") from None
        _bad_set(self.dataset).update(found)
        return fed[0].t

    def _to_torch(self, tensor_list):
        dense = tensor_list.as_tensor()
        device = self.device if self.device_id is not None else None
        out = torch.empty(dense.shape(), dtype=torch.float32, device=device)
        stream = torch.cuda.current_stream(self.device) if self.device_id is not None else None
        self.dali.feed_ndarray(dense, out, cuda_stream=stream)
        return out.to(self.device, non_blocking=True)

    def _labels(self, batch):
        y = torch.tensor(batch.labels, dtype=torch.int64)
        return y.to(self.device, non_blocking=self.device.type == "cuda")


class DaliTrainLoader(_DaliLoader):
    """One epoch of (normalised float images, int64 labels) on `device` for one rank, DeiT train
    transform in DALI; the same batches (indices, labels) as data.loaders.TrainLoader."""

    def __init__(self, dataset, cfg, *, seed, epoch, rank, world_size, start_batch=0, device="cpu"):
        tasks = epoch_train_batches(dataset, cfg, seed=seed, epoch=epoch, rank=rank, world_size=world_size,
                                    start_batch=start_batch)
        super().__init__(dataset, cfg, tasks, device)
        self.seed, self.epoch, self.rank, self.world_size, self.start_batch = seed, epoch, rank, world_size, start_batch
        self.batches_per_epoch = len(tasks)
        self.ra_spec = P.parse_rand_augment(cfg.auto_augment) if cfg.auto_augment else None

    def __len__(self):
        return self.batches_per_epoch

    def __iter__(self):
        return iter(_DaliEpoch(self, self.tasks[self.start_batch:]))

    def pipeline_key(self):
        c = self.cfg
        return ("train", c.image_size, tuple(c.mean), tuple(c.std), c.interpolation, self.ra_spec, c.batch_size,
                self.num_threads, self.device_id)

    def build_pipeline(self, source):
        return self.dali.build_train_pipeline(source, image_size=self.cfg.image_size, mean=self.cfg.mean,
                                              std=self.cfg.std, interpolation=self.cfg.interpolation,
                                              ra_spec=self.ra_spec, batch_size=self.cfg.batch_size,
                                              num_threads=self.num_threads, device_id=self.device_id,
                                              num_outputs=4 if self.ra_spec is None else 7)

    def prepare(self, t, resolved, seeds):
        labels = [int(self.dataset.samples[r[0]][1]) for r in resolved]
        batch = _HostBatch(t, resolved, np.asarray(seeds, dtype=np.uint64), labels)
        widths = np.array([r[2][0] for r in resolved])
        heights = np.array([r[2][1] for r in resolved])
        x, y, w, h = P.rrc_windows(batch.seeds, widths, heights)
        anchors = np.stack([x, y], 1).astype(np.float32)
        shapes = np.stack([w, h], 1).astype(np.float32)
        flip = P.flips(batch.seeds, self.cfg.hflip)
        feed = [[np.frombuffer(r[1], dtype=np.uint8) for r in resolved], list(anchors), list(shapes),
                [np.array(f, dtype=np.int32) for f in flip]]
        if self.ra_spec is not None:
            op, bins, signs = P.rand_augment_plan(batch.seeds, self.ra_spec, self.dali.RA_NUM_OPS)
            feed += [list(op), list(bins), list(signs)]
        batch.feed = tuple(feed)
        if self.cfg.reprob > 0:
            batch.erase = P.erase_boxes(batch.seeds, self.cfg.image_size, self.cfg.reprob)
        return batch

    def finish(self, out, batch):
        x = self._to_torch(out[0])
        if batch.erase is not None:
            self._erase(x, batch)
        return x, self._labels(batch)

    def _erase(self, x, batch):
        """timm RandomErasing 'pixel' mode: N(0, 1) noise in normalised space, one box per sample,
        boxes from the host (no device reads); noise seeded per sample, so it survives resume."""
        apply, top, left, h, w = batch.erase
        gen = torch.Generator(device=x.device)
        for k in np.flatnonzero(apply):
            gen.manual_seed(int(batch.seeds[k] ^ np.uint64(0x5EED5EED)) & ((1 << 63) - 1))
            t, lf, hh, ww = int(top[k]), int(left[k]), int(h[k]), int(w[k])
            x[k, :, t:t + hh, lf:lf + ww] = torch.randn((x.shape[1], hh, ww), generator=gen, device=x.device)


class DaliEvalLoader(_DaliLoader):
    """Deterministic eval batches (rank r gets r::world_size, no padding) with timm's eval transform."""

    def __init__(self, dataset, cfg, *, rank, world_size, device="cpu"):
        tasks = eval_batches(len(dataset), rank=rank, world_size=world_size, batch_size=cfg.eval_batch_size)
        super().__init__(dataset, cfg, tasks, device)
        self.num_samples = sum(len(t[0]) for t in tasks)

    def __len__(self):
        return len(self.tasks)

    def __iter__(self):
        return iter(_DaliEpoch(self, self.tasks))

    def pipeline_key(self):
        c = self.cfg
        return ("eval", c.image_size, tuple(c.mean), tuple(c.std), c.interpolation, c.eval_batch_size,
                self.num_threads, self.device_id)

    def build_pipeline(self, source):
        spec = eval_transform(self.cfg)  # the transform the PIL path and the exports describe
        return self.dali.build_eval_pipeline(source, image_size=spec.image_size, mean=spec.mean, std=spec.std,
                                             interpolation=spec.interpolation, batch_size=self.cfg.eval_batch_size,
                                             num_threads=self.num_threads, device_id=self.device_id)

    def prepare(self, t, resolved, seeds):
        labels = [int(self.dataset.samples[r[0]][1]) for r in resolved]
        batch = _HostBatch(t, resolved, None, labels)
        widths = np.array([r[2][0] for r in resolved])
        heights = np.array([r[2][1] for r in resolved])
        rw, rh, cx, cy = P.eval_geometry(widths, heights, self.cfg.image_size, eval_transform(self.cfg).crop_pct)
        crop = np.array([self.cfg.image_size, self.cfg.image_size], dtype=np.float32)
        batch.feed = ([np.frombuffer(r[1], dtype=np.uint8) for r in resolved],
                      list(np.stack([rh, rw], 1).astype(np.float32)), list(np.stack([cx, cy], 1).astype(np.float32)),
                      [crop] * len(resolved))
        return batch

    def finish(self, out, batch):
        return self._to_torch(out[0]), self._labels(batch)
