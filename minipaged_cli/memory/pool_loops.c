/* The memory plane's hottest loops compiled: the same functions, arguments and results as the Python reference
 * in pool_loops.py, which builds this file at run time (CPython's C API, no other library) and checks it there
 * (tests/memory/test_pool_loops.py drives both on random pools and sequences and compares every list, map and
 * length).
 *
 * The pool keeps its per-block state in Python lists indexed by block id (``refs``: reference counts,
 * ``hashes``: the key a block is cached under, or None) and its prefix cache in a dict (key -> block). A replay
 * with prefix caching moves millions of blocks through them; in Python each block costs a few bytecodes per list
 * or dict operation, here only the operations themselves; and they fetch the memory of the blocks ahead (below).
 * grow_lengths, and the passes after it (fill_keys, hand_out, fill_blocks), read and write a SequenceState's slots
 * through their member definitions (bound once), at their offsets, without a lookup or a call per sequence.
 * full_attention_profile is bulk.py's NumPy profile of a bulk decode (a handful of steps: NumPy's calls cost more
 * than their arithmetic), checked against it by tests/memory/test_bulk.py; its loop (full_attention_steps.h) is a
 * replay's decode_run's too (sim/request_loops.c).
 *
 * take_into, cache_into, release_into and grow_batch run a whole call of the pool or the growth (BlockPool.take,
 * BlockPool.cache_fresh, a sequence's release_split, batched_growth.grow_together) where the pool is in its usual
 * case, reading and writing its attributes by name as Python does: a replay makes hundreds of thousands of those
 * calls, each a handful of Python frames around the loops above. Where it is not, they answer False with nothing
 * changed and the pool's own path runs; that path is their reference (pool_loops.py's answer False, always), and
 * tests/memory/test_take_into.py and the growth's tests drive both and compare the pools.
 *
 * Sequences arrive as lists or tuples (PySequence_Fast: others are copied once). Every block id is checked against
 * the list it indexes (IndexError, as Python's would be); an error leaves the lists as the Python loop leaves them at
 * the same block.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "full_attention_steps.h"

static PyObject *ZERO, *ONE;  /* the ints 0 and 1 (CPython's cached small ints) */
static PyObject *PRIVATE;  /* pool_loops.PRIVATE (bind_private): a key carried without an entry */

/* Whether ``index`` (a block id) is in ``list``; 0 with IndexError set where it is not. */
static int in_list(PyObject *list, Py_ssize_t index) {
    if (index >= 0 && index < PyList_GET_SIZE(list))
        return 1;
    PyErr_Format(PyExc_IndexError, "block %zd is not in the pool's lists of %zd", index, PyList_GET_SIZE(list));
    return 0;
}

/* ``list[index]`` for a block id read from ``id``; -1 with IndexError or TypeError set where it is not one. */
static Py_ssize_t block_index(PyObject *list, PyObject *id) {
    Py_ssize_t index = PyLong_AsSsize_t(id);
    if (index == -1 && PyErr_Occurred())
        return -1;
    return in_list(list, index) ? index : -1;
}

/* Prefetches, so that a loop over blocks (a pool of tens of thousands, or a fleet's pools together: their lists, ids
 * and keys are scattered in memory) asks for the memory of the blocks ahead while it works on this one. None changes
 * anything or raises. (On one pool small enough to stay in the core's cache they cost a little: about 0.5% of a
 * replay of 3,640 blocks.) */
#define AHEAD 8  /* blocks: the id's int object is fetched AHEAD blocks ahead, its list slots AHEAD / 2 */
#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(address, ...) __builtin_prefetch(address, ##__VA_ARGS__)
#else
#define PREFETCH(address, ...) ((void)(address))  /* (a compiler without it: the same loops, unfetched) */
#endif

/* The block id ``id`` where it is an int indexing ``list``; -1 else (no error set). */
static Py_ssize_t peek_index(PyObject *list, PyObject *id) {
    if (!PyLong_CheckExact(id))
        return -1;
    Py_ssize_t index = PyLong_AsSsize_t(id);
    if (index == -1 && PyErr_Occurred())
        PyErr_Clear();
    return index >= 0 && index < PyList_GET_SIZE(list) ? index : -1;
}

/* Block ``i`` of ``blocks`` is next: fetch the int of block i + AHEAD, and the slots of block i + AHEAD / 2 in
 * ``first`` and ``second`` (NULL: none). */
static void prefetch(PyObject *blocks, Py_ssize_t i, Py_ssize_t n, PyObject *first, PyObject *second) {
    if (i + AHEAD < n)
        PREFETCH(PySequence_Fast_GET_ITEM(blocks, i + AHEAD));
    if (i + AHEAD / 2 < n) {
        Py_ssize_t index = peek_index(first, PySequence_Fast_GET_ITEM(blocks, i + AHEAD / 2));
        if (index >= 0) {
            PREFETCH(&PyList_GET_ITEM(first, index), 1);
            if (second != NULL && index < PyList_GET_SIZE(second))
                PREFETCH(&PyList_GET_ITEM(second, index), 1);
        }
    }
}

/* The key block i + 2 carries in ``hashes`` (its slot fetched two blocks ago), fetched. */
static void prefetch_key(PyObject *blocks, Py_ssize_t i, Py_ssize_t n, PyObject *hashes) {
    if (i + 2 < n) {
        Py_ssize_t index = peek_index(hashes, PySequence_Fast_GET_ITEM(blocks, i + 2));
        if (index >= 0)
            PREFETCH(PyList_GET_ITEM(hashes, index));
    }
}

/* list[index] = value (a new reference to value; the old item released). */
static void store(PyObject *list, Py_ssize_t index, PyObject *value) {
    Py_INCREF(value);
    PyList_SetItem(list, index, value);
}

/* enter_keys' loop over keys[start:] (``keys`` and ``table`` lists or tuples): where it stopped; -1 with an error set. */
static Py_ssize_t enter_run(PyObject *hashes, PyObject *cached, PyObject *keys, PyObject *table, Py_ssize_t offset,
                            Py_ssize_t start) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(keys), i = start;
    if (offset < 0 || start < 0 || offset + n > PySequence_Fast_GET_SIZE(table)) {
        PyErr_Format(PyExc_IndexError, "enter_keys: %zd keys from %zd past the table's %zd blocks", n, offset,
                     PySequence_Fast_GET_SIZE(table));
        return -1;
    }
    for (; i < n; i++) {
        prefetch(table, offset + i, offset + n, hashes, NULL);
        prefetch_key(table, offset + i, offset + n, hashes);
        PyObject *key = PySequence_Fast_GET_ITEM(keys, i), *block = PySequence_Fast_GET_ITEM(table, offset + i);
        Py_ssize_t index = block_index(hashes, block);
        if (index < 0)
            return -1;
        PyObject *old = PyList_GET_ITEM(hashes, index);
        if (old != Py_None && old != PRIVATE && PyDict_DelItem(cached, old) < 0)
            return -1;
        store(hashes, index, key);
        if (key == PRIVATE)
            continue;
        PyObject *entry = PyDict_SetDefault(cached, key, block);  /* borrowed */
        if (entry == NULL)
            return -1;
        if (entry != block) {
            int same = PyObject_RichCompareBool(entry, block, Py_EQ);
            if (same < 0)
                return -1;
            if (!same)
                break;  /* the key has another block's entry: the caller's */
        }
    }
    return i;
}

static PyObject *enter_keys(PyObject *self, PyObject *args) {
    PyObject *hashes, *cached, *keys_arg, *table_arg;
    Py_ssize_t offset, start;
    if (!PyArg_ParseTuple(args, "O!O!OOnn:enter_keys", &PyList_Type, &hashes, &PyDict_Type, &cached, &keys_arg,
                          &table_arg, &offset, &start))
        return NULL;
    PyObject *keys = PySequence_Fast(keys_arg, "enter_keys: keys must be a sequence");
    if (keys == NULL)
        return NULL;
    PyObject *table = PySequence_Fast(table_arg, "enter_keys: table must be a sequence");
    if (table == NULL) {
        Py_DECREF(keys);
        return NULL;
    }
    Py_ssize_t stopped = enter_run(hashes, cached, keys, table, offset, start);
    Py_DECREF(keys);
    Py_DECREF(table);
    return stopped < 0 ? NULL : PyLong_FromSsize_t(stopped);
}

/* name_private: each of ``blocks`` that carries PRIVATE in ``hashes`` takes its key in ``keys`` (the same place) and
 * becomes its entry in ``cached``; where the two differ in length, those the shorter reaches, then ValueError (as
 * zip's strict). */
static PyObject *name_private(PyObject *self, PyObject *args) {
    PyObject *hashes, *cached, *keys_arg, *blocks_arg;
    if (!PyArg_ParseTuple(args, "O!O!OO:name_private", &PyList_Type, &hashes, &PyDict_Type, &cached, &keys_arg,
                          &blocks_arg))
        return NULL;
    PyObject *keys = PySequence_Fast(keys_arg, "name_private: keys must be a sequence");
    PyObject *blocks = keys == NULL ? NULL : PySequence_Fast(blocks_arg, "name_private: blocks must be a sequence");
    PyObject *result = NULL;
    if (blocks == NULL)
        goto done;
    Py_ssize_t num_keys = PySequence_Fast_GET_SIZE(keys), num_blocks = PySequence_Fast_GET_SIZE(blocks);
    Py_ssize_t n = num_keys < num_blocks ? num_keys : num_blocks;
    for (Py_ssize_t i = 0; i < n; i++) {
        prefetch(blocks, i, n, hashes, NULL);
        PyObject *key = PySequence_Fast_GET_ITEM(keys, i), *block = PySequence_Fast_GET_ITEM(blocks, i);
        Py_ssize_t index = block_index(hashes, block);
        if (index < 0)
            goto done;
        if (PyList_GET_ITEM(hashes, index) != PRIVATE)
            continue;
        store(hashes, index, key);
        if (PyDict_SetItem(cached, key, block) < 0)
            goto done;
    }
    if (num_keys != num_blocks) {
        PyErr_Format(PyExc_ValueError, "name_private: %zd keys for %zd blocks", num_keys, num_blocks);
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(keys);
    Py_XDECREF(blocks);
    return result;
}

/* hold_evicting's loop over blocks[start:n] (a list or tuple): how many carried a key; -1 with an error set. */
static Py_ssize_t evict_held(PyObject *refs, PyObject *hashes, PyObject *cached, PyObject *blocks, Py_ssize_t start,
                             Py_ssize_t n) {
    Py_ssize_t keyed = 0;
    for (Py_ssize_t i = start; i < n; i++) {
        prefetch(blocks, i, n, hashes, refs);
        prefetch_key(blocks, i, n, hashes);
        PyObject *block = PySequence_Fast_GET_ITEM(blocks, i);
        Py_ssize_t index = block_index(refs, block);
        if (index < 0 || !in_list(hashes, index))
            return -1;
        store(refs, index, ONE);
        PyObject *key = PyList_GET_ITEM(hashes, index);
        if (key != Py_None) {
            if (key != PRIVATE && PyDict_DelItem(cached, key) < 0)
                return -1;
            store(hashes, index, Py_None);
            keyed++;
        }
    }
    return keyed;
}

static PyObject *hold_evicting(PyObject *self, PyObject *args) {
    PyObject *refs, *hashes, *cached, *blocks_arg;
    if (!PyArg_ParseTuple(args, "O!O!O!O:hold_evicting", &PyList_Type, &refs, &PyList_Type, &hashes,
                          &PyDict_Type, &cached, &blocks_arg))
        return NULL;
    PyObject *blocks = PySequence_Fast(blocks_arg, "hold_evicting: blocks must be a sequence");
    if (blocks == NULL)
        return NULL;
    Py_ssize_t keyed = evict_held(refs, hashes, cached, blocks, 0, PySequence_Fast_GET_SIZE(blocks));
    Py_DECREF(blocks);
    return keyed < 0 ? NULL : PyLong_FromSsize_t(keyed);
}

/* free_unshared's loop over ``blocks`` (a list or tuple): where it stopped; -1 with an error set. */
static Py_ssize_t free_held_once(PyObject *refs, PyObject *blocks) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(blocks), i = 0;
    for (; i < n; i++) {
        prefetch(blocks, i, n, refs, NULL);
        Py_ssize_t index = block_index(refs, PySequence_Fast_GET_ITEM(blocks, i));
        if (index < 0)
            return -1;
        PyObject *count = PyList_GET_ITEM(refs, index);
        if (count != ONE) {
            int once = PyObject_RichCompareBool(count, ONE, Py_EQ);
            if (once < 0)
                return -1;
            if (!once)
                break;  /* held by another table too: the caller's */
        }
        store(refs, index, ZERO);
    }
    return i;
}

