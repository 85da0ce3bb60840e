/*
 * placement.h - which routed experts live in GPU memory when the model does
 * not fit it (docs/DESIGN.md 3.5).
 *
 * A backend with a memory budget keeps everything that is not a routed
 * expert on the device (attention, shared experts, routers, HC, head, the
 * session state and its pass buffers: the "fixed" bytes), then as many
 * routed experts as the rest of the budget holds; the others stay in the
 * mmap'ed file in host RAM and are computed there (or streamed over for
 * large prefill chunks).  Which experts go first:
 *
 *   no profile    whole layers, from the first: layer 0's experts, then
 *                 layer 1's, ...; the last layer that fits in part keeps
 *                 its lowest-numbered experts;
 *   a profile     the experts most used per token first, over all layers
 *                 (an expert's share of its layer's selections; ties: the
 *                 lower layer, then the lower expert), so the host reads
 *                 the fewest bytes per token.
 *
 * A profile is either this engine's text file (written by ds4-bench
 * --expert-profile-out or the server) or a ds4 imatrix (format/imatrix.h),
 * whose per-expert sums of squared inputs grow with the tokens routed to
 * each expert:
 *
 *   ds4-expert-profile 1
 *   layers L experts E tokens N
 *   then L lines of E whitespace-separated counts (selections of expert e
 *   in layer l over N tokens)
 *
 * The accounting is exact: every routed tensor of a layer is one
 * allocation of n_gpu experts rounded up to `align` bytes, and the device
 * total the placement reports is what the backend allocates.
 */
#ifndef DS4_MODEL_PLACEMENT_H
#define DS4_MODEL_PLACEMENT_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"

/* How often each routed expert is used: use[l * n_expert + e] counts (or a
 * quantity proportional to) the selections of expert e in layer l. */
typedef struct ds4_expert_profile {
    uint32_t n_layer, n_expert;
    uint64_t tokens; /* tokens counted (0 when unknown: an imatrix) */
    double *use;
} ds4_expert_profile;

ds4_expert_profile *ds4_expert_profile_new(uint32_t n_layer, uint32_t n_expert, ds4_err *err);
void ds4_expert_profile_free(ds4_expert_profile *p);
/* A profile file or an imatrix, checked against the model's layers and
 * experts; errors name the file and what is wrong. */
ds4_expert_profile *ds4_expert_profile_load(const char *path, uint32_t n_layer, uint32_t n_expert, ds4_err *err);
/* Written through a temporary file renamed into place. */
int ds4_expert_profile_save(const ds4_expert_profile *p, const char *path, ds4_err *err);

/* The three routed tensors of a layer (gate, up, down) as the device
 * stores them. */
#define DS4_PLACE_TENSORS 3

typedef struct ds4_place_in {
    uint32_t n_layer, n_expert, k; /* k: experts a token uses */
    uint64_t budget;               /* bytes the backend may allocate on the device */
    uint64_t fixed;                /* bytes it allocates whatever the placement */
    /* per layer and routed tensor: device bytes of one expert's matrix */
    const uint64_t *dev_mat;           /* n_layer x DS4_PLACE_TENSORS */
    const uint64_t *host_expert;       /* per layer: file bytes of one expert (all three) */
    uint64_t align;                    /* each routed tensor's allocation rounds up to this */
    const ds4_expert_profile *profile; /* NULL: whole layers */
} ds4_place_in;

typedef struct ds4_placement {
    uint32_t n_layer, n_expert;
    uint8_t *on_gpu;       /* n_layer x n_expert */
    uint32_t *n_gpu;       /* per layer: experts on the device */
    uint64_t dev_routed;   /* device bytes of the resident experts (allocations, aligned) */
    uint64_t dev_total;    /* fixed + dev_routed: what the backend allocates */
    uint64_t host_bytes;   /* file bytes of the experts left on the host */
    uint32_t host_experts; /* their count */
    /* expected routed bytes a token reads on each side (the profile's
     * frequencies, else every expert equally likely) */
    double tok_dev, tok_host;
} ds4_placement;

/* The placement for `in`; an error when even the fixed bytes exceed the
 * budget (the message gives the minimum). */
int ds4_place_experts(const ds4_place_in *in, ds4_placement *out, ds4_err *err);
void ds4_placement_free(ds4_placement *p);

/* Bytes of layer l's routed allocations for n experts on the device. */
uint64_t ds4_place_layer_bytes(const ds4_place_in *in, uint32_t l, uint32_t n);

#endif
