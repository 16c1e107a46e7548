/* SPDX-License-Identifier: MIT */
/*
 * dlpack_abi.h: the DLPack C ABI that cudamem exchanges, declared from
 * the published layout (DLPack 1.x, with the legacy 0.x managed tensor).
 *
 * Only what dlpack.c uses is declared: the device and type codes it
 * exports or accepts, the plain tensor, the two managed tensors, the
 * flag bits and the capsule names of the Python protocol.  The layouts
 * must match the published ABI byte for byte; the static asserts pin the
 * field offsets of the 64-bit ABI.
 */
#ifndef CM_DLPACK_ABI_H
#define CM_DLPACK_ABI_H

#include <stddef.h>
#include <stdint.h>

/* The version cudamem produces in versioned capsules. */
#define CM_DL_MAJOR 1
#define CM_DL_MINOR 1

/* Device types (DLDeviceType). */
enum {
    CM_DL_CPU = 1,
    CM_DL_CUDA = 2,
    CM_DL_CUDA_HOST = 3,
    CM_DL_CUDA_MANAGED = 13
};

/* Type codes (DLDataTypeCode). */
enum {
    CM_DL_INT = 0,
    CM_DL_UINT = 1,
    CM_DL_FLOAT = 2,
    CM_DL_OPAQUE = 3,
    CM_DL_BFLOAT = 4,
    CM_DL_COMPLEX = 5,
    CM_DL_BOOL = 6
};

/* Flag bits of a versioned managed tensor. */
#define CM_DL_FLAG_READ_ONLY ((uint64_t)1 << 0)
#define CM_DL_FLAG_IS_COPIED ((uint64_t)1 << 1)

/* Capsule names: offered, and after a consumer took the tensor. */
#define CM_DL_NAME "dltensor"
#define CM_DL_NAME_USED "used_dltensor"
#define CM_DL_NAME_V "dltensor_versioned"
#define CM_DL_NAME_V_USED "used_dltensor_versioned"

/* A version: a consumer must refuse a major it does not know. */
typedef struct {
    uint32_t major;
    uint32_t minor;
} cm_dl_version;

/* Where the data lives: a device type and its ordinal. */
typedef struct {
    int32_t device_type;      /* the C enum, int-sized on every ABI */
    int32_t device_id;
} cm_dl_device;

/* An element type: code, bits per lane, lanes (1 for scalars). */
typedef struct {
    uint8_t code;
    uint8_t bits;
    uint16_t lanes;
} cm_dl_dtype;

/* A strided tensor that owns nothing. */
typedef struct {
    void *data;               /* base address (device address on CUDA) */
    cm_dl_device device;
    int32_t ndim;
    cm_dl_dtype dtype;
    int64_t *shape;           /* ndim entries */
    int64_t *strides;         /* ndim entries, in elements; NULL: compact
                               * row-major (producers of 1.2+ never
                               * send NULL) */
    uint64_t byte_offset;     /* from data to the first element */
} cm_dl_tensor;

/* The legacy (0.x) managed tensor, capsule "dltensor". */
typedef struct cm_dl_managed {
    cm_dl_tensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct cm_dl_managed *self);
} cm_dl_managed;

/* The versioned (1.x) managed tensor, capsule "dltensor_versioned". */
typedef struct cm_dl_managed_v {
    cm_dl_version version;
    void *manager_ctx;
    void (*deleter)(struct cm_dl_managed_v *self);
    uint64_t flags;
    cm_dl_tensor dl_tensor;
} cm_dl_managed_v;

#if UINTPTR_MAX == 0xFFFFFFFFFFFFFFFFu
_Static_assert(sizeof(cm_dl_dtype) == 4, "DLDataType is 4 bytes");
_Static_assert(offsetof(cm_dl_tensor, ndim) == 16, "DLTensor.ndim");
_Static_assert(offsetof(cm_dl_tensor, shape) == 24, "DLTensor.shape");
_Static_assert(sizeof(cm_dl_tensor) == 48, "DLTensor is 48 bytes");
_Static_assert(offsetof(cm_dl_managed, deleter) == 56,
               "DLManagedTensor.deleter");
_Static_assert(offsetof(cm_dl_managed_v, flags) == 24,
               "DLManagedTensorVersioned.flags");
_Static_assert(offsetof(cm_dl_managed_v, dl_tensor) == 32,
               "DLManagedTensorVersioned.dl_tensor");
#endif

#endif /* CM_DLPACK_ABI_H */
