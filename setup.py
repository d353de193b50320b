"""The one thing pyproject.toml cannot say yet without an experimental table:
the native core, ``tiered._native``: the read path's run check and the
CommitLog pass's check-and-copy, a CRC per record, where numpy has nothing
to offer (tiered/_native.c), the key index's key scan and hash
(tiered/_native_keys.c), and the CommitLog pass's many small ConsumeQueue
reads in one call (tiered/_native_reads.c). docs/development.md ("Native code") has the
figures with and without it. Optional: an install without a C compiler
still succeeds and runs the Python twin of every function
(tiered.format.batch, tiered.format.keyindex, tiered.store.preads);
tiered.native says which at start-up.

Its CRC-32 is linked here: ISA-L's (Debian/Ubuntu ``libisal-dev``) where the
compiler finds it, else zlib's (``zlib1g-dev``), a few times slower."""

import hashlib
import os
import tempfile

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CompileError, LinkError


_ISAL_PROBE = "#include <isa-l/crc.h>\nint main(void) { return (int)crc32_gzip_refl(0, 0, 0); }\n"


SOURCES = ["tiered/_native.c", "tiered/_native_keys.c", "tiered/_native_reads.c"]
DEPENDS = ["tiered/_native.h"]


def source_digest(paths: list[str]) -> str:
    """What tiered.native.source_digest computes from the same files: a core
    built from other sources (an editable install not rebuilt) is not used."""
    h = hashlib.sha256()
    for path in sorted(paths, key=os.path.basename):
        with open(path, "rb") as fh:
            h.update(os.path.basename(path).encode() + b"\0" + fh.read())
    return h.hexdigest()


class BuildNative(build_ext):
    """Links the native core's CRC to ISA-L when the compiler can."""

    def _has_isal(self) -> bool:
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "isal.c")
            with open(src, "w") as fh:
                fh.write(_ISAL_PROBE)
            try:
                objs = self.compiler.compile([src], output_dir=tmp)
                self.compiler.link_executable(objs, os.path.join(tmp, "isal"), libraries=["isal"])
            except (CompileError, LinkError):
                return False
        return True

    def build_extensions(self) -> None:
        if self._has_isal():
            for ext in self.extensions:
                ext.libraries.append("isal")
                ext.define_macros.append(("TIERED_CRC_ISAL", "1"))
        super().build_extensions()


setup(cmdclass={"build_ext": BuildNative},
      ext_modules=[Extension("tiered._native", SOURCES, depends=DEPENDS, optional=True, libraries=["z"],
                             define_macros=[("TIERED_NATIVE_SOURCES", f'"{source_digest(SOURCES + DEPENDS)}"')],
                             extra_compile_args=["-O2", "-pthread"], extra_link_args=["-pthread"])])