static PyObject *free_unshared(PyObject *self, PyObject *args) {
    PyObject *refs, *blocks_arg;
    if (!PyArg_ParseTuple(args, "O!O:free_unshared", &PyList_Type, &refs, &blocks_arg))
        return NULL;
    PyObject *blocks = PySequence_Fast(blocks_arg, "free_unshared: blocks must be a sequence");
    if (blocks == NULL)
        return NULL;
    Py_ssize_t stopped = free_held_once(refs, blocks);
    Py_DECREF(blocks);
    return stopped < 0 ? NULL : PyLong_FromSsize_t(stopped);
}

static PyObject *lookup(PyObject *self, PyObject *args) {
    PyObject *cached, *keys_arg;
    if (!PyArg_ParseTuple(args, "O!O:lookup", &PyDict_Type, &cached, &keys_arg))
        return NULL;
    PyObject *keys = PyObject_GetIter(keys_arg);  /* (walked up to the first miss, not listed) */
    if (keys == NULL)
        return NULL;
    PyObject *hits = PyList_New(0), *key;
    while (hits != NULL && (key = PyIter_Next(keys)) != NULL) {
        PyObject *block = PyDict_GetItemWithError(cached, key);  /* borrowed */
        Py_DECREF(key);
        if (block == NULL || block == Py_None)  /* (a miss ends the hit; an error, the call) */
            break;
        if (PyList_Append(hits, block) < 0)
            Py_CLEAR(hits);
    }
    Py_DECREF(keys);
    if (PyErr_Occurred())
        Py_CLEAR(hits);
    return hits;
}

static PyObject *add_references(PyObject *self, PyObject *args) {
    PyObject *refs, *blocks_arg;
    if (!PyArg_ParseTuple(args, "O!O:add_references", &PyList_Type, &refs, &blocks_arg))
        return NULL;
    PyObject *blocks = PySequence_Fast(blocks_arg, "add_references: blocks must be a sequence");
    if (blocks == NULL)
        return NULL;
    PyObject *revived = PyList_New(0);
    Py_ssize_t num_shared = 0, n = PySequence_Fast_GET_SIZE(blocks);
    for (Py_ssize_t i = 0; revived != NULL && i < n; i++) {
        PyObject *block = PySequence_Fast_GET_ITEM(blocks, i);
        Py_ssize_t index = block_index(refs, block);
        int held = index < 0 ? -1 : PyObject_IsTrue(PyList_GET_ITEM(refs, index));
        PyObject *more = held < 0 ? NULL : PyNumber_Add(PyList_GET_ITEM(refs, index), ONE);
        if (more == NULL || (!held && PyList_Append(revived, block) < 0)) {
            Py_XDECREF(more);
            Py_CLEAR(revived);
            break;
        }
        num_shared += held;
        PyList_SetItem(refs, index, more);  /* (takes ``more``, releases the old count) */
    }
    Py_DECREF(blocks);
    return revived == NULL ? NULL : Py_BuildValue("(Nn)", revived, num_shared);
}

/* set_refs' loop over blocks[:n] (a list or tuple): each one's count ``value``; -1 with an error set. */
static int set_each(PyObject *refs, PyObject *blocks, Py_ssize_t n, PyObject *value) {
    for (Py_ssize_t i = 0; i < n; i++) {
        prefetch(blocks, i, n, refs, NULL);
        Py_ssize_t index = block_index(refs, PySequence_Fast_GET_ITEM(blocks, i));
        if (index < 0)
            return -1;
        store(refs, index, value);
    }
    return 0;
}

static PyObject *set_refs(PyObject *self, PyObject *args) {
    PyObject *refs, *blocks_arg, *value;
    if (!PyArg_ParseTuple(args, "O!OO:set_refs", &PyList_Type, &refs, &blocks_arg, &value))
        return NULL;
    PyObject *blocks = PySequence_Fast(blocks_arg, "set_refs: blocks must be a sequence");
    if (blocks == NULL)
        return NULL;
    int failed = set_each(refs, blocks, PySequence_Fast_GET_SIZE(blocks), value);
    Py_DECREF(blocks);
    return failed ? NULL : Py_NewRef(Py_None);
}

/* SequenceState's slots that grow_lengths and the passes after it read and write, bound once (bind_sequence_state): a
 * slot is read and written through its member definition, without a lookup by name per sequence. */
static PyTypeObject *STATE_TYPE;
static PyMemberDef *LENGTH, *COMPUTED, *LOADING, *HELD, *CACHED_BLOCKS, *BLOCK_HASHES, *BLOCK_TABLES, *FINAL, *SEQUENCE_ID,
                   *CACHED_TOKENS, *NULLS;

static PyMemberDef *slot(PyObject *cls, const char *name) {
    PyObject *descriptor = PyObject_GetAttrString(cls, name);
    if (descriptor == NULL)
        return NULL;
    PyMemberDef *member = NULL;
    if (Py_IS_TYPE(descriptor, &PyMemberDescr_Type))
        member = ((PyMemberDescrObject *)descriptor)->d_member;  /* (the class keeps its descriptor alive) */
    if (member != NULL && (member->type != T_OBJECT_EX || member->flags & READONLY))
        member = NULL;  /* (slot_value and set_slot read and write an object's pointer at the slot's offset) */
    if (member == NULL)
        PyErr_Format(PyExc_TypeError, "%s is not a writable slot of the sequence state", name);
    Py_DECREF(descriptor);
    return member;
}

/* The allocators' Holding (bind_holding): a grow_batch's sequence may be named by a holding, its id read from its
 * ``sequence_id`` slot (NULL: none bound, every item an id). */
static PyTypeObject *HOLDING_TYPE;
static PyMemberDef *HOLDING_ID;

static PyObject *bind_holding(PyObject *self, PyObject *cls) {
    if (!PyType_Check(cls))
        return PyErr_Format(PyExc_TypeError, "bind_holding takes the class");
    if (!(HOLDING_ID = slot(cls, "sequence_id")))
        return NULL;
    Py_INCREF(cls);
    Py_XSETREF(HOLDING_TYPE, (PyTypeObject *)cls);
    Py_RETURN_NONE;
}

static PyObject *bind_sequence_state(PyObject *self, PyObject *cls) {
    if (!PyType_Check(cls))
        return PyErr_Format(PyExc_TypeError, "bind_sequence_state takes the class");
    /* (new_state sets these 11 slots: a state of more would leave one unset) */
    PyObject *slots = PyObject_GetAttrString(cls, "__slots__");
    Py_ssize_t num_slots = slots == NULL ? -1 : PyObject_Length(slots);
    Py_XDECREF(slots);
    if (num_slots < 0)
        return NULL;
    if (num_slots != 11)
        return PyErr_Format(PyExc_TypeError, "the sequence state has %zd slots where create_into's new_state sets 11: "
                            "set the new ones there", num_slots);
    if (!(LENGTH = slot(cls, "sequence_length")) || !(COMPUTED = slot(cls, "num_computed_tokens")) ||
        !(LOADING = slot(cls, "num_loading_tokens")) || !(HELD = slot(cls, "num_held_blocks")) ||
        !(CACHED_BLOCKS = slot(cls, "num_cached_blocks")) || !(BLOCK_HASHES = slot(cls, "block_hashes")) ||
        !(BLOCK_TABLES = slot(cls, "block_tables")) || !(FINAL = slot(cls, "final_length")) ||
        !(SEQUENCE_ID = slot(cls, "sequence_id")) || !(CACHED_TOKENS = slot(cls, "num_cached_tokens")) ||
        !(NULLS = slot(cls, "num_null")))
        return NULL;
    Py_INCREF(cls);
    Py_XSETREF(STATE_TYPE, (PyTypeObject *)cls);
    Py_RETURN_NONE;
}

/* A bound slot's value in ``state``, borrowed (the state holds it): PyMember_GetOne's read of a T_OBJECT_EX slot,
 * without its call and reference; NULL with AttributeError set where the slot is unset. */
static PyObject *slot_value(PyObject *state, PyMemberDef *member) {
    PyObject *value = *(PyObject **)((char *)state + member->offset);
    if (value == NULL)
        PyErr_Format(PyExc_AttributeError, "'%s' object has no attribute '%s'", Py_TYPE(state)->tp_name,
                     member->name);
    return value;
}

/* A bound slot of ``state`` set to ``value`` (PyMember_SetOne's write of a T_OBJECT_EX slot, which cannot fail). */
static void set_slot(PyObject *state, PyMemberDef *member, PyObject *value) {
    Py_XSETREF(*(PyObject **)((char *)state + member->offset), Py_NewRef(value));
}

/* ``value`` as a long long (PyLong_AsLongLong), held while another type's __index__ runs. */
static long long as_long(PyObject *value) {
    if (PyLong_CheckExact(value))
        return PyLong_AsLongLong(value);
    Py_INCREF(value);
    long long number = PyLong_AsLongLong(value);
    Py_DECREF(value);
    return number;
}

/* The int in a slot of ``state`` (-1 with an error set where it is none, or not an int below 2**63). */
static long long read_int(PyObject *state, PyMemberDef *member) {
    PyObject *value = slot_value(state, member);
    return value == NULL ? -1 : as_long(value);
}

/* Both lengths of each of ``states[:count]`` moved by ``delta`` (all their tokens computed). */
static int move_lengths(PyObject *states, Py_ssize_t count, long long delta) {
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *state = PyList_GET_ITEM(states, i);
        long long length = read_int(state, LENGTH);
        if (length == -1 && PyErr_Occurred())
            return -1;
        PyObject *moved = PyLong_FromLongLong(length + delta);
        if (moved == NULL)
            return -1;
        set_slot(state, LENGTH, moved);
        set_slot(state, COMPUTED, moved);
        Py_DECREF(moved);
    }
    return 0;
}

/* ``state.<member>[group]`` as an int (-1 with an error set where it fails). */
static long long read_item(PyObject *state, PyMemberDef *member, Py_ssize_t group) {
    PyObject *items = slot_value(state, member);
    if (items == NULL)
        return -1;
    if (PyList_CheckExact(items) && group >= 0 && group < PyList_GET_SIZE(items))  /* (the manager's lists) */
        return as_long(PyList_GET_ITEM(items, group));
    PyObject *item = PySequence_GetItem(items, group);
    if (item == NULL)
        return -1;
    long long number = PyLong_AsLongLong(item);
    Py_DECREF(item);
    return number;
}

/* One pass of grow_lengths over a step's sequences: their states in order, and its takes and fills as indices into
 * them (grow_lengths hands them to Python as (state, number) pairs; grow_batch reads them here). */
typedef struct {
    PyObject *states;  /* every sequence's state, in order */
    Py_ssize_t num_grown, num_takes, num_fills;
    long long num_taken;
    Py_ssize_t *take_at, *fill_at;  /* a take's or a fill's state: its index in ``states`` */
    long long *take_count, *fill_stop;  /* a take's blocks per group; a fill's stop */
} Growth;

static void growth_clear(Growth *growth) {
    Py_CLEAR(growth->states);
    PyMem_Free(growth->take_at);
    PyMem_Free(growth->fill_at);
    PyMem_Free(growth->take_count);
    PyMem_Free(growth->fill_stop);
    growth->take_at = growth->fill_at = NULL;
    growth->take_count = growth->fill_stop = NULL;
}

/* grow_lengths into ``growth`` (growth_clear it after, whatever the answer): 1 where they grew, 0 where the answer
 * is None (an unknown sequence, one reserved ahead or loading: nothing changed), -1 with an error set. ``holdings``:
 * an item may be a holding (bind_holding), its id read from its slot (grow_batch's; grow_lengths takes ids, as its
 * Python twin). */
