/* Prefix keys compiled: content_hash and block_content_keys with the same arguments and results as the Python
 * reference in prefix.py, which builds this file at run time (CPython's C API, no other library) and checks it
 * there (tests/memory/test_prefix_keys.py compares the two on random contents and runs, key for key).
 *
 * A key is the first 60 bits of the 8-byte BLAKE2b digest of the pickle (protocol 5) of (parent, content). In
 * Python a digest costs a pickler's call, a hasher's copy, update and digest, and an int built from bytes: a
 * microsecond, and a replay makes one a run of every prompt it admits (hundreds of thousands). Here the pickle of
 * the contents a replay's runs take (None, ints, strings, and tuples of them) is written byte for byte as CPython's
 * pickler writes it, its memo of repeated strings and tuples included, and hashed by BLAKE2b (RFC 7693) written
 * out below. Any other content (another type, a subclass, a string UTF-8 cannot encode, a long pickle) goes to the
 * reference's content_hash, and runs that are not (label, int) pairs to its block_content_keys (bind() names both).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* ---- BLAKE2b, unkeyed, an 8-byte digest ---- */

static const uint64_t IV[8] = {
    0x6a09e667f3bcc908ULL, 0xbb67ae8584caa73bULL, 0x3c6ef372fe94f82bULL, 0xa54ff53a5f1d36f1ULL,
    0x510e527fade682d1ULL, 0x9b05688c2b3e6c1fULL, 0x1f83d9abfb41bd6bULL, 0x5be0cd19137e2179ULL,
};

static const uint8_t SIGMA[12][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4}, {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13}, {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11}, {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5}, {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
};

#define ROTR64(x, n) (((x) >> (n)) | ((x) << (64 - (n))))
#define G(a, b, c, d, x, y)                                                                                        \
    do {                                                                                                           \
        v[a] = v[a] + v[b] + (x);                                                                                  \
        v[d] = ROTR64(v[d] ^ v[a], 32);                                                                            \
        v[c] = v[c] + v[d];                                                                                        \
        v[b] = ROTR64(v[b] ^ v[c], 24);                                                                            \
        v[a] = v[a] + v[b] + (y);                                                                                  \
        v[d] = ROTR64(v[d] ^ v[a], 16);                                                                            \
        v[c] = v[c] + v[d];                                                                                        \
        v[b] = ROTR64(v[b] ^ v[c], 63);                                                                            \
    } while (0)

static void compress(uint64_t h[8], const uint8_t block[128], uint64_t counted, int last) {
    uint64_t v[16], m[16];
    for (int i = 0; i < 16; i++) {
        uint64_t word = 0;
        for (int j = 7; j >= 0; j--)
            word = (word << 8) | block[8 * i + j];  /* little-endian */
        m[i] = word;
    }
    for (int i = 0; i < 8; i++) {
        v[i] = h[i];
        v[i + 8] = IV[i];
    }
    v[12] ^= counted;  /* (the counter's high word stays 0: a pickle here is a few hundred bytes) */
    if (last)
        v[14] = ~v[14];
    for (int r = 0; r < 12; r++) {
        const uint8_t *s = SIGMA[r];
        G(0, 4, 8, 12, m[s[0]], m[s[1]]);
        G(1, 5, 9, 13, m[s[2]], m[s[3]]);
        G(2, 6, 10, 14, m[s[4]], m[s[5]]);
        G(3, 7, 11, 15, m[s[6]], m[s[7]]);
        G(0, 5, 10, 15, m[s[8]], m[s[9]]);
        G(1, 6, 11, 12, m[s[10]], m[s[11]]);
        G(2, 7, 8, 13, m[s[12]], m[s[13]]);
        G(3, 4, 9, 14, m[s[14]], m[s[15]]);
    }
    for (int i = 0; i < 8; i++)
        h[i] ^= v[i] ^ v[i + 8];
}

