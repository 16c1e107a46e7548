/* SPDX-License-Identifier: MIT */
/*
 * context/kbatch.c: a run of small copies in a capture as one kernel
 * node.  Recorded one a node (context/kcopy.c), a graph's chain of 1 KiB
 * round trips replays in about 1.6 µs a copy on an H100; a single kernel
 * doing them all one after another, in about 1.0-1.2 µs, each read of
 * page-locked host memory waiting for the bus (docs/performance.md,
 * "Graphs").  What is left is that wait, paid per copy.  So while a
 * stream cudamem captures records kernel copies one after another, with
 * nothing else recorded on it or joined to it in between, the copies
 * after the first go into the first one's node (a batch) instead of
 * nodes of their own, and the batch's kernel
 *
 * - first reads, all at once, the sources no earlier copy of the batch
 *   writes (the preloads: word-aligned, a source read twice read once,
 *   at most CM_KB_STAGE bytes in all), into shared memory, so the bus's
 *   latency is paid about once for all of them;
 * - then makes the copies in their order, the staged ones from shared
 *   memory, with a barrier of the block before a copy that reads what
 *   an earlier copy since the last barrier writes, or writes what it
 *   reads or writes (a segment's copies are independent: its threads
 *   run them at once).
 *
 * A copy reading host memory an earlier copy of the batch wrote starts
 * a new batch.  One block of CM_KB_THREADS threads runs a batch.  The
 * batch is the kernel's one parameter, by value (at most CM_KB_MAX
 * entries, preloads first); when a copy joins it, the node's parameters
 * are set again (cuGraphKernelNodeSetParams: a capture's graph may be
 * changed while it is captured), after cuStreamGetCaptureInfo said the
 * node is still the stream's one dependency.  Without those entry points
 * (a driver before 12.3), or the kernel loaded, each copy keeps its own
 * node.
 *
 * On the simulator the batch is a host function over the same
 * parameter (cm_kbatch_sim_run), which the simulator's capture records
 * and changes in place (cm_sim_kbatch) under the same rule; it makes
 * the preloads first, then each segment's copies in reverse order (one
 * order the device may take), so that a barrier or a preload the
 * analysis got wrong changes what a test reads.
 *
 * Locks and the GIL: no lock.  The open batches (cm_kb_open) are read
 * and written with the GIL held; the GIL may be released inside the
 * driver calls (CM_CU), while no other thread touches the batch of a
 * stream this thread captures.
 */
#include "context/stream.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The most entries (preloads and copies) of a batch: the parameter stays
 * within the 4 KiB every driver takes. */
#define CM_KB_MAX 160

/* The most bytes a batch preloads (dynamic shared memory, within the 48
 * KiB no attribute needs). */
#define CM_KB_STAGE 32768

/* The threads of the one block. */
#define CM_KB_THREADS 512

/* A copy's flags: a barrier before it; its source is the stage. */
#define CM_KB_BARRIER 1u
#define CM_KB_STAGED 2u

/* Batches open at once (one a capturing stream). */
#define CM_KB_OPEN 64

/* One entry: a preload (src, n bytes, to stage offset f) or a copy
 * (dst <- src, n bytes; src a stage offset when f has CM_KB_STAGED). */
typedef struct {
    unsigned long long dst;
    unsigned long long src;
    unsigned int n;
    unsigned int f;
} cm_kb_ent;

/* The kernel's parameter: n copies after npre preloads of words words
 * in all, laid out in the stage one after another. */
typedef struct {
    unsigned int n;
    unsigned int npre;
    unsigned int words;
    unsigned int pad;
    cm_kb_ent e[CM_KB_MAX];
} cm_kb;

_Static_assert(sizeof(cm_kb) == 3856, "the kernel's parameter is 3856 B");

/* A batch open on a capturing stream. */
typedef struct {
    CUstream h;               /* the stream */
    uint64_t capid;           /* its capture's id */
    uint64_t seq;             /* the simulator's node */
    CUgraphNode node;         /* the driver's node */
    cm_kb kb;
    struct {
        uintptr_t dst;        /* where copy i writes and reads, as */
        uintptr_t src;        /* device addresses */
        size_t n;
        int dst_host;
    } c[CM_KB_MAX];
    unsigned int seg;         /* the first copy of the current segment */
    unsigned int stage;       /* bytes preloaded */
} cm_kbatch;

static cm_kbatch *cm_kb_open[CM_KB_OPEN];

/* The batch to give up next when all are taken. */
static int cm_kb_next;

/* Batching on (1) or off; _capture_kernel_batch changes it. */
static atomic_int cm_kb_on = 1;

/* Copies that joined a batch since import. */
static atomic_size_t cm_kb_joined;

