/* Packed token ids (array('I')) as a msgpack array of ints, native (see packed_ids.py).
 *
 * The bytes are exactly msgspec's for the same ids as a list of ints: the array header in its
 * shortest form, then each id in its shortest unsigned form (positive fixint, uint 8, 16 or
 * 32). No library beyond Python's. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* msgpack_u32(ids) -> the msgpack encoding of the 4-byte unsigned ids as an array of ints. */
static PyObject *msgpack_u32(PyObject *self, PyObject *ids) {
    Py_buffer view;
    if (PyObject_GetBuffer(ids, &view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (view.itemsize != 4 || view.format == NULL || strcmp(view.format, "I") != 0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_TypeError, "msgpack_u32 takes an array('I') of token ids");
        return NULL;
    }
    Py_ssize_t n = view.len / 4;
    if ((uint64_t)n > 0xffffffffULL) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "too many ids for one msgpack array");
        return NULL;
    }
    PyObject *result = PyBytes_FromStringAndSize(NULL, 5 + 5 * n);
    if (result == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    uint8_t *start = (uint8_t *)PyBytes_AS_STRING(result), *out = start;
    if (n < 16) {
        *out++ = (uint8_t)(0x90 | n);
    } else if (n < 65536) {
        *out++ = 0xdc;
        *out++ = (uint8_t)(n >> 8);
        *out++ = (uint8_t)n;
    } else {
        *out++ = 0xdd;
        *out++ = (uint8_t)(n >> 24);
        *out++ = (uint8_t)(n >> 16);
        *out++ = (uint8_t)(n >> 8);
        *out++ = (uint8_t)n;
    }
    const uint8_t *in = (const uint8_t *)view.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t x;
        memcpy(&x, in + 4 * i, 4);
        if (x < 0x80) {
            *out++ = (uint8_t)x;
        } else if (x < 0x100) {
            *out++ = 0xcc;
            *out++ = (uint8_t)x;
        } else if (x < 0x10000) {
            *out++ = 0xcd;
            *out++ = (uint8_t)(x >> 8);
            *out++ = (uint8_t)x;
        } else {
            *out++ = 0xce;
            *out++ = (uint8_t)(x >> 24);
            *out++ = (uint8_t)(x >> 16);
            *out++ = (uint8_t)(x >> 8);
            *out++ = (uint8_t)x;
        }
    }
    PyBuffer_Release(&view);
    if (_PyBytes_Resize(&result, out - start) < 0) return NULL;
    return result;
}

static PyMethodDef methods[] = {
    {"msgpack_u32", msgpack_u32, METH_O,
     "msgpack_u32(ids) -> the msgpack array of ints of an array('I'), as msgspec encodes it"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_packed_ids",
                                    "Packed token ids as msgpack, native.", -1, methods};

PyMODINIT_FUNC PyInit__packed_ids(void) { return PyModule_Create(&module); }
