"""tiered/store/_preads.c: the compiled reads of tiered.store.preads."""

import numpy as np

def read_files(paths: list[str], los: np.ndarray, ns: np.ndarray, out: np.ndarray, ats: np.ndarray,
               got: np.ndarray, sizes: np.ndarray, errs: np.ndarray, want_size: bool, kept: np.ndarray | None,
               /) -> None: ...
def read_fds(fds: np.ndarray, los: np.ndarray, ns: np.ndarray, out: np.ndarray, ats: np.ndarray, got: np.ndarray,
             errs: np.ndarray, /) -> None: ...