/* The kernel's CUDA C source (nvcc -ptx -arch=compute_75 -O3):
 *
 * struct cm_kb_ent {
 *     unsigned long long dst;
 *     unsigned long long src;
 *     unsigned int n;
 *     unsigned int f;
 * };
 *
 * struct cm_kb {
 *     unsigned int n;
 *     unsigned int npre;
 *     unsigned int words;
 *     unsigned int pad;
 *     cm_kb_ent e[160];
 * };
 *
 * extern "C" __global__ void
 * cm_kbatch(const __grid_constant__ cm_kb b)
 * {
 *     extern __shared__ unsigned int stage[];
 *     const unsigned int t = threadIdx.x;
 *     const unsigned int nt = blockDim.x;
 *     unsigned int p = 0;
 *     unsigned int pend = b.npre > 0 ? (b.e[0].f + b.e[0].n) >> 2 : 0;
 *     unsigned int k0;
 *     unsigned int i;
 *
 *     for (k0 = t; k0 < b.words; k0 += 4 * nt) {
 *         const unsigned int *a[4];
 *         unsigned int v[4];
 *         int j;
 *
 * #pragma unroll
 *         for (j = 0; j < 4; j++) {
 *             unsigned int k = k0 + j * nt;
 *
 *             a[j] = 0;
 *             if (k < b.words) {
 *                 while (k >= pend) {
 *                     p++;
 *                     pend = (b.e[p].f + b.e[p].n) >> 2;
 *                 }
 *                 a[j] = (const unsigned int *)b.e[p].src
 *                        + (k - (b.e[p].f >> 2));
 *             }
 *         }
 * #pragma unroll
 *         for (j = 0; j < 4; j++) {
 *             if (a[j] != 0) {
 *                 v[j] = *a[j];
 *             }
 *         }
 * #pragma unroll
 *         for (j = 0; j < 4; j++) {
 *             if (a[j] != 0) {
 *                 stage[k0 + j * nt] = v[j];
 *             }
 *         }
 *     }
 *     __syncthreads();
 *     for (i = b.npre; i < b.npre + b.n; i++) {
 *         unsigned long long dst = b.e[i].dst;
 *         unsigned long long src = b.e[i].src;
 *         unsigned int n = b.e[i].n;
 *         unsigned int f = b.e[i].f;
 *         const unsigned char *s;
 *         unsigned int x;
 *
 *         if (f & 1) {
 *             __syncthreads();
 *         }
 *         s = (f & 2) ? (const unsigned char *)stage + src
 *                     : (const unsigned char *)src;
 *         if (((dst | (unsigned long long)s | n) & 3) == 0) {
 *             for (x = t; x < (n >> 2); x += nt) {
 *                 ((unsigned int *)dst)[x] = ((const unsigned int *)s)[x];
 *             }
 *         }
 *         else {
 *             for (x = t; x < n; x += nt) {
 *                 ((unsigned char *)dst)[x] = s[x];
 *             }
 *         }
 *     }
 * }
 *
 * and its PTX, the ISA version and target lowered to what the
 * instructions need, so that older drivers load it. */
