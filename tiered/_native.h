/* The native core, tiered._native: one module from several C files, each
 * giving its functions in a method table that _native.c's module joins. */
#ifndef TIERED_NATIVE_H
#define TIERED_NATIVE_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>

extern PyMethodDef tiered_native_key_methods[];  /* _native_keys.c */
extern PyMethodDef tiered_native_read_methods[];  /* _native_reads.c */

#endif
