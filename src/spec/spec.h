/* spec.h: internal header of the speculative core (tree, verification, attention backends). */
#ifndef ST_SPEC_H
#define ST_SPEC_H
#include "core/core.h"
#include "spec/attn_api.h"
#include "spec/tree_api.h"
#endif
