/* A step's passes over its running requests compiled, and a bulk's step times and clock (decode_clock, below): the
 * same functions, arguments and results as the Python reference in request_loops.py, which builds this file at run
 * time (CPython's C API, no other library) and checks it there (tests/sim/test_request_loops.py drives both on
 * random requests and compares every figure, the clock's bit for bit). decode_run (a DecodeRun) has no Python twin:
 * it is a bulk's decode_lengths, decode_clock, cut at its stop, pool profile (full_attention_steps.h, the pool's
 * own loop) and bulk_integrals with its categories in one pass, checked against those (tests/sim/test_decode_run.py).
 *
 * Each pass reads or writes a few int slots of every running request (a LiveRequest: a slots dataclass), bound once
 * by bind_live_request: a slot is read and written at its offset, as the slot's descriptor does, without a lookup by
 * name per request. An unset slot raises AttributeError, as Python does, and an error leaves the requests before it
 * changed, as the Python loop leaves them; an item of another class raises AttributeError before any request moves.
 * The counts are ints: a slot holding another number raises TypeError, where Python would add it, and a count past
 * 2**63 OverflowError, where Python's ints would grow (a replay's stay far below).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../memory/full_attention_steps.h"

static PyTypeObject *REQUEST_TYPE;
static Py_ssize_t COMPUTED, GENERATED, OUTPUT, FINAL, PREFILL, LOADING;  /* the slots' offsets in a request */

static Py_ssize_t slot_offset(PyObject *cls, const char *name) {
    PyObject *descriptor = PyObject_GetAttrString(cls, name);
    if (descriptor == NULL)
        return -1;
    Py_ssize_t offset = -1;
    if (Py_IS_TYPE(descriptor, &PyMemberDescr_Type) &&
        ((PyMemberDescrObject *)descriptor)->d_member->type == T_OBJECT_EX)
        offset = ((PyMemberDescrObject *)descriptor)->d_member->offset;
    else
        PyErr_Format(PyExc_TypeError, "%s is not a slot of the request", name);
    Py_DECREF(descriptor);
    return offset;
}

static PyObject *bind_live_request(PyObject *self, PyObject *cls) {
    if (!PyType_Check(cls))
        return PyErr_Format(PyExc_TypeError, "bind_live_request takes the class");
    if ((COMPUTED = slot_offset(cls, "num_computed")) < 0 || (GENERATED = slot_offset(cls, "num_generated")) < 0 ||
        (OUTPUT = slot_offset(cls, "output_tokens")) < 0 || (FINAL = slot_offset(cls, "final_length")) < 0 ||
        (PREFILL = slot_offset(cls, "num_prefill_tokens")) < 0 || (LOADING = slot_offset(cls, "loading_tokens")) < 0)
        return NULL;
    Py_INCREF(cls);
    Py_XSETREF(REQUEST_TYPE, (PyTypeObject *)cls);
    Py_RETURN_NONE;
}

/* The list or tuple of requests ``arg`` (a new reference), each checked to be of the bound class; NULL, an error
 * set, else. */
static PyObject *requests_of(PyObject *arg, const char *function) {
    if (REQUEST_TYPE == NULL)
        return PyErr_Format(PyExc_RuntimeError, "%s: bind_live_request first", function);
    PyObject *requests = PySequence_Fast(arg, "requests must be a sequence");
    if (requests == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(requests);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *request = PySequence_Fast_GET_ITEM(requests, i);
        if (!PyObject_TypeCheck(request, REQUEST_TYPE)) {
            PyErr_Format(PyExc_AttributeError, "%s: item %zd is a %.100s, not a %.100s: no request's counts",
                         function, i, Py_TYPE(request)->tp_name, REQUEST_TYPE->tp_name);
            Py_DECREF(requests);
            return NULL;
        }
    }
    return requests;
}

/* The slot at ``offset`` of ``request`` (borrowed), or NULL with AttributeError set where it is unset. */
static PyObject *slot(PyObject *request, Py_ssize_t offset) {
    PyObject *value = *(PyObject **)((char *)request + offset);
    if (value == NULL)
        PyErr_Format(PyExc_AttributeError, "a request's slot at %zd is unset", offset);
    return value;
}