static const char cm_kbatch_ptx[] =
    ".version 7.0\n"
    ".target sm_52\n"
    ".address_size 64\n"
    ".extern .shared .align 16 .b8 stage[];\n"
    ".visible .entry cm_kbatch(\n"
    "    .param .align 8 .b8 cm_kbatch_param_0[3856]\n"
    ")\n"
    "{\n"
    "    .reg .pred %p<36>;\n"
    "    .reg .b16 %rs<2>;\n"
    "    .reg .b32 %r<164>;\n"
    "    .reg .b64 %rd<117>;\n"
    "    mov.b64 %rd42, cm_kbatch_param_0;\n"
    "    mov.u32 %r1, %ntid.x;\n"
    "    add.s64 %rd2, %rd42, 4;\n"
    "    ld.param.u32 %r2, [cm_kbatch_param_0+8];\n"
    "    mov.u32 %r3, %tid.x;\n"
    "    setp.ge.u32 %p1, %r3, %r2;\n"
    "    @%p1 bra $L__BB0_39;\n"
    "    ld.param.u32 %r64, [%rd2];\n"
    "    ld.param.v2.u32 {%r65, %r66}, [%rd2+28];\n"
    "    mov.u32 %r134, 0;\n"
    "    add.s32 %r69, %r65, %r66;\n"
    "    shr.u32 %r70, %r69, 2;\n"
    "    setp.eq.s32 %p2, %r64, 0;\n"
    "    selp.b32 %r135, 0, %r70, %p2;\n"
    "    mov.u32 %r136, %r3;\n"
    "$L__BB0_2:\n"
    "    setp.ge.u32 %p3, %r136, %r2;\n"
    "    mov.u64 %rd108, 0;\n"
    "    mov.u64 %rd105, %rd108;\n"
    "    mov.u64 %rd106, %rd108;\n"
    "    @%p3 bra $L__BB0_7;\n"
    "    setp.lt.u32 %p4, %r136, %r135;\n"
    "    @%p4 bra $L__BB0_5;\n"
    "    bra.uni $L__BB0_4;\n"
    "$L__BB0_5:\n"
    "    cvt.u64.u32 %rd104, %r134;\n"
    "    bra.uni $L__BB0_6;\n"
    "$L__BB0_4:\n"
    "    add.s32 %r134, %r134, 1;\n"
    "    cvt.u64.u32 %rd104, %r134;\n"
    "    mul.wide.u32 %rd45, %r134, 24;\n"
    "    add.s64 %rd46, %rd42, %rd45;\n"
    "    ld.param.v2.u32 {%r71, %r72}, [%rd46+32];\n"
    "    add.s32 %r75, %r71, %r72;\n"
    "    shr.u32 %r135, %r75, 2;\n"
    "    setp.lt.u32 %p5, %r136, %r135;\n"
    "    @%p5 bra $L__BB0_6;\n"
    "    bra.uni $L__BB0_4;\n"
    "$L__BB0_6:\n"
    "    mul.lo.s64 %rd47, %rd104, 24;\n"
    "    add.s64 %rd48, %rd42, 16;\n"
    "    add.s64 %rd49, %rd48, %rd47;\n"
    "    ld.param.u64 %rd50, [%rd49+8];\n"
    "    cvta.to.global.u64 %rd51, %rd50;\n"
    "    mul.lo.s64 %rd52, %rd104, 24;\n"
    "    add.s64 %rd53, %rd48, %rd52;\n"
    "    ld.param.u32 %r76, [%rd53+20];\n"
    "    shr.u32 %r77, %r76, 2;\n"
    "    sub.s32 %r78, %r136, %r77;\n"
    "    mul.wide.u32 %rd54, %r78, 4;\n"
    "    add.s64 %rd105, %rd51, %rd54;\n"
    "    add.s64 %rd106, %rd50, %rd54;\n"
    "$L__BB0_7:\n"
    "    add.s32 %r19, %r1, %r136;\n"
    "    setp.ge.u32 %p6, %r19, %r2;\n"
    "    mov.u64 %rd109, %rd108;\n"
    "    @%p6 bra $L__BB0_12;\n"
    "    setp.lt.u32 %p7, %r19, %r135;\n"
    "    @%p7 bra $L__BB0_10;\n"
    "    bra.uni $L__BB0_9;\n"
    "$L__BB0_10:\n"
    "    cvt.u64.u32 %rd107, %r134;\n"
    "    bra.uni $L__BB0_11;\n"
    "$L__BB0_9:\n"
    "    add.s32 %r134, %r134, 1;\n"
    "    cvt.u64.u32 %rd107, %r134;\n"
    "    mul.wide.u32 %rd57, %r134, 24;\n"
    "    add.s64 %rd58, %rd42, %rd57;\n"
    "    ld.param.v2.u32 {%r79, %r80}, [%rd58+32];\n"
    "    add.s32 %r83, %r79, %r80;\n"
    "    shr.u32 %r135, %r83, 2;\n"
    "    setp.lt.u32 %p8, %r19, %r135;\n"
    "    @%p8 bra $L__BB0_11;\n"
    "    bra.uni $L__BB0_9;\n"
    "$L__BB0_11:\n"
    "    mul.lo.s64 %rd59, %rd107, 24;\n"
    "    add.s64 %rd60, %rd42, 16;\n"
    "    add.s64 %rd61, %rd60, %rd59;\n"
    "    ld.param.u64 %rd62, [%rd61+8];\n"
    "    cvta.to.global.u64 %rd63, %rd62;\n"
    "    mul.lo.s64 %rd64, %rd107, 24;\n"
    "    add.s64 %rd65, %rd60, %rd64;\n"
    "    ld.param.u32 %r84, [%rd65+20];\n"
    "    shr.u32 %r85, %r84, 2;\n"
    "    sub.s32 %r86, %r19, %r85;\n"
    "    mul.wide.u32 %rd66, %r86, 4;\n"
    "    add.s64 %rd108, %rd63, %rd66;\n"
    "    add.s64 %rd109, %rd62, %rd66;\n"
    "$L__BB0_12:\n"
    "    add.s32 %r27, %r19, %r1;\n"
    "    setp.ge.u32 %p9, %r27, %r2;\n"
    "    mov.u64 %rd114, 0;\n"
    "    mov.u64 %rd111, %rd114;\n"
    "    mov.u64 %rd112, %rd114;\n"
    "    @%p9 bra $L__BB0_17;\n"
    "    setp.lt.u32 %p10, %r27, %r135;\n"
    "    @%p10 bra $L__BB0_15;\n"
    "    bra.uni $L__BB0_14;\n"
    "$L__BB0_15:\n"
    "    cvt.u64.u32 %rd110, %r134;\n"
    "    bra.uni $L__BB0_16;\n"
    "$L__BB0_14:\n"
    "    add.s32 %r134, %r134, 1;\n"
    "    cvt.u64.u32 %rd110, %r134;\n"
    "    mul.wide.u32 %rd69, %r134, 24;\n"
    "    add.s64 %rd70, %rd42, %rd69;\n"
    "    ld.param.v2.u32 {%r87, %r88}, [%rd70+32];\n"
    "    add.s32 %r91, %r87, %r88;\n"
    "    shr.u32 %r135, %r91, 2;\n"
    "    setp.lt.u32 %p11, %r27, %r135;\n"
    "    @%p11 bra $L__BB0_16;\n"
    "    bra.uni $L__BB0_14;\n"
    "$L__BB0_16:\n"
    "    mul.lo.s64 %rd71, %rd110, 24;\n"
    "    add.s64 %rd72, %rd42, 16;\n"
    "    add.s64 %rd73, %rd72, %rd71;\n"
    "    ld.param.u64 %rd74, [%rd73+8];\n"
    "    cvta.to.global.u64 %rd75, %rd74;\n"
    "    mul.lo.s64 %rd76, %rd110, 24;\n"
    "    add.s64 %rd77, %rd72, %rd76;\n"
    "    ld.param.u32 %r92, [%rd77+20];\n"
    "    shr.u32 %r93, %r92, 2;\n"
    "    sub.s32 %r94, %r27, %r93;\n"
    "    mul.wide.u32 %rd78, %r94, 4;\n"
    "    add.s64 %rd111, %rd75, %rd78;\n"
    "    add.s64 %rd112, %rd74, %rd78;\n"
    "$L__BB0_17:\n"
    "    add.s32 %r35, %r27, %r1;\n"
    "    setp.ge.u32 %p12, %r35, %r2;\n"
    "    mov.u64 %rd115, %rd114;\n"
    "    @%p12 bra $L__BB0_22;\n"
    "    setp.lt.u32 %p13, %r35, %r135;\n"
    "    @%p13 bra $L__BB0_20;\n"
    "    bra.uni $L__BB0_19;\n"
    "$L__BB0_20:\n"
    "    cvt.u64.u32 %rd113, %r134;\n"
    "    bra.uni $L__BB0_21;\n"
    "$L__BB0_19:\n"
    "    add.s32 %r134, %r134, 1;\n"
    "    cvt.u64.u32 %rd113, %r134;\n"
    "    mul.wide.u32 %rd81, %r134, 24;\n"
    "    add.s64 %rd82, %rd42, %rd81;\n"
    "    ld.param.v2.u32 {%r95, %r96}, [%rd82+32];\n"
    "    add.s32 %r99, %r95, %r96;\n"
    "    shr.u32 %r135, %r99, 2;\n"
    "    setp.lt.u32 %p14, %r35, %r135;\n"
    "    @%p14 bra $L__BB0_21;\n"
    "    bra.uni $L__BB0_19;\n"
    "$L__BB0_21:\n"
    "    mul.lo.s64 %rd83, %rd113, 24;\n"
    "    add.s64 %rd84, %rd42, 16;\n"
    "    add.s64 %rd85, %rd84, %rd83;\n"
    "    ld.param.u64 %rd86, [%rd85+8];\n"
    "    cvta.to.global.u64 %rd87, %rd86;\n"
    "    mul.lo.s64 %rd88, %rd113, 24;\n"
    "    add.s64 %rd89, %rd84, %rd88;\n"
    "    ld.param.u32 %r100, [%rd89+20];\n"
    "    shr.u32 %r101, %r100, 2;\n"
    "    sub.s32 %r102, %r35, %r101;\n"
    "    mul.wide.u32 %rd90, %r102, 4;\n"
    "    add.s64 %rd114, %rd87, %rd90;\n"
    "    add.s64 %rd115, %rd86, %rd90;\n"
    "$L__BB0_22:\n"
    "    setp.eq.s64 %p15, %rd106, 0;\n"
    "    @%p15 bra $L__BB0_24;\n"
    "    ld.global.u32 %r157, [%rd105];\n"
    "$L__BB0_24:\n"
    "    setp.eq.s64 %p16, %rd109, 0;\n"
    "    @%p16 bra $L__BB0_26;\n"
    "    ld.global.u32 %r158, [%rd108];\n"
    "$L__BB0_26:\n"
    "    setp.eq.s64 %p17, %rd112, 0;\n"
    "    @%p17 bra $L__BB0_28;\n"
    "    ld.global.u32 %r159, [%rd111];\n"
    "$L__BB0_28:\n"
    "    setp.eq.s64 %p18, %rd115, 0;\n"
    "    @%p18 bra $L__BB0_30;\n"
    "    ld.global.u32 %r160, [%rd114];\n"
    "$L__BB0_30:\n"
    "    @%p15 bra $L__BB0_32;\n"
    "    shl.b32 %r103, %r136, 2;\n"
    "    mov.u32 %r104, stage;\n"
    "    add.s32 %r105, %r104, %r103;\n"
    "    st.shared.u32 [%r105], %r157;\n"
    "$L__BB0_32:\n"
    "    @%p16 bra $L__BB0_34;\n"
    "    shl.b32 %r106, %r19, 2;\n"
    "    mov.u32 %r107, stage;\n"
    "    add.s32 %r108, %r107, %r106;\n"
    "    st.shared.u32 [%r108], %r158;\n"
    "$L__BB0_34:\n"
    "    @%p17 bra $L__BB0_36;\n"
    "    shl.b32 %r109, %r27, 2;\n"
    "    mov.u32 %r110, stage;\n"
    "    add.s32 %r111, %r110, %r109;\n"
    "    st.shared.u32 [%r111], %r159;\n"
    "$L__BB0_36:\n"
    "    @%p18 bra $L__BB0_38;\n"
    "    shl.b32 %r112, %r35, 2;\n"
    "    mov.u32 %r113, stage;\n"
    "    add.s32 %r114, %r113, %r112;\n"
    "    st.shared.u32 [%r114], %r160;\n"
    "$L__BB0_38:\n"
    "    add.s32 %r136, %r35, %r1;\n"
    "    setp.lt.u32 %p23, %r136, %r2;\n"
    "    @%p23 bra $L__BB0_2;\n"
    "$L__BB0_39:\n"
    "    bar.sync 0;\n"
    "    ld.param.v2.u32 {%r115, %r161}, [%rd2+-4];\n"
    "    add.s32 %r118, %r115, %r161;\n"
    "    setp.ge.u32 %p24, %r161, %r118;\n"
    "    @%p24 bra $L__BB0_52;\n"
    "$L__BB0_40:\n"
    "    mul.wide.u32 %rd91, %r161, 24;\n"
    "    add.s64 %rd92, %rd42, %rd91;\n"
    "    ld.param.u64 %rd35, [%rd92+16];\n"
    "    ld.param.u64 %rd116, [%rd92+24];\n"
    "    ld.param.v2.u32 {%r119, %r120}, [%rd92+32];\n"
    "    and.b32 %r121, %r120, 1;\n"
    "    setp.eq.b32 %p25, %r121, 1;\n"
    "    mov.pred %p26, 0;\n"
    "    xor.pred %p27, %p25, %p26;\n"
    "    not.pred %p28, %p27;\n"
    "    @%p28 bra $L__BB0_42;\n"
    "    bar.sync 0;\n"
    "$L__BB0_42:\n"
    "    and.b32 %r122, %r120, 2;\n"
    "    setp.eq.s32 %p29, %r122, 0;\n"
    "    @%p29 bra $L__BB0_44;\n"
    "    mov.u32 %r123, stage;\n"
    "    { .reg .b64 %tmp;\n"
    "    cvt.u64.u32 %tmp, %r123;\n"
    "    cvta.shared.u64 %rd93, %tmp; }\n"
    "    add.s64 %rd116, %rd93, %rd116;\n"
    "$L__BB0_44:\n"
    "    cvt.u64.u32 %rd94, %r119;\n"
    "    or.b64 %rd95, %rd35, %rd94;\n"
    "    or.b64 %rd96, %rd95, %rd116;\n"
    "    and.b64 %rd97, %rd96, 3;\n"
    "    setp.eq.s64 %p30, %rd97, 0;\n"
    "    @%p30 bra $L__BB0_48;\n"
    "    setp.ge.u32 %p31, %r3, %r119;\n"
    "    @%p31 bra $L__BB0_51;\n"
    "    cvta.to.global.u64 %rd40, %rd35;\n"
    "    mov.u32 %r162, %r3;\n"
    "$L__BB0_47:\n"
    "    cvt.u64.u32 %rd98, %r162;\n"
    "    add.s64 %rd99, %rd116, %rd98;\n"
    "    ld.u8 %rs1, [%rd99];\n"
    "    add.s64 %rd100, %rd40, %rd98;\n"
    "    st.global.u8 [%rd100], %rs1;\n"
    "    add.s32 %r162, %r162, %r1;\n"
    "    setp.lt.u32 %p32, %r162, %r119;\n"
    "    @%p32 bra $L__BB0_47;\n"
    "    bra.uni $L__BB0_51;\n"
    "$L__BB0_48:\n"
    "    shr.u32 %r58, %r119, 2;\n"
    "    setp.ge.u32 %p33, %r3, %r58;\n"
    "    @%p33 bra $L__BB0_51;\n"
    "    cvta.to.global.u64 %rd41, %rd35;\n"
    "    mov.u32 %r163, %r3;\n"
    "$L__BB0_50:\n"
    "    mul.wide.u32 %rd101, %r163, 4;\n"
    "    add.s64 %rd102, %rd116, %rd101;\n"
    "    ld.u32 %r124, [%rd102];\n"
    "    add.s64 %rd103, %rd41, %rd101;\n"
    "    st.global.u32 [%rd103], %r124;\n"
    "    add.s32 %r163, %r163, %r1;\n"
    "    setp.lt.u32 %p34, %r163, %r58;\n"
    "    @%p34 bra $L__BB0_50;\n"
    "$L__BB0_51:\n"
    "    add.s32 %r161, %r161, 1;\n"
    "    ld.param.v2.u32 {%r125, %r126}, [%rd2+-4];\n"
    "    add.s32 %r129, %r125, %r126;\n"
    "    setp.lt.u32 %p35, %r161, %r129;\n"
    "    @%p35 bra $L__BB0_40;\n"
    "$L__BB0_52:\n"
    "    ret;\n"
    "}\n";