static int grow_states(Growth *growth, PyObject *sequences, PyObject *ids_arg, int holdings, long long num_tokens,
                       long long block_size, long long num_groups, long long num_free, Py_ssize_t cached_group) {
    *growth = (Growth){0};
    if (STATE_TYPE == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "grow_lengths: bind_sequence_state first");
        return -1;
    }
    PyObject *ids = PySequence_Fast(ids_arg, "grow_lengths: sequence_ids must be a sequence");
    if (ids == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(ids);
    int answer = -1;
    growth->take_at = PyMem_New(Py_ssize_t, n + 1);
    growth->fill_at = PyMem_New(Py_ssize_t, n + 1);
    growth->take_count = PyMem_New(long long, n + 1);
    growth->fill_stop = PyMem_New(long long, n + 1);
    if (!growth->take_at || !growth->fill_at || !growth->take_count || !growth->fill_stop) {
        PyErr_NoMemory();
        goto done;
    }
    PyObject *states = growth->states = PyList_New(n);
    if (states == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *id = PySequence_Fast_GET_ITEM(ids, i);  /* (a holding: the id in its slot) */
        if (holdings && HOLDING_TYPE != NULL && PyObject_TypeCheck(id, HOLDING_TYPE) &&
                !(id = slot_value(id, HOLDING_ID)))
            goto done;
        PyObject *state = PyDict_GetItemWithError(sequences, id);  /* borrowed */
        if (state == NULL) {
            if (!PyErr_Occurred())
                answer = 0;  /* an unknown sequence: the caller's ``grow`` raises */
            goto done;
        }
        if (!Py_IS_TYPE(state, STATE_TYPE)) {
            PyErr_Format(PyExc_TypeError, "grow_lengths: a %s, not the bound sequence state", Py_TYPE(state)->tp_name);
            goto done;
        }
        PyList_SET_ITEM(states, i, Py_NewRef(state));
    }
    growth->num_grown = n;
    for (Py_ssize_t done = 0; done < n; done++) {
        PyObject *state = PyList_GET_ITEM(states, done);
        long long length, computed, loading, held;  /* (each read checked: no call with an error pending) */
        if (((length = read_int(state, LENGTH)) == -1 && PyErr_Occurred()) ||
            ((computed = read_int(state, COMPUTED)) == -1 && PyErr_Occurred()) ||
            ((loading = read_int(state, LOADING)) == -1 && PyErr_Occurred()) ||
            ((held = read_int(state, HELD)) == -1 && PyErr_Occurred()))
            goto done;
        if (computed != length || loading) {  /* reserved ahead, loading: ``grow``, one at a time */
            if (move_lengths(states, done, -num_tokens) == 0)
                answer = 0;
            goto done;
        }
        long long new_length = length + num_tokens;
        if (new_length * num_groups > held * block_size) {
            long long per_group = (new_length + block_size - 1) / block_size - held / num_groups;
            if (growth->num_taken + per_group * num_groups > num_free) {
                growth->num_grown = done;  /* (one at a time, this one's take fails: it and the rest stay) */
                break;
            }
            growth->num_taken += per_group * num_groups;
            growth->take_at[growth->num_takes] = done;
            growth->take_count[growth->num_takes++] = per_group;
        }
        if (cached_group >= 0) {
            long long num_cached = read_item(state, CACHED_BLOCKS, cached_group);
            if (num_cached == -1 && PyErr_Occurred())
                goto done;
            if (new_length / block_size > num_cached) {
                PyObject *hashes = PyMember_GetOne((const char *)state, BLOCK_HASHES);
                Py_ssize_t num_hashes = hashes == NULL ? -1 : PyObject_Length(hashes);
                Py_XDECREF(hashes);
                if (num_hashes < 0)
                    goto done;
                growth->fill_at[growth->num_fills] = done;
                growth->fill_stop[growth->num_fills++] =
                    new_length / block_size < num_hashes ? new_length / block_size : num_hashes;
            }
        }
        PyObject *grown = PyLong_FromLongLong(new_length);
        if (grown == NULL)
            goto done;
        set_slot(state, LENGTH, grown);
        set_slot(state, COMPUTED, grown);
        Py_DECREF(grown);
    }
    answer = 1;
done:
    Py_DECREF(ids);
    return answer;
}

/* A growth's takes or fills as grow_lengths lists them: (state, number) pairs. */
static PyObject *growth_pairs(Growth *growth, Py_ssize_t *at, long long *numbers, Py_ssize_t count) {
    PyObject *pairs = PyList_New(count);
    for (Py_ssize_t i = 0; pairs != NULL && i < count; i++) {
        PyObject *item = Py_BuildValue("(OL)", PyList_GET_ITEM(growth->states, at[i]), numbers[i]);
        if (item == NULL)
            Py_CLEAR(pairs);
        else
            PyList_SET_ITEM(pairs, i, item);
    }
    return pairs;
}

static PyObject *grow_lengths_of(PyObject *sequences, PyObject *ids, long long num_tokens, long long block_size,
                                 long long num_groups, long long num_free, Py_ssize_t cached_group) {
    Growth growth;
    PyObject *result = NULL, *takes = NULL, *fills = NULL;
    int grew = grow_states(&growth, sequences, ids, 0, num_tokens, block_size, num_groups, num_free, cached_group);
    if (grew == 0)
        result = Py_NewRef(Py_None);
    else if (grew == 1 &&
             (takes = growth_pairs(&growth, growth.take_at, growth.take_count, growth.num_takes)) != NULL &&
             (fills = growth_pairs(&growth, growth.fill_at, growth.fill_stop, growth.num_fills)) != NULL)
        result = Py_BuildValue("(OnLOO)", growth.states, growth.num_grown, growth.num_taken, takes, fills);
    Py_XDECREF(takes);
    Py_XDECREF(fills);
    growth_clear(&growth);
    return result;
}

static PyObject *grow_lengths(PyObject *self, PyObject *args) {
    PyObject *sequences, *ids;
    long long num_tokens, block_size, num_groups, num_free;
    Py_ssize_t cached_group;
    if (!PyArg_ParseTuple(args, "O!OLLLLn:grow_lengths", &PyDict_Type, &sequences, &ids, &num_tokens, &block_size,
                          &num_groups, &num_free, &cached_group))
        return NULL;
    return grow_lengths_of(sequences, ids, num_tokens, block_size, num_groups, num_free, cached_group);
}

/* A pair (state, number) of grow_lengths' takes or fills: the state (borrowed; TypeError where it is not the bound
 * sequence state) and the number. NULL with an error set where the pair is not one. */
static PyObject *pair(PyObject *item, long long *number) {
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2)
        return PyErr_Format(PyExc_TypeError, "expected (state, int) pairs");
    PyObject *state = PyTuple_GET_ITEM(item, 0);
    if (STATE_TYPE == NULL || !Py_IS_TYPE(state, STATE_TYPE))
        return PyErr_Format(PyExc_TypeError, "a %s, not the bound sequence state", Py_TYPE(state)->tp_name);
    *number = PyLong_AsLongLong(PyTuple_GET_ITEM(item, 1));
    return *number == -1 && PyErr_Occurred() ? NULL : state;
}

/* ``state.<member>[start:stop]`` (or ``state.<member>[group][start:stop]`` where ``group`` >= 0) added to the end of
 * ``out``; -1 with an error set where it fails. */
static int extend_by_slice(PyObject *out, PyObject *state, PyMemberDef *member, Py_ssize_t group, long long start,
                           long long stop) {
    PyObject *items = PyMember_GetOne((const char *)state, member);
    if (items != NULL && group >= 0)
        Py_SETREF(items, PySequence_GetItem(items, group));
    if (items == NULL)
        return -1;
    PyObject *part = PySequence_GetSlice(items, (Py_ssize_t)start, (Py_ssize_t)stop);
    Py_DECREF(items);
    if (part == NULL)
        return -1;
    Py_ssize_t size = PyList_GET_SIZE(out);
    int failed = PyList_SetSlice(out, size, size, part);
    Py_DECREF(part);
    return failed;
}

/* The fill ``fill`` (state, stop) in group ``group``: the items of the state's ``member`` (its keys, or its table in
 * the group where ``of_group``) from the group's cached count to the stop, added to ``out``. The state (borrowed),
 * the count and the stop read; NULL with an error set where it fails. */
static PyObject *add_filled(PyObject *out, PyObject *fill, Py_ssize_t group, PyMemberDef *member, int of_group,
                            long long *start, long long *stop) {
    PyObject *state = pair(fill, stop);
    if (state == NULL || ((*start = read_item(state, CACHED_BLOCKS, group)) == -1 && PyErr_Occurred()) ||
            extend_by_slice(out, state, member, of_group ? group : -1, *start, *stop) < 0)
        return NULL;
    return state;
}

/* fill_keys' answer for the keys filled (``keys``, a list, taken): the keys, or Py_None where a key other than
 * PRIVATE (no key twice, and no entry) repeats or has an entry in ``cached``; NULL with an error set. */
static PyObject *keys_unless_met(PyObject *keys, PyObject *cached) {
    if (keys == NULL)
        return NULL;
    PyObject *distinct = NULL;
    Py_ssize_t num_keyed = 0;  /* (keys other than PRIVATE: most of a replay's are it, and need no test) */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(keys); i++)
        num_keyed += PyList_GET_ITEM(keys, i) != PRIVATE;
    int met = 0;
    if (num_keyed > 1) {  /* a key twice */
        if (!(distinct = PySet_New(NULL)))
            goto failed;
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(keys); i++)
            if (PyList_GET_ITEM(keys, i) != PRIVATE && PySet_Add(distinct, PyList_GET_ITEM(keys, i)) < 0)
                goto failed;
        met = PySet_GET_SIZE(distinct) != num_keyed;
        Py_CLEAR(distinct);
    }
    for (Py_ssize_t i = 0; !met && num_keyed && i < PyList_GET_SIZE(keys); i++) {  /* a key with an entry */
        if (PyList_GET_ITEM(keys, i) != PRIVATE && (met = PyDict_Contains(cached, PyList_GET_ITEM(keys, i))) < 0)
            goto failed;
    }
    if (met) {
        Py_DECREF(keys);
        Py_RETURN_NONE;
    }
    return keys;
failed:
    Py_XDECREF(distinct);
    Py_DECREF(keys);
    return NULL;
}

static PyObject *fill_keys_of(PyObject *fills, Py_ssize_t group, PyObject *cached) {
    PyObject *keys = PyList_New(0);
    for (Py_ssize_t i = 0; keys != NULL && i < PyList_GET_SIZE(fills); i++) {
        long long start, stop;
        if (add_filled(keys, PyList_GET_ITEM(fills, i), group, BLOCK_HASHES, 0, &start, &stop) == NULL)
            Py_CLEAR(keys);
    }
    return keys_unless_met(keys, cached);
}

static PyObject *fill_keys(PyObject *self, PyObject *args) {
    PyObject *fills, *cached;
    Py_ssize_t group;
    if (!PyArg_ParseTuple(args, "O!nO!:fill_keys", &PyList_Type, &fills, &group, &PyDict_Type, &cached))
        return NULL;
    return fill_keys_of(fills, group, cached);
}

/* SequenceState.holds_past_final through the bound slots: 1 or 0; -1 with an error set. */
static int past_its_final(PyObject *state, long long block_size) {
    PyObject *final = PyMember_GetOne((const char *)state, FINAL);
    if (final == NULL)
        return -1;
    int past = 0;
    if (final != Py_None) {
        PyObject *tables = PyMember_GetOne((const char *)state, BLOCK_TABLES);
        PyObject *first = tables == NULL ? NULL : PySequence_GetItem(tables, 0);
        Py_XDECREF(tables);
        Py_ssize_t length = first == NULL ? -1 : PyObject_Length(first);
        Py_XDECREF(first);
        long long limit = length < 0 ? -1 : PyLong_AsLongLong(final);
        past = length < 0 || (limit == -1 && PyErr_Occurred()) ? -1 : (long long)length * block_size > limit;
    }
    Py_DECREF(final);
    return past;
}

/* The state listed in ``past_final`` (a dict) by its id where its table now holds slots past its final length
 * (take_cached.note_past_final); -1 with an error set. */
static int list_past_final(PyObject *state, PyObject *past_final, long long block_size) {
    int past = past_its_final(state, block_size);
    PyObject *id = past == 1 ? PyMember_GetOne((const char *)state, SEQUENCE_ID) : NULL;
    int failed = past < 0 || (past == 1 && (id == NULL || PyDict_SetItem(past_final, id, state) < 0));
    Py_XDECREF(id);
    return failed ? -1 : 0;
}

