/* The steps of a bulk decode over one full-attention pool whose new blocks the free blocks cover: bulk.py's
 * python_full_attention_profile's loop, shared by the pool's full_attention_profile (pool_loops.c) and a replay's
 * decode_run (sim/request_loops.c). native_build digests a C file's quoted includes with it: a change here rebuilds
 * both. */
#ifndef MINIPAGED_FULL_ATTENTION_STEPS_H
#define MINIPAGED_FULL_ATTENTION_STEPS_H

#include <stdint.h>

/* For requests of ``lengths`` and ``finals`` (n of each) writing one token a step into blocks of ``block_size``
 * slots, while the slots in use stay within ``limit`` (allocated now + the free blocks' slots + B - 1): during each
 * step j = 1..num_steps, the slots they hold, Σ ceil((L + j) / B) * B, into ``per_step``, and those past their
 * final lengths into ``past_final``; the steps that fit. (The slots only grow with j: no later step fits either.) */
static int64_t full_attention_steps(const int64_t *lengths, const int64_t *finals, Py_ssize_t n, int64_t block_size,
                                    int64_t limit, int64_t num_steps, int64_t *per_step, int64_t *past_final) {
    int64_t num_ok = 0;
    for (int64_t j = 1; j <= num_steps; j++, num_ok++) {
        int64_t slots = 0, past = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            int64_t held = (lengths[i] + j + block_size - 1) / block_size * block_size;
            slots += held;
            past += held > finals[i] ? held - finals[i] : 0;
        }
        if (slots > limit)
            break;
        per_step[num_ok] = slots;
        past_final[num_ok] = past;
    }
    return num_ok;
}

#endif
