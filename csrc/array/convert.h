/* SPDX-License-Identifier: MIT */
/*
 * convert.h: element conversion between NumPy's numeric types, written
 * once and used twice: compiled here for the simulator's host copies, and
 * handed as source text to NVRTC for the device kernels, so both backends
 * cast alike.
 *
 * The code sits inside CM_CONVERT_CODE(...): the host compiles the
 * argument and the same argument is kept as the string cm_convert_src.
 * It therefore uses no preprocessor directives and only constructs that
 * are both C11 and CUDA C++.  CM_FN is "static inline" on the host and
 * "__device__ static inline" in kernels.
 *
 * Casting follows C (and NumPy's unsafe casting): floats to integers
 * truncate toward zero (NaN and values out of the 64-bit range give the
 * 64-bit minimum, then wrap to the target's width, on both backends),
 * complex to real keeps the real part, anything to bool is "not zero".
 */
#ifndef CM_CONVERT_H
#define CM_CONVERT_H

#define CM_CONVERT_CODE(...)                                           \
    static const char cm_convert_src[] = #__VA_ARGS__;                 \
    __VA_ARGS__

#define CM_FN static inline

CM_CONVERT_CODE(
/* One value on its way from one type to another. */
typedef struct {
    int cls;                /* 0 signed integer, 1 unsigned, 2 floating */
    long long i;            /* the value when cls is 0 */
    unsigned long long u;   /* the value when cls is 1 */
    double re;              /* the value (real part) when cls is 2 */
    double im;              /* the imaginary part when cls is 2 */
} cm_val;

CM_FN float
cm_half_to_float(unsigned short h)
{
    unsigned int sign = (unsigned int)(h >> 15) << 31;
    unsigned int exp = (h >> 10) & 0x1f;
    unsigned int man = h & 0x3ff;
    unsigned int bits;
    union { unsigned int u; float f; } cvt;

    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        }
        else {
            exp = 127 - 15 + 1;
            while ((man & 0x400) == 0) {
                man <<= 1;
                exp--;
            }
            man &= 0x3ff;
            bits = sign | (exp << 23) | (man << 13);
        }
    }
    else if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    }
    else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    cvt.u = bits;
    return cvt.f;
}

CM_FN unsigned short
cm_float_to_half(float f)
{
    union { unsigned int u; float f; } cvt;
    unsigned int x;
    unsigned int sign;
    int exp;
    unsigned int man;
    unsigned int half;
    unsigned int rest;

    cvt.f = f;
    x = cvt.u;
    sign = (x >> 16) & 0x8000;
    exp = (int)((x >> 23) & 0xff) - 127 + 15;
    man = x & 0x7fffff;
    if (((x >> 23) & 0xff) == 0xff) {
        return (unsigned short)(sign | 0x7c00 | (man ? 0x200 : 0));
    }
    if (exp >= 0x1f) {
        return (unsigned short)(sign | 0x7c00);
    }
    if (exp <= 0) {
        if (exp < -10) {
            return (unsigned short)sign;
        }
        man |= 0x800000;
        half = man >> (14 - exp);
        rest = man & ((1u << (14 - exp)) - 1);
        if (rest > (1u << (13 - exp))
            || (rest == (1u << (13 - exp)) && (half & 1))) {
            half++;
        }
        return (unsigned short)(sign | half);
    }
    half = sign | ((unsigned int)exp << 10) | (man >> 13);
    rest = man & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (half & 1))) {
        half++;
    }
    return (unsigned short)half;
}