static PyObject *hand_out_of(PyObject *takes, PyObject *taken, long long num_groups, PyObject *past_final,
                             long long block_size) {
    if (past_final != Py_None && !PyDict_Check(past_final))
        return PyErr_Format(PyExc_TypeError, "hand_out: past_final must be a dict or None");
    Py_ssize_t position = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(takes); i++) {
        long long per_group, held;
        PyObject *state = pair(PyList_GET_ITEM(takes, i), &per_group);
        if (state == NULL)
            return NULL;
        PyObject *tables = PyMember_GetOne((const char *)state, BLOCK_TABLES);
        PyObject *each = tables == NULL ? NULL : PyObject_GetIter(tables);
        Py_XDECREF(tables);
        if (each == NULL)
            return NULL;
        PyObject *table;
        while ((table = PyIter_Next(each)) != NULL) {  /* table += taken[position:position + per_group] */
            PyObject *part = PyList_GetSlice(taken, position, position + (Py_ssize_t)per_group);
            PyObject *grown = part == NULL ? NULL : PyNumber_InPlaceAdd(table, part);
            Py_XDECREF(part);
            Py_DECREF(table);
            if (grown == NULL)
                break;
            Py_DECREF(grown);
            position += (Py_ssize_t)per_group;
        }
        Py_DECREF(each);
        if (PyErr_Occurred() || ((held = read_int(state, HELD)) == -1 && PyErr_Occurred()))
            return NULL;
        PyObject *count = PyLong_FromLongLong(held + per_group * num_groups);
        int failed = count == NULL || PyMember_SetOne((char *)state, HELD, count) < 0;
        Py_XDECREF(count);
        if (failed)
            return NULL;
        if (past_final != Py_None && list_past_final(state, past_final, block_size) < 0)
            return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *hand_out(PyObject *self, PyObject *args) {
    PyObject *takes, *taken, *past_final = Py_None;
    long long num_groups, block_size = 0;
    if (!PyArg_ParseTuple(args, "O!O!L|OL:hand_out", &PyList_Type, &takes, &PyList_Type, &taken, &num_groups,
                          &past_final, &block_size))
        return NULL;
    return hand_out_of(takes, taken, num_groups, past_final, block_size);
}

static PyObject *fill_blocks_of(PyObject *fills, Py_ssize_t group) {
    PyObject *blocks = PyList_New(0);
    for (Py_ssize_t i = 0; blocks != NULL && i < PyList_GET_SIZE(fills); i++) {
        long long start, stop;
        PyObject *state = add_filled(blocks, PyList_GET_ITEM(fills, i), group, BLOCK_TABLES, 1, &start, &stop);
        if (state == NULL) {
            Py_CLEAR(blocks);
            break;
        }
        if (stop > start) {  /* num_cached_blocks[group] = stop */
            PyObject *counts = PyMember_GetOne((const char *)state, CACHED_BLOCKS);
            PyObject *moved = counts == NULL ? NULL : PyLong_FromLongLong(stop);
            int failed = moved == NULL || PySequence_SetItem(counts, group, moved) < 0;
            Py_XDECREF(moved);
            Py_XDECREF(counts);
            if (failed)
                Py_CLEAR(blocks);
        }
    }
    return blocks;
}

static PyObject *fill_blocks(PyObject *self, PyObject *args) {
    PyObject *fills;
    Py_ssize_t group;
    if (!PyArg_ParseTuple(args, "O!n:fill_blocks", &PyList_Type, &fills, &group))
        return NULL;
    return fill_blocks_of(fills, group);
}

/* An int64 column (a C-contiguous buffer of 8-byte ints: a NumPy int64 array), or -1 with an error set. */
static int int64_column(PyObject *array, Py_buffer *view, const char *what) {
    if (PyObject_GetBuffer(array, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    const char *format = view->format == NULL ? "B" : view->format;
    if (view->itemsize != 8 || view->ndim != 1 || (strcmp(format, "l") != 0 && strcmp(format, "q") != 0)) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_TypeError, "full_attention_profile: %s must be a 1-d int64 array", what);
        return -1;
    }
    return 0;
}

static PyObject *full_attention_profile(PyObject *self, PyObject *args) {
    PyObject *lengths_arg, *finals_arg;
    long long allocated_sum, block_size, num_free, num_steps;
    if (!PyArg_ParseTuple(args, "LLOOLL:full_attention_profile", &block_size, &num_free, &lengths_arg,
                          &finals_arg, &allocated_sum, &num_steps))
        return NULL;
    if (block_size < 1 || num_steps < 0)
        return PyErr_Format(PyExc_ValueError, "full_attention_profile: block size %lld, %lld steps", block_size,
                            num_steps);
    Py_buffer lengths_view, finals_view;
    if (int64_column(lengths_arg, &lengths_view, "lengths") < 0)
        return NULL;
    if (int64_column(finals_arg, &finals_view, "finals") < 0) {
        PyBuffer_Release(&lengths_view);
        return NULL;
    }
    PyObject *result = NULL, *allocated = NULL, *internal = NULL;
    Py_ssize_t n = lengths_view.len / 8;
    if (finals_view.len / 8 != n) {
        PyErr_SetString(PyExc_ValueError, "full_attention_profile: as many finals as lengths");
        goto done;
    }
    allocated = PyByteArray_FromStringAndSize(NULL, num_steps * 8);
    internal = PyByteArray_FromStringAndSize(NULL, num_steps * 8);
    if (allocated == NULL || internal == NULL)
        goto done;
    /* Steps whose new blocks the free blocks cover: Σ allocated during the step stays within the limit */
    long long num_ok = full_attention_steps(lengths_view.buf, finals_view.buf, n, block_size,
                                            allocated_sum + block_size * (num_free + 1) - 1, num_steps,
                                            (int64_t *)PyByteArray_AS_STRING(allocated),
                                            (int64_t *)PyByteArray_AS_STRING(internal));
    if (PyByteArray_Resize(allocated, num_ok * 8) < 0 || PyByteArray_Resize(internal, num_ok * 8) < 0)
        goto done;
    result = Py_BuildValue("(LOO)", num_ok, allocated, internal);
done:
    Py_XDECREF(allocated);
    Py_XDECREF(internal);
    PyBuffer_Release(&lengths_view);
    PyBuffer_Release(&finals_view);
    return result;
}

/* The attributes of the pool, its free queue and the block manager that the compiled calls below (take_into,
 * cache_into, grow_batch, release_into) read and write, by name as Python does; the names interned once. */
enum { A_NUM_GROUPS, A_EVENTS, A_SUBSCRIBERS, A_LOG, A_DUPLICATES, A_FREE_BLOCKS, A_NUM_FREE, A_REF_COUNTS,
       A_BLOCK_HASH, A_BLOCK_GROUP, A_CACHED_BLOCKS, A_FRONT, A_NUM_TOUCHED, A_NUM_BLOCKS, A_BACK, A_HEAD, A_STALE,
       A_NUM_STALE, A_NUM_ALLOCATIONS, A_NUM_EVICTIONS, A_CACHE_VERSION, A_POPLEFT, A_POOL, A_WINDOW, A_NUM_FORKS,
       A_BLOCK_SIZE, A_SEQUENCES, A_ENABLE_PREFIX_CACHING, A_CACHED_GROUP_IDS, A_PAST_FINAL, A_TAKE, A_CACHE_FRESH,
       A_EXTENDLEFT, A_NUM_FREES, A_NUM_SHARED_REFERENCES, A_RELEASED, A_POP, A_REFERENCE, A_SLIDING, A_GROUPS,
       A_FULL_IDS, A_POPITEM, A_COUNT };
static const char *ATTRIBUTE_NAMES[A_COUNT] = {
    "num_groups", "events", "subscribers", "log", "duplicate_blocks", "free_blocks", "num_free", "ref_counts",
    "block_hash", "block_group", "cached_blocks", "_front", "num_touched", "num_blocks", "_back", "_head", "_stale",
    "_num_stale", "num_allocations", "num_evictions", "cache_version", "popleft", "pool", "window", "num_forks",
    "block_size", "sequences", "enable_prefix_caching", "cached_group_ids", "past_final", "take", "cache_fresh",
    "extendleft", "num_frees", "num_shared_references", "_released", "pop", "reference", "sliding", "groups",
    "full_ids", "popitem"};
static PyObject *ATTRIBUTES[A_COUNT];  /* interned (PyInit) */

/* ``object.<name>`` as a Py_ssize_t; -1 with an error set where it is none or no int. */
static int read_size(PyObject *object, int name, Py_ssize_t *out) {
    PyObject *value = PyObject_GetAttr(object, ATTRIBUTES[name]);
    if (value == NULL)
        return -1;
    *out = PyLong_AsSsize_t(value);
    Py_DECREF(value);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

/* ``object.<name> = value``; -1 with an error set. */
static int write_size(PyObject *object, int name, Py_ssize_t value) {
    PyObject *number = PyLong_FromSsize_t(value);
    int failed = number == NULL || PyObject_SetAttr(object, ATTRIBUTES[name], number) < 0;
    Py_XDECREF(number);
    return failed ? -1 : 0;
}

/* ``object.<name> += delta``; -1 with an error set. */
static int add_size(PyObject *object, int name, Py_ssize_t delta) {
    Py_ssize_t value;
    return read_size(object, name, &value) < 0 ? -1 : write_size(object, name, value + delta);
}

/* Whether the pool is in its usual case: one group, no subscriber to its events and no key log, and, where
 * ``without_duplicates``, no duplicate entry; -1 with an error set. */
static int usual_pool(PyObject *pool, int without_duplicates) {
    Py_ssize_t num_groups;
    if (read_size(pool, A_NUM_GROUPS, &num_groups) < 0)
        return -1;
    if (num_groups != 1)
        return 0;
    PyObject *events = PyObject_GetAttr(pool, ATTRIBUTES[A_EVENTS]);
    PyObject *subscribers = events == NULL ? NULL : PyObject_GetAttr(events, ATTRIBUTES[A_SUBSCRIBERS]);
    PyObject *log = subscribers == NULL ? NULL : PyObject_GetAttr(events, ATTRIBUTES[A_LOG]);
    PyObject *duplicates = log == NULL ? NULL : PyObject_GetAttr(pool, ATTRIBUTES[A_DUPLICATES]);
    int usual = duplicates == NULL ? -1 :
        PyList_CheckExact(subscribers) && PyList_GET_SIZE(subscribers) == 0 && log == Py_None &&
        PyList_CheckExact(duplicates) && PyList_GET_SIZE(duplicates) == 1 &&
        PyDict_CheckExact(PyList_GET_ITEM(duplicates, 0)) &&
        (!without_duplicates || PyDict_GET_SIZE(PyList_GET_ITEM(duplicates, 0)) == 0);
    Py_XDECREF(events);
    Py_XDECREF(subscribers);
    Py_XDECREF(log);
    Py_XDECREF(duplicates);
    return usual;
}

/* Whether the pool's take is the usual case (usual_pool, no duplicate entry) of 0 < count <= the free blocks (the
 * pool's own path asserts that); -1 with an error set. */
static int usual_take(PyObject *pool, PyObject *queue, Py_ssize_t count) {
    Py_ssize_t num_free;
    if (read_size(queue, A_NUM_FREE, &num_free) < 0)
        return -1;
    return count <= 0 || count > num_free ? 0 : usual_pool(pool, 1);
}

/* Whether the block manager is in the usual case of its compiled calls (grow_batch, create_into): no sliding window,
 * no fork, its pool in its usual case (usual_pool, with ``without_duplicates``); its pool in ``*pool`` (a new
 * reference, NULL where the answer is -1, with an error set). */
static int usual_manager(PyObject *manager, PyObject **pool, int without_duplicates) {
    PyObject *window = NULL, *forks = NULL;
    int usual = -1;
    if ((*pool = PyObject_GetAttr(manager, ATTRIBUTES[A_POOL])) &&
            (window = PyObject_GetAttr(manager, ATTRIBUTES[A_WINDOW])) &&
            (forks = PyObject_GetAttr(manager, ATTRIBUTES[A_NUM_FORKS])))
        usual = window == Py_None ? PyObject_Not(forks) : 0;
    if (usual == 1)
        usual = usual_pool(*pool, without_duplicates);
    Py_XDECREF(window);
    Py_XDECREF(forks);
    if (usual < 0)
        Py_CLEAR(*pool);
    return usual;
}

/* The back part's next ``count`` live entries added to ``taken``, from ``*head`` on, each stale entry met skipped and
 * forgotten (``stale``: block -> its stale entries; ``*num_stale`` their count); -1 with an error set. */
static int take_back(PyObject *back, Py_ssize_t *head, PyObject *stale, Py_ssize_t *num_stale, Py_ssize_t count,
                     PyObject *taken) {
    Py_ssize_t at = *head, size = PyList_GET_SIZE(back);
    while (count > 0) {
        if (at >= size) {
            PyErr_SetString(PyExc_RuntimeError, "take_into: the free queue's back part has fewer live blocks than "
                            "it counts");
            return -1;
        }
        PyObject *block = PyList_GET_ITEM(back, at++);
        PyObject *skips = PyDict_GET_SIZE(stale) ? PyDict_GetItemWithError(stale, block) : NULL;  /* borrowed */
        if (skips == NULL && PyErr_Occurred())
            return -1;
        if (skips == NULL) {
            if (PyList_Append(taken, block) < 0)
                return -1;
            count--;
            continue;
        }
        Py_ssize_t left = PyLong_AsSsize_t(skips);
        if (left == -1 && PyErr_Occurred())
            return -1;
        PyObject *fewer = left == 1 ? NULL : PyLong_FromSsize_t(left - 1);
        if ((left == 1 && PyDict_DelItem(stale, block) < 0) ||
                (left != 1 && (fewer == NULL || PyDict_SetItem(stale, block, fewer) < 0))) {
            Py_XDECREF(fewer);
            return -1;
        }
        Py_XDECREF(fewer);
        (*num_stale)--;
    }
    if (at > size - at) {  /* the passed entries outnumber the rest: dropped (FreeBlockQueue._passed) */
        if (PyList_SetSlice(back, 0, at, NULL) < 0)
            return -1;
        at = 0;
    }
    *head = at;
    return 0;
}

/* take_into's take, of 0 < count <= the free blocks from a pool in its usual case without duplicate entries (its
 * queue: ``queue``): Py_True, or Py_False where its lists are not the pool's own kinds (nothing changed); NULL with
 * an error set. */
static PyObject *take_blocks(PyObject *pool, PyObject *queue, Py_ssize_t count, PyObject *table) {
    PyObject *refs = NULL, *hashes = NULL, *groups = NULL, *maps = NULL, *front = NULL, *back = NULL, *stale = NULL,
             *taken = NULL, *result = NULL;
    Py_ssize_t num_free, num_touched, num_blocks, head, num_stale;
    if (!(refs = PyObject_GetAttr(pool, ATTRIBUTES[A_REF_COUNTS])) ||
            !(hashes = PyObject_GetAttr(pool, ATTRIBUTES[A_BLOCK_HASH])) ||
            !(groups = PyObject_GetAttr(pool, ATTRIBUTES[A_BLOCK_GROUP])) ||
            !(maps = PyObject_GetAttr(pool, ATTRIBUTES[A_CACHED_BLOCKS])) ||
            !(front = PyObject_GetAttr(queue, ATTRIBUTES[A_FRONT])) ||
            !(back = PyObject_GetAttr(queue, ATTRIBUTES[A_BACK])) ||
            !(stale = PyObject_GetAttr(queue, ATTRIBUTES[A_STALE])) ||
            read_size(queue, A_NUM_FREE, &num_free) < 0 || read_size(queue, A_NUM_TOUCHED, &num_touched) < 0 ||
            read_size(queue, A_NUM_BLOCKS, &num_blocks) < 0 || read_size(queue, A_HEAD, &head) < 0 ||
            read_size(queue, A_NUM_STALE, &num_stale) < 0)
        goto done;
    if (!PyList_CheckExact(refs) || !PyList_CheckExact(hashes) || !PyList_CheckExact(groups) ||
            !PyList_CheckExact(maps) || PyList_GET_SIZE(maps) != 1 || !PyDict_CheckExact(PyList_GET_ITEM(maps, 0)) ||
            !PyList_CheckExact(back) || !PyDict_CheckExact(stale)) {
        result = Py_NewRef(Py_False);  /* (not the pool's own kinds: its own path) */
        goto done;
    }
    PyObject *cached = PyList_GET_ITEM(maps, 0);
    Py_ssize_t num_front = PyObject_Length(front);
    if (num_front < 0 || (taken = PyList_New(0)) == NULL)
        goto done;
    /* The free queue's take: the front first, then the blocks never handed out, then the back part */
    Py_ssize_t from_front = num_front < count ? num_front : count;
    for (Py_ssize_t i = 0; i < from_front; i++) {
        PyObject *block = PyObject_CallMethodNoArgs(front, ATTRIBUTES[A_POPLEFT]);
        int failed = block == NULL || PyList_Append(taken, block) < 0;
        Py_XDECREF(block);
        if (failed)
            goto done;
    }
    Py_ssize_t fresh = count - from_front < num_blocks - num_touched ? count - from_front : num_blocks - num_touched;
    for (Py_ssize_t block = num_touched; block < num_touched + fresh; block++) {
        PyObject *id = PyLong_FromSsize_t(block);
        int failed = id == NULL || PyList_Append(taken, id) < 0;
        Py_XDECREF(id);
        if (failed)
            goto done;
    }
    num_touched += fresh;
    Py_ssize_t from_back = count - from_front - fresh, was_stale = num_stale;
    if ((fresh && write_size(queue, A_NUM_TOUCHED, num_touched) < 0) ||
            (from_back && take_back(back, &head, stale, &num_stale, from_back, taken) < 0) ||
            (from_back && write_size(queue, A_HEAD, head) < 0) ||
            (num_stale != was_stale && write_size(queue, A_NUM_STALE, num_stale) < 0) ||
            write_size(queue, A_NUM_FREE, num_free - count) < 0)
        goto done;
    /* State for the blocks seen for the first time (BlockPool.take_free) */
    for (Py_ssize_t seen = PyList_GET_SIZE(refs); seen < num_touched; seen++)
        if (PyList_Append(refs, ZERO) < 0 || PyList_Append(hashes, Py_None) < 0 || PyList_Append(groups, ZERO) < 0)
            goto done;
    /* Each taken block held once; those from the back drop their entries (_hold_evicting) */
    Py_ssize_t kept = count - from_back;
    if (set_each(refs, taken, kept, ONE) < 0)
        goto done;
    Py_ssize_t evicted = from_back ? evict_held(refs, hashes, cached, taken, kept, count) : 0;
    if (evicted < 0 || (evicted && (add_size(pool, A_CACHE_VERSION, 1) < 0 ||
                                    add_size(pool, A_NUM_EVICTIONS, evicted) < 0)))
        goto done;
    if (PyList_SetSlice(table, PyList_GET_SIZE(table), PyList_GET_SIZE(table), taken) < 0 ||
            add_size(pool, A_NUM_ALLOCATIONS, count) < 0)
        goto done;
    result = Py_NewRef(Py_True);
done:
    Py_XDECREF(refs);
    Py_XDECREF(hashes);
    Py_XDECREF(groups);
    Py_XDECREF(maps);
    Py_XDECREF(front);
    Py_XDECREF(back);
    Py_XDECREF(stale);
    Py_XDECREF(taken);
    return result;
}

/* BlockPool.take compiled where it is the usual case (take_into): the free queue's take (FreeBlockQueue.take: its
 * front, then blocks never handed out, then the back part's live entries, its stale ones skipped), the state of
 * blocks seen for the first time (take_free), the taken blocks held and their entries dropped (_hold_evicting), the
 * table and the counts. */
static PyObject *take_into(PyObject *self, PyObject *args) {
    PyObject *pool, *table;
    Py_ssize_t count;
    if (!PyArg_ParseTuple(args, "OnO!:take_into", &pool, &count, &PyList_Type, &table))
        return NULL;
    PyObject *queue = PyObject_GetAttr(pool, ATTRIBUTES[A_FREE_BLOCKS]);
    if (queue == NULL)
        return NULL;
    int usual = usual_take(pool, queue, count);
    PyObject *result = usual <= 0 ? (usual < 0 ? NULL : Py_NewRef(Py_False)) : take_blocks(pool, queue, count, table);
    Py_DECREF(queue);
    return result;
}

/* cache_into's caching into a pool in its usual case: Py_True, or Py_False where its lists are not the pool's own
 * kinds (nothing changed); NULL with an error set. */
static PyObject *cache_blocks(PyObject *pool, PyObject *keys_arg, PyObject *blocks_arg) {
    PyObject *maps = PyObject_GetAttr(pool, ATTRIBUTES[A_CACHED_BLOCKS]);
    PyObject *duplicate_maps = maps == NULL ? NULL : PyObject_GetAttr(pool, ATTRIBUTES[A_DUPLICATES]);
    PyObject *hashes = duplicate_maps == NULL ? NULL : PyObject_GetAttr(pool, ATTRIBUTES[A_BLOCK_HASH]);
    PyObject *keys = hashes == NULL ? NULL : PySequence_Fast(keys_arg, "cache_into: keys must be a sequence");
    PyObject *blocks = keys == NULL ? NULL : PySequence_Fast(blocks_arg, "cache_into: blocks must be a sequence");
    PyObject *result = NULL;
    if (blocks == NULL)
        goto done;
    if (!PyList_CheckExact(maps) || PyList_GET_SIZE(maps) != 1 || !PyDict_CheckExact(PyList_GET_ITEM(maps, 0)) ||
            !PyList_CheckExact(hashes)) {
        result = Py_NewRef(Py_False);  /* (not the pool's own kinds: its own path) */
        goto done;
    }
    PyObject *cached = PyList_GET_ITEM(maps, 0), *duplicates = PyList_GET_ITEM(duplicate_maps, 0);
    Py_ssize_t num_entries = PyDict_GET_SIZE(cached), n = PySequence_Fast_GET_SIZE(keys), met = 0;
    while ((met = enter_run(hashes, cached, keys, blocks, 0, met)) < n) {
        if (met < 0)
            goto done;
        /* duplicates.setdefault(keys[met], []).append(blocks[met]): cached in the group already */
        PyObject *empty = PyList_New(0);
        PyObject *copies = empty == NULL ? NULL :
            PyDict_SetDefault(duplicates, PySequence_Fast_GET_ITEM(keys, met), empty);  /* borrowed */
        Py_XDECREF(empty);
        if (copies == NULL || PyList_Append(copies, PySequence_Fast_GET_ITEM(blocks, met)) < 0)
            goto done;
        met++;
    }
    Py_ssize_t made = PyDict_GET_SIZE(cached) - num_entries;
    if (made && add_size(pool, A_CACHE_VERSION, made) < 0)
        goto done;
    result = Py_NewRef(Py_True);
done:
    Py_XDECREF(maps);
    Py_XDECREF(duplicate_maps);
    Py_XDECREF(hashes);
    Py_XDECREF(keys);
    Py_XDECREF(blocks);
    return result;
}

/* BlockPool.cache_fresh compiled where the pool is in its usual case (cache_into): each block's key entered, and
 * where the key is the entry of another block already, the block listed among its duplicates; the cache's version
 * moved by the entries made. */
static PyObject *cache_into(PyObject *self, PyObject *args) {
    PyObject *pool, *keys, *blocks;
    Py_ssize_t group;
    if (!PyArg_ParseTuple(args, "OOOn:cache_into", &pool, &keys, &blocks, &group))
        return NULL;
    int usual = group == 0 ? usual_pool(pool, 0) : 0;
    return usual <= 0 ? (usual < 0 ? NULL : Py_NewRef(Py_False)) : cache_blocks(pool, keys, blocks);
}

/* ``pool.<method>(first, second)`` (the pool's own path) unless a compiled call already did it (``answer``
 * Py_True; Py_False: not the usual case); -1 with an error set (``answer`` NULL: the compiled call's). */
static int or_pools_own(PyObject *answer, PyObject *pool, int method, PyObject *first, PyObject *second) {
    if (answer == NULL)
        return -1;
    int done = answer == Py_True;
    Py_DECREF(answer);
    if (done)
        return 0;
    PyObject *own = PyObject_CallMethodObjArgs(pool, ATTRIBUTES[method], first, second, NULL);
    Py_XDECREF(own);
    return own == NULL ? -1 : 0;
}

/* A new SequenceState of one group, without its ``__init__`` (a Python call): every slot set as that call with these
 * arguments sets it (``block_hashes`` the caller's list, as create_sequence keeps it; its table a copy of ``hits``, a
 * list, or empty where they are None); NULL with an error set. */
static PyObject *new_state(PyObject *sequence_id, PyObject *keys, PyObject *final_length, PyObject *hits,
                           Py_ssize_t block_size) {
    Py_ssize_t num_hits = hits == Py_None ? 0 : PyList_GET_SIZE(hits);
    PyObject *empty = PyTuple_New(0), *state = NULL, *tables = NULL,
             *table = hits == Py_None ? PyList_New(0) : PyList_GetSlice(hits, 0, num_hits),
             *nulls = NULL, *offered = NULL, *hit_blocks = PyLong_FromSsize_t(num_hits),
             *hit_tokens = PyLong_FromSsize_t(num_hits * block_size);
    if (empty == NULL || table == NULL || hit_blocks == NULL || hit_tokens == NULL || !(tables = PyList_New(1)) ||
            !(nulls = PyList_New(1)) || !(offered = PyList_New(1)))
        goto done;
    PyList_SET_ITEM(tables, 0, Py_NewRef(table));
    PyList_SET_ITEM(nulls, 0, Py_NewRef(ZERO));
    PyList_SET_ITEM(offered, 0, Py_NewRef(hit_blocks));
    if (!(state = STATE_TYPE->tp_new(STATE_TYPE, empty, NULL)))
        goto done;
    PyMemberDef *members[] = {SEQUENCE_ID, LENGTH, BLOCK_TABLES, BLOCK_HASHES, CACHED_TOKENS, COMPUTED, NULLS,
                              CACHED_BLOCKS, LOADING, HELD, FINAL};
    PyObject *values[] = {sequence_id, hit_tokens, tables, keys, hit_tokens, hit_tokens, nulls, offered, ZERO,
                          hit_blocks, final_length};
    for (size_t i = 0; i < sizeof(members) / sizeof(members[0]); i++)
        if (PyMember_SetOne((char *)state, members[i], values[i]) < 0) {
            Py_CLEAR(state);
            goto done;
        }
done:
    Py_XDECREF(empty);
    Py_XDECREF(table);
    Py_XDECREF(tables);
    Py_XDECREF(nulls);
    Py_XDECREF(offered);
    Py_XDECREF(hit_blocks);
    Py_XDECREF(hit_tokens);
    return state;
}

/* create_into's _take of a new state's ``required`` blocks (take_blocks, or the pool's own take), the blocks its first
 * ``cached_tokens`` fill cached at once with their keys (take_computed: cache_blocks, or the pool's own cache_fresh;
 * 0: none), its count of blocks held, and its place among those past their final length (note_past_final); -1 with
 * an error set. */
static int take_prompt(PyObject *manager, PyObject *pool, PyObject *queue, PyObject *sequence_id, PyObject *state,
                       PyObject *keys, Py_ssize_t required, Py_ssize_t cached_tokens, Py_ssize_t block_size) {
    PyObject *tables = PyMember_GetOne((const char *)state, BLOCK_TABLES), *table = NULL, *count = NULL,
             *keys_part = NULL, *blocks_part = NULL, *offered = NULL, *stop_count = NULL, *held = NULL,
             *past_final = NULL;
    int result = -1;
    if (tables == NULL || !(table = Py_NewRef(PyList_GET_ITEM(tables, 0))))
        goto done;
    Py_ssize_t first = PyList_GET_SIZE(table);  /* (its hits: offered already) */
    if (!(count = PyLong_FromSsize_t(required)) ||
            or_pools_own(take_blocks(pool, queue, required, table), pool, A_TAKE, count, table) < 0)
        goto done;
    Py_ssize_t stop = cached_tokens / block_size;
    if (stop > PyList_GET_SIZE(keys))
        stop = PyList_GET_SIZE(keys);
    if (stop > first && (!(keys_part = PyList_GetSlice(keys, first, stop)) ||
                         !(blocks_part = PyList_GetSlice(table, first, stop)) ||
                     or_pools_own(cache_blocks(pool, keys_part, blocks_part), pool, A_CACHE_FRESH, keys_part,
                                  blocks_part) < 0 ||
                     !(offered = PyMember_GetOne((const char *)state, CACHED_BLOCKS)) ||
                     !(stop_count = PyLong_FromSsize_t(stop)) || PyList_SetItem(offered, 0, Py_NewRef(stop_count)) < 0))
        goto done;
    if (!(held = PyLong_FromSsize_t(first + required)) || PyMember_SetOne((char *)state, HELD, held) < 0)
        goto done;
    int past = past_its_final(state, block_size);
    if (past < 0 || (past && (!(past_final = PyObject_GetAttr(manager, ATTRIBUTES[A_PAST_FINAL])) ||
                              PyObject_SetItem(past_final, sequence_id, state) < 0)))
        goto done;
    result = 0;
done:
    Py_XDECREF(tables);
    Py_XDECREF(table);
    Py_XDECREF(count);
    Py_XDECREF(keys_part);
    Py_XDECREF(blocks_part);
    Py_XDECREF(offered);
    Py_XDECREF(stop_count);
    Py_XDECREF(held);
    Py_XDECREF(past_final);
    return result;
}

/* KVBlockManager.create_sequence compiled where it is the usual case (create_into): one full-attention group and no
 * fork, the pool in its usual case without duplicate entries (usual_pool), enough free blocks, and either a prompt
 * whose first key has no entry (``hits`` None: no hit, most prompts) or the hits find_hits found (a list). The hits
 * held (the pool's reference), the state made and listed, its other blocks taken (take_blocks) and those its
 * computed tokens fill cached (cache_blocks), listed among those past their final length, its lengths set: what
 * create_sequence's loop over its groups, _take, take_computed and _computed do. False, nothing changed, elsewhere
 * (the Python path then runs, and raises where it raises); else the state. ``keys``: a list (another sequence is the
 * Python path's: it copies it). */
static PyObject *create_into(PyObject *self, PyObject *args) {
    PyObject *manager, *sequence_id, *keys, *final_length, *hits;
    Py_ssize_t num_tokens, num_computed;
    if (!PyArg_ParseTuple(args, "OOnOnOO:create_into", &manager, &sequence_id, &num_tokens, &keys, &num_computed,
                          &final_length, &hits))
        return NULL;
    if (hits != Py_None && !PyList_CheckExact(hits))
        return PyErr_Format(PyExc_TypeError, "create_into: hits must be a list or None");
    if (STATE_TYPE == NULL)
        return PyErr_Format(PyExc_RuntimeError, "create_into: bind_sequence_state first");
    PyObject *pool = NULL, *sequences = NULL, *enabled = NULL, *queue = NULL, *maps = NULL, *released = NULL,
             *state = NULL, *result = NULL;
    Py_ssize_t block_size, num_free;
    int usual = PyList_CheckExact(keys) && 0 <= num_computed && num_computed <= num_tokens ?
        usual_manager(manager, &pool, 1) : 0;
    if (usual == 1 && (read_size(manager, A_BLOCK_SIZE, &block_size) < 0 ||
                       !(sequences = PyObject_GetAttr(manager, ATTRIBUTES[A_SEQUENCES])) ||
                       !(enabled = PyObject_GetAttr(manager, ATTRIBUTES[A_ENABLE_PREFIX_CACHING])) ||
                       !(queue = PyObject_GetAttr(pool, ATTRIBUTES[A_FREE_BLOCKS])) ||
                       !(maps = PyObject_GetAttr(pool, ATTRIBUTES[A_CACHED_BLOCKS])) ||
                       !(released = PyObject_GetAttr(manager, ATTRIBUTES[A_RELEASED])) ||
                       read_size(queue, A_NUM_FREE, &num_free) < 0))
        goto done;
    if (usual == 1)  /* (the manager's own kinds) */
        usual = PyDict_CheckExact(sequences) && PyList_CheckExact(maps) && PyList_GET_SIZE(maps) == 1 &&
            PyDict_CheckExact(PyList_GET_ITEM(maps, 0)) && block_size >= 1;
    int caching = usual == 1 ? PyObject_IsTrue(enabled) : 0;
    Py_ssize_t num_hits = hits == Py_None ? 0 : PyList_GET_SIZE(hits);
    Py_ssize_t required = usual == 1 ? (num_tokens + block_size - 1) / block_size - num_hits : 0;
    /* (a listed sequence, or too few free blocks: create_sequence raises; hits end before a prompt's last token) */
    if (usual == 1 && caching >= 0 && (required > num_free || PyDict_GetItemWithError(sequences, sequence_id) ||
                                       (num_hits && (num_tokens - 1) / block_size < num_hits)))
        usual = 0;
    if (usual == 1 && hits == Py_None && caching == 1 && num_tokens > block_size && PyList_GET_SIZE(keys)) {
        int found = PyDict_Contains(PyList_GET_ITEM(maps, 0), PyList_GET_ITEM(keys, 0));
        usual = found < 0 ? -1 : !found;
    }
    if (usual < 0 || caching < 0 || PyErr_Occurred())
        goto done;
    if (usual == 0) {
        result = Py_NewRef(Py_False);
        goto done;
    }
    if (num_hits) {  /* (find_hits' blocks held: a free one revived) */
        PyObject *held = PyList_AsTuple(hits), *reference = PyObject_GetAttr(pool, ATTRIBUTES[A_REFERENCE]);
        PyObject *answer = held == NULL || reference == NULL ? NULL : PyObject_Call(reference, held, NULL);
        Py_XDECREF(held);
        Py_XDECREF(reference);
        if (answer == NULL)
            goto done;
        Py_DECREF(answer);
    }
    if (!(state = new_state(sequence_id, keys, final_length, hits, block_size)) ||
            PyDict_SetItem(sequences, sequence_id, state) < 0)
        goto done;
    PyObject *popped = PyObject_CallMethodObjArgs(released, ATTRIBUTES[A_POP], sequence_id, Py_None, NULL);
    if (popped == NULL)
        goto done;
    Py_DECREF(popped);
    if (required > 0 && take_prompt(manager, pool, queue, sequence_id, state, keys, required,
                                    caching ? num_computed : 0, block_size) < 0)
        goto done;
    Py_ssize_t hit_tokens = num_hits * block_size;  /* (_computed: a hit counts as computed) */
    PyObject *length = PyLong_FromSsize_t(num_tokens),
             *computed = PyLong_FromSsize_t(num_computed > hit_tokens ? num_computed : hit_tokens);
    int failed = length == NULL || computed == NULL || PyMember_SetOne((char *)state, LENGTH, length) < 0 ||
        PyMember_SetOne((char *)state, COMPUTED, computed) < 0;  /* (_computed: nothing loads, nothing more fills) */
    Py_XDECREF(length);
    Py_XDECREF(computed);
    if (failed)
        goto done;
    result = Py_NewRef(state);
done:
    Py_XDECREF(pool);
    Py_XDECREF(sequences);
    Py_XDECREF(enabled);
    Py_XDECREF(queue);
    Py_XDECREF(maps);
    Py_XDECREF(released);
    Py_XDECREF(state);
    return result;
}

/* grow_batch's one group: the state's table (``block_tables[0]``), borrowed (the state holds it, and nothing in
 * grow_batch replaces a slot's list); NULL, no error set, where the tables are not lists as the manager makes them. */
static PyObject *only_table(PyObject *state) {
    PyObject *tables = slot_value(state, BLOCK_TABLES);
    if (tables == NULL)
        return NULL;
    PyObject *table = PyList_CheckExact(tables) && PyList_GET_SIZE(tables) == 1 ? PyList_GET_ITEM(tables, 0) : NULL;
    return table != NULL && PyList_CheckExact(table) ? table : NULL;
}

/* The first cached count (``num_cached_blocks[0]``), its list borrowed in ``*counts``: -1 with ``*counts`` NULL and
 * no error set where the counts are not a list of ints as the manager makes them (-1 with an error set: it failed). */
static long long only_count(PyObject *state, PyObject **counts) {
    PyObject *list = slot_value(state, CACHED_BLOCKS);
    *counts = NULL;
    if (list == NULL)
        return -1;
    long long count = -1;
    if (PyList_CheckExact(list) && PyList_GET_SIZE(list) == 1 && PyLong_CheckExact(PyList_GET_ITEM(list, 0))) {
        count = PyLong_AsLongLong(PyList_GET_ITEM(list, 0));
        if (count >= 0)
            *counts = list;
    }
    return count;
}

/* Whether grow_batch's passes may read a growth's takes and fills as the manager makes their lists (a table list,
 * a list of one cached count, the keys a list or a tuple): 1; 0 where not (its Python path runs), -1 with an error
 * set. */
static int growth_lists(Growth *growth) {
    for (Py_ssize_t i = 0; i < growth->num_takes; i++)
        if (only_table(PyList_GET_ITEM(growth->states, growth->take_at[i])) == NULL)
            return PyErr_Occurred() ? -1 : 0;
    for (Py_ssize_t i = 0; i < growth->num_fills; i++) {
        PyObject *state = PyList_GET_ITEM(growth->states, growth->fill_at[i]), *counts;
        if (only_table(state) == NULL || (only_count(state, &counts), counts == NULL))
            return PyErr_Occurred() ? -1 : 0;
        PyObject *hashes = slot_value(state, BLOCK_HASHES);
        if (hashes == NULL)
            return -1;
        if (!PyList_CheckExact(hashes) && !PyTuple_CheckExact(hashes))
            return 0;
    }
    return 1;
}

/* fill_keys over a growth's fills (growth_lists checked): the keys they fill, in order; Py_None where a key other
 * than PRIVATE repeats or has an entry in ``cached``. */
static PyObject *growth_fill_keys(Growth *growth, PyObject *cached) {
    PyObject *keys = PyList_New(0);
    for (Py_ssize_t i = 0; keys != NULL && i < growth->num_fills; i++) {
        PyObject *state = PyList_GET_ITEM(growth->states, growth->fill_at[i]), *counts;
        long long start = only_count(state, &counts);
        PyObject *hashes = counts == NULL ? NULL : slot_value(state, BLOCK_HASHES);
        if (hashes == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_RuntimeError, "grow_batch: a fill's counts went missing");
            Py_CLEAR(keys);
            break;
        }
        PyObject **items = PySequence_Fast_ITEMS(hashes);  /* (a list or a tuple: growth_lists) */
        for (long long j = start; j < growth->fill_stop[i] && j < PySequence_Fast_GET_SIZE(hashes); j++)
            if (PyList_Append(keys, items[j]) < 0) {
                Py_CLEAR(keys);
                break;
            }
    }
    return keys_unless_met(keys, cached);
}

/* hand_out over a growth's takes in one group: each table gains its blocks from ``taken`` in order, its held count
 * moves, and a table now past the sequence's final length lists it in ``past_final`` (a dict); -1 with an error
 * set. */
static int growth_hand_out(Growth *growth, PyObject *taken, PyObject *past_final, long long block_size) {
    Py_ssize_t position = 0;
    for (Py_ssize_t i = 0; i < growth->num_takes; i++) {
        PyObject *state = PyList_GET_ITEM(growth->states, growth->take_at[i]);
        PyObject *table = only_table(state);
        long long count = growth->take_count[i], held;
        if (table == NULL || position + count > PyList_GET_SIZE(taken)) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_RuntimeError, "grow_batch: a take's blocks or table went missing");
            return -1;
        }
        for (long long k = 0; k < count; k++)
            if (PyList_Append(table, PyList_GET_ITEM(taken, position++)) < 0)
                return -1;
        if ((held = read_int(state, HELD)) == -1 && PyErr_Occurred())
            return -1;
        PyObject *moved = PyLong_FromLongLong(held + count);
        if (moved == NULL)
            return -1;
        set_slot(state, HELD, moved);
        Py_DECREF(moved);
        if (list_past_final(state, past_final, block_size) < 0)
            return -1;
    }
    return 0;
}

