/* The KV allocator's whole-page slot lists, native (see slot_pages.py for the contract).
 *
 * A page's slots are one tuple of the allocator's page table. ``slots_of`` joins the tuples of
 * some pages into one list sized once; ``whole_pages`` recognises a list of whole pages by
 * comparing each slot with the page table's slot object (by identity, by value if another
 * int object), reading one slot's value per page. No library beyond Python's. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* slots_of(table, pages) -> the slots of every page of ``pages`` in order, as one list. */
static PyObject *slots_of(PyObject *self, PyObject *args) {
    PyObject *table, *pages;
    if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &table, &PyList_Type, &pages))
        return NULL;
    Py_ssize_t num_pages = PyList_GET_SIZE(pages), rows = PyList_GET_SIZE(table), total = 0;
    for (Py_ssize_t j = 0; j < num_pages; j++) {
        Py_ssize_t p = PyLong_AsSsize_t(PyList_GET_ITEM(pages, j));
        if (p == -1 && PyErr_Occurred()) return NULL;
        if (p < 0 || p >= rows) {
            PyErr_SetString(PyExc_IndexError, "page outside the page table");
            return NULL;
        }
        PyObject *row = PyList_GET_ITEM(table, p);
        if (!PyTuple_Check(row)) {
            PyErr_SetString(PyExc_TypeError, "the page table holds tuples of slots");
            return NULL;
        }
        total += PyTuple_GET_SIZE(row);
    }
    PyObject *out = PyList_New(total);
    if (out == NULL) return NULL;
    /* Creating the list may run a collection, and a finalizer may change the lists: check
     * again while filling it. */
    Py_ssize_t k = 0;
    for (Py_ssize_t j = 0; j < num_pages; j++) {
        if (j >= PyList_GET_SIZE(pages)) goto changed;
        Py_ssize_t p = PyLong_AsSsize_t(PyList_GET_ITEM(pages, j));
        if (p < 0 || p >= PyList_GET_SIZE(table)) goto changed;
        PyObject *row = PyList_GET_ITEM(table, p);
        if (!PyTuple_Check(row)) goto changed;
        Py_ssize_t n = PyTuple_GET_SIZE(row);
        if (k + n > total) goto changed;
        for (Py_ssize_t r = 0; r < n; r++) {
            PyObject *slot = PyTuple_GET_ITEM(row, r);
            Py_INCREF(slot);
            PyList_SET_ITEM(out, k++, slot);
        }
    }
    if (k == total) return out;
changed:
    Py_DECREF(out);
    PyErr_Clear();
    PyErr_SetString(PyExc_RuntimeError, "the page table or the pages changed during slots_of");
    return NULL;
}

/* whole_pages(indices, table, page_size[, ids]) -> the pages of ``indices`` in order if it
 * lists whole pages slot by slot; False if it does not; None if an item that decides it is not
 * an exact int (the caller decides those its own way). With ``ids`` (``ids[p] == p``), page
 * ``p`` is given as the object ``ids[p]`` instead of a new int. */
static PyObject *whole_pages(PyObject *self, PyObject *args) {
    PyObject *indices, *table, *ids = NULL;
    Py_ssize_t page_size;
    if (!PyArg_ParseTuple(args, "O!O!n|O!", &PyList_Type, &indices, &PyList_Type, &table,
                          &page_size, &PyList_Type, &ids))
        return NULL;
    if (page_size < 1) {
        PyErr_SetString(PyExc_ValueError, "page_size must be at least 1");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(indices), rows = PyList_GET_SIZE(table);
    if (n == 0 || n % page_size) Py_RETURN_FALSE;
    Py_ssize_t num_pages = n / page_size;
    /* Each page's first slot is read anyway; another slot only when it is not the table's. */
    for (Py_ssize_t j = 0; j < num_pages; j++)
        if (!PyLong_CheckExact(PyList_GET_ITEM(indices, j * page_size))) Py_RETURN_NONE;
    PyObject *pages = PyList_New(num_pages);
    if (pages == NULL) return NULL;
    for (Py_ssize_t j = 0; j < num_pages; j++) {
        PyObject **slots = &PyList_GET_ITEM(indices, j * page_size);
        int overflow;
        long long first = PyLong_AsLongLongAndOverflow(slots[0], &overflow);
        if (overflow || first < 0 || first % page_size || first / page_size >= rows) goto no;
        Py_ssize_t p = (Py_ssize_t)(first / page_size);
        PyObject *row = PyList_GET_ITEM(table, p);
        if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) != page_size) goto no;
        for (Py_ssize_t r = 0; r < page_size; r++) {
            PyObject *own = PyTuple_GET_ITEM(row, r);
            if (slots[r] == own) continue;
            if (!PyLong_CheckExact(slots[r])) {
                Py_DECREF(pages);
                Py_RETURN_NONE;
            }
            long long value = PyLong_AsLongLongAndOverflow(slots[r], &overflow);
            if (overflow || value != first + r) goto no;
        }
        PyObject *page;
        if (ids != NULL && p < PyList_GET_SIZE(ids)) {
            page = PyList_GET_ITEM(ids, p);
            Py_INCREF(page);
        } else {
            page = PyLong_FromSsize_t(p);
        }
        if (page == NULL) {
            Py_DECREF(pages);
            return NULL;
        }
        PyList_SET_ITEM(pages, j, page);
    }
    return pages;
no:
    Py_DECREF(pages);
    Py_RETURN_FALSE;
}

static PyMethodDef methods[] = {
    {"slots_of", slots_of, METH_VARARGS,
     "slots_of(table, pages) -> the slots of the pages in order, as one list"},
    {"whole_pages", whole_pages, METH_VARARGS,
     "whole_pages(indices, table, page_size[, ids]) -> the pages if indices lists whole "
     "pages, "
     "False if not, None if an item is not an exact int"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_slot_pages",
                                    "The KV allocator's whole-page slot lists, native.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__slot_pages(void) { return PyModule_Create(&module); }