void *
cm_kbatch_load(void)
{
    CUmodule mod = NULL;
    CUfunction fn = NULL;
    CUresult rc;
    int regs = 0;

    if (cm_cu.StreamGetCaptureInfo == NULL
        || cm_cu.GraphKernelNodeSetParams == NULL) {
        return NULL;
    }
    /* The caller released the GIL: the driver compiles the PTX. */
    rc = CM_CU_RAW(ModuleLoadData, (&mod, cm_kbatch_ptx));
    if (rc == CUDA_SUCCESS) {
        rc = CM_CU_RAW(ModuleGetFunction, (&fn, mod, "cm_kbatch"));
    }
    if (rc == CUDA_SUCCESS) {
        rc = CM_CU_RAW(FuncGetAttribute,
                       (&regs, CU_FUNC_ATTRIBUTE_NUM_REGS, fn));
    }
    if (rc != CUDA_SUCCESS) {
        if (mod != NULL) {
            (void)CM_CU_RAW(ModuleUnload, (mod));
        }
        return NULL;
    }
    return fn;
}

/* The simulator's kernel: b's preloads into a stage, then each
 * segment's copies, last first. */
static void CUDA_CB
cm_kbatch_sim_run(void *arg)
{
    const cm_kb *b = arg;
    unsigned char stage[CM_KB_STAGE];
    const cm_kb_ent *e;
    unsigned int i;
    unsigned int j;
    unsigned int k;
    unsigned int end = b->npre + b->n;

    for (i = 0; i < b->npre; i++) {
        e = &b->e[i];
        memcpy(stage + e->f, (const void *)(uintptr_t)e->src, e->n);
    }
    for (i = b->npre; i < end; i = j) {
        for (j = i + 1; j < end && !(b->e[j].f & CM_KB_BARRIER); j++) {
        }
        for (k = j; k-- > i;) {
            e = &b->e[k];
            memmove((void *)(uintptr_t)e->dst,
                    (e->f & CM_KB_STAGED)
                        ? (const void *)(stage + e->src)
                        : (const void *)(uintptr_t)e->src,
                    e->n);
        }
    }
}