/* fill_blocks over a growth's fills in one group (growth_lists checked): the blocks they fill, in order, each
 * state's cached count moved to its stop. */
static PyObject *growth_fill_blocks(Growth *growth) {
    PyObject *blocks = PyList_New(0);
    for (Py_ssize_t i = 0; blocks != NULL && i < growth->num_fills; i++) {
        PyObject *state = PyList_GET_ITEM(growth->states, growth->fill_at[i]), *counts;
        PyObject *table = only_table(state);
        long long start = only_count(state, &counts), stop = growth->fill_stop[i];
        if (table == NULL || counts == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_RuntimeError, "grow_batch: a fill's table or counts went missing");
            Py_CLEAR(blocks);
            break;
        }
        for (long long j = start; j < stop && j < PyList_GET_SIZE(table); j++)
            if (PyList_Append(blocks, PyList_GET_ITEM(table, j)) < 0) {
                Py_CLEAR(blocks);
                break;
            }
        PyObject *moved = blocks != NULL && stop > start ? PyLong_FromLongLong(stop) : NULL;
        if (moved != NULL)
            PyList_SetItem(counts, 0, moved);  /* (takes ``moved``) */
        else if (blocks != NULL && stop > start)
            Py_CLEAR(blocks);
    }
    return blocks;
}