/* The 8-byte BLAKE2b digest of ``data``, read big-endian (as int.from_bytes(digest, "big")). */
static uint64_t blake2b_64(const uint8_t *data, size_t size) {
    uint64_t h[8];
    memcpy(h, IV, sizeof h);
    h[0] ^= 0x01010000ULL ^ 8;  /* depth 1, fanout 1, no key, 8-byte digest */
    uint64_t counted = 0;
    while (size > 128) {
        counted += 128;
        compress(h, data, counted, 0);
        data += 128;
        size -= 128;
    }
    uint8_t block[128] = {0};
    memcpy(block, data, size);
    compress(h, block, counted + size, 1);
    uint64_t digest = 0;
    for (int j = 0; j < 8; j++)
        digest = (digest << 8) | ((h[0] >> (8 * j)) & 0xff);  /* the digest's bytes are h[0]'s, little-endian */
    return digest;
}

/* ---- the pickle of (parent, content), protocol 5, as CPython's pickler writes it ---- */

#define PICKLE_BYTES 512  /* a longer pickle goes to the reference (one frame: CPython splits frames at 64 KiB) */
#define MEMO_SIZE 64
#define HEADER 11  /* PROTO 5, then FRAME and its 8-byte length */

typedef struct {
    uint8_t bytes[PICKLE_BYTES];
    size_t size;
    PyObject *memo[MEMO_SIZE];  /* what each MEMOIZE stored, by index (NULL: a tuple made for this pickle alone) */
    int num_memo;
} Pickle;

/* Each writer returns 0 where the reference must pickle this content (no Python error set). */
static int put(Pickle *p, const void *bytes, size_t size) {
    if (p->size + size > PICKLE_BYTES)
        return 0;
    memcpy(p->bytes + p->size, bytes, size);
    p->size += size;
    return 1;
}

static int put_byte(Pickle *p, uint8_t byte) {
    return put(p, &byte, 1);
}

static int memoize(Pickle *p, PyObject *obj) {
    if (p->num_memo == MEMO_SIZE)
        return 0;
    p->memo[p->num_memo++] = obj;
    return put_byte(p, 0x94);  /* MEMOIZE */
}

/* BINGET of ``obj`` where the memo holds it: 1 written, 0 not held, -1 for the reference. */
static int memo_get(Pickle *p, PyObject *obj) {
    for (int i = 0; i < p->num_memo; i++)
        if (p->memo[i] == obj) {
            uint8_t get[2] = {'h', (uint8_t)i};  /* BINGET (MEMO_SIZE < 256) */
            return put(p, get, 2) ? 1 : -1;
        }
    return 0;
}

static int bit_length(unsigned long long x) {
#if defined(__GNUC__) || defined(__clang__)
    return x ? 64 - __builtin_clzll(x) : 0;
#else
    int bits = 0;
    for (; x; x >>= 1)
        bits++;
    return bits;
#endif
}

static int save_int(Pickle *p, long long value) {
    uint8_t out[11];  /* LONG1: the opcode, the size, 9 bytes at most */
    if (value >= 0 && value <= 0xff) {
        out[0] = 'K';  /* BININT1 */
        out[1] = (uint8_t)value;
        return put(p, out, 2);
    }
    if (value >= 0 && value <= 0xffff) {
        out[0] = 'M';  /* BININT2 */
        out[1] = (uint8_t)value;
        out[2] = (uint8_t)(value >> 8);
        return put(p, out, 3);
    }
    if (value >= -0x80000000LL && value <= 0x7fffffffLL) {
        out[0] = 'J';  /* BININT */
        for (int j = 0; j < 4; j++)
            out[1 + j] = (uint8_t)((unsigned long long)value >> (8 * j));
        return put(p, out, 5);
    }
    /* LONG1: two's complement, little-endian, in (bits of |value|) / 8 + 1 bytes, less a redundant sign byte */
    unsigned long long magnitude = value < 0 ? 0ULL - (unsigned long long)value : (unsigned long long)value;
    int bits = bit_length(magnitude);
    int size = bits / 8 + 1;
    out[0] = 0x8a;
    for (int j = 0; j < size; j++)
        out[2 + j] = j < 8 ? (uint8_t)((unsigned long long)value >> (8 * j)) : (value < 0 ? 0xff : 0);
    if (value < 0 && size > 1 && out[2 + size - 1] == 0xff && (out[2 + size - 2] & 0x80))
        size--;
    out[1] = (uint8_t)size;
    return put(p, out, 2 + size);
}

