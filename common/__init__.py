"""The leaf of the import graph: the user-error type, atomic file writes and the JSON writer.

Nothing here imports from the project, so every package (models, data, configs, engine,
evaluation) may depend on it.
"""