/* batched_growth.grow_together compiled where the pool is in its usual case (grow_batch): grow_lengths, fill_keys,
 * the pool's take, hand_out, fill_blocks and the caching in one call (a sequence named by its id or its holding).
 * False, nothing changed, where it is not (the Python path then runs); else grow_together's answer: how many grew, or
 * None where it would answer None. */
static PyObject *grow_batch(PyObject *self, PyObject *args) {
    PyObject *manager, *ids;
    long long num_tokens;
    if (!PyArg_ParseTuple(args, "OOL:grow_batch", &manager, &ids, &num_tokens))
        return NULL;
    PyObject *pool = NULL, *sequences = NULL, *enabled = NULL, *cached_ids = NULL, *queue = NULL, *maps = NULL,
             *duplicates = NULL, *keys = NULL, *taken = NULL, *num_taken = NULL, *past_final = NULL, *blocks = NULL,
             *result = NULL;
    Py_ssize_t block_size, num_free, cached_group = -1;
    Growth growth = {0};
    /* (one group: grow_together's own guards, and no key log) */
    int usual = num_tokens >= 1 ? usual_manager(manager, &pool, 0) : 0;
    if (usual <= 0) {
        result = usual < 0 ? NULL : Py_NewRef(Py_False);
        goto done;
    }
    if (read_size(manager, A_BLOCK_SIZE, &block_size) < 0 ||
            !(sequences = PyObject_GetAttr(manager, ATTRIBUTES[A_SEQUENCES])) ||
            !(enabled = PyObject_GetAttr(manager, ATTRIBUTES[A_ENABLE_PREFIX_CACHING])) ||
            !(cached_ids = PyObject_GetAttr(manager, ATTRIBUTES[A_CACHED_GROUP_IDS])) ||
            !(queue = PyObject_GetAttr(pool, ATTRIBUTES[A_FREE_BLOCKS])) ||
            !(maps = PyObject_GetAttr(pool, ATTRIBUTES[A_CACHED_BLOCKS])) ||
            !(duplicates = PyObject_GetAttr(pool, ATTRIBUTES[A_DUPLICATES])) ||
            read_size(queue, A_NUM_FREE, &num_free) < 0)
        goto done;
    if (!PyDict_CheckExact(sequences) || !PyList_CheckExact(maps) || PyList_GET_SIZE(maps) != 1 ||
            !PyDict_CheckExact(PyList_GET_ITEM(maps, 0))) {
        result = Py_NewRef(Py_False);  /* (not the manager's own kinds: the Python path) */
        goto done;
    }
    int caching = PyObject_IsTrue(enabled);
    if (caching < 0)
        goto done;
    if (caching && PyObject_Length(cached_ids) > 0) {
        PyObject *first = PySequence_GetItem(cached_ids, 0);
        cached_group = first == NULL ? -1 : PyLong_AsSsize_t(first);
        Py_XDECREF(first);
        if (cached_group == -1 && PyErr_Occurred())
            goto done;
        if (cached_group != 0) {  /* (one group: its only map) */
            result = Py_NewRef(Py_False);
            goto done;
        }
    }
    int grew = grow_states(&growth, sequences, ids, 1, num_tokens, block_size, 1, num_free, cached_group);
    if (grew <= 0) {
        result = grew < 0 ? NULL : Py_NewRef(Py_None);  /* (unknown, reserved ahead, loading: ``grow``'s path) */
        goto done;
    }
    int lists = growth_lists(&growth);
    if (lists <= 0) {  /* (lists of other kinds: the lengths moved back, and the Python path) */
        if (lists == 0 && move_lengths(growth.states, growth.num_grown, -num_tokens) == 0)
            result = Py_NewRef(Py_False);
        goto done;
    }
    if (growth.num_fills && cached_group >= 0) {
        if (!(keys = growth_fill_keys(&growth, PyList_GET_ITEM(maps, 0))))
            goto done;
        if (keys == Py_None) {  /* a key met: the lengths moved back, and grow_together's None */
            if (move_lengths(growth.states, growth.num_grown, -num_tokens) == 0)
                result = Py_NewRef(Py_None);
            goto done;
        }
    }
    if (growth.num_takes) {  /* (0 < blocks taken <= the free ones: grow_states counted them) */
        if (!(taken = PyList_New(0)) || !(num_taken = PyLong_FromLongLong(growth.num_taken)) ||
                !(past_final = PyObject_GetAttr(manager, ATTRIBUTES[A_PAST_FINAL])))
            goto done;
        if (!PyDict_Check(past_final)) {  /* (before the take: an error here changes nothing more) */
            PyErr_SetString(PyExc_TypeError, "grow_batch: the manager's past_final must be a dict");
            goto done;
        }
        int without_duplicates = PyList_CheckExact(duplicates) && PyList_GET_SIZE(duplicates) == 1 &&
            PyDict_CheckExact(PyList_GET_ITEM(duplicates, 0)) && PyDict_GET_SIZE(PyList_GET_ITEM(duplicates, 0)) == 0;
        PyObject *answer = without_duplicates ? take_blocks(pool, queue, growth.num_taken, taken)
                                              : Py_NewRef(Py_False);
        if (or_pools_own(answer, pool, A_TAKE, num_taken, taken) < 0 ||
                growth_hand_out(&growth, taken, past_final, block_size) < 0)
            goto done;
    }
    if (keys != NULL) {
        if (!(blocks = growth_fill_blocks(&growth)))
            goto done;
        if (PyList_GET_SIZE(blocks) && or_pools_own(cache_blocks(pool, keys, blocks), pool, A_CACHE_FRESH, keys,
                                                    blocks) < 0)
            goto done;
    }
    result = PyLong_FromSsize_t(growth.num_grown);
done:
    Py_XDECREF(pool);
    Py_XDECREF(sequences);
    Py_XDECREF(enabled);
    Py_XDECREF(cached_ids);
    Py_XDECREF(queue);
    Py_XDECREF(maps);
    Py_XDECREF(duplicates);
    Py_XDECREF(keys);
    Py_XDECREF(taken);
    Py_XDECREF(num_taken);
    Py_XDECREF(past_final);
    Py_XDECREF(blocks);
    growth_clear(&growth);
    return result;
}

