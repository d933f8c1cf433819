/* tok_api.h: now part of include/spectree.h (kept so internal includes keep working). */
#ifndef ST_TOK_API_H
#define ST_TOK_API_H
#include "spectree.h"
#endif
