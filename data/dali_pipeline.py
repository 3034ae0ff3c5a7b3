"""NVIDIA DALI pipeline definitions: the DeiT train transform and timm's eval transform.

One definition per transform serves both devices: `device_id=None` builds a CPU-only pipeline
(libjpeg-turbo decode, CPU operators), an int builds the GPU one ("mixed" nvJPEG decode, the
rest on the GPU). Only the device arguments differ, so the CPU tests exercise the GPU graph.
Every random parameter arrives through `fn.external_source` from data/dali_params.py; DALI's own
RNGs are never used, so outputs are a pure function of (seed, epoch, position).

Train: decode only the random-resized-crop window (`decoders.image_slice`), resize to
image_size, flip, RandAugment (timm's op suite rebuilt from `nvidia.dali.auto_aug` parts,
Cubuk et al. 2020), normalise to CHW float. Random erasing runs on the training device
afterwards (data/dali_loader.py). Eval: decode, resize the shorter side to
floor(image_size / crop_pct), centre crop, normalise.

Known differences from timm's PIL ops (distributional, not per-pixel): geometric RandAugment ops
interpolate bilinearly and fill with one grey level (DALI takes a scalar fill; timm fills with
the per-channel ImageNet mean); equalize follows OpenCV's formula (DALI).

DALI is optional (requirements-dali.txt): this module imports it at its top, and data/dali_loader.py
imports this module only once `require_dali` found it (`dali_available` says whether it is installed).
"""
import numpy as np
from nvidia.dali import fn, pipeline_def, types
from nvidia.dali import math as dmath
from nvidia.dali.auto_aug import augmentations
from nvidia.dali.pipeline import do_not_convert
from nvidia.dali.plugin.pytorch import feed_ndarray  # noqa: F401  (the loaders' copy into torch tensors)

FILL_GREY = 115  # ~ mean of timm's per-channel fill (124, 116, 104)


def _interp(name):
    return {"bicubic": types.INTERP_CUBIC, "bilinear": types.INTERP_LINEAR, "nearest": types.INTERP_NN,
            "random": types.INTERP_CUBIC}[name]


def _signed_levels(spec):
    """Level of every magnitude index: index 2*b + s is bin b (timm level b / 10) with sign s (1 = negated)."""
    levels = np.arange(spec.num_bins, dtype=np.float64) / 10.0
    return np.repeat(levels, 2), np.tile([1.0, -1.0], spec.num_bins)


def rand_augment_suite(spec, image_size):
    """timm's RandAugment ops (inc1: _RAND_INCREASING_TRANSFORMS, inc0: _RAND_TRANSFORMS) in timm's
    order -> [(op(images, parameter), parameter table or None, table on the images' device)]; the
    op at index len(suite) - 1 is the identity ('op not applied'). The implementations are
    nvidia.dali.auto_aug's (`augmentations.X.op`) where they match timm, own ones where timm
    differs (posterize down to 0 bits, saturating solarize-add).

    Each table is timm's level_to_arg at every (magnitude bin b, sign s) index 2*b + s,
    precomputed here: the pipeline only looks parameters up with the host's bins and signs, and
    DALI's graph tracer never calls back into Python per magnitude (which made builds take ~20 s).
    """
    a = augmentations  # (short: the suite below names twelve of its ops)
    level, sign = _signed_levels(spec)
    frac = level / 10.0  # timm: level / _LEVEL_DENOM
    f32 = np.float32

    def geometric(op):
        return lambda data, param: op(data, param, fill_value=FILL_GREY)

    def posterize(data, mask):
        return data & mask

    def solarize_add(data, shift):
        low = data < types.Constant(128, dtype=types.UINT8)
        shifted = fn.cast(dmath.min(fn.cast(data, dtype=types.INT16) + shift, 255), dtype=types.UINT8)
        return low * shifted + (low ^ True) * data

    def posterize_masks(bits):
        bits = np.clip(bits, 0, 8).astype(np.int64)  # 0 bits -> black, as timm with Pillow < 11
        return (255 ^ ((1 << (8 - bits)) - 1)).astype(np.uint8)

    if spec.increasing:
        bits = 4 - np.floor(frac * 4)
        thresholds = 256 - np.minimum(256, np.floor(frac * 256))
        factors = np.maximum(0.1, 1.0 + sign * frac * 0.9)
    else:
        bits = np.floor(frac * 4)
        thresholds = np.minimum(256, np.floor(frac * 256))
        factors = frac * 1.8 + 0.1
    # PIL ImageEnhance.Sharpness(factor) = 3x3 kernel blending the image with PIL's smooth filter
    kernels = np.stack([a.sharpness_kernel(f - 1.0) for f in factors]).astype(f32)
    translate_px = sign * frac * 0.45 * image_size  # timm translate_pct 0.45 of the (square) image
    zero = np.zeros_like(frac)
    # (op, parameter table or None, table lives on the images' device): as DALI's own suite places
    # them (param_device "auto" for ops whose parameter is a tensor input, "cpu" for argument inputs)
    return [
        (lambda data, _: a.auto_contrast.op(data, None), None, False),
        (lambda data, _: fn.equalize(data), None, False),  # OpenCV's formula (PIL's differs slightly)
        (lambda data, _: a.invert.op(data, None), None, False),
        (geometric(a.rotate.op), (sign * frac * 30).astype(f32), False),
        (posterize, posterize_masks(bits), True),
        (a.solarize.op, thresholds.astype(f32), True),
        (solarize_add, np.minimum(128, np.floor(frac * 110)).astype(np.int16), True),
        (a.color.op, factors.astype(f32), False),
        (a.contrast.op, factors.astype(f32), False),
        (a.brightness.op, factors.astype(f32), False),
        (lambda data, kernel: fn.filter(data, kernel), kernels, True),
        # DALI's shear/translate map forward, PIL's affine inverse: negated, so (bin, sign) means timm's op
        (geometric(a.shear_x.op), np.stack([-sign * frac * 0.3, zero], 1).astype(f32), False),
        (geometric(a.shear_y.op), np.stack([zero, -sign * frac * 0.3], 1).astype(f32), False),
        (geometric(a.translate_x_no_shape.op), np.stack([-translate_px, zero], 1).astype(f32), False),
        (geometric(a.translate_y_no_shape.op), np.stack([zero, -translate_px], 1).astype(f32), False),
        (lambda data, _: data, None, False),
    ]