static int
cm_kb_overlap(uintptr_t a, size_t an, uintptr_t b, size_t bn)
{
    return a < b + bn && b < a + an;
}

/* Add the copy dst <- src, n bytes, to b: 1, or 0 when it cannot join
 * (b full, or src host memory b writes). */
static int
cm_kb_append(cm_kbatch *b, uintptr_t dst, int dst_host, uintptr_t src,
             size_t n)
{
    cm_kb *kb = &b->kb;
    unsigned int nc = kb->n;
    unsigned int f = 0;
    unsigned long long esrc = src;
    unsigned int i;
    int written = 0;

    if (kb->npre + nc + 2 > CM_KB_MAX || n > UINT32_MAX) {
        return 0;
    }
    for (i = 0; i < nc; i++) {
        if (cm_kb_overlap(src, n, b->c[i].dst, b->c[i].n)) {
            if (b->c[i].dst_host) {
                return 0;
            }
            written = 1;
        }
    }
    for (i = b->seg; i < nc; i++) {
        if (cm_kb_overlap(src, n, b->c[i].dst, b->c[i].n)
            || cm_kb_overlap(dst, n, b->c[i].dst, b->c[i].n)
            || cm_kb_overlap(dst, n, b->c[i].src, b->c[i].n)) {
            f |= CM_KB_BARRIER;
            b->seg = nc;
            break;
        }
    }
    if (!written && (src & 3) == 0 && (n & 3) == 0) {
        for (i = 0; i < kb->npre; i++) {
            if (kb->e[i].src == src && kb->e[i].n == n) {
                break;
            }
        }
        if (i == kb->npre && b->stage + n <= CM_KB_STAGE) {
            memmove(&kb->e[kb->npre + 1], &kb->e[kb->npre],
                    nc * sizeof(kb->e[0]));
            kb->e[i].dst = 0;
            kb->e[i].src = src;
            kb->e[i].n = (unsigned int)n;
            kb->e[i].f = b->stage;
            kb->npre++;
            kb->words += (unsigned int)(n / 4);
            b->stage += (unsigned int)n;
        }
        if (i < kb->npre) {
            f |= CM_KB_STAGED;
            esrc = kb->e[i].f;
        }
    }
    i = kb->npre + nc;
    kb->e[i].dst = dst;
    kb->e[i].src = esrc;
    kb->e[i].n = (unsigned int)n;
    kb->e[i].f = f;
    b->c[nc].dst = dst;
    b->c[nc].src = src;
    b->c[nc].n = n;
    b->c[nc].dst_host = dst_host;
    kb->n = nc + 1;
    return 1;
}

