/*
 * expand.c: EAGLE-2's dynamic-tree expansion step (Li et al., EAGLE-2, 2024), shared by every
 * drafter: of the K*K candidates of a level, the K best by cumulative score are the nodes
 * expanded at the next level, in rank order. Those are also the level's entries of
 * level_parents (TREE_SPEC §1.4), which st_tree_organize turns into parent_list.
 */
#include "draft/drafter.h"

#include <math.h>

void st_draft_expand_level(const float *scores, int64_t K, int64_t level, int64_t *parents,
                           int64_t n_parents, int64_t *pick) {
    const int64_t base = st_tree_level_base(K, level), n = K * K;
    const float *sc = scores + base;
    for (int64_t k = 0; k < K; k++) {
        int64_t best = -1;
        for (int64_t q = 0; q < n; q++) {
            if (sc[q] == -INFINITY)
                continue; /* no such candidate */
            int taken = 0;
            for (int64_t r = 0; r < k && !taken; r++)
                taken = pick[r] == q;
            if (!taken && (best < 0 || st_ranks_before(sc[q], q, sc[best], best)))
                best = q;
        }
        pick[k] = best;
        if (k < n_parents) /* slots past the last needed level are never read */
            parents[k] = base + (best >= 0 ? best : 0);
    }
}