def _apply_one(suite, op_idx, images, params, lo, hi):
    """Apply suite[op_idx] per sample: binary split of the batch with DALI conditionals (as
    nvidia.dali.auto_aug.core.select does), each leaf sees only its samples."""
    if lo == hi:
        return do_not_convert(suite[lo][0])(images, params[lo])  # leaves have no conditionals: skip tracing
    mid = (lo + hi) // 2
    if op_idx <= mid:
        out = _apply_one(suite, op_idx, images, params, lo, mid)
    else:
        out = _apply_one(suite, op_idx, images, params, mid + 1, hi)
    return out


RA_NUM_OPS = 15  # len(rand_augment_suite(...)) - 1 (the trailing identity)


def build_train_pipeline(source, *, image_size, mean, std, interpolation, ra_spec, batch_size, num_threads,
                         device_id, num_outputs):
    """source() -> per batch: (encoded images, crop anchors (x, y), crop shapes (w, h), flips,
    [op indices, magnitude bins, signs]); raises StopIteration after the last batch."""
    gpu = device_id is not None

    @pipeline_def(enable_conditionals=ra_spec is not None)
    def train_pipeline():
        inputs = fn.external_source(source=source, num_outputs=num_outputs, batch=True,
                                    dtype=[types.UINT8, types.FLOAT, types.FLOAT, types.INT32]
                                    + [types.INT32] * (num_outputs - 4))
        encoded, anchor, shape, flip = inputs[:4]
        images = fn.decoders.image_slice(encoded, anchor, shape, device="mixed" if gpu else "cpu",
                                         output_type=types.RGB, normalized_anchor=False, normalized_shape=False,
                                         axis_names="WH", adjust_orientation=False)
        images = fn.resize(images, size=(image_size, image_size), interp_type=_interp(interpolation),
                           antialias=True)
        images = fn.flip(images, horizontal=flip)
        if ra_spec is not None:
            op_idx, bins, signs = inputs[4:]
            suite = rand_augment_suite(ra_spec, image_size)
            tables = [None if table is None else types.Constant(table, device="gpu" if gpu and on_device else "cpu")
                      for _, table, on_device in suite]
            signed = bins * 2 + signs  # index into the (bin, sign) parameter tables
            for layer in range(ra_spec.num_layers):
                params = [None if table is None else table[signed[layer]] for table in tables]
                images = _apply_one(suite, op_idx[layer], images, params, 0, len(suite) - 1)
        return fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW",
                                        mean=[255.0 * m for m in mean], std=[255.0 * s for s in std])

    pipe = train_pipeline(batch_size=batch_size, num_threads=num_threads, device_id=device_id, seed=0,
                          prefetch_queue_depth=2)
    pipe.build()
    return pipe


def build_eval_pipeline(source, *, image_size, mean, std, interpolation, batch_size, num_threads, device_id):
    """source() -> per batch: (encoded images, resized (h, w), crop anchors (x, y), crop shapes (w, h));
    StopIteration at the end. (Anchors and shapes come from the host: slice takes them as CPU inputs.)"""
    gpu = device_id is not None

    @pipeline_def
    def eval_pipeline():
        encoded, size, anchor, crop = fn.external_source(source=source, num_outputs=4, batch=True,
                                                         dtype=[types.UINT8, types.FLOAT, types.FLOAT, types.FLOAT])
        images = fn.decoders.image(encoded, device="mixed" if gpu else "cpu", output_type=types.RGB,
                                   adjust_orientation=False)
        images = fn.resize(images, size=size, interp_type=_interp(interpolation), antialias=True)
        images = fn.slice(images, anchor, crop, axis_names="WH", normalized_anchor=False, normalized_shape=False)
        return fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW",
                                        mean=[255.0 * m for m in mean], std=[255.0 * s for s in std])

    pipe = eval_pipeline(batch_size=batch_size, num_threads=num_threads, device_id=device_id, seed=0,
                         prefetch_queue_depth=2)
    pipe.build()
    return pipe