/* The int in a slot as a C number; -1 with an error set where it is none (or past 2**63). */
static long long slot_int(PyObject *request, Py_ssize_t offset) {
    PyObject *value = slot(request, offset);
    if (value == NULL)
        return -1;
    if (!PyLong_Check(value)) {
        PyErr_Format(PyExc_TypeError, "a request's count is a %.100s, not an int", Py_TYPE(value)->tp_name);
        return -1;
    }
    return PyLong_AsLongLong(value);
}

/* ``request.<slot at offset> += delta``; -1 with an error set where it fails. */
static int add_to_slot(PyObject *request, Py_ssize_t offset, long long delta) {
    long long value = slot_int(request, offset), sum;
    if (value == -1 && PyErr_Occurred())
        return -1;
    if (__builtin_add_overflow(value, delta, &sum)) {
        PyErr_SetString(PyExc_OverflowError, "a request's count passed 2**63");
        return -1;
    }
    PyObject *moved = PyLong_FromLongLong(sum);
    if (moved == NULL)
        return -1;
    Py_SETREF(*(PyObject **)((char *)request + offset), moved);
    return 0;
}

static PyObject *advance(PyObject *self, PyObject *args) {
    PyObject *arg;
    long long num_steps;
    if (!PyArg_ParseTuple(args, "OL:advance", &arg, &num_steps))
        return NULL;
    PyObject *requests = requests_of(arg, "advance");
    if (requests == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(requests);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *request = PySequence_Fast_GET_ITEM(requests, i);
        if (add_to_slot(request, COMPUTED, num_steps) < 0 || add_to_slot(request, GENERATED, num_steps) < 0) {
            Py_DECREF(requests);
            return NULL;
        }
    }
    Py_DECREF(requests);
    Py_RETURN_NONE;
}

static PyObject *computed_total(PyObject *self, PyObject *arg) {
    PyObject *requests = requests_of(arg, "computed_total");
    if (requests == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(requests);
    long long total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        long long computed = slot_int(PySequence_Fast_GET_ITEM(requests, i), COMPUTED);
        if ((computed == -1 && PyErr_Occurred()) || __builtin_add_overflow(total, computed, &total)) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_OverflowError, "the requests' lengths sum past 2**63");
            Py_DECREF(requests);
            return NULL;
        }
    }
    Py_DECREF(requests);
    return PyLong_FromLongLong(total);
}

/* The computed and final lengths of ``requests[:n]`` (a list or tuple of bound requests) into ``lengths`` and
 * ``finals``, the fewest tokens any has left to generate and the computed lengths' sum; -1 with an error set. */
static int read_decodes(PyObject *requests, Py_ssize_t n, int64_t *lengths, int64_t *finals, long long *fewest,
                        long long *total) {
    *fewest = 0;
    *total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *request = PySequence_Fast_GET_ITEM(requests, i);
        long long computed = slot_int(request, COMPUTED), final = slot_int(request, FINAL);
        long long output = slot_int(request, OUTPUT), generated = slot_int(request, GENERATED), left;
        if ((computed == -1 || final == -1 || output == -1 || generated == -1) && PyErr_Occurred())
            return -1;
        if (__builtin_sub_overflow(output, generated, &left)) {
            PyErr_SetString(PyExc_OverflowError, "a request's tokens left pass 2**63");
            return -1;
        }
        if (__builtin_add_overflow(*total, computed, total)) {
            PyErr_SetString(PyExc_OverflowError, "the requests' computed tokens pass 2**63");
            return -1;
        }
        if (i == 0 || left < *fewest)
            *fewest = left;
        lengths[i] = computed;
        finals[i] = final;
    }
    return 0;
}