/* The open batch of h (where with_new, a free one made h's, emptied);
 * NULL when none. */
static cm_kbatch *
cm_kb_find(CUstream h, int with_new)
{
    int i;
    int spare = -1;

    for (i = 0; i < CM_KB_OPEN; i++) {
        if (cm_kb_open[i] != NULL && cm_kb_open[i]->h == h) {
            spare = i;
            break;
        }
    }
    if (spare < 0 && !with_new) {
        return NULL;
    }
    for (i = 0; spare < 0 && i < CM_KB_OPEN; i++) {
        if (cm_kb_open[i] == NULL) {
            spare = i;
        }
    }
    if (spare < 0) {
        /* All taken: the batches go in turn (one of a capture still in
         * progress only leaves its stream's next copy a node of its
         * own). */
        spare = cm_kb_next;
        cm_kb_next = (cm_kb_next + 1) % CM_KB_OPEN;
    }
    if (cm_kb_open[spare] == NULL) {
        cm_kb_open[spare] = PyMem_RawMalloc(sizeof(cm_kbatch));
        if (cm_kb_open[spare] == NULL) {
            return NULL;
        }
        memset(cm_kb_open[spare], 0, sizeof(cm_kbatch));
    }
    if (with_new) {
        memset(cm_kb_open[spare], 0, sizeof(cm_kbatch));
        cm_kb_open[spare]->h = h;
    }
    return cm_kb_open[spare];
}