static int save(Pickle *p, PyObject *obj);

static int save_tuple_end(Pickle *p, Py_ssize_t size, PyObject *obj) {
    if (!put_byte(p, size <= 3 ? (uint8_t)(0x84 + size) : 't'))  /* TUPLE1..3, or TUPLE after a MARK */
        return 0;
    return memoize(p, obj);
}

static int save(Pickle *p, PyObject *obj) {
    if (obj == Py_None)
        return put_byte(p, 'N');
    if (PyLong_CheckExact(obj)) {
        int overflow;
        long long value = PyLong_AsLongLongAndOverflow(obj, &overflow);
        if (overflow || (value == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return 0;
        }
        return save_int(p, value);
    }
    int held = memo_get(p, obj);
    if (held)
        return held > 0;
    if (PyUnicode_CheckExact(obj)) {
        Py_ssize_t size;
        const char *text = PyUnicode_AsUTF8AndSize(obj, &size);
        if (text == NULL) {  /* (a lone surrogate: the pickler's own encoding) */
            PyErr_Clear();
            return 0;
        }
        if (size >= 256)
            return 0;
        uint8_t head[2] = {0x8c, (uint8_t)size};  /* SHORT_BINUNICODE */
        return put(p, head, 2) && put(p, text, (size_t)size) && memoize(p, obj);
    }
    if (PyTuple_CheckExact(obj)) {
        Py_ssize_t size = PyTuple_GET_SIZE(obj);
        if (size == 0)
            return put_byte(p, ')');  /* EMPTY_TUPLE, not memoized */
        if (size > 3 && !put_byte(p, '('))  /* MARK */
            return 0;
        for (Py_ssize_t i = 0; i < size; i++)
            if (!save(p, PyTuple_GET_ITEM(obj, i)))
                return 0;
        return save_tuple_end(p, size, obj);
    }
    return 0;
}

/* A piece of a block: tokens start..stop of the run ``label``. */
typedef struct {
    PyObject *label;  /* borrowed: the runs hold it */
    long long start, stop;
} Piece;

static PyObject *python_content_hash, *python_block_content_keys;  /* the reference's (bind) */

/* A pickle begun: its header's place, then the parent (``has_parent`` 0: None). */
static int begin(Pickle *p, int has_parent, long long parent) {
    p->size = HEADER;
    p->num_memo = 0;
    return has_parent ? save_int(p, parent) : put_byte(p, 'N');
}

/* The key of a pickle whose content is written: the pair's tuple, STOP, the header; 60 bits of its digest. */
static int finish(Pickle *p, long long *key) {
    if (!save_tuple_end(p, 2, NULL) || !put_byte(p, '.'))
        return 0;
    uint64_t frame = p->size - HEADER;
    p->bytes[0] = 0x80;  /* PROTO 5 */
    p->bytes[1] = 5;
    p->bytes[2] = 0x95;  /* FRAME */
    for (int j = 0; j < 8; j++)
        p->bytes[3 + j] = (uint8_t)(frame >> (8 * j));
    *key = (long long)(blake2b_64(p->bytes, p->size) >> 4);
    return 1;
}

/* The reference's key of (parent, content); -1 with a Python error set where it fails. */
static long long reference_key(int has_parent, long long parent, PyObject *content) {
    if (python_content_hash == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "prefix keys: bind() was not called");
        return -1;
    }
    PyObject *parent_obj = has_parent ? PyLong_FromLongLong(parent) : Py_NewRef(Py_None);
    if (parent_obj == NULL)
        return -1;
    PyObject *key = PyObject_CallFunctionObjArgs(python_content_hash, parent_obj, content, NULL);
    Py_DECREF(parent_obj);
    if (key == NULL)
        return -1;
    long long value = PyLong_AsLongLong(key);
    Py_DECREF(key);
    return value;  /* (-1 with an error set only where it failed: a key is below 2**60) */
}

