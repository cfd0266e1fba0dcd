/* The block pool's per-block loops compiled: the same functions, arguments and results as the Python reference
 * in pool_loops.py, which builds this file at run time (CPython's C API, no other library) and checks it there
 * (tests/memory/test_pool_loops.py drives both on random pools and compares every list and map).
 *
 * The pool keeps its per-block state in Python lists indexed by block id (``refs``: reference counts,
 * ``hashes``: the key a block is cached under, or None) and its prefix cache in a dict (key -> block). A replay
 * with prefix caching moves millions of blocks through them; in Python each block costs a few bytecodes per list
 * or dict operation, here only the operations themselves.
 *
 * Sequences arrive as lists or tuples (PySequence_Fast: others are copied once). Every block id is checked against
 * the list it indexes (IndexError, as Python's would be); an error leaves the lists as the Python loop leaves them at
 * the same block.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *ZERO, *ONE;  /* the ints 0 and 1 (CPython's cached small ints) */

/* ``list[index]`` for a block id read from ``id``; -1 with IndexError or TypeError set where it is not one. */
static Py_ssize_t block_index(PyObject *list, PyObject *id) {
    Py_ssize_t index = PyLong_AsSsize_t(id);
    if (index == -1 && PyErr_Occurred())
        return -1;
    if (index < 0 || index >= PyList_GET_SIZE(list)) {
        PyErr_Format(PyExc_IndexError, "block %zd is not in the pool's lists of %zd", index, PyList_GET_SIZE(list));
        return -1;
    }
    return index;
}

/* list[index] = value (a new reference to value; the old item released). */
static void store(PyObject *list, Py_ssize_t index, PyObject *value) {
    Py_INCREF(value);
    PyList_SetItem(list, index, value);
}

static PyObject *enter_keys(PyObject *self, PyObject *args) {
    PyObject *refs, *hashes, *cached, *keys_arg, *table_arg;
    Py_ssize_t offset, start;
    if (!PyArg_ParseTuple(args, "OO!O!OOnn:enter_keys", &refs, &PyList_Type, &hashes, &PyDict_Type, &cached,
                          &keys_arg, &table_arg, &offset, &start))
        return NULL;
    int hold = refs != Py_None;
    if (hold && !PyList_Check(refs))
        return PyErr_Format(PyExc_TypeError, "enter_keys: refs must be a list or None");
    PyObject *keys = PySequence_Fast(keys_arg, "enter_keys: keys must be a sequence");
    if (keys == NULL)
        return NULL;
    PyObject *table = PySequence_Fast(table_arg, "enter_keys: table must be a sequence");
    if (table == NULL) {
        Py_DECREF(keys);
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(keys), i = start;
    if (offset < 0 || start < 0 || offset + n > PySequence_Fast_GET_SIZE(table)) {
        PyErr_Format(PyExc_IndexError, "enter_keys: %zd keys from %zd past the table's %zd blocks", n, offset,
                     PySequence_Fast_GET_SIZE(table));
        goto done;
    }
    for (; i < n; i++) {
        PyObject *key = PySequence_Fast_GET_ITEM(keys, i), *block = PySequence_Fast_GET_ITEM(table, offset + i);
        Py_ssize_t index = block_index(hashes, block);
        if (index < 0)
            goto done;
        if (hold) {
            if (block_index(refs, block) < 0)
                goto done;
            store(refs, index, ONE);
        }
        PyObject *old = PyList_GET_ITEM(hashes, index);
        if (old != Py_None && PyDict_DelItem(cached, old) < 0)
            goto done;
        store(hashes, index, key);
        PyObject *entry = PyDict_SetDefault(cached, key, block);  /* borrowed */
        if (entry == NULL)
            goto done;
        if (entry != block) {
            int same = PyObject_RichCompareBool(entry, block, Py_EQ);
            if (same < 0)
                goto done;
            if (!same)
                break;  /* the key has another block's entry: the caller's */
        }
    }
    result = PyLong_FromSsize_t(i);
done:
    Py_DECREF(keys);
    Py_DECREF(table);
    return result;
}

static PyObject *hold_evicting(PyObject *self, PyObject *args) {
    PyObject *refs, *hashes, *cached, *blocks_arg;
    if (!PyArg_ParseTuple(args, "O!O!O!O:hold_evicting", &PyList_Type, &refs, &PyList_Type, &hashes,
                          &PyDict_Type, &cached, &blocks_arg))
        return NULL;
    PyObject *blocks = PySequence_Fast(blocks_arg, "hold_evicting: blocks must be a sequence");
    if (blocks == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(blocks); i++) {
        PyObject *block = PySequence_Fast_GET_ITEM(blocks, i);
        Py_ssize_t index = block_index(refs, block);
        if (index < 0 || block_index(hashes, block) < 0)
            goto error;
        store(refs, index, ONE);
        PyObject *key = PyList_GET_ITEM(hashes, index);
        if (key != Py_None) {
            if (PyDict_DelItem(cached, key) < 0)
                goto error;
            store(hashes, index, Py_None);
        }
    }
    Py_DECREF(blocks);
    Py_RETURN_NONE;
error:
    Py_DECREF(blocks);
    return NULL;
}

static PyObject *free_unshared(PyObject *self, PyObject *args) {
    PyObject *refs, *blocks_arg;
    if (!PyArg_ParseTuple(args, "O!O:free_unshared", &PyList_Type, &refs, &blocks_arg))
        return NULL;
    PyObject *blocks = PySequence_Fast(blocks_arg, "free_unshared: blocks must be a sequence");
    if (blocks == NULL)
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(blocks), i = 0;
    for (; i < n; i++) {
        Py_ssize_t index = block_index(refs, PySequence_Fast_GET_ITEM(blocks, i));
        if (index < 0)
            goto done;
        PyObject *count = PyList_GET_ITEM(refs, index);
        if (count != ONE) {
            int once = PyObject_RichCompareBool(count, ONE, Py_EQ);
            if (once < 0)
                goto done;
            if (!once)
                break;  /* held by another table too: the caller's */
        }
        store(refs, index, ZERO);
    }
    result = PyLong_FromSsize_t(i);
done:
    Py_DECREF(blocks);
    return result;
}

static PyObject *set_refs(PyObject *self, PyObject *args) {
    PyObject *refs, *blocks_arg, *value;
    if (!PyArg_ParseTuple(args, "O!OO:set_refs", &PyList_Type, &refs, &blocks_arg, &value))
        return NULL;
    PyObject *blocks = PySequence_Fast(blocks_arg, "set_refs: blocks must be a sequence");
    if (blocks == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(blocks); i++) {
        Py_ssize_t index = block_index(refs, PySequence_Fast_GET_ITEM(blocks, i));
        if (index < 0) {
            Py_DECREF(blocks);
            return NULL;
        }
        store(refs, index, value);
    }
    Py_DECREF(blocks);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"enter_keys", enter_keys, METH_VARARGS, NULL},
    {"hold_evicting", hold_evicting, METH_VARARGS, NULL},
    {"free_unshared", free_unshared, METH_VARARGS, NULL},
    {"set_refs", set_refs, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_pool_loops", .m_doc = NULL, .m_size = -1, .m_methods = methods,
};

PyMODINIT_FUNC PyInit__pool_loops(void) {
    ZERO = PyLong_FromLong(0);
    ONE = PyLong_FromLong(1);
    if (ZERO == NULL || ONE == NULL)
        return NULL;
    return PyModule_Create(&module);
}
