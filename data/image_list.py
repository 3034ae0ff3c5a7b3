"""The image files a user means by predict.py's --images: standard library only, so that a folder
without images is answered before torch loads (inference/arguments.py lists them there; the body
predicts the list it was given).

`list_images(spec)`: spec is a folder (searched recursively, hidden entries skipped, in the order
of ImageFolder's scan: sorted folders, then sorted files), a glob (`photos/*.png`, `**` recursive),
a list file (one path per line; blank lines and `#` comments skipped; relative paths are relative
to the current directory, like the output of `find`), or one image file. Only files with an image
extension (IMG_EXTENSIONS) are taken from a folder or glob; every path of a list file is taken as
given (a missing or undecodable one is reported as unreadable when decoded, not dropped silently).
"""
import glob
import os

from common.errors import UserError

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png")  # what an image folder holds (data/imagefolder.py reads the same)
GLOB_CHARS = "*?["


def is_image_name(name):
    return name.lower().endswith(IMG_EXTENSIONS)


def _walk(folder):
    """(image paths, count of other files) under folder, ImageFolder's order, hidden entries skipped."""
    images, others = [], 0
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(f for f in files if not f.startswith(".")):
            if is_image_name(name):
                images.append(os.path.join(root, name))
            else:
                others += 1
    return images, others


def _from_folder(folder):
    images, others = _walk(folder)
    if images:
        return images
    if others:
        raise UserError(f"{folder} holds {others} file(s) but no images ({', '.join(IMG_EXTENSIONS)}, searched "
                        f"recursively); point --images at the images' folder, a glob or a list file")
    raise UserError(f"{folder} is empty (no files, searched recursively); point --images at a folder of images")


def _from_glob(pattern):
    matches = sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
    if not matches:
        raise UserError(f"no file matches --images {pattern!r} (quote the pattern so the shell leaves it to "
                        f"predict.py; use ** for subfolders)")
    images = [p for p in matches if is_image_name(p)]
    if not images:
        raise UserError(f"--images {pattern!r} matches {len(matches)} file(s) but no images "
                        f"({', '.join(IMG_EXTENSIONS)})")
    return images


def _from_list_file(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = [(n, line.strip()) for n, line in enumerate(f, 1)]
    paths, first_line = [], {}
    for n, line in lines:
        if not line or line.startswith("#"):
            continue
        if line in first_line:
            raise UserError(f"{path} line {n} repeats line {first_line[line]} ({line}); list each image once")
        first_line[line] = n
        paths.append(line)
    if not paths:
        raise UserError(f"{path} lists no images (one path per line expected)")
    return paths


def list_images(spec):
    """The image paths `spec` names (see the module docstring); UserError when it names none."""
    if os.path.isdir(spec):
        return _from_folder(spec)
    if os.path.isfile(spec):
        return [spec] if is_image_name(spec) else _from_list_file(spec)
    if any(c in spec for c in GLOB_CHARS):
        return _from_glob(spec)
    raise UserError(f"--images {spec}: no such folder, file or glob match (give a folder of images, a glob "
                    f"such as 'photos/*.jpg', or a text file with one image path per line)")
