/*
 * eagle_io.h: the pieces the EAGLE-1/2 and EAGLE-3 head loaders share (eagle_io.c): typed
 * config.json fields with ranges, the table of a layout's tensors checked against a checkpoint,
 * and the copies of its weights into the head's one block; and the two loaders, which
 * st_eagle_head_load (head_load.c) chooses between.
 */
#ifndef ST_EAGLE_IO_H
#define ST_EAGLE_IO_H

#include "io/safetensors.h"
#include "model/model.h"

/* One tensor of a layout: rows x cols (cols 0: a vector of rows elements). */
typedef struct st_head_tensor {
    const char *name;
    int64_t rows, cols;
    int required;
    int32_t rope_heads; /* q/k: heads whose rows are permuted (0: copied as is) */
    const st_sf_tensor *t;
    void *copy; /* its bytes in the owned block */
} st_head_tensor;

/* Reads an integer field of config `path` in [lo, hi] (def when absent and optional). */
st_status st_head_cfg_int(const st_hf_config *c, const char *path, const char *key, int optional,
                          int64_t def, int64_t lo, int64_t hi, int32_t *out);
/* Finds and checks the n tensors of the layout (shapes; F32/F16/BF16 unless `raw_ok` names
 * tensors whose dtype the caller checks); any other tensor of the checkpoint is an error naming
 * `what` (RoPE tables of HF exports are skipped). */
st_status st_head_find_tensors(const st_safetensors *sf, st_head_tensor *ht, int n,
                               const char *what, const char *const *raw_ok);
/* Copies a tensor's bytes into h->copy, q/k rows from HF's half-split order to adjacent pairs. */
void st_head_copy_tensor(const st_head_tensor *h);
/* ST_ERR_FORMAT naming the tensor and the place of its first value that is not finite (every
 * value of h's copy, through the target loader's check, st_first_non_finite; a head is copied
 * whole anyway); integer tensors pass. */
st_status st_head_check_finite(const st_head_tensor *h);
/* A weight matrix over h's copy. */
void st_head_set_wt(st_wt *w, const st_head_tensor *h);
/* A float copy of a vector tensor into `into`, or a new st_malloc'd one (NULL: out of memory). */
float *st_head_vector_of(const st_head_tensor *h, float *into);

/* The EAGLE-1/2 loader (eagle_load.c) and the EAGLE-3 one (eagle3_load.c, public). */
st_status st_eagle1_head_load(const char *dir, const st_model *target, st_model **out);

#endif /* ST_EAGLE_IO_H */
