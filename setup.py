"""The one thing pyproject.toml cannot say yet without an experimental table:
the read path's run check in C (tiered/format/_runcheck.c, with the
CommitLog pass's check-and-copy on POSIX threads) and the key
index's key scan in C (tiered/format/_keyscan.c), and the CommitLog pass's
many small ConsumeQueue reads in one call (tiered/store/_preads.c). Optional: an install
without a C compiler still succeeds and works with numpy instead
(tiered.format.batch, tiered.format.keyindex and tiered.store.preads pick
the path at import)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("tiered.format._runcheck", ["tiered/format/_runcheck.c"], optional=True,
                             extra_compile_args=["-O2", "-pthread"], extra_link_args=["-pthread"]),
                   Extension("tiered.format._keyscan", ["tiered/format/_keyscan.c"], optional=True,
                             extra_compile_args=["-O2"]),
                   Extension("tiered.store._preads", ["tiered/store/_preads.c"], optional=True,
                             extra_compile_args=["-O2"])])