/* The key of (parent, content): ``has_parent`` 0 for None. ``content`` is (label, start) where ``pieces`` is NULL,
 * else the tuple of the ``num_pieces`` pieces as (label, start, stop). -1 with a Python error set where it fails. */
static long long key_of(int has_parent, long long parent, PyObject *label, long long start, const Piece *pieces,
                        Py_ssize_t num_pieces) {
    Pickle p;
    int ok = begin(&p, has_parent, parent);
    if (pieces == NULL) {
        ok = ok && save(&p, label) && save_int(&p, start) && save_tuple_end(&p, 2, NULL);
    } else {
        ok = ok && (num_pieces <= 3 || put_byte(&p, '('));
        for (Py_ssize_t i = 0; ok && i < num_pieces; i++)
            ok = save(&p, pieces[i].label) && save_int(&p, pieces[i].start) && save_int(&p, pieces[i].stop)
                 && save_tuple_end(&p, 3, NULL);
        ok = ok && save_tuple_end(&p, num_pieces, NULL);
    }
    long long key;
    if (ok && finish(&p, &key))
        return key;
    /* The reference pickles it: the same objects, built */
    PyObject *content;
    if (pieces == NULL) {
        content = Py_BuildValue("(OL)", label, start);
    } else {
        content = PyTuple_New(num_pieces);
        for (Py_ssize_t i = 0; content != NULL && i < num_pieces; i++) {
            PyObject *piece = Py_BuildValue("(OLL)", pieces[i].label, pieces[i].start, pieces[i].stop);
            if (piece == NULL)
                Py_CLEAR(content);
            else
                PyTuple_SET_ITEM(content, i, piece);
        }
    }
    if (content == NULL)
        return -1;
    key = reference_key(has_parent, parent, content);
    Py_DECREF(content);
    return key;
}

static PyObject *content_hash(PyObject *self, PyObject *args) {
    PyObject *parent_obj, *content;
    if (!PyArg_ParseTuple(args, "OO:content_hash", &parent_obj, &content))
        return NULL;
    int has_parent = parent_obj != Py_None, overflow = 0;
    long long parent = 0;
    if (has_parent && PyLong_CheckExact(parent_obj)) {
        parent = PyLong_AsLongLongAndOverflow(parent_obj, &overflow);
        if (parent == -1 && PyErr_Occurred())
            return NULL;
    }
    Pickle p;
    long long key;
    if ((!has_parent || (PyLong_CheckExact(parent_obj) && !overflow)) && begin(&p, has_parent, parent)
            && save(&p, content) && finish(&p, &key))
        return PyLong_FromLongLong(key);
    if (python_content_hash == NULL)
        return PyErr_Format(PyExc_RuntimeError, "prefix keys: bind() was not called");
    return PyObject_CallFunctionObjArgs(python_content_hash, parent_obj, content, NULL);
}

/* Python's floor division (block_size > 0). */
static long long floor_div(long long a, long long b) {
    long long q = a / b;
    return (a % b != 0 && a < 0) ? q - 1 : q;
}

#define MAX_LENGTH (1LL << 40)  /* a run longer goes to the reference (keys stay far below 2**63) */

/* A run of the token stream: ``length`` tokens of ``label`` (borrowed: the caller's sequences hold it). */
typedef struct {
    PyObject *label;
    long long length;
} Run;

/* ``length`` read from ``obj`` where it is an int the loop takes (exact, below MAX_LENGTH either way); 0 else. */
static int run_length(PyObject *obj, long long *length) {
    if (!PyLong_CheckExact(obj))
        return 0;
    *length = PyLong_AsLongLong(obj);
    if (*length == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return *length > -MAX_LENGTH && *length < MAX_LENGTH;
}

/* ``runs[from:]`` read from ``items``, (label, int) pairs; 0 where one is not. */
static int read_runs(Run *runs, Py_ssize_t from, PyObject **items, Py_ssize_t num_items) {
    for (Py_ssize_t i = 0; i < num_items; i++) {
        PyObject *item = items[i];
        if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 2
                || !run_length(PyTuple_GET_ITEM(item, 1), &runs[from + i].length))
            return 0;
        runs[from + i].label = PyTuple_GET_ITEM(item, 0);
    }
    return 1;
}

