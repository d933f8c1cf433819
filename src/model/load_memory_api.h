/* load_memory_api.h: now part of include/spectree.h (kept so internal includes keep working). */
#ifndef ST_LOAD_MEMORY_API_H
#define ST_LOAD_MEMORY_API_H
#include "spectree.h"
#endif
