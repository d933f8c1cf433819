/*
 * peak_amx.c: the AMX-INT8 loop of the roofline (peak.h): tdpbssd on full tiles (16 x 64 bytes
 * times 16 x 64 bytes into 16 x 16 int32 sums, 16384 multiply-adds), four independent C tiles
 * fed by two A and two B tiles, as kernels_amx.c blocks them. Compiled for AMX (CMakeLists.txt),
 * called only where st_peak_has(PEAK_ISA_AMX) (the CPU has AMX-INT8 and the OS let this process
 * use its tile state).
 */
#include "peak.h"

#include <immintrin.h>
#include <string.h>

typedef struct tilecfg {
    uint8_t palette, start;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tilecfg;

uint64_t st_peak_amx_tdpbssd(int64_t iters) {
    tilecfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) {
        c.colsb[t] = 64;
        c.rows[t] = 16;
    }
    _tile_loadconfig(&c);
    static _Alignas(64) int8_t src[16 * 64];
    memset(src, 1, sizeof src);
    _tile_loadd(0, src, 64);
    _tile_loadd(1, src, 64);
    _tile_loadd(2, src, 64);
    _tile_loadd(3, src, 64);
    _tile_zero(4);
    _tile_zero(5);
    _tile_zero(6);
    _tile_zero(7);
    for (int64_t it = 0; it < iters; it++) {
        _tile_dpbssd(4, 0, 2);
        _tile_dpbssd(5, 0, 3);
        _tile_dpbssd(6, 1, 2);
        _tile_dpbssd(7, 1, 3);
    }
    _Alignas(64) int32_t out[4][16 * 16];
    _tile_stored(4, out[0], 64);
    _tile_stored(5, out[1], 64);
    _tile_stored(6, out[2], 64);
    _tile_stored(7, out[3], 64);
    _tile_release();
    uint64_t s = 0;
    for (int t = 0; t < 4; t++)
        s ^= (uint64_t)(uint32_t)out[t][0] << t;
    return s;
}
