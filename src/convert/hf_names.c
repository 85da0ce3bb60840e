/*
 * hf_names.c - GGUF tensor name -> official Hugging Face name (see hf.h and
 * docs/MODEL.md 2.6): the block's HF prefix ("layers.N.") and the hf column
 * of the tensor's row in the tensor table (model/tensors.h).
 */
#include "convert/hf.h"

#include <stdio.h>
#include <string.h>

static bool is_routed(ds4_tclass cls) {
    return cls == DS4_TC_EXP_GATE || cls == DS4_TC_EXP_UP || cls == DS4_TC_EXP_DOWN;
}

int ds4_hf_name(const ds4_tensor_spec *t, int expert, char *buf, size_t len, ds4_err *err) {
    char tail[96];
    if (is_routed(t->cls)) {
        if (expert < 0) return ds4_err_set(err, DS4_EINVAL, "tensor %s: an expert id is needed", t->name);
        snprintf(tail, sizeof(tail), t->row->hf, expert);
    } else {
        snprintf(tail, sizeof(tail), "%s", t->row->hf);
    }
    int n = snprintf(buf, len, "%s%s", t->hf_prefix, tail);
    if (n < 0 || (size_t)n >= len) return ds4_err_set(err, DS4_ERANGE, "tensor %s: name buffer too small", t->name);
    return 0;
}

int ds4_hf_scale_name(const char *weight_name, char *buf, size_t len, ds4_err *err) {
    size_t n = strlen(weight_name);
    static const char suffix[] = ".weight";
    size_t s = sizeof(suffix) - 1;
    if (n < s || strcmp(weight_name + n - s, suffix) != 0)
        return ds4_err_set(err, DS4_EFORMAT, "%s: block-quantized tensor name does not end in .weight", weight_name);
    if (n - s + sizeof(".scale") > len) return ds4_err_set(err, DS4_ERANGE, "%s: name too long", weight_name);
    memcpy(buf, weight_name, n - s);
    memcpy(buf + n - s, ".scale", sizeof(".scale"));
    return 0;
}