/* The simulator's record of t (a new node where *seq is 0, else t's
 * node changed, or CUDA_ERROR_NOT_FOUND where that node is no longer
 * h's only dependency). */
static CUresult
cm_kb_sim_put(cm_kbatch *t, CUstream h, uint64_t *seq, uint64_t *capid)
{
    uintptr_t *start = PyMem_RawMalloc(2 * t->kb.n * sizeof(*start));
    size_t *len = PyMem_RawMalloc(2 * t->kb.n * sizeof(*len));
    unsigned int i;
    CUresult rc = CUDA_ERROR_OUT_OF_MEMORY;

    if (start != NULL && len != NULL) {
        for (i = 0; i < t->kb.n; i++) {
            start[2 * i] = t->c[i].dst;
            start[2 * i + 1] = t->c[i].src;
            len[2 * i] = len[2 * i + 1] = t->c[i].n;
        }
        rc = CM_GIL_YIELD(cm_cu.sim_kbatch(h, cm_kbatch_sim_run, &t->kb,
                                           sizeof(t->kb),
                                           (int)(2 * t->kb.n), start, len,
                                           seq, capid));
    }
    PyMem_RawFree(start);
    PyMem_RawFree(len);
    return rc;
}

/* The driver's: t's node given t's parameter, where it is still h's only
 * dependency (else CUDA_ERROR_NOT_FOUND). */
static CUresult
cm_kb_driver_put(cm_context *ctx, cm_kbatch *t, CUstream h)
{
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    cuuint64_t id = 0;
    const CUgraphNode *deps = NULL;
    size_t nd = 0;
    CUDA_KERNEL_NODE_PARAMS kp;
    void *params[1];

    if (CM_CU_RAW(StreamGetCaptureInfo, (h, &st, &id, NULL, &deps, NULL,
                                         &nd)) != CUDA_SUCCESS
        || st != CU_STREAM_CAPTURE_STATUS_ACTIVE || id != t->capid
        || nd != 1 || deps == NULL || deps[0] != t->node) {
        return CUDA_ERROR_NOT_FOUND;
    }
    memset(&kp, 0, sizeof(kp));
    params[0] = &t->kb;
    kp.func = (CUfunction)ctx->kbatch;
    kp.gridDimX = kp.gridDimY = kp.gridDimZ = 1;
    kp.blockDimX = CM_KB_THREADS;
    kp.blockDimY = kp.blockDimZ = 1;
    kp.sharedMemBytes = t->kb.words * 4;
    kp.kernelParams = params;
    return CM_CU_RAW(GraphKernelNodeSetParams, (t->node, &kp));
}

