"""What a folder holds, to assert that a refused command left it byte-identical."""
import os


def snapshot(root):
    """{relative path: bytes, '-> target' for a link (not followed), or 'dir'} of everything under root."""
    found = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                found[rel] = "-> " + os.readlink(path)
            elif os.path.isfile(path):
                with open(path, "rb") as f:
                    found[rel] = f.read()
            else:
                found[rel] = "dir"
    return found