/* The keys of the stream ``runs``: prefix.py's python_block_content_keys, step for step. */
static PyObject *keys_of_runs(const Run *runs, Py_ssize_t num_runs, long long block_size) {
    PyObject *keys = PyList_New(0);
    Piece *pieces = NULL;  /* a block begun in an earlier run */
    Py_ssize_t num_pieces = 0, capacity = 0;
    int has_chain = 0;  /* the hash of all content before ``pieces`` (0: None) */
    long long chain = 0, filled = 0;
    for (Py_ssize_t i = 0; keys != NULL && i < num_runs; i++) {
        PyObject *label = runs[i].label;
        long long length = runs[i].length, start = 0;
        if (length == 0)
            continue;
        if (num_pieces) {
            start = block_size - filled < length ? block_size - filled : length;
            if (num_pieces == capacity) {
                capacity = 2 * capacity + 4;
                Piece *grown = PyMem_Realloc(pieces, (size_t)capacity * sizeof(Piece));
                if (grown == NULL) {
                    PyErr_NoMemory();
                    Py_CLEAR(keys);
                    break;
                }
                pieces = grown;
            }
            pieces[num_pieces++] = (Piece){label, 0, start};
            filled += start;
            if (filled < block_size)
                continue;
            chain = key_of(has_chain, chain, NULL, 0, pieces, num_pieces);
            PyObject *key = chain == -1 && PyErr_Occurred() ? NULL : PyLong_FromLongLong(chain);
            if (key == NULL || PyList_Append(keys, key) < 0) {
                Py_XDECREF(key);
                Py_CLEAR(keys);
                break;
            }
            Py_DECREF(key);
            has_chain = 1;
            num_pieces = filled = 0;
        }
        long long whole = floor_div(length - start, block_size);
        if (whole) {
            long long run_key = key_of(has_chain, chain, label, start, NULL, 0);
            if (run_key == -1 && PyErr_Occurred()) {
                Py_CLEAR(keys);
                break;
            }
            has_chain = 1;
            chain = run_key + whole;
            for (long long k = run_key; k < chain; k++) {  /* (a negative length keys no block) */
                PyObject *key = PyLong_FromLongLong(k);
                if (key == NULL || PyList_Append(keys, key) < 0) {
                    Py_XDECREF(key);
                    Py_CLEAR(keys);
                    break;
                }
                Py_DECREF(key);
            }
        }
        if (keys != NULL && start + whole * block_size < length) {
            if (capacity == 0) {
                capacity = 4;
                pieces = PyMem_Malloc((size_t)capacity * sizeof(Piece));
                if (pieces == NULL) {
                    PyErr_NoMemory();
                    Py_CLEAR(keys);
                    break;
                }
            }
            pieces[0] = (Piece){label, start + whole * block_size, length};
            num_pieces = 1;
            filled = length - pieces[0].start;
        }
    }
    PyMem_Free(pieces);
    return keys;
}

/* The block size where the loop takes it (an exact int of 1 to 2**31 - 1); 0 else. */
static long long plain_block_size(PyObject *obj) {
    long long block_size;
    return run_length(obj, &block_size) && block_size >= 1 && block_size < (1LL << 31) ? block_size : 0;
}

static PyObject *python_segment_keys;  /* the reference's (bind) */

/* ``reference(*args)``, or RuntimeError where bind() was not called. */
static PyObject *call_reference(PyObject *reference, PyObject *args) {
    if (reference == NULL)
        return PyErr_Format(PyExc_RuntimeError, "prefix keys: bind() was not called");
    return PyObject_Call(reference, args, NULL);
}

