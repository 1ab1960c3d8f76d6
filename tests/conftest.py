"""Loaded first by pytest, with tests/ put on sys.path (no __init__.py here), so that
test modules in the subfolders can import the shared `helpers` as the top-level
ones do, whichever tests a run selects."""