/* The hit of a prompt's ``keys`` in one full-attention group's ``map`` (KVCacheCoordinator.search_hits: the walk
 * from the left over its first ``num_candidates`` keys, up to the first miss): how many blocks, and in ``*num_free``
 * how many of them no table holds (their counts in ``refs``); -1 with an error set. */
static Py_ssize_t walk_hits(PyObject *map, PyObject *keys_arg, Py_ssize_t num_candidates, PyObject *refs,
                            Py_ssize_t *num_free) {
    PyObject *keys = PySequence_Fast(keys_arg, "admission_headroom: block_hashes must be a sequence");
    if (keys == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(keys), num_hits = 0;
    *num_free = 0;
    for (; num_hits < n && num_hits < num_candidates; num_hits++) {
        PyObject *block = PyDict_GetItemWithError(map, PySequence_Fast_GET_ITEM(keys, num_hits));  /* borrowed */
        if (block == NULL || block == Py_None)  /* (a miss ends the hit, as BlockPool.lookup's) */
            break;
        Py_ssize_t index = block_index(refs, block), count;
        if (index < 0 || ((count = PyLong_AsSsize_t(PyList_GET_ITEM(refs, index))) == -1 && PyErr_Occurred()))
            break;
        *num_free += count == 0;
    }
    Py_DECREF(keys);
    return PyErr_Occurred() ? -1 : num_hits;
}

/* FreeBlockQueue.remove of ``blocks`` (prefix-cache hits take them out of the back part): each gains a stale entry,
 * the counts move, and the back list is compacted (FreeBlockQueue._compact: its live entries only, from 0) where
 * its stale entries outnumber the live ones. False, nothing changed, where the queue's parts are not its own kinds
 * (the queue's own ``remove`` then runs). */
static PyObject *remove_free(PyObject *self, PyObject *args) {
    PyObject *queue, *blocks_arg;
    if (!PyArg_ParseTuple(args, "OO:remove_free", &queue, &blocks_arg))
        return NULL;
    PyObject *blocks = NULL, *stale = NULL, *back = NULL, *live = NULL, *result = NULL;
    Py_ssize_t head, num_stale, n;
    if (!(stale = PyObject_GetAttr(queue, ATTRIBUTES[A_STALE])) ||
            !(back = PyObject_GetAttr(queue, ATTRIBUTES[A_BACK])) || read_size(queue, A_HEAD, &head) < 0 ||
            read_size(queue, A_NUM_STALE, &num_stale) < 0)
        goto done;
    if (!PyDict_CheckExact(stale) || !PyList_CheckExact(back) || head < 0 || head > PyList_GET_SIZE(back)) {
        result = Py_NewRef(Py_False);
        goto done;
    }
    if (!(blocks = PySequence_Fast(blocks_arg, "remove_free: blocks must be a sequence")))
        goto done;
    n = PySequence_Fast_GET_SIZE(blocks);
    for (Py_ssize_t i = 0; i < n; i++) {  /* stale[block] = stale.get(block, 0) + 1 */
        PyObject *block = PySequence_Fast_GET_ITEM(blocks, i);
        PyObject *count = PyDict_GetItemWithError(stale, block);  /* borrowed */
        if (count == NULL && PyErr_Occurred())
            goto done;
        PyObject *more = count == NULL ? Py_NewRef(ONE) : PyNumber_Add(count, ONE);
        int failed = more == NULL || PyDict_SetItem(stale, block, more) < 0;
        Py_XDECREF(more);
        if (failed)
            goto done;
    }
    num_stale += n;
    if (write_size(queue, A_NUM_STALE, num_stale) < 0 || add_size(queue, A_NUM_FREE, -n) < 0)
        goto done;
    Py_ssize_t num_live = PyList_GET_SIZE(back) - head - num_stale;
    if (num_stale > num_live) {  /* (_compact: the back list's live entries, in order: take_back's walk over all) */
        if (!(live = PyList_New(0)) || take_back(back, &head, stale, &num_stale, num_live, live) < 0 ||
                PyObject_SetAttr(queue, ATTRIBUTES[A_BACK], live) < 0 || write_size(queue, A_HEAD, 0) < 0 ||
                write_size(queue, A_NUM_STALE, 0) < 0)
            goto done;
        PyDict_Clear(stale);  /* (the stale entries it did not reach, past the last live one, go with the list) */
    }
    result = Py_NewRef(Py_True);
done:
    Py_XDECREF(blocks);
    Py_XDECREF(stale);
    Py_XDECREF(back);
    Py_XDECREF(live);
    return result;
}

/* PagedAllocator.admission_headroom where no group slides: the free blocks less the gate's count and ``keep``, in
 * slots. The gate counts every group's blocks for the prompt; with one group, its blocks past the hit and the hit's
 * blocks no table holds (KVCacheCoordinator.blocks_to_allocate). None where a hit is possible in several groups, a
 * group slides or the count is negative (the Python path answers or raises). */
static PyObject *admission_headroom(PyObject *self, PyObject *args) {
    PyObject *manager, *keys;
    long long num_tokens, keep;
    if (!PyArg_ParseTuple(args, "OOLL:admission_headroom", &manager, &keys, &num_tokens, &keep))
        return NULL;
    PyObject *sliding = NULL, *enabled = NULL, *groups = NULL, *pool = NULL, *queue = NULL, *full_ids = NULL,
             *maps = NULL, *map = NULL, *first = NULL, *refs = NULL, *result = NULL;
    Py_ssize_t block_size, num_free, num_groups, num_keys, num_hits = 0, num_free_hits = 0;
    int caching;
    if (!(sliding = PyObject_GetAttr(manager, ATTRIBUTES[A_SLIDING])) ||
            !(enabled = PyObject_GetAttr(manager, ATTRIBUTES[A_ENABLE_PREFIX_CACHING])) ||
            read_size(manager, A_BLOCK_SIZE, &block_size) < 0 || (caching = PyObject_IsTrue(enabled)) < 0 ||
            !(groups = PyObject_GetAttr(manager, ATTRIBUTES[A_GROUPS])) || (num_groups = PyObject_Length(groups)) < 0)
        goto done;
    if (sliding != Py_None || num_tokens < 0 || block_size < 1) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    if (!(pool = PyObject_GetAttr(manager, ATTRIBUTES[A_POOL])))
        goto done;
    if (caching && num_tokens > block_size) {  /* (find_hits: a hit needs a prompt past one block and a first key) */
        if ((num_keys = PyObject_Length(keys)) < 0)
            goto done;
        if (num_keys > 0) {
            Py_ssize_t group;
            if (!(full_ids = PyObject_GetAttr(manager, ATTRIBUTES[A_FULL_IDS])) ||
                    !(maps = PyObject_GetAttr(pool, ATTRIBUTES[A_CACHED_BLOCKS])) ||
                    !(first = PySequence_GetItem(full_ids, 0)) ||
                    ((group = PyLong_AsSsize_t(first)) == -1 && PyErr_Occurred()) ||
                    !(map = PySequence_GetItem(maps, group)) ||
                    !(refs = PyObject_GetAttr(pool, ATTRIBUTES[A_REF_COUNTS])))
                goto done;
            if (num_groups == 1 && PyDict_CheckExact(map) && PyList_CheckExact(refs)) {
                if ((num_hits = walk_hits(map, keys, (num_tokens - 1) / block_size, refs, &num_free_hits)) < 0)
                    goto done;
            } else {
                Py_SETREF(first, PySequence_GetItem(keys, 0));
                int found = first == NULL ? -1 : PySequence_Contains(map, first);
                if (found != 0) {
                    result = found == 1 ? Py_NewRef(Py_None) : NULL;  /* (the search for hits, in Python) */
                    goto done;
                }
            }
        }
    }
    if (!(queue = PyObject_GetAttr(pool, ATTRIBUTES[A_FREE_BLOCKS])) || read_size(queue, A_NUM_FREE, &num_free) < 0)
        goto done;
    long long required = (num_tokens + block_size - 1) / block_size;
    long long blocks = num_hits ? (required > num_hits ? required - num_hits : 0) + num_free_hits
                                : (long long)num_groups * required;
    result = PyLong_FromLongLong((num_free - blocks - keep) * block_size);
done:
    Py_XDECREF(sliding);
    Py_XDECREF(enabled);
    Py_XDECREF(groups);
    Py_XDECREF(pool);
    Py_XDECREF(queue);
    Py_XDECREF(full_ids);
    Py_XDECREF(maps);
    Py_XDECREF(map);
    Py_XDECREF(first);
    Py_XDECREF(refs);
    return result;
}

/* BlockPool.release_split of one table (release_into): its first ``num_keyed`` blocks (offered to the cache) and the
 * rest, each part tail first (single_type.tail_first), as KVCacheCoordinator.release_tables splits them. The keyed
 * part's blocks held once are freed up to the first shared one, the others counted down (BlockPool.unreference);
 * the keyless part is freed and goes to the front, the freed keyed blocks to the back; the counts. False, nothing
 * changed, where the pool's lists are not its own kinds. */
static PyObject *release_table(PyObject *pool, PyObject *table, Py_ssize_t num_keyed) {
    Py_ssize_t n = PyList_GET_SIZE(table);
    PyObject *refs = NULL, *queue = NULL, *front = NULL, *back = NULL, *keyed = NULL, *freed = NULL,
             *forward = NULL, *result = NULL;
    if (!(refs = PyObject_GetAttr(pool, ATTRIBUTES[A_REF_COUNTS])) ||
            !(queue = PyObject_GetAttr(pool, ATTRIBUTES[A_FREE_BLOCKS])) ||
            !(front = PyObject_GetAttr(queue, ATTRIBUTES[A_FRONT])) ||
            !(back = PyObject_GetAttr(queue, ATTRIBUTES[A_BACK])))
        goto done;
    if (num_keyed < 0 || num_keyed > n || !PyList_CheckExact(refs) || !PyList_CheckExact(back)) {
        result = Py_NewRef(Py_False);
        goto done;
    }
    if (!(keyed = PyList_New(num_keyed)))
        goto done;
    for (Py_ssize_t i = 0; i < num_keyed; i++)
        PyList_SET_ITEM(keyed, i, Py_NewRef(PyList_GET_ITEM(table, num_keyed - 1 - i)));
    /* The keyed part: held once up to the first shared block, freed; from there each counted down */
    Py_ssize_t first = free_held_once(refs, keyed);
    if (first < 0)
        goto done;
    if (first == num_keyed)
        freed = Py_NewRef(keyed);
    else {
        if (!(freed = PyList_GetSlice(keyed, 0, first)))
            goto done;
        for (Py_ssize_t i = first; i < num_keyed; i++) {
            PyObject *block = PyList_GET_ITEM(keyed, i);
            Py_ssize_t index = block_index(refs, block);
            if (index < 0)
                goto done;
            Py_ssize_t count = PyLong_AsSsize_t(PyList_GET_ITEM(refs, index));
            PyObject *fewer = count == -1 && PyErr_Occurred() ? NULL : PyLong_FromSsize_t(count - 1);
            if (fewer == NULL)
                goto done;
            PyList_SetItem(refs, index, fewer);  /* (takes ``fewer``) */
            if (count == 1 && PyList_Append(freed, block) < 0)
                goto done;
        }
        if (add_size(pool, A_NUM_SHARED_REFERENCES, -(num_keyed - PyList_GET_SIZE(freed))) < 0)
            goto done;
    }
    /* The keyless part: freed, to the front in table order (FreeBlockQueue.prepend of it tail first) */
    if (!(forward = PyList_GetSlice(table, num_keyed, n)) || set_each(refs, forward, n - num_keyed, ZERO) < 0)
        goto done;
    PyObject *extended = PyObject_CallMethodOneArg(front, ATTRIBUTES[A_EXTENDLEFT], forward);
    if (extended == NULL)
        goto done;
    Py_DECREF(extended);
    Py_ssize_t num_freed = PyList_GET_SIZE(freed) + n - num_keyed;
    if (PyList_SetSlice(back, PyList_GET_SIZE(back), PyList_GET_SIZE(back), freed) < 0 ||
            add_size(queue, A_NUM_FREE, num_freed) < 0 || add_size(pool, A_NUM_FREES, num_freed) < 0)
        goto done;
    result = Py_NewRef(Py_True);
done:
    Py_XDECREF(refs);
    Py_XDECREF(queue);
    Py_XDECREF(front);
    Py_XDECREF(back);
    Py_XDECREF(keyed);
    Py_XDECREF(freed);
    Py_XDECREF(forward);
    return result;
}

static PyObject *release_into(PyObject *self, PyObject *args) {
    PyObject *pool, *table;
    Py_ssize_t num_keyed;
    if (!PyArg_ParseTuple(args, "OO!n:release_into", &pool, &PyList_Type, &table, &num_keyed))
        return NULL;
    return release_table(pool, table, num_keyed);
}

/* KVBlockManager.release_sequence in one call where KVCacheCoordinator.release_tables takes its compiled path (one
 * group, no window, no fork) and the sequence is live and not among the ids released (only a fork's child is both):
 * its table released (release_table), it is no longer past its final length nor live, and its id is the latest
 * released, the oldest forgotten past ``kept``. False, nothing changed, elsewhere (an unknown or released id, lists of
 * other kinds): the Python path then runs and raises where it raises. */
static PyObject *release_sequence_into(PyObject *self, PyObject *args) {
    PyObject *manager, *sequence_id;
    Py_ssize_t kept;
    if (!PyArg_ParseTuple(args, "OOn:release_sequence_into", &manager, &sequence_id, &kept))
        return NULL;
    PyObject *pool = NULL, *window = NULL, *forks = NULL, *sequences = NULL, *released = NULL, *past_final = NULL,
             *result = NULL;
    Py_ssize_t num_groups;
    int usual = -1;
    if ((pool = PyObject_GetAttr(manager, ATTRIBUTES[A_POOL])) && read_size(pool, A_NUM_GROUPS, &num_groups) == 0 &&
            (window = PyObject_GetAttr(manager, ATTRIBUTES[A_WINDOW])) &&
            (forks = PyObject_GetAttr(manager, ATTRIBUTES[A_NUM_FORKS])))
        usual = num_groups == 1 && window == Py_None ? PyObject_Not(forks) : 0;  /* (only_offered_blocks_keyed) */
    if (usual == 1 && (!(sequences = PyObject_GetAttr(manager, ATTRIBUTES[A_SEQUENCES])) ||
                       !(released = PyObject_GetAttr(manager, ATTRIBUTES[A_RELEASED])) ||
                       !(past_final = PyObject_GetAttr(manager, ATTRIBUTES[A_PAST_FINAL]))))
        usual = -1;
    if (usual == 1)  /* (the manager's own kinds) */
        usual = PyDict_CheckExact(sequences) && PyODict_Check(released) && PyDict_CheckExact(past_final);
    PyObject *state = usual == 1 ? PyDict_GetItemWithError(sequences, sequence_id) : NULL;  /* (borrowed) */
    int known = state == NULL ? 0 : PyDict_Contains(released, sequence_id);
    if (usual < 0 || known < 0 || PyErr_Occurred())
        goto done;
    if (state == NULL || known || !Py_IS_TYPE(state, STATE_TYPE)) {
        result = Py_NewRef(Py_False);  /* (unusual, an unknown or released id, other kinds: the Python path) */
        goto done;
    }
    /* (its table and count borrowed from the state, which its entry holds until the table is released) */
    PyObject *table = only_table(state), *counts = NULL, *answer = NULL;
    long long num_keyed = table == NULL ? -1 : only_count(state, &counts);
    if (!PyErr_Occurred())
        answer = counts == NULL ? Py_NewRef(Py_False) : release_table(pool, table, (Py_ssize_t)num_keyed);
    if (answer == NULL || answer == Py_False) {
        result = answer;  /* (False: nothing changed) */
        goto done;
    }
    Py_DECREF(answer);
    int listed = PyDict_Contains(past_final, sequence_id);
    if (listed < 0 || (listed && PyDict_DelItem(past_final, sequence_id) < 0) ||
            PyDict_DelItem(sequences, sequence_id) < 0 || PyODict_SetItem(released, sequence_id, Py_None) < 0)
        goto done;
    if (PyDict_GET_SIZE(released) > kept) {  /* (popitem(last=False): the oldest) */
        PyObject *oldest = PyObject_CallMethodObjArgs(released, ATTRIBUTES[A_POPITEM], Py_False, NULL);
        if (oldest == NULL)
            goto done;
        Py_DECREF(oldest);
    }
    result = Py_NewRef(Py_True);
done:
    Py_XDECREF(pool);
    Py_XDECREF(window);
    Py_XDECREF(forks);
    Py_XDECREF(sequences);
    Py_XDECREF(released);
    Py_XDECREF(past_final);
    return result;
}

static PyObject *bind_private(PyObject *self, PyObject *key) {
    Py_INCREF(key);
    Py_XSETREF(PRIVATE, key);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"enter_keys", enter_keys, METH_VARARGS, NULL},
    {"hold_evicting", hold_evicting, METH_VARARGS, NULL},
    {"name_private", name_private, METH_VARARGS, NULL},
    {"bind_private", bind_private, METH_O, NULL},
    {"free_unshared", free_unshared, METH_VARARGS, NULL},
    {"set_refs", set_refs, METH_VARARGS, NULL},
    {"lookup", lookup, METH_VARARGS, NULL},
    {"add_references", add_references, METH_VARARGS, NULL},
    {"bind_sequence_state", bind_sequence_state, METH_O, NULL},
    {"bind_holding", bind_holding, METH_O, NULL},
    {"grow_lengths", grow_lengths, METH_VARARGS, NULL},
    {"fill_keys", fill_keys, METH_VARARGS, NULL},
    {"hand_out", hand_out, METH_VARARGS, NULL},
    {"fill_blocks", fill_blocks, METH_VARARGS, NULL},
    {"take_into", take_into, METH_VARARGS, NULL},
    {"cache_into", cache_into, METH_VARARGS, NULL},
    {"grow_batch", grow_batch, METH_VARARGS, NULL},
    {"admission_headroom", admission_headroom, METH_VARARGS, NULL},
    {"release_sequence_into", release_sequence_into, METH_VARARGS, NULL},
    {"remove_free", remove_free, METH_VARARGS, NULL},
    {"create_into", create_into, METH_VARARGS, NULL},
    {"release_into", release_into, METH_VARARGS, NULL},
    {"full_attention_profile", full_attention_profile, METH_VARARGS, NULL},
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
    for (int i = 0; i < A_COUNT; i++)
        if ((ATTRIBUTES[i] = PyUnicode_InternFromString(ATTRIBUTE_NAMES[i])) == NULL)
            return NULL;
    return PyModule_Create(&module);
}
