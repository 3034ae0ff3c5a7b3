"""The leaf of the import graph: the user-error type (errors), the one atomic, error-mapped file
writer and JSON encoding (io), safetensors/torch weights through it (weights), deleting that never
follows links (removal), the names of a run directory's files (rundir) and the seed hash (seeding).

Nothing here imports from the project, so every package (models, data, configs, engine,
evaluation) and every entry point may depend on it.
"""