static PyObject *block_content_keys(PyObject *self, PyObject *args) {
    PyObject *runs_arg, *size_obj;
    if (!PyArg_ParseTuple(args, "OO:block_content_keys", &runs_arg, &size_obj))
        return NULL;
    PyObject *runs = PySequence_Fast(runs_arg, "block_content_keys: runs must be iterable");
    if (runs == NULL)
        return NULL;
    Py_ssize_t num_runs = PySequence_Fast_GET_SIZE(runs);
    long long block_size = plain_block_size(size_obj);
    Run *read = PyMem_Malloc((size_t)(num_runs + 1) * sizeof(Run));
    PyObject *keys;
    if (read == NULL)
        keys = PyErr_NoMemory();
    else if (block_size && read_runs(read, 0, PySequence_Fast_ITEMS(runs), num_runs))
        keys = keys_of_runs(read, num_runs, block_size);
    else {  /* (the runs as a list: an iterator given is spent) */
        PyObject *again = PyTuple_Pack(2, runs, size_obj);
        keys = again == NULL ? NULL : call_reference(python_block_content_keys, again);
        Py_XDECREF(again);
    }
    PyMem_Free(read);
    Py_DECREF(runs);
    return keys;
}

static PyObject *segment_keys(PyObject *self, PyObject *args) {
    PyObject *prefix_arg, *segments, *own_arg, *size_obj;
    if (!PyArg_ParseTuple(args, "OOOO:segment_keys", &prefix_arg, &segments, &own_arg, &size_obj))
        return NULL;
    PyObject *prefix = PySequence_Fast(prefix_arg, "segment_keys: prefix must be a sequence");
    if (prefix == NULL)
        return NULL;
    PyObject *own = PySequence_Fast(own_arg, "segment_keys: own must be iterable");
    if (own == NULL) {
        Py_DECREF(prefix);
        return NULL;
    }
    Py_ssize_t num_named = PySequence_Fast_GET_SIZE(prefix), num_own = PySequence_Fast_GET_SIZE(own);
    long long block_size = plain_block_size(size_obj);
    Run *read = PyMem_Malloc((size_t)(num_named + num_own + 1) * sizeof(Run));
    int plain = read != NULL && block_size && PyDict_CheckExact(segments);
    PyObject **names = PySequence_Fast_ITEMS(prefix);
    for (Py_ssize_t i = 0; plain && i < num_named; i++) {  /* (a name missing: the reference raises its KeyError) */
        PyObject *length = PyDict_GetItemWithError(segments, names[i]);
        plain = length != NULL && run_length(length, &read[i].length);
        read[i].label = names[i];
    }
    PyErr_Clear();
    PyObject *keys;
    if (read == NULL)
        keys = PyErr_NoMemory();
    else if (plain && read_runs(read, num_named, PySequence_Fast_ITEMS(own), num_own))
        keys = keys_of_runs(read, num_named + num_own, block_size);
    else {
        PyObject *again = PyTuple_Pack(4, prefix, segments, own, size_obj);
        keys = again == NULL ? NULL : call_reference(python_segment_keys, again);
        Py_XDECREF(again);
    }
    PyMem_Free(read);
    Py_DECREF(prefix);
    Py_DECREF(own);
    return keys;
}

static PyObject *bind(PyObject *self, PyObject *args) {
    PyObject *hash, *keys, *segments;
    if (!PyArg_ParseTuple(args, "OOO:bind", &hash, &keys, &segments))
        return NULL;
    Py_XSETREF(python_content_hash, Py_NewRef(hash));
    Py_XSETREF(python_block_content_keys, Py_NewRef(keys));
    Py_XSETREF(python_segment_keys, Py_NewRef(segments));
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"content_hash", content_hash, METH_VARARGS, NULL},
    {"block_content_keys", block_content_keys, METH_VARARGS, NULL},
    {"segment_keys", segment_keys, METH_VARARGS, NULL},
    {"bind", bind, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_prefix_keys", .m_doc = NULL, .m_size = -1, .m_methods = methods,
};

PyMODINIT_FUNC PyInit__prefix_keys(void) {
    return PyModule_Create(&module);
}