int
cm_kbatch_join(cm_context *ctx, uintptr_t dst, int dst_host,
               uintptr_t src, size_t n, CUstream h)
{
    int sim = cm_driver_backend() == CM_BACKEND_SIM;
    cm_kbatch *b;
    cm_kbatch *t;
    CUresult rc = CUDA_ERROR_NOT_FOUND;
    uint64_t seq = 0;
    uint64_t capid = 0;

    if (!atomic_load(&cm_kb_on) || (!sim && ctx->kbatch == NULL)) {
        return 0;
    }
    if ((t = PyMem_RawMalloc(sizeof(*t))) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b = cm_kb_find(h, 0);
    if (b != NULL && (sim ? b->seq != 0 : b->node != NULL)) {
        memcpy(t, b, sizeof(*t));
        if (cm_kb_append(t, dst, dst_host, src, n)) {
            seq = t->seq;
            capid = t->capid;
            rc = sim ? cm_kb_sim_put(t, h, &seq, &capid)
                     : cm_kb_driver_put(ctx, t, h);
            if (rc == CUDA_SUCCESS) {
                memcpy(b, t, sizeof(*t));
                atomic_fetch_add_explicit(&cm_kb_joined, 1,
                                          memory_order_relaxed);
                PyMem_RawFree(t);
                return 1;
            }
        }
    }
    PyMem_RawFree(t);
    if (rc == CUDA_ERROR_NOT_FOUND) {
        return 0;
    }
    /* The driver refused to change the node: the copy gets its own. */
    return sim && cm_cu_check(rc, "cuLaunchKernel") < 0 ? -1 : 0;
}

int
cm_kbatch_open(cm_context *ctx, uintptr_t dst, int dst_host,
               uintptr_t src, size_t n, CUstream h)
{
    int sim = cm_driver_backend() == CM_BACKEND_SIM;
    cm_kbatch *b;
    cm_kbatch *t;
    CUresult rc;
    uint64_t seq = 0;
    uint64_t capid = 0;

    if ((t = PyMem_RawMalloc(sizeof(*t))) == NULL) {
        if (!sim) {
            return 1;        /* recorded; only the batch is not opened */
        }
        PyErr_NoMemory();
        return -1;
    }
    memset(t, 0, sizeof(*t));
    t->h = h;
    (void)cm_kb_append(t, dst, dst_host, src, n);
    if (sim) {
        /* The copy's node: a batch of one. */
        rc = cm_kb_sim_put(t, h, &seq, &capid);
        if (cm_cu_check(rc, "cuLaunchKernel") < 0) {
            PyMem_RawFree(t);
            return -1;
        }
        t->seq = seq;
        t->capid = capid;
    }
    else {
        /* The caller recorded the copy's node (kcopy.c's kernel): it is
         * h's one dependency now. */
        CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
        cuuint64_t id = 0;
        const CUgraphNode *deps = NULL;
        size_t nd = 0;

        if (ctx->kbatch == NULL || !atomic_load(&cm_kb_on)
            || CM_CU_RAW(StreamGetCaptureInfo,
                         (h, &st, &id, NULL, &deps, NULL, &nd))
                   != CUDA_SUCCESS
            || st != CU_STREAM_CAPTURE_STATUS_ACTIVE || nd != 1
            || deps == NULL) {
            PyMem_RawFree(t);
            return 1;
        }
        t->capid = id;
        t->node = deps[0];
    }
    if (atomic_load(&cm_kb_on) && (b = cm_kb_find(h, 1)) != NULL) {
        memcpy(b, t, sizeof(*t));
    }
    PyMem_RawFree(t);
    return 1;
}

PyDoc_STRVAR(cm_kbatch_fn_doc,
"_capture_kernel_batch(on=None, /)\n--\n\n"
"Whether kernel copies recorded one after another on a stream cudamem\n"
"captures join one kernel node (context/kbatch.c), and how many copies\n"
"joined a batch so: (on, count) before the call.  Sets it when given.\n"
"A new process reads it from CUDAMEM_CAPTURE_KERNEL_BATCH (0 or 1).");

static PyObject *
cm_kbatch_fn(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    int old = atomic_load(&cm_kb_on);
    int on;

    (void)mod;
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError,
                        "_capture_kernel_batch takes at most one argument");
        return NULL;
    }
    if (nargs == 1 && args[0] != Py_None) {
        if ((on = PyObject_IsTrue(args[0])) < 0) {
            return NULL;
        }
        atomic_store(&cm_kb_on, on);
    }
    return Py_BuildValue("On", old ? Py_True : Py_False,
                         (Py_ssize_t)atomic_load(&cm_kb_joined));
}

static PyMethodDef cm_kbatch_methods[] = {
    {"_capture_kernel_batch", (PyCFunction)(void (*)(void))cm_kbatch_fn,
     METH_FASTCALL, cm_kbatch_fn_doc},
    {NULL, NULL, 0, NULL},
};

int
cm_kbatch_init(PyObject *mod)
{
    const char *v = getenv("CUDAMEM_CAPTURE_KERNEL_BATCH");

    if (v != NULL && v[0] != '\0') {
        if (strcmp(v, "0") != 0 && strcmp(v, "1") != 0) {
            PyErr_Format(PyExc_ValueError,
                         "CUDAMEM_CAPTURE_KERNEL_BATCH=%.100s: 0 or 1", v);
            return -1;
        }
        atomic_store(&cm_kb_on, v[0] == '1');
    }
    return PyModule_AddFunctions(mod, cm_kbatch_methods);
}
