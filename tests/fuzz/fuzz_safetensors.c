/*
 * fuzz_safetensors.c - libFuzzer target for the safetensors reader.
 *
 * Any byte string must either open (and then every tensor's bytes must lie
 * inside the buffer, which the target re-checks by touching them) or be
 * refused with a non-empty message.  Built and run briefly by
 * tests/suite/fuzz_safetensors.sh; run longer by hand with
 *   build/fuzz/fuzz_safetensors -max_total_time=600 tests/fuzz/corpus/safetensors
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "convert/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ds4_err err = {0};
    ds4_st_file *f = ds4_st_open_buffer(data, size, "fuzz", &err);
    if (!f) {
        if (err.msg[0] == '\0') abort();
        return 0;
    }
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < f->n_tensors; i++) {
        const ds4_st_tensor *t = &f->tensors[i];
        if (t->offset + t->nbytes > size || ds4_st_find(f, t->name) != t) abort();
        if (t->nbytes) sink ^= t->data[0] ^ t->data[t->nbytes - 1];
    }
    (void)sink;
    ds4_st_close(f);
    return 0;
}
