/*
 * policy.c - per-tensor storage types for the quantizer (see policy.h).
 */
#include "convert/policy.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "format/quants.h"

void ds4_policy_init(ds4_policy *p, const ds4_recipe *recipe) {
    memset(p, 0, sizeof(*p));
    p->recipe = recipe;
    p->routed_w1 = p->routed_w2 = p->routed_w3 = DS4_POLICY_KEEP;
    p->embedding = p->output = p->shared = DS4_POLICY_KEEP;
    p->attention_proj = p->attention = p->dense = DS4_POLICY_KEEP;
}

void ds4_policy_free(ds4_policy *p) {
    for (size_t i = 0; i < p->n_overrides; i++) free(p->overrides[i].prefix);
    free(p->overrides);
    p->overrides = NULL;
    p->n_overrides = 0;
}

/* Lower case without '-' and '_', so "Q4_K", "q4k" and "q4-k" agree. */
static void squash(const char *s, char *out, size_t len) {
    size_t n = 0;
    for (; *s && n + 1 < len; s++)
        if (*s != '-' && *s != '_') out[n++] = (char)tolower((unsigned char)*s);
    out[n] = '\0';
}

static const uint32_t writable[] = {DS4_TYPE_F32,  DS4_TYPE_F16,  DS4_TYPE_BF16,   DS4_TYPE_Q8_0,
                                    DS4_TYPE_Q2_K, DS4_TYPE_Q4_K, DS4_TYPE_IQ2_XXS};

bool ds4_policy_writable(uint32_t type) {
    for (size_t i = 0; i < sizeof(writable) / sizeof(writable[0]); i++)
        if (writable[i] == type) return true;
    return false;
}

int ds4_policy_parse_type(const char *s, uint32_t *type, ds4_err *err) {
    char want[32], name[32];
    squash(s, want, sizeof(want));
    if (strcmp(want, "copy") == 0 || strcmp(want, "template") == 0 || strcmp(want, "keep") == 0) {
        *type = DS4_POLICY_KEEP;
        return 0;
    }
    for (size_t i = 0; i < sizeof(writable) / sizeof(writable[0]); i++) {
        squash(ds4_type_get(writable[i])->name, name, sizeof(name));
        if (strcmp(name, want) == 0) {
            *type = writable[i];
            return 0;
        }
    }
    return ds4_err_set(err, DS4_EINVAL,
                       "unknown tensor type \"%s\" (expected f32, f16, bf16, q8_0, q2_k, q4_k, iq2_xxs or copy)", s);
}

int ds4_policy_add_override(ds4_policy *p, const char *spec, ds4_err *err) {
    const char *eq = strrchr(spec, '=');
    if (!eq || eq == spec || !eq[1])
        return ds4_err_set(err, DS4_EINVAL, "--tensor-type %s: expected PREFIX=TYPE", spec);
    uint32_t type;
    if (ds4_policy_parse_type(eq + 1, &type, err) != 0) return ds4_err_prefix(err, "--tensor-type %s", spec);
    ds4_type_override *grown = realloc(p->overrides, (p->n_overrides + 1) * sizeof(*grown));
    if (!grown) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    p->overrides = grown;
    char *prefix = strndup(spec, (size_t)(eq - spec));
    if (!prefix) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    p->overrides[p->n_overrides++] = (ds4_type_override){.prefix = prefix, .type = type};
    return 0;
}

static uint32_t first_set(uint32_t a, uint32_t b, uint32_t c) {
    return a != DS4_POLICY_KEEP ? a : b != DS4_POLICY_KEEP ? b : c;
}

static uint32_t class_choice(const ds4_policy *p, ds4_tclass cls) {
    switch (cls) {
    case DS4_TC_EXP_GATE: return p->routed_w1;
    case DS4_TC_EXP_DOWN: return p->routed_w2;
    case DS4_TC_EXP_UP: return p->routed_w3;
    case DS4_TC_TOKEN_EMBD: return first_set(p->embedding, p->dense, DS4_POLICY_KEEP);
    case DS4_TC_OUTPUT: return first_set(p->output, p->dense, DS4_POLICY_KEEP);
    case DS4_TC_SHARED: return first_set(p->shared, p->dense, DS4_POLICY_KEEP);
    case DS4_TC_ATTN_PROJ: return first_set(p->attention_proj, p->attention, p->dense);
    case DS4_TC_COMPRESSOR:
    case DS4_TC_COMPRESSOR_APE:
    case DS4_TC_INDEXER: return first_set(p->attention, p->dense, DS4_POLICY_KEEP);
    default: return DS4_POLICY_KEEP;
    }
}

static bool fits(const ds4_tensor_spec *t, uint32_t ty) {
    const ds4_type_info *info = ds4_type_get(ty);
    return (t->allowed & (1ull << ty)) && t->ne[0] % (uint64_t)info->block_elems == 0;
}

/* The first override naming this tensor exactly, or the first prefix
 * override whose type the tensor can hold: "blk.1.=f16" means the matrices
 * of layer 1, not its F32-only vectors. */
static const ds4_type_override *find_override(const ds4_policy *p, const ds4_tensor_spec *t) {
    for (size_t i = 0; i < p->n_overrides; i++) {
        const ds4_type_override *o = &p->overrides[i];
        if (strncmp(t->name, o->prefix, strlen(o->prefix)) != 0) continue;
        if (strcmp(t->name, o->prefix) == 0 || o->type == DS4_POLICY_KEEP || fits(t, o->type)) return o;
    }
    return NULL;
}

int ds4_policy_type(const ds4_policy *p, const ds4_tensor_spec *t, uint32_t *type, ds4_err *err) {
    const ds4_type_override *o = find_override(p, t);
    uint32_t ty = o ? o->type : class_choice(p, t->cls);
    const char *why = o ? "--tensor-type" : "a class option";
    if (ty == DS4_POLICY_KEEP) return ds4_recipe_type_for(p->recipe, t, type, err);
    const ds4_type_info *info = ds4_type_get(ty);
    if (!(t->allowed & (1ull << ty)))
        return ds4_err_set(err, DS4_EUNSUPPORTED, "%s: type %s (from %s) is not accepted for this tensor", t->name,
                           info->name, why);
    if (t->ne[0] % (uint64_t)info->block_elems != 0)
        return ds4_err_set(err, DS4_EUNSUPPORTED, "%s: rows of %llu values are not a multiple of the %s block (%lld)",
                           t->name, (unsigned long long)t->ne[0], info->name, (long long)info->block_elems);
    *type = ty;
    return 0;
}