static PyObject *decode_lengths(PyObject *self, PyObject *arg) {
    PyObject *requests = requests_of(arg, "decode_lengths");
    if (requests == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(requests);
    PyObject *result = NULL;
    PyObject *lengths = PyBytes_FromStringAndSize(NULL, n * 8), *finals = PyBytes_FromStringAndSize(NULL, n * 8);
    long long fewest, total;
    if (lengths == NULL || finals == NULL)
        goto done;
    if (n == 0) {
        PyErr_SetString(PyExc_ValueError, "decode_lengths: no requests");
        goto done;
    }
    if (read_decodes(requests, n, (int64_t *)PyBytes_AS_STRING(lengths), (int64_t *)PyBytes_AS_STRING(finals),
                     &fewest, &total) < 0)
        goto done;
    result = Py_BuildValue("OOLL", lengths, finals, fewest, total);
done:
    Py_XDECREF(lengths);
    Py_XDECREF(finals);
    Py_DECREF(requests);
    return result;
}

static PyObject *finished(PyObject *self, PyObject *arg) {
    PyObject *requests = requests_of(arg, "finished");
    if (requests == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(requests);
    PyObject *done = PyList_New(0);
    for (Py_ssize_t i = 0; done != NULL && i < n; i++) {
        PyObject *request = PySequence_Fast_GET_ITEM(requests, i);
        long long generated = slot_int(request, GENERATED), output = slot_int(request, OUTPUT);
        if (((generated == -1 || output == -1) && PyErr_Occurred()) ||
            (generated >= output && PyList_Append(done, request) < 0))
            Py_CLEAR(done);
    }
    Py_DECREF(requests);
    return done;
}

/* Whether ``request`` decodes: its prompt computed (num_computed >= num_prefill_tokens) and nothing loading; -1
 * with an error set where a slot fails. */
static int decodes(PyObject *request, int loading_too) {
    long long computed = slot_int(request, COMPUTED), prefill = slot_int(request, PREFILL);
    if ((computed == -1 || prefill == -1) && PyErr_Occurred())
        return -1;
    if (computed < prefill)
        return 0;
    if (!loading_too)
        return 1;
    long long loading = slot_int(request, LOADING);
    if (loading == -1 && PyErr_Occurred())
        return -1;
    return loading == 0;
}

static PyObject *decode_run_end(PyObject *self, PyObject *args) {
    PyObject *arg;
    Py_ssize_t start, stop;
    if (!PyArg_ParseTuple(args, "Onn:decode_run_end", &arg, &start, &stop))
        return NULL;
    if (start < 0)
        return PyErr_Format(PyExc_ValueError, "decode_run_end: start %zd < 0", start);
    PyObject *requests = requests_of(arg, "decode_run_end");
    if (requests == NULL)
        return NULL;
    Py_ssize_t end = start;
    if (stop > PySequence_Fast_GET_SIZE(requests))
        stop = PySequence_Fast_GET_SIZE(requests);
    for (; end < stop; end++) {
        int decoding = decodes(PySequence_Fast_GET_ITEM(requests, end), 1);
        if (decoding < 0) {
            Py_DECREF(requests);
            return NULL;
        }
        if (!decoding)
            break;
    }
    Py_DECREF(requests);
    return PyLong_FromSsize_t(end);
}

static PyObject *all_prefilled(PyObject *self, PyObject *arg) {
    PyObject *requests = requests_of(arg, "all_prefilled");
    if (requests == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(requests);
    int all = 1;
    for (Py_ssize_t i = 0; all == 1 && i < n; i++)
        all = decodes(PySequence_Fast_GET_ITEM(requests, i), 0);
    Py_DECREF(requests);
    if (all < 0)
        return NULL;
    return PyBool_FromLong(all);
}

/* decode_clock: the same floats as request_loops.py's NumPy: each step's time added up in the reference's order, one
 * IEEE operation at a time (the product through a volatile, so that no compiler fuses it into the sum: a fused
 * multiply-add rounds once, NumPy twice), and the clock by the same sequential additions as np.add.accumulate. At
 * most 8 tails (the step-time model has 3). */
#define MAX_TAILS 8

/* The tails (a sequence of floats) into ``values``; their number, or -1 with an error set. */
static Py_ssize_t read_tails(PyObject *tails_arg, double values[MAX_TAILS], const char *function) {
    PyObject *tails = PySequence_Fast(tails_arg, "tails must be a sequence");
    if (tails == NULL)
        return -1;
    Py_ssize_t num_tails = PySequence_Fast_GET_SIZE(tails);
    if (num_tails > MAX_TAILS) {
        Py_DECREF(tails);
        PyErr_Format(PyExc_ValueError, "%s: %zd tails, at most %d", function, num_tails, MAX_TAILS);
        return -1;
    }
    for (Py_ssize_t t = 0; t < num_tails; t++) {
        values[t] = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(tails, t));
        if (values[t] == -1.0 && PyErr_Occurred()) {
            Py_DECREF(tails);
            return -1;
        }
    }
    Py_DECREF(tails);
    return num_tails;
}

/* ``num_steps`` step times into ``durations`` and the clock at each boundary into ``clock`` (num_steps + 1, from
 * ``now``); the shortest step's time (NaN where one is NaN, infinity where there is none). */
static double fill_clock(double now, long long first_context, long long step_context, Py_ssize_t num_steps,
                         double head, double per_token, const double *tails, Py_ssize_t num_tails, double *durations,
                         double *clock) {
    double shortest = INFINITY;
    int any_nan = 0;
    clock[0] = now;
    long long context = first_context;
    for (Py_ssize_t j = 0; j < num_steps; j++, context += step_context) {
        volatile double reads = (double)context * per_token;
        double seconds = head + reads;
        for (Py_ssize_t t = 0; t < num_tails; t++)
            seconds = seconds + tails[t];
        durations[j] = seconds;
        clock[j + 1] = clock[j] + seconds;
        if (isnan(seconds))
            any_nan = 1;
        else if (seconds < shortest)
            shortest = seconds;
    }
    return any_nan ? NAN : shortest;
}

static PyObject *decode_clock(PyObject *self, PyObject *args) {
    double now, head, per_token, tails[MAX_TAILS];
    long long first_context, step_context;
    Py_ssize_t num_steps, num_tails;
    PyObject *tails_arg;
    if (!PyArg_ParseTuple(args, "dLLnddO:decode_clock", &now, &first_context, &step_context, &num_steps, &head,
                          &per_token, &tails_arg))
        return NULL;
    if (num_steps < 0)
        return PyErr_Format(PyExc_ValueError, "decode_clock: num_steps %zd < 0", num_steps);
    if ((num_tails = read_tails(tails_arg, tails, "decode_clock")) < 0)
        return NULL;
    PyObject *buffer = PyBytes_FromStringAndSize(NULL, (2 * num_steps + 1) * (Py_ssize_t)sizeof(double));
    if (buffer == NULL)
        return NULL;
    double *durations = (double *)PyBytes_AS_STRING(buffer);
    double shortest = fill_clock(now, first_context, step_context, num_steps, head, per_token, tails, num_tails,
                                 durations, durations + num_steps);
    PyObject *result = Py_BuildValue("(Od)", buffer, shortest);
    Py_DECREF(buffer);
    return result;
}

/* Whether a buffer ``view`` holds float64s ("d") or, ``integers``, int64s ("l" or "q"). */
static int holds(const Py_buffer *view, int integers) {
    if (view->itemsize != 8 || view->format == NULL)
        return 0;
    return integers ? strcmp(view->format, "l") == 0 || strcmp(view->format, "q") == 0
                    : strcmp(view->format, "d") == 0;
}

/* Σ d_j * series[j] over ``count`` steps lasting ``part``, in step order (each product through a volatile). */
static double series_sum(const int64_t *series, const double *part, Py_ssize_t count) {
    double total = 0.0;
    for (Py_ssize_t j = 0; j < count; j++) {
        volatile double product = (double)series[j] * part[j];
        total = total + product;
    }
    return total;
}

/* The time Σ d_j of ``count`` steps lasting ``part``, the first of them step ``start``, and the weight
 * Σ d_j * (j - first + 1) of the tokens each adds since step ``first``, in step order. */
static void part_sums(const double *part, Py_ssize_t start, Py_ssize_t count, Py_ssize_t first, double *duration,
                      double *weighted) {
    double seconds = 0.0, weight = 0.0;
    for (Py_ssize_t j = 0; j < count; j++) {
        volatile double product = part[j] * (double)(start + j - first + 1);
        seconds = seconds + part[j];
        weight = weight + product;
    }
    *duration = seconds;
    *weighted = weight;
}

/* One BulkProfile series over steps [start, stop): Σ d_j * values[j] in step order (each product through a
 * volatile, as decode_clock's), or, for a number (a NumPy scalar included: a buffer of no dimension), that number
 * times ``duration``; -1 with an error set where it is neither an int64 array covering the steps nor a number. */
static int series_integral(PyObject *values, const double *part, Py_ssize_t start, Py_ssize_t count, double duration,
                           double *integral) {
    Py_buffer view;
    int is_array = 0;
    if (PyObject_CheckBuffer(values)) {
        if (PyObject_GetBuffer(values, &view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
            return -1;
        is_array = view.ndim != 0;
        if (!is_array)
            PyBuffer_Release(&view);
    }
    if (!is_array) {
        double number = PyFloat_AsDouble(values);
        if (number == -1.0 && PyErr_Occurred())
            return -1;
        *integral = number * duration;
        return 0;
    }
    if (!holds(&view, 1) || view.ndim != 1 || start + count > view.len / 8) {
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_ValueError, "bulk_integrals: a series must be int64 covering steps %zd to %zd", start,
                     start + count);
        return -1;
    }
    *integral = series_sum((const int64_t *)view.buf + start, part, count);
    PyBuffer_Release(&view);
    return 0;
}

/* bulk_integrals: request_loops.py's sums, in its order, one IEEE operation at a time. */
static PyObject *bulk_integrals(PyObject *self, PyObject *args) {
    Py_buffer durations;
    Py_ssize_t start, stop, first;
    PyObject *durations_arg, *allocated, *internal, *tokens;
    if (!PyArg_ParseTuple(args, "OnnnOOO:bulk_integrals", &durations_arg, &start, &stop, &first, &allocated, &internal,
                          &tokens) ||
        PyObject_GetBuffer(durations_arg, &durations, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t num_steps = durations.len / (Py_ssize_t)sizeof(double);
    if (!holds(&durations, 0) || durations.ndim != 1) {
        PyErr_SetString(PyExc_TypeError, "bulk_integrals: the durations must be float64s");
        goto done;
    }
    if (start < 0 || stop < start || stop > num_steps) {
        PyErr_Format(PyExc_IndexError, "bulk_integrals: steps %zd to %zd of %zd", start, stop, num_steps);
        goto done;
    }
    const double *part = (const double *)durations.buf + start;
    Py_ssize_t count = stop - start;
    double duration, weighted, allocated_integral, internal_integral, tokens_integral = 0.0;
    part_sums(part, start, count, first, &duration, &weighted);
    if (series_integral(allocated, part, start, count, duration, &allocated_integral) < 0 ||
        series_integral(internal, part, start, count, duration, &internal_integral) < 0 ||
        (tokens != Py_None && series_integral(tokens, part, start, count, duration, &tokens_integral) < 0))
        goto done;
    if (tokens == Py_None)
        result = Py_BuildValue("(ddddO)", duration, weighted, allocated_integral, internal_integral, Py_None);
    else
        result = Py_BuildValue("(ddddd)", duration, weighted, allocated_integral, internal_integral, tokens_integral);
done:
    PyBuffer_Release(&durations);
    return result;
}

/* ---- decode_run: a fresh bulk of decode steps of one full-attention pool (bulk_advance.py's plain case) ---- */

/* What a bulk of decode steps reads, from one pass: the clock of ``most`` steps (as decode_clock), the steps it runs
 * (cut before the one starting at or after the stop, then at the first whose new blocks the free ones do not cover,
 * as the pool's full_attention_profile), and those steps' slots in use and past the final lengths. */
typedef struct {
    PyObject_HEAD
    Py_ssize_t n, most, num_steps;
    long long total_length, allocated_sum;
    double shortest;
    double *durations, *clock;  /* [most], [most + 1] */
    int64_t *allocated, *internal;  /* [num_steps] */
} DecodeRun;

static void run_dealloc(DecodeRun *run) {
    PyMem_Free(run->durations);
    PyMem_Free(run->allocated);
    Py_TYPE(run)->tp_free((PyObject *)run);
}

/* 1 + the boundaries clock[1:stop] before ``t`` (NumPy's searchsorted, side "left", on a sorted clock). */
static Py_ssize_t step_before(const DecodeRun *run, double t, Py_ssize_t stop) {
    Py_ssize_t lo = 1, hi = stop < 1 ? 1 : stop;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (run->clock[mid] < t)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int check_steps(const DecodeRun *run, Py_ssize_t stop, Py_ssize_t bound) {
    if (stop < 0 || stop > bound) {
        PyErr_Format(PyExc_IndexError, "decode run: step %zd of %zd", stop, bound);
        return -1;
    }
    return 0;
}

static PyObject *run_step_at(DecodeRun *run, PyObject *args) {
    double t;
    Py_ssize_t stop;
    if (!PyArg_ParseTuple(args, "dn:step_at", &t, &stop) || check_steps(run, stop, run->num_steps) < 0)
        return NULL;
    return PyLong_FromSsize_t(step_before(run, t, stop));
}

static PyObject *run_time_at(DecodeRun *run, PyObject *arg) {
    Py_ssize_t step = PyLong_AsSsize_t(arg);
    if ((step == -1 && PyErr_Occurred()) || check_steps(run, step, run->num_steps) < 0)
        return NULL;
    return PyFloat_FromDouble(run->clock[step]);
}

static PyObject *run_steps_within(DecodeRun *run, PyObject *args) {
    long long headroom;
    Py_ssize_t stop;
    if (!PyArg_ParseTuple(args, "Ln:steps_within", &headroom, &stop) || check_steps(run, stop, run->num_steps) < 0)
        return NULL;
    Py_ssize_t lo = 0, hi = stop;  /* (the steps' slots only grow: NumPy's searchsorted, side "right") */
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (run->allocated[mid] - run->allocated_sum <= headroom)
            lo = mid + 1;
        else
            hi = mid;
    }
    return PyLong_FromSsize_t(lo);
}

static PyObject *run_record(DecodeRun *run, PyObject *args) {
    Py_ssize_t start, stop, first;
    long long external, capacity, shared;
    if (!PyArg_ParseTuple(args, "nnnLLL:record", &start, &stop, &first, &external, &capacity, &shared) ||
        check_steps(run, stop, run->num_steps) < 0 || check_steps(run, start, stop) < 0)
        return NULL;
    const double *part = run->durations + start;
    Py_ssize_t count = stop - start;
    double duration, weighted;
    part_sums(part, start, count, first, &duration, &weighted);
    double allocated = series_sum(run->allocated + start, part, count);
    double internal = series_sum(run->internal + start, part, count);
    /* BulkAdvance._record's tokens and categories.category_slots, one IEEE operation at a time in their order */
    volatile double earlier = (double)(run->total_length + (long long)run->n * first) * duration;
    volatile double added = (double)run->n * weighted;
    double tokens = earlier + added;
    volatile double external_slots = (double)external * duration, capacity_slots = (double)capacity * duration;
    volatile double shared_slots = (double)shared * duration;
    double token_state = tokens - shared_slots, used = allocated - shared_slots;
    double reserved = used - token_state - internal, free = capacity_slots - used - external_slots;
    return Py_BuildValue("(d(dddddd))", duration, token_state, reserved, internal, (double)external_slots, free,
                         used);
}

static PyMethodDef run_methods[] = {
    {"step_at", (PyCFunction)run_step_at, METH_VARARGS, NULL},
    {"time_at", (PyCFunction)run_time_at, METH_O, NULL},
    {"steps_within", (PyCFunction)run_steps_within, METH_VARARGS, NULL},
    {"record", (PyCFunction)run_record, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef run_members[] = {
    {"num_steps", T_PYSSIZET, offsetof(DecodeRun, num_steps), READONLY, NULL},
    {"total_length", T_LONGLONG, offsetof(DecodeRun, total_length), READONLY, NULL},
    {"shortest", T_DOUBLE, offsetof(DecodeRun, shortest), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject DecodeRunType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_request_loops.DecodeRun",
    .tp_basicsize = sizeof(DecodeRun),
    .tp_dealloc = (destructor)run_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_methods = run_methods,
    .tp_members = run_members,
};

/* decode_run(requests, now, cap, head, per_token, tails, stop_s, block_size, num_free, allocated_sum): a fresh bulk of
 * the running ``requests`` (all decoding) from ``now``: at most ``cap`` steps and none past the first finish, timed by
 * the step-time model's line (head, per_token, tails: StepTimeModel.decode_step_terms), cut before the step that
 * starts at or after ``stop_s`` (None: no stop), then at the first step whose new blocks the ``num_free`` free blocks
 * of ``block_size`` slots do not cover (``allocated_sum``: the slots the requests hold now). */
static PyObject *decode_run(PyObject *self, PyObject *args) {
    PyObject *arg, *tails_arg, *stop_arg;
    double now, head, per_token, tails[MAX_TAILS];
    Py_ssize_t cap, num_tails;
    long long block_size, num_free, allocated_sum;
    if (!PyArg_ParseTuple(args, "OdnddOOLLL:decode_run", &arg, &now, &cap, &head, &per_token, &tails_arg, &stop_arg,
                          &block_size, &num_free, &allocated_sum))
        return NULL;
    double stop_s = 0.0;
    if (stop_arg != Py_None && (stop_s = PyFloat_AsDouble(stop_arg)) == -1.0 && PyErr_Occurred())
        return NULL;
    if (block_size < 1)
        return PyErr_Format(PyExc_ValueError, "decode_run: block size %lld", block_size);
    if ((num_tails = read_tails(tails_arg, tails, "decode_run")) < 0)
        return NULL;
    PyObject *requests = requests_of(arg, "decode_run");
    if (requests == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(requests);
    DecodeRun *run = NULL;
    int64_t *lengths = PyMem_Malloc(2 * (n ? n : 1) * sizeof(int64_t)), *finals = NULL;
    long long fewest, total;
    if (lengths == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    finals = lengths + n;
    if (n == 0) {
        PyErr_SetString(PyExc_ValueError, "decode_run: no requests");
        goto done;
    }
    if (read_decodes(requests, n, lengths, finals, &fewest, &total) < 0)
        goto done;
    Py_ssize_t most = fewest < cap ? (Py_ssize_t)fewest : cap;
    if (most < 0) {
        PyErr_Format(PyExc_ValueError, "decode_run: %zd steps < 0", most);
        goto done;
    }
    if ((run = PyObject_New(DecodeRun, &DecodeRunType)) == NULL)
        goto done;
    run->durations = NULL;
    run->allocated = NULL;
    run->n = n;
    run->most = most;
    run->total_length = total;
    run->allocated_sum = allocated_sum;
    run->durations = PyMem_Malloc((2 * most + 1) * sizeof(double));
    if (run->durations == NULL) {
        PyErr_NoMemory();
        Py_CLEAR(run);
        goto done;
    }
    run->clock = run->durations + most;
    run->shortest = fill_clock(now, total + n, n, most, head, per_token, tails, num_tails, run->durations,
                               run->clock);
    Py_ssize_t num_steps = stop_arg == Py_None ? most : step_before(run, stop_s, most);
    if (num_steps > most)  /* (no step to run: the clock ends at its start) */
        num_steps = most;
    run->allocated = PyMem_Malloc(2 * (num_steps ? num_steps : 1) * sizeof(int64_t));
    if (run->allocated == NULL) {
        PyErr_NoMemory();
        Py_CLEAR(run);
        goto done;
    }
    run->internal = run->allocated + num_steps;
    /* The steps whose new blocks the free blocks cover: Σ allocated during the step stays within the limit */
    run->num_steps = full_attention_steps(lengths, finals, n, block_size,
                                          allocated_sum + block_size * (num_free + 1) - 1, num_steps,
                                          run->allocated, run->internal);
done:
    PyMem_Free(lengths);
    Py_DECREF(requests);
    return (PyObject *)run;
}

static PyMethodDef methods[] = {
    {"bind_live_request", bind_live_request, METH_O, NULL},
    {"advance", advance, METH_VARARGS, NULL},
    {"computed_total", computed_total, METH_O, NULL},
    {"decode_lengths", decode_lengths, METH_O, NULL},
    {"finished", finished, METH_O, NULL},
    {"decode_run_end", decode_run_end, METH_VARARGS, NULL},
    {"all_prefilled", all_prefilled, METH_O, NULL},
    {"decode_clock", decode_clock, METH_VARARGS, NULL},
    {"bulk_integrals", bulk_integrals, METH_VARARGS, NULL},
    {"decode_run", decode_run, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_request_loops", .m_doc = NULL, .m_size = -1, .m_methods = methods,
};

PyMODINIT_FUNC PyInit__request_loops(void) {
    if (PyType_Ready(&DecodeRunType) < 0)
        return NULL;
    return PyModule_Create(&module);
}
