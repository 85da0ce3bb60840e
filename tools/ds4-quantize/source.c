/*
 * source.c - where ds4-quantize's weights come from (see quantize.h): the
 * official checkpoint (--hf, convert/hf.h), or a ds4 GGUF (--gguf,
 * convert/gguf_src.h) whose tensors are decoded by the format's
 * dequantizers and quantized again by the same policy, so that a file
 * can be requantized when the checkpoint it came from is not at hand.
 * The MTP block of a GGUF input lives in its own file (--mtp-gguf) or in
 * the model file itself.
 */
#include <stdio.h>
#include <string.h>

#include "format/quants.h"
#include "quantize.h"

/* An MTP file with deepseek4.* keys must describe the model's shape (ds4's
 * own MTP files may carry none: their tensors are checked anyway). */
static int check_mtp_shape(const qz_job *j, ds4_err *err) {
    if (!ds4_gguf_find_kv(j->mtp_in, "deepseek4.block_count")) return 0;
    ds4_config c;
    if (ds4_config_from_gguf(j->mtp_in, &c, err) != 0) return ds4_err_prefix(err, "%s", j->o->mtp_gguf);
    if (memcmp(&c, &j->hc.cfg, sizeof(c)) != 0)
        return ds4_err_set(err, DS4_EFORMAT, "%s: its deepseek4.* metadata describes another model than %s",
                           j->o->mtp_gguf, j->o->gguf_in);
    return 0;
}

int qz_open_input(qz_job *j, ds4_err *err) {
    const qz_opts *o = j->o;
    if (o->hf_dir) {
        char path[4096];
        snprintf(path, sizeof(path), "%s/config.json", o->hf_dir);
        if (ds4_hf_config_load(path, &j->hc, err) != 0) return -1;
        return (j->ck = ds4_st_ckpt_open(o->hf_dir, err)) ? 0 : -1;
    }
    if (!(j->in = ds4_gguf_open(o->gguf_in, err))) return -1;
    if (ds4_config_from_gguf(j->in, &j->hc.cfg, err) != 0) return ds4_err_prefix(err, "--gguf: not a ds4 model");
    j->src = j->in;
    if (!o->mtp_gguf) return 0;
    if (!(j->mtp_in = ds4_gguf_open(o->mtp_gguf, err))) return -1;
    return check_mtp_shape(j, err);
}

void qz_close_input(qz_job *j) {
    ds4_st_ckpt_close(j->ck);
    ds4_gguf_close(j->in);
    ds4_gguf_close(j->mtp_in);
    j->ck = NULL;
    j->in = j->mtp_in = NULL;
    j->src = NULL;
}

void qz_select_input(qz_job *j, bool mtp) {
    if (j->in) j->src = mtp && j->mtp_in ? j->mtp_in : j->in;
}

bool qz_input_has(const qz_job *j, const ds4_tensor_spec *t) {
    if (j->src) return ds4_gguf_find_tensor(j->src, t->name) != NULL;
    char hf[160];
    ds4_err ignored = {0};
    return ds4_hf_name(t, 0, hf, sizeof(hf), &ignored) == 0 && ds4_st_ckpt_has(j->ck, hf);
}

int qz_resolve(const qz_job *j, const ds4_tensor_spec *t, int expert, qz_source *s, ds4_err *err) {
    memset(s, 0, sizeof(*s));
    s->is_gguf = j->src != NULL;
    if (s->is_gguf) {
        if (ds4_gguf_src_resolve(j->src, t, expert, &s->gguf, err) != 0) return -1;
        s->rows = s->gguf.rows;
        s->cols = s->gguf.cols;
        return 0;
    }
    if (ds4_hf_resolve(j->ck, &j->hc, t, expert, &s->hf, err) != 0) return -1;
    s->rows = s->hf.rows;
    s->cols = s->hf.cols;
    return 0;
}

int qz_decode_rows(const qz_source *s, int64_t row0, int64_t nrows, float *out, ds4_err *err) {
    if (s->is_gguf) return ds4_gguf_src_decode_rows(&s->gguf, row0, nrows, out, err);
    return ds4_hf_decode_rows(&s->hf, row0, nrows, out, err);
}

int qz_decode_i32(const qz_job *j, const qz_source *s, int32_t *out, ds4_err *err) {
    if (s->is_gguf) return ds4_gguf_src_decode_i32(&s->gguf, j->hc.cfg.n_expert, out, err);
    return ds4_hf_decode_i32(&s->hf, j->hc.cfg.n_expert, out, err);
}

const char *qz_source_type(const qz_source *s) {
    if (s->is_gguf) return ds4_type_get(s->gguf.t->type)->name;
    return ds4_st_dtype_name(s->hf.w->dtype);
}