/* Read one element of type t at p (no alignment needed). */
CM_FN cm_val
cm_load(int t, const unsigned char *p)
{
    union {
        unsigned char b[16];
        signed char i8;
        unsigned char u8;
        short i16;
        unsigned short u16;
        int i32;
        unsigned int u32;
        long long i64;
        unsigned long long u64;
        float f32;
        double f64;
        float c64[2];
        double c128[2];
    } m;
    cm_val v;
    int n = t == CM_T_BOOL || t == CM_T_I8 || t == CM_T_U8 ? 1
            : t == CM_T_I16 || t == CM_T_U16 || t == CM_T_F16 ? 2
            : t == CM_T_I32 || t == CM_T_U32 || t == CM_T_F32 ? 4
            : t == CM_T_C128 ? 16 : 8;
    int k;

    for (k = 0; k < n; k++) {
        m.b[k] = p[k];
    }
    v.cls = 0;
    v.i = 0;
    v.u = 0;
    v.re = 0.0;
    v.im = 0.0;
    switch (t) {
    case CM_T_BOOL: v.i = m.u8 != 0; break;
    case CM_T_I8: v.i = m.i8; break;
    case CM_T_U8: v.cls = 1; v.u = m.u8; break;
    case CM_T_I16: v.i = m.i16; break;
    case CM_T_U16: v.cls = 1; v.u = m.u16; break;
    case CM_T_I32: v.i = m.i32; break;
    case CM_T_U32: v.cls = 1; v.u = m.u32; break;
    case CM_T_I64: v.i = m.i64; break;
    case CM_T_U64: v.cls = 1; v.u = m.u64; break;
    case CM_T_F16: v.cls = 2; v.re = cm_half_to_float(m.u16); break;
    case CM_T_F32: v.cls = 2; v.re = m.f32; break;
    case CM_T_F64: v.cls = 2; v.re = m.f64; break;
    case CM_T_C64: v.cls = 2; v.re = m.c64[0]; v.im = m.c64[1]; break;
    default: v.cls = 2; v.re = m.c128[0]; v.im = m.c128[1]; break;
    }
    return v;
}

/* The value as a signed 64-bit integer, C-style. */
CM_FN long long
cm_as_i64(cm_val v)
{
    if (v.cls == 0) {
        return v.i;
    }
    if (v.cls == 1) {
        return (long long)v.u;
    }
    if (!(v.re > -9223372036854775808.0 && v.re < 9223372036854775808.0)) {
        return (long long)(-9223372036854775807LL - 1);
    }
    return (long long)v.re;
}

/* The value as an unsigned 64-bit integer, C-style (wrapping). */
CM_FN unsigned long long
cm_as_u64(cm_val v)
{
    if (v.cls == 1) {
        return v.u;
    }
    if (v.cls == 2 && v.re >= 9223372036854775808.0
        && v.re < 18446744073709551616.0) {
        return (unsigned long long)v.re;
    }
    return (unsigned long long)cm_as_i64(v);
}

CM_FN double
cm_as_f64(cm_val v)
{
    return v.cls == 0 ? (double)v.i : v.cls == 1 ? (double)v.u : v.re;
}

/* Write v as one element of type t at p (no alignment needed). */
CM_FN void
cm_store(int t, unsigned char *p, cm_val v)
{
    union {
        unsigned char b[16];
        signed char i8;
        unsigned char u8;
        short i16;
        unsigned short u16;
        int i32;
        unsigned int u32;
        long long i64;
        unsigned long long u64;
        float f32;
        double f64;
        float c64[2];
        double c128[2];
    } m;
    int n = 8;
    int k;

    switch (t) {
    case CM_T_BOOL:
        m.u8 = (unsigned char)(v.cls == 0 ? v.i != 0 : v.cls == 1 ? v.u != 0
                               : (v.re != 0.0 || v.im != 0.0));
        n = 1;
        break;
    case CM_T_I8: m.i8 = (signed char)cm_as_i64(v); n = 1; break;
    case CM_T_U8: m.u8 = (unsigned char)cm_as_u64(v); n = 1; break;
    case CM_T_I16: m.i16 = (short)cm_as_i64(v); n = 2; break;
    case CM_T_U16: m.u16 = (unsigned short)cm_as_u64(v); n = 2; break;
    case CM_T_I32: m.i32 = (int)cm_as_i64(v); n = 4; break;
    case CM_T_U32: m.u32 = (unsigned int)cm_as_u64(v); n = 4; break;
    case CM_T_I64: m.i64 = cm_as_i64(v); break;
    case CM_T_U64: m.u64 = cm_as_u64(v); break;
    case CM_T_F16:
        m.u16 = cm_float_to_half((float)cm_as_f64(v));
        n = 2;
        break;
    case CM_T_F32: m.f32 = (float)cm_as_f64(v); n = 4; break;
    case CM_T_F64: m.f64 = cm_as_f64(v); break;
    case CM_T_C64:
        m.c64[0] = (float)cm_as_f64(v);
        m.c64[1] = (float)(v.cls == 2 ? v.im : 0.0);
        break;
    default:
        m.c128[0] = cm_as_f64(v);
        m.c128[1] = v.cls == 2 ? v.im : 0.0;
        n = 16;
        break;
    }
    for (k = 0; k < n; k++) {
        p[k] = m.b[k];
    }
}
)

#endif /* CM_CONVERT_H */
